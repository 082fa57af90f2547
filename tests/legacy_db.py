"""A database made by the schema before reply branches (Alembic revision 0002), filled through plain SQL as
that schema's code wrote it: what the migration tests upgrade."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

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
            con.execute("INSERT INTO sessions (id, owner, version, title, system_prompt, settings, created_at, "
                        "updated_at) VALUES (?, ?, 0, ?, NULL, ?, ?, ?)",
                        (sid, owner, title, json.dumps(SETTINGS), when, when))
            for pos, (role, content, status, reason, tokens) in enumerate(messages):
                con.execute("INSERT INTO messages (id, session_id, position, role, content, status, finish_reason, "
                            "completion_tokens, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (message_id(sid, pos), sid, pos, role, content, status, reason, tokens, when, when))
    con.close()
    return url
