"""A local HTTP server that stands in for the model hub, for huggingface_hub pointed at it through HF_ENDPOINT.

It answers what `HfApi.model_info(files_metadata=True)` and `hf_hub_download` ask: GET /api/models/OWNER/REPO
(the file list with sizes, LFS sha256 and git blob ids), HEAD and GET /OWNER/REPO/resolve/REV/FILE (X-Repo-Commit,
ETag, X-Linked-Etag, X-Linked-Size; Range requests answered 206), and the hub's error codes (X-Error-Code:
RepoNotFound, EntryNotFound, GatedRepo). Faults on request: a file served with other bytes than its metadata
describes, a connection dropped halfway through a file once.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_API = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$")
_RANGE = re.compile(r"^bytes=(\d+)-$")


@dataclass(slots=True)
class HubFile:
    data: bytes
    lfs: bool = True  # large files live in LFS: the hub gives their sha256; small ones only a git blob id
    served: bytes | None = None  # the bytes actually sent, when they differ from `data` (a corrupt transfer)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_blob_id(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


@dataclass(slots=True)
class HubRepo:
    files: dict[str, HubFile]
    gated: bool = False
    commit: str = "0123456789abcdef0123456789abcdef01234567"


@dataclass(slots=True)
class Seen:
    method: str
    path: str
    range: str | None
    authorized: bool


@dataclass
class HubStandIn:
    """The server's state: repositories, the token gated ones accept, faults to inject, and every request seen."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    token: str = "hf_test_token"
    cut_once: set[tuple[str, str]] = field(default_factory=set)  # (repo, file): drop the connection halfway, once
    # (repo, file): send half, then hold the connection open without a byte more, once (a pull a user then stops)
    stall_once: set[tuple[str, str]] = field(default_factory=set)
    released: threading.Event = field(default_factory=threading.Event)  # ends a stall
    stalled: set[tuple[str, str]] = field(default_factory=set)  # stalled until released: retries wait too
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> HubStandIn:
        hub = self

        class Handler(_Handler):
            state = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def file_gets(self, repo: str, name: str) -> list[Seen]:
        """The GETs of a file's bytes."""
        return [
            s
            for s in self.seen
            if s.method == "GET" and s.path.startswith(f"/{repo}/resolve/") and s.path.endswith(f"/{name}")
        ]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: HubStandIn

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        hub = self.state
        auth = self.headers.get("Authorization")
        hub.seen.append(Seen(self.command, self.path, self.headers.get("Range"), auth == f"Bearer {hub.token}"))
        path = self.path.split("?", 1)[0]
        if m := _API.match(path):
            repo = hub.repos.get(m.group(1))
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            return self._json(_model_info(m.group(1), repo), body)
        m = _RESOLVE.match(path)
        if m is None:
            return self._error(404, None, "Not found")
        repo = hub.repos.get(m.group(1))
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if repo.gated and auth != f"Bearer {hub.token}":
            code = 403 if auth else 401
            return self._error(code, "GatedRepo", "Access to this model is restricted: you must be authenticated")
        f = repo.files.get(m.group(3))
        if f is None:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit})
        self._file(m.group(1), m.group(3), repo, f, body)

    def _file(self, repo_id: str, name: str, repo: HubRepo, f: HubFile, body: bool) -> None:
        if body and (repo_id, name) in self.state.stalled:
            # A retry of a stalled download (the client's read timed out) hangs as the first did: the download
            # stays stuck, whatever the client's timeout, until the user stops it.
            self.state.released.wait(60)
        data = f.served if f.served is not None else f.data
        etag = f.sha256 if f.lfs else f.git_blob_id
        start = 0
        if body and (r := _RANGE.match(self.headers.get("Range") or "")):
            start = int(r.group(1))
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        if f.lfs:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(f.data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        key = (repo_id, name)
        if key in self.state.cut_once and not start:
            self.state.cut_once.discard(key)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True  # the rest never comes: the client sees a body cut short
            return
        if key in self.state.stall_once and not start:
            self.state.stall_once.discard(key)
            self.state.stalled.add(key)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.state.released.wait(60)
            self.close_connection = True
            return
        self.wfile.write(data[start:])

    def _json(self, obj: object, body: bool) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if body:
            self.wfile.write(raw)

    def _error(self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None) -> None:
        raw = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)


def _model_info(repo_id: str, repo: HubRepo) -> dict:
    siblings = []
    for name, f in repo.files.items():
        s: dict = {"rfilename": name, "size": len(f.data), "blobId": f.git_blob_id}
        if f.lfs:
            s["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": 134}
        siblings.append(s)
    return {
        "id": repo_id,
        "modelId": repo_id,
        "sha": repo.commit,
        "private": False,
        "gated": "manual" if repo.gated else False,
        "disabled": False,
        "siblings": siblings,
    }
