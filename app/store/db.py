"""Database engine set-up: any SQLAlchemy async URL; SQLite gets WAL, foreign keys and a busy timeout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

BUSY_TIMEOUT_MS = 10_000


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL, or None for in-memory / non-SQLite URLs."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: committed rows survive a process crash
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.close()


def make_engine(url: str) -> AsyncEngine:
    """Create an async engine for `url`; for SQLite, create the file's folder and set the pragmas."""
    try:
        parsed = make_url(url)
    except Exception as e:  # sqlalchemy.exc.ArgumentError
        raise ValueError(f"database URL {url!r} is not a valid SQLAlchemy URL: {e}") from None
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_pre_ping=True)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)
