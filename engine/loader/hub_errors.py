"""What goes wrong talking to the hub, said plainly: huggingface_hub's, httpx's and the OS's exceptions -> HubError."""

from __future__ import annotations

import errno

from engine.loader.hub_names import HubError, HubRef

TOKEN_HINT = "set HF_TOKEN to a token of an account that has access"


def gated(repo: str) -> HubError:
    """The error for a gated repository reached without a token that has access."""
    return HubError(f"{repo} is gated: accept its terms on its hub page, then {TOKEN_HINT}")


def explain(exc: BaseException, ref: HubRef, what: str, endpoint: str) -> HubError:
    """A HubError for `exc`, raised while `what` (e.g. "downloading x.gguf") for `ref`, against `endpoint`."""
    import httpx2
    from huggingface_hub import errors as hf

    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return HubError(
            f"{ref} is not on disk and offline mode is on (HF_HUB_OFFLINE): pull it while online; "
            "`forge models` lists what is on disk"
        )
    if isinstance(exc, hf.GatedRepoError):
        return gated(ref.repo)
    if isinstance(exc, hf.RepositoryNotFoundError):
        return HubError(f"no repository {ref.repo} on the hub at {endpoint} (a private one needs HF_TOKEN)")
    if isinstance(exc, hf.RevisionNotFoundError):
        return HubError(f"{ref.repo} has no such revision")
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return HubError(f"{ref.repo} has no file {ref.file!r}")
    if isinstance(exc, hf.LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        if cause is not None and not isinstance(cause, hf.LocalEntryNotFoundError):
            return explain(cause, ref, what, endpoint)
        return HubError(f"{ref} is not on disk and the hub at {endpoint} cannot be reached while {what}")
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError)):
        return HubError(
            f"cannot reach the hub at {endpoint} while {what} ({type(exc).__name__}: {exc}); check the network "
            "(or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 to use only what is on disk"
        )
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status in (401, 403):
            return HubError(f"the hub refused access to {ref.repo} (HTTP {status}) while {what}: {TOKEN_HINT}")
        return HubError(f"the hub at {endpoint} answered HTTP {status} while {what}")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return HubError(f"disk full while {what}: free some space (`forge rm NAME` removes a model) and pull again")
    if isinstance(exc, OSError):
        return HubError(f"{what} failed: {exc}")
    raise exc
