"""Models from the hub by name, through huggingface_hub and its cache (HF_HOME, HF_ENDPOINT, HF_TOKEN,
HF_HUB_OFFLINE): `pull` fetches and verifies one GGUF, `find_cached` finds one already on disk without the network,
`resolve` is what loading `hf:...` does (on disk first, a pull only when it is not). Only an `hf:` model name
reaches this module, so nothing else ever touches the network."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.hf_api import RepoSibling
from huggingface_hub.utils import get_token

from engine.loader.hub_errors import explain, gated
from engine.loader.hub_names import HubError, HubRef, choose_gguf, format_size, parse_hub_ref
from engine.loader.hub_verify import Expected, check_gguf, verify

log = logging.getLogger("forge.hub")

Say = Callable[[str], None]


def cache_dir() -> Path:
    """huggingface_hub's cache folder (HF_HUB_CACHE, else $HF_HOME/hub)."""
    return Path(constants.HF_HUB_CACHE)


def endpoint() -> str:
    """The hub huggingface_hub talks to (HF_ENDPOINT, else its default)."""
    return constants.ENDPOINT


def repo_folder(repo: str) -> Path:
    """Where the cache keeps a model repository's blobs, refs and snapshots."""
    return cache_dir() / ("models--" + repo.replace("/", "--"))


def resolve(name: str) -> Path:
    """The local file for an `hf:` model name: the cached one when there is one (no network), else pulled now."""
    ref = parse_hub_ref(name)
    cached = find_cached(ref)
    if cached is not None:
        return cached
    log.warning("%s is not on disk: pulling it from %s", ref, endpoint())
    return pull(ref, say=lambda line: log.warning("%s", line))


def find_cached(ref: HubRef) -> Path | None:
    """The GGUF `ref` names in the cache's copy of the repository's main revision, or None; the same choice rule
    as a pull (hub_names.choose_gguf) over the files on disk. Never touches the network."""
    folder = repo_folder(ref.repo)
    try:
        commit = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    files = {p.relative_to(snapshot).as_posix(): p.stat().st_size for p in snapshot.rglob("*") if p.is_file()}
    if ref.file is not None and ref.file not in files:
        return None
    if ref.file is None and not any(f.lower().endswith(".gguf") for f in files):
        return None
    return snapshot / choose_gguf(ref, files)


def pull(ref: HubRef, say: Say | None = None) -> Path:
    """Download the GGUF `ref` names into the cache (or find it there), check its size and sha256 against the hub's
    metadata and its GGUF magic, and return its path. A dropped connection resumes where it broke (huggingface_hub
    asks for the rest with a Range request). Raises HubError with a message for people."""
    say = say or (lambda line: None)
    hub = endpoint()
    if constants.is_offline_mode():
        cached = find_cached(ref)
        if cached is None:
            raise HubError(f"{ref} is not on disk and offline mode is on (HF_HUB_OFFLINE): pull it while online")
        say(f"{ref}: on disk at {cached} (offline: not checked against the hub)")
        return cached
    try:
        info = HfApi().model_info(ref.repo, files_metadata=True)
    except Exception as exc:
        raise explain(exc, ref, f"reading {ref.repo}'s file list", hub) from None
    siblings = {s.rfilename: s for s in info.siblings or []}
    file = choose_gguf(ref, {name: _size(s) for name, s in siblings.items()})
    sibling = siblings[file]
    expected = Expected(_size(sibling), sibling.lfs.sha256 if sibling.lfs else None, sibling.blob_id)
    named = HubRef(ref.repo, file)
    if info.gated and get_token() is None:
        raise gated(ref.repo)
    if find_cached(named) is None:
        _check_space(ref.repo, expected.size)
    say(f"pulling {named} ({format_size(expected.size)}) from {hub}")
    try:
        path = Path(hf_hub_download(ref.repo, file))
    except Exception as exc:
        raise explain(exc, named, f"downloading {file}", hub) from None
    if expected.sha256 or expected.git_blob_id:
        say(f"checking {file} ({'sha256' if expected.sha256 else 'git blob id'}) ...")
        verify(path, expected, str(named))
    else:
        check_gguf(path, str(named))
    say(f"{named}: {format_size(path.stat().st_size)} at {path}")
    return path


def _size(sibling: RepoSibling) -> int | None:
    return sibling.lfs.size if sibling.lfs else sibling.size


def _check_space(repo: str, size: int | None) -> None:
    """Refuse before downloading when the cache's disk has less room than the file needs (huggingface_hub only
    warns, then fails mid-way)."""
    if size is None:
        return
    where = repo_folder(repo)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if free < size:
        raise HubError(
            f"not enough disk space in {cache_dir()}: the file needs {format_size(size)}, {format_size(free)} is "
            "free; free some (`forge rm NAME` removes a model) or point HF_HOME elsewhere"
        )
