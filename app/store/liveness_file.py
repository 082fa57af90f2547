"""Liveness on SQLite: each replica holds an exclusive `flock` on a file named for its incarnation in a folder
beside the database (`forge.db-replicas/<incarnation>.lock`). The kernel drops the lock when the process dies,
however it dies; another process that can take the lock knows its holder is gone.

`flock`, not `fcntl` record locks: a flock belongs to its open file, so two stores in one process see each
other's locks, and closing another descriptor of the same file does not drop ours.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from app.store.liveness import Liveness, Lost


class FileLiveness(Liveness):
    """File locks in `folder` (made on first use)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fd: int | None = None
        self._path: Path | None = None

    def _file(self, incarnation: str) -> Path:
        assert incarnation.isalnum(), incarnation  # a file name, never a path
        return self.folder / f"{incarnation}.lock"

    async def hold(self, incarnation: str, on_lost: Lost) -> None:
        await self.release()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._file(incarnation)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"the lock of incarnation {incarnation} is held already") from None
        self._fd, self._path = fd, path  # a file lock is never lost while the process lives: on_lost stays unused

    async def release(self) -> None:
        if self._fd is None:
            return
        assert self._path is not None
        self._path.unlink(missing_ok=True)  # before the unlock: a checker that finds no file knows it is gone
        os.close(self._fd)
        self._fd = self._path = None

    async def held(self, incarnations: Sequence[str]) -> set[str] | None:
        return {inc for inc in incarnations if _locked(self._file(inc))}


def _locked(path: Path) -> bool:
    """Whether a live process holds the lock on `path`; a free lock's file is removed (its holder is gone)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        path.unlink(missing_ok=True)
        return False
    finally:
        os.close(fd)
