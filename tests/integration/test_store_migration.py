"""Migrations 0003 (reply branches, search), 0004 (replicas, leases, PostgreSQL search) and 0005 (tool calls) on a
database made by the schema before them: created by Alembic at 0002, filled through plain SQL as that schema's code
wrote it, then upgraded; on SQLite and on PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from legacy_db import legacy_database, legacy_rows, message_id
from sqlalchemy import text

from app.store import Store
from app.store.migrate import alembic_config, head_revision, upgrade

ME, OTHER = "owner-a", "owner-b"
LEGACY = [
    (
        "s" * 32,
        ME,
        "Capitals",
        [
            ("user", "What is the capital of France?", "complete", None, None),
            ("assistant", "Paris is the capital of France.", "complete", "stop", 8),
            ("user", "And of Germany?", "complete", None, None),
            ("assistant", "Berlin", "stopped", "abort", 2),
            ("user", "Thanks, café owner!", "complete", None, None),
        ],
    ),
    (
        "t" * 32,
        OTHER,
        "Someone else's capitals",
        [("user", "The capital of Spain?", "complete", None, None), ("assistant", "Madrid", "interrupted", "abort", 1)],
    ),
    ("u" * 32, ME, "Empty", []),
]


async def query(url: str, sql: str) -> list[tuple]:
    store = Store(url)
    try:
        async with store.engine.connect() as conn:
            return [tuple(r) for r in (await conn.execute(text(sql))).all()]
    finally:
        await store.close()


async def rows(url: str) -> list[tuple]:
    return await query(
        url,
        "SELECT id, session_id, position, role, content, status, finish_reason, "
        "completion_tokens FROM messages ORDER BY session_id, position",
    )


async def test_upgrade_keeps_every_session_and_message_as_one_branch(database_url: str) -> None:
    url = database_url
    if url.startswith("sqlite"):
        legacy_database(Path(url.split("///", 1)[1]), LEGACY)
    else:
        await legacy_rows(url, LEGACY)
    before = await rows(url)
    assert len(before) == 7

    upgrade(url)
    assert await query(url, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert await rows(url) == before  # every message, every field

    store = Store(url)
    try:
        assert [s.title for s in await store.list_sessions(ME)] == ["Empty", "Capitals"]
        for sid, owner, title, messages in LEGACY:
            session, branch = await store.get_history(sid, owner)  # type: ignore[misc]
            assert session.title == title
            assert [(m.role, m.content, m.status) for m in branch] == [m[:3] for m in messages]
            assert [m.parent_id for m in branch] == [None, *(m.id for m in branch)][: len(branch)]
            assert all(m.siblings == [m.id] for m in branch)

        # the search index holds the old rows (accents folded), for their owner only
        hits = await store.search(ME, "cafe", 10)
        assert [(h["session"]["id"], h["message"]["position"]) for h in hits] == [("s" * 32, 4)]
        assert [h["session"]["title"] for h in await store.search(ME, "capitals", 10)] == ["Capitals"]
        assert [h["session"]["title"] for h in await store.search(OTHER, "capitals", 10)] == ["Someone else's capitals"]

        # branches grow on the upgraded rows: regenerate the stopped reply
        sid = "s" * 32
        _, branch = await store.start_reply(sid, ME, parent_id=message_id(sid, 2))  # type: ignore[misc]
        assert branch[-1].siblings == [message_id(sid, 3), branch[-1].id]
        await store.finish_reply(
            branch[-1].id,
            content="Berlin, of course.",
            status="complete",
            finish_reason="stop",
            prompt_tokens=9,
            cached_tokens=0,
            completion_tokens=5,
            ttft_ms=None,
            tokens_per_s=None,
        )
        assert [h["message"]["id"] for h in await store.search(ME, "course", 10)] == [branch[-1].id]
    finally:
        await store.close()

    # downgrading keeps the chosen branch of each session (the new reply, not the stopped one)
    command.downgrade(alembic_config(url), "0002")
    after = await rows(url)
    assert len(after) == 6 and ("Berlin, of course." in {r[4] for r in after}) and "Berlin" not in {r[4] for r in after}
    if url.startswith("sqlite"):
        assert not await query(url, "SELECT name FROM sqlite_master WHERE name LIKE '%fts%'")
    else:
        assert not await query(url, "SELECT indexname FROM pg_indexes WHERE indexname LIKE '%search%'")
        assert not await query(url, "SELECT cfgname FROM pg_ts_config WHERE cfgname = 'forge_search'")


async def test_0004_down_and_up_again_keeps_messages_and_search(database_url: str) -> None:
    """0004 adds and drops its column in place: on SQLite the FTS5 triggers of 0003 keep working below it."""
    url = database_url
    upgrade(url)
    store = Store(url)
    try:
        s = await store.create_session(ME, "Round trip", None, {})
        await store.start_reply(s.id, ME, parent_id=None, user_content="before the downgrade", replica="r1")
    finally:
        await store.close()
    command.downgrade(alembic_config(url), "0003")
    assert await query(url, "SELECT version_num FROM alembic_version") == [("0003",)]
    if url.startswith("sqlite"):
        assert [r[1] for r in await query(url, "PRAGMA table_info(messages)") if r[1] == "replica"] == []
        # the triggers still index what 0003's schema writes:
        con = sqlite3.connect(url.split("///", 1)[1])
        with con:
            con.execute("UPDATE messages SET content = 'after the downgrade' WHERE role = 'user'")
        hits = con.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'after'").fetchall()
        con.close()
        assert len(hits) == 1
    upgrade(url)
    store = Store(url)
    try:
        hits = await store.search(ME, "downgrade", 10)
        assert [h["message"]["role"] for h in hits] == ["user"]
        assert await store.leases.sweep() == 1  # the reply its replica (gone with the column) left streaming
    finally:
        await store.close()


async def test_0005_adds_tool_calls_and_results_in_place_and_back(database_url: str) -> None:
    """0005's columns hold a reply's calls and a result's call id; rows made at 0004 keep everything (nulls in the
    new columns), SQLite's FTS5 triggers keep indexing, and the downgrade takes the results away with the columns."""
    url = database_url
    command.upgrade(alembic_config(url), "0004")
    store = Store(url)
    try:  # the messages as 0004's code wrote them (today's model has the new columns)
        s = await store.create_session(ME, "Tools", None, {})
        async with store.engine.begin() as conn:
            for i, (mid, role, content, status) in enumerate(
                [("m" * 32, "user", "weather in Lisbon?", "complete"), ("r" * 32, "assistant", "", "streaming")]
            ):
                await conn.execute(
                    text(
                        "INSERT INTO messages (id, session_id, parent_id, ordinal, position, active, role, content,"
                        " status, created_at, updated_at) VALUES (:id, :sid, :parent, :i, :i, :active, :role,"
                        " :content, :status, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {
                        "id": mid,
                        "sid": s.id,
                        "parent": "m" * 32 if i else None,
                        "i": i,
                        "active": True,
                        "role": role,
                        "content": content,
                        "status": status,
                    },
                )
    finally:
        await store.close()
    branch = [{"id": "m" * 32}, {"id": "r" * 32}]
    upgrade(url)
    store = Store(url)
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}
    ]
    try:
        _, before = await store.get_history(s.id, ME)  # type: ignore[misc]
        assert [(m.content, m.tool_calls, m.tool_call_id) for m in before] == [
            ("weather in Lisbon?", None, None),
            ("", None, None),
        ]
        await store.finish_reply(
            branch[-1]["id"],
            content="",
            status="complete",
            finish_reason="tool_calls",
            prompt_tokens=9,
            cached_tokens=0,
            completion_tokens=12,
            ttft_ms=None,
            tokens_per_s=None,
            tool_calls=calls,
        )
        added = await store.add_tool_result(
            s.id, ME, parent_id=branch[-1]["id"], tool_call_id="call_1", content="sunny and breezy"
        )
        assert added is not None and added[1].parent_id == branch[-1]["id"]
        _, after = await store.get_history(s.id, ME)  # type: ignore[misc]
        assert [(m.role, m.tool_calls, m.tool_call_id) for m in after] == [
            ("user", None, None),
            ("assistant", calls, None),
            ("tool", None, "call_1"),
        ]
        assert [h["message"]["role"] for h in await store.search(ME, "breezy", 10)] == ["tool"]
        exported = await store.export_session(s.id, ME)
        assert [m["tool_call_id"] for m in exported["messages"]] == [None, None, "call_1"]  # type: ignore[index]
    finally:
        await store.close()
    command.downgrade(alembic_config(url), "0004")
    assert [r[0] for r in await query(url, "SELECT role FROM messages ORDER BY ordinal")] == ["user", "assistant"]
    if url.startswith("sqlite"):
        assert {r[1] for r in await query(url, "PRAGMA table_info(messages)")} & {"tool_calls", "tool_call_id"} == set()
    upgrade(url)
    store = Store(url)
    try:
        _, branch = await store.get_history(s.id, ME)  # type: ignore[misc]
        assert [m.tool_calls for m in branch] == [None, None]
    finally:
        await store.close()
