"""A downloaded hub file checked against the hub's metadata (size, then sha256 for LFS files or the git blob id
for small ones) and for the GGUF magic; a file that fails is removed from the cache, never loaded."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from engine.loader.gguf_file import GGUF_MAGIC
from engine.loader.hub_names import HubError

_CHUNK = 8 << 20


@dataclass(slots=True, frozen=True)
class Expected:
    """What the hub says a file is: its size, and the sha256 (LFS files) or git blob id (files kept in git)."""

    size: int | None
    sha256: str | None
    git_blob_id: str | None


def verify(path: Path, expected: Expected, name: str) -> None:
    """Raise HubError, after removing the file from the cache, when `path` is not what the hub described
    or not a GGUF file."""
    size = path.stat().st_size
    if expected.size is not None and size != expected.size:
        discard(path)
        raise HubError(f"{name}: downloaded {size} bytes but the hub says {expected.size}; removed it, pull again")
    if expected.sha256:
        got = _digest(path, "sha256")
        if got != expected.sha256.lower():
            discard(path)
            raise HubError(
                f"{name}: sha256 mismatch (hub {expected.sha256}, downloaded file {got}): the download is corrupt "
                "and was removed; pull again"
            )
    elif expected.git_blob_id:
        got = _digest(path, "sha1", f"blob {size}\0".encode())  # git's object id of a blob
        if got != expected.git_blob_id.lower():
            discard(path)
            raise HubError(f"{name}: git blob id mismatch (hub {expected.git_blob_id}, file {got}); removed it")
    check_gguf(path, name)


def check_gguf(path: Path, name: str) -> None:
    """Raise HubError, after removing the file from the cache, when `path` does not start with the GGUF magic."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        discard(path)
        raise HubError(f"{name} is not a GGUF file (it starts with {magic!r}); removed it")


def discard(pointer: Path) -> None:
    """Remove a cached file: its snapshot entry and, when no other snapshot entry uses it, its blob."""
    blob = pointer.resolve()
    pointer.unlink(missing_ok=True)
    if blob != pointer and blob.exists() and not _still_used(blob):
        blob.unlink()


def _still_used(blob: Path) -> bool:
    snapshots = blob.parent.parent / "snapshots"  # the hub cache: <repo>/blobs/<etag>, <repo>/snapshots/<rev>/...
    for root, _dirs, files in os.walk(snapshots):
        for f in files:
            p = Path(root) / f
            if p.is_symlink() and p.resolve() == blob:
                return True
    return False


def _digest(path: Path, algorithm: str, prefix: bytes = b"") -> str:
    h = hashlib.new(algorithm, prefix, usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
