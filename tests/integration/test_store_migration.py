"""Migration 0003 (reply branches, search) on a database made by the schema before it: created by Alembic at
0002, filled through plain SQL as that schema's code wrote it, then upgraded."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from legacy_db import legacy_database, message_id

from app.store import Store
from app.store.migrate import alembic_config, head_revision, upgrade

ME, OTHER = "owner-a", "owner-b"
LEGACY = [
    ("s" * 32, ME, "Capitals", [("user", "What is the capital of France?", "complete", None, None),
                                ("assistant", "Paris is the capital of France.", "complete", "stop", 8),
                                ("user", "And of Germany?", "complete", None, None),
                                ("assistant", "Berlin", "stopped", "abort", 2),
                                ("user", "Thanks, café owner!", "complete", None, None)]),
    ("t" * 32, OTHER, "Someone else's capitals", [("user", "The capital of Spain?", "complete", None, None),
                                                  ("assistant", "Madrid", "interrupted", "abort", 1)]),
    ("u" * 32, ME, "Empty", []),
]


def rows(path: Path) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT id, session_id, position, role, content, status, finish_reason, completion_tokens "
                           "FROM messages ORDER BY session_id, position").fetchall()
    finally:
        con.close()


async def test_upgrade_keeps_every_session_and_message_as_one_branch(tmp_path: Path) -> None:
    db = tmp_path / "legacy.db"
    url = legacy_database(db, LEGACY)
    before = rows(db)
    assert len(before) == 7

    upgrade(url)
    con = sqlite3.connect(db)
    assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(head_revision(),)]
    con.close()
    assert rows(db) == before  # every message, every field

    store = Store(url)
    try:
        assert [s["title"] for s in await store.list_sessions(ME)] == ["Empty", "Capitals"]
        for sid, owner, title, messages in LEGACY:
            session, branch = await store.get_history(sid, owner)  # type: ignore[misc]
            assert session["title"] == title
            assert [(m["role"], m["content"], m["status"]) for m in branch] == [m[:3] for m in messages]
            assert [m["parent_id"] for m in branch] == [None, *(m["id"] for m in branch)][:len(branch)]
            assert all(m["siblings"] == [m["id"]] for m in branch)

        # the search index holds the old rows (accents folded), for their owner only
        hits = await store.search(ME, "cafe", 10)
        assert [(h["session"]["id"], h["message"]["position"]) for h in hits] == [("s" * 32, 4)]
        assert [h["session"]["title"] for h in await store.search(ME, "capitals", 10)] == ["Capitals"]
        assert [h["session"]["title"] for h in await store.search(OTHER, "capitals", 10)] == ["Someone else's capitals"]

        # branches grow on the upgraded rows: regenerate the stopped reply
        sid = "s" * 32
        _, branch = await store.start_reply(sid, ME, parent_id=message_id(sid, 2))  # type: ignore[misc]
        assert branch[-1]["siblings"] == [message_id(sid, 3), branch[-1]["id"]]
        await store.finish_reply(branch[-1]["id"], content="Berlin, of course.", status="complete",
                                 finish_reason="stop", prompt_tokens=9, cached_tokens=0, completion_tokens=5,
                                 ttft_ms=None, tokens_per_s=None)
        assert [h["message"]["id"] for h in await store.search(ME, "course", 10)] == [branch[-1]["id"]]
    finally:
        await store.close()

    # downgrading keeps the chosen branch of each session (the new reply, not the stopped one)
    command.downgrade(alembic_config(url), "0002")
    after = rows(db)
    assert len(after) == 6 and ("Berlin, of course." in {r[4] for r in after}) and "Berlin" not in {r[4] for r in after}
    con = sqlite3.connect(db)
    assert not con.execute("SELECT name FROM sqlite_master WHERE name LIKE '%fts%'").fetchall()
    con.close()

