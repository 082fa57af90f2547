"""Apply Alembic migrations (to head) under a file lock, so workers starting together don't race."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from app.store.db import sqlite_path

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config for `url` that needs no alembic.ini (and leaves logging alone)."""
    if not MIGRATIONS_DIR.is_dir():
        raise RuntimeError(f"migrations folder not found at {MIGRATIONS_DIR}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["url"] = url
    return cfg


@contextlib.contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    db = sqlite_path(url)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        lock_path = db.with_name(db.name + ".migrate.lock")
    else:  # other databases: one lock per URL on this host (PostgreSQL also takes an advisory lock in env.py)
        digest = hashlib.sha1(url.encode()).hexdigest()[:16]
        lock_path = Path(tempfile.gettempdir()) / f"forge-migrate-{digest}.lock"
    with open(lock_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision`. Blocking; from async code use asyncio.to_thread."""
    with _migration_lock(url):
        command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    """The newest revision in migrations/."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
