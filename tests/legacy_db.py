"""A database made by the schema before reply branches (Alembic revision 0002), filled through plain SQL as
that schema's code wrote it: what the migration tests upgrade."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text

from app.store.db import make_engine
from app.store.migrate import upgrade

SETTINGS = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 512}
# session: (id, owner, title, [(role, content, status, finish_reason, completion_tokens), ...])
Legacy = tuple[str, str, str, list[tuple[str, str, str, str | None, int | None]]]


def message_id(session_id: str, position: int) -> str:
    return f"{session_id[:28]}{position:04d}"


def legacy_database(path: Path, sessions: list[Legacy]) -> str:
    """A database at revision 0002 at `path` holding `sessions` (each message's id is message_id(...));
    returns its URL."""
    url = f"sqlite+aiosqlite:///{path}"
    upgrade(url, "0002")
    con = sqlite3.connect(path)
    with con:
        for n, (sid, owner, title, messages) in enumerate(sessions):
            when = f"2025-02-{n + 1:02d} 12:00:00.000000"
            con.execute(
                "INSERT INTO sessions (id, owner, version, title, system_prompt, settings, created_at, "
                "updated_at) VALUES (?, ?, 0, ?, NULL, ?, ?, ?)",
                (sid, owner, title, json.dumps(SETTINGS), when, when),
            )
            for pos, (role, content, status, reason, tokens) in enumerate(messages):
                con.execute(
                    "INSERT INTO messages (id, session_id, position, role, content, status, finish_reason, "
                    "completion_tokens, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (message_id(sid, pos), sid, pos, role, content, status, reason, tokens, when, when),
                )
    con.close()
    return url


async def legacy_rows(url: str, sessions: list[Legacy]) -> None:
    """`legacy_database` on any database (`url`: an empty one), through SQLAlchemy."""
    upgrade(url, "0002")
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            for n, (sid, owner, title, messages) in enumerate(sessions):
                when = datetime(2025, 2, n + 1, 12, tzinfo=UTC)
                await conn.execute(
                    text(
                        "INSERT INTO sessions (id, owner, version, title, system_prompt, settings, created_at, "
                        "updated_at) VALUES (:id, :owner, 0, :title, NULL, :settings, :when, :when)"
                    ),
                    {"id": sid, "owner": owner, "title": title, "settings": json.dumps(SETTINGS), "when": when},
                )
                for pos, (role, content, status, reason, tokens) in enumerate(messages):
                    await conn.execute(
                        text(
                            "INSERT INTO messages (id, session_id, position, role, content, status, finish_reason, "
                            "completion_tokens, created_at, updated_at) VALUES (:id, :sid, :pos, :role, :content, "
                            ":status, :reason, :tokens, :when, :when)"
                        ),
                        {
                            "id": message_id(sid, pos),
                            "sid": sid,
                            "pos": pos,
                            "role": role,
                            "content": content,
                            "status": status,
                            "reason": reason,
                            "tokens": tokens,
                            "when": when,
                        },
                    )
    finally:
        await engine.dispose()
