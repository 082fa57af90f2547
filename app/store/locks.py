"""Which lock proves a replica alive on a given database (app.store.liveness)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import sqlite_path
from app.store.liveness import Liveness
from app.store.liveness_file import FileLiveness
from app.store.liveness_pg import PgLiveness


def make_liveness(engine: AsyncEngine) -> Liveness:
    """The lock that fits the store's database: PostgreSQL's advisory locks, a file lock beside an SQLite file,
    else none (the time lease alone)."""
    dialect = engine.dialect.name
    if dialect == "postgresql":
        return PgLiveness(engine)
    path = sqlite_path(engine.url.render_as_string(hide_password=False)) if dialect == "sqlite" else None
    if path is not None:
        return FileLiveness(path.parent / f"{path.name}-replicas")
    return Liveness()
