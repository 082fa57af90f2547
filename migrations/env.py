"""Alembic environment for Forge: async engines (aiosqlite, asyncpg, ...), also usable from a running loop.

Callers that already hold a connection pass it as `config.attributes["connection"]`;
otherwise the URL comes from `config.attributes["url"]`, FORGE_DATABASE_URL or alembic.ini.
"""

from __future__ import annotations

import asyncio
import os
import threading
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from app.store.db import make_engine
from app.store.models import Base

config = context.config
if config.config_file_name is not None:
    # Keep the server's loggers alive (Alembic's default would disable them).
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata
PG_MIGRATION_LOCK = 0x466F726765  # "Forge": serialises concurrent upgrades across hosts on PostgreSQL


def _url() -> str:
    return (
        config.attributes.get("url") or os.environ.get("FORGE_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    )


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})")
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = make_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        do_run_migrations(connection)
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(run_async_migrations())
        return
    # Called (synchronously) from code running in an event loop: use a loop of our own on another thread.
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(run_async_migrations())
        except BaseException as e:  # handed back to the caller below
            errors.append(e)

    worker = threading.Thread(target=run, name="forge-migrate")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
