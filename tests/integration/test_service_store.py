"""Persistence layer against a real SQLite file and a real PostgreSQL database, migrated by Alembic (no model
needed): every store test runs on both (tests/postgres.py)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.api.bodies import Export, SessionFields, decode
from app.config import Settings
from app.domain.defaults import DEFAULT_SETTINGS
from app.domain.errors import ServiceError
from app.store import Store
from app.store.migrate import head_revision, upgrade
from app.store.records import MessageRecord

REPO = Path(__file__).resolve().parents[2]
ME, OTHER = "owner-a", "owner-b"  # what app.api.gate.key_id makes of two API keys


def url_for(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
async def store(database_url: str):
    upgrade(database_url)
    s = Store(database_url)
    yield s
    await s.close()


async def scalar(store: Store, sql: str, **params: object) -> object:
    async with store.engine.connect() as conn:
        return (await conn.execute(text(sql), params)).scalar()


def test_upgrade_creates_schema_in_wal_mode_and_is_idempotent(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "forge.db"  # the folder is created too
    upgrade(url_for(db))
    upgrade(url_for(db))
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(head_revision(),)]
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"sessions", "messages", "alembic_version"} <= tables
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        con.close()


async def test_upgrade_on_postgresql_creates_schema_and_search_indexes_and_is_idempotent(postgres) -> None:
    url = postgres.database()
    upgrade(url)
    upgrade(url)
    store = Store(url)
    try:
        assert await scalar(store, "SELECT version_num FROM alembic_version") == head_revision()
        tables = await scalar(store, "SELECT array_agg(tablename::text) FROM pg_tables WHERE schemaname = 'public'")
        assert {"sessions", "messages", "replicas", "session_leases", "alembic_version"} <= set(tables)
        indexes = await scalar(
            store,
            "SELECT array_agg(indexname::text) FROM pg_indexes WHERE schemaname = 'public' "
            "AND indexdef LIKE '%USING gin%'",
        )
        assert set(indexes) == {"ix_sessions_search", "ix_messages_search"}
        folded = await scalar(store, "SELECT to_tsvector('forge_search', 'Crème BRÛLÉE')::text")
        assert folded == "'brulee':2 'creme':1"
    finally:
        await store.close()


async def test_workers_migrating_at_once_all_succeed(tmp_path: Path, database_url: str) -> None:
    go = tmp_path / "go"
    workers = 3 if database_url.startswith("sqlite") else 2  # two race as well: fewer processes importing at once
    script = (
        "import os, sys, time\n"
        "from app.store.migrate import upgrade\n"
        f"open(os.path.join({str(tmp_path)!r}, 'ready-' + sys.argv[1]), 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
        f"upgrade({database_url!r})\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(i)], cwd=REPO, stderr=subprocess.PIPE)
        for i in range(workers)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < workers and time.monotonic() < deadline:
        time.sleep(0.01)  # every worker has imported; now they race
    go.touch()
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * workers, errors
    store = Store(database_url)
    try:
        assert await scalar(store, "SELECT count(*) FROM alembic_version") == 1
        assert await scalar(store, "SELECT version_num FROM alembic_version") == head_revision()
    finally:
        await store.close()


async def test_sessions_list_newest_first_rename_and_delete_with_messages(store: Store) -> None:
    a = await store.create_session(ME, "a", None, DEFAULT_SETTINGS)
    b = await store.create_session(ME, "b", "be brief", DEFAULT_SETTINGS)
    c = await store.create_session(ME, "c", None, DEFAULT_SETTINGS)
    assert [s.id for s in await store.list_sessions(ME)] == [c.id, b.id, a.id]
    renamed = await store.update_session(a.id, ME, title="renamed")
    assert renamed is not None and renamed.title == "renamed"
    assert [s.id for s in await store.list_sessions(ME)] == [a.id, c.id, b.id]
    assert await store.update_session("nope", ME, title="x") is None

    await store.start_reply(b.id, ME, parent_id=None, user_content="hello")
    session, messages = await store.get_history(b.id, ME)  # type: ignore[misc]
    assert session.system_prompt == "be brief" and len(messages) == 2
    assert await store.delete_session(b.id, ME) is True
    assert await store.delete_session(b.id, ME) is False
    assert await store.get_history(b.id, ME) is None
    assert await scalar(store, "SELECT count(*) FROM messages WHERE session_id = :s", s=b.id) == 0


async def test_reply_lifecycle_and_branches(store: Store) -> None:
    s = await store.create_session(ME, "t", None, DEFAULT_SETTINGS)
    started = await store.start_reply(s.id, ME, parent_id=None, user_content="one")
    assert started is not None
    _, (u1, r1) = started
    assert (u1.position, u1.role, u1.status, u1.parent_id) == (0, "user", "complete", None)
    assert (r1.position, r1.role, r1.status, r1.content) == (1, "assistant", "streaming", "")
    assert (r1.parent_id, r1.siblings) == (u1.id, [r1.id])

    await store.save_progress({r1.id: ("partial", 3)})
    _, msgs = await store.get_history(s.id, ME)  # type: ignore[misc]
    assert (msgs[1].content, msgs[1].completion_tokens, msgs[1].status) == ("partial", 3, "streaming")

    done = await store.finish_reply(
        r1.id,
        content="partial reply",
        status="complete",
        finish_reason="stop",
        prompt_tokens=10,
        cached_tokens=4,
        completion_tokens=5,
        ttft_ms=12.5,
        tokens_per_s=30.0,
    )
    assert done is not None and (done.status, done.cached_tokens, done.ttft_ms) == ("complete", 4, 12.5)
    _, (*_, u2, r2) = await store.start_reply(s.id, ME, parent_id=r1.id, user_content="two")  # type: ignore[misc]
    assert (u2.position, r2.position) == (2, 3)

    # Regenerate the first reply: a sibling of it, chosen; the branch below the old one is kept, not shown.
    _, branch = await store.start_reply(s.id, ME, parent_id=u1.id)  # type: ignore[misc]
    r1b = branch[-1]
    assert [m.id for m in branch] == [u1.id, r1b.id] and branch[-1].siblings == [r1.id, r1b.id]
    # Edit the first user message: a sibling of it, with its own reply.
    _, branch = await store.start_reply(s.id, ME, parent_id=None, user_content="one, edited")  # type: ignore[misc]
    u1b, r1c = branch
    assert (u1b.position, u1b.siblings, r1c.siblings) == (0, [u1.id, u1b.id], [r1c.id])
    assert (await store.get_history(s.id, ME))[1] == branch  # type: ignore[index]

    # Choosing the old first message restores the choices made below it: the second reply, not the first.
    _, branch = await store.select(s.id, ME, u1.id)  # type: ignore[misc]
    assert [m.id for m in branch] == [u1.id, r1b.id]
    _, branch = await store.select(s.id, ME, u2.id)  # type: ignore[misc]  # deep inside another branch
    assert [m.id for m in branch] == [u1.id, r1.id, u2.id, r2.id]
    assert [m.content for m in branch[:2]] == ["one", "partial reply"]
    assert await store.select(s.id, ME, "missing") is None
    assert await store.select(s.id, OTHER, u2.id) is None
    with pytest.raises(ValueError):
        await store.start_reply(s.id, ME, parent_id="missing")

    assert await store.start_reply("missing", ME, parent_id=None, user_content="x") is None
    assert (
        await store.finish_reply(
            "missing",
            content="",
            status="stopped",
            finish_reason="abort",
            prompt_tokens=None,
            cached_tokens=None,
            completion_tokens=None,
            ttft_ms=None,
            tokens_per_s=None,
        )
        is None
    )


async def test_mark_interrupted_only_touches_streaming_replies(store: Store) -> None:
    s = await store.create_session(ME, "t", None, DEFAULT_SETTINGS)
    _, (_, r) = await store.start_reply(s.id, ME, parent_id=None, user_content="q")  # type: ignore[misc]
    await store.save_progress({r.id: ("half a rep", 4)})
    assert await store.mark_interrupted(older_than_s=3600) == 0  # recent: a live worker may own it
    assert await store.mark_interrupted() == 1
    _, msgs = await store.get_history(s.id, ME)  # type: ignore[misc]
    assert [(m.status, m.content) for m in msgs] == [("complete", "q"), ("interrupted", "half a rep")]
    assert await store.mark_interrupted() == 0


async def streaming_replies(store: Store, n: int) -> list[tuple[str, str]]:
    """(session id, reply id) of `n` new sessions, each with a reply streaming below its first message."""
    out = []
    for i in range(n):
        s = await store.create_session(ME, f"t{i}", None, DEFAULT_SETTINGS)
        _, (_, r) = await store.start_reply(s.id, ME, parent_id=None, user_content="q")  # type: ignore[misc]
        out.append((s.id, r.id))
    return out


async def stored_reply(store: Store, session_id: str) -> MessageRecord:
    """The reply below the first message of `session_id`, as stored."""
    _, msgs = await store.get_history(session_id, ME)  # type: ignore[misc]
    return msgs[1]


async def test_progress_of_many_replies_goes_in_one_batch_that_skips_deleted_ones(store: Store) -> None:
    replies = await streaming_replies(store, 3)
    assert await store.delete_session(replies[1][0], ME)  # deleted while its reply streams
    await store.save_progress({r: (f"text {i}", i + 1) for i, (_, r) in enumerate(replies)})
    for i in (0, 2):
        got = await stored_reply(store, replies[i][0])
        assert (got.content, got.completion_tokens, got.status) == (f"text {i}", i + 1, "streaming")


async def test_progress_is_batched_and_never_lands_after_a_replys_final_write(store: Store) -> None:
    """app/domain/progress.py: notes of several replies become one write; a reply settled before its final
    write (as the runner does) is not rewritten by a batch that was pending or still being written."""
    from app.domain.progress import Progress

    writes: list[dict] = []
    written = asyncio.Event()  # the test lets the first batch reach the database
    save = store.save_progress

    async def gated(replies):  # type: ignore[no-untyped-def]
        writes.append(dict(replies))
        await written.wait()
        await save(replies)

    async def until(check) -> None:  # type: ignore[no-untyped-def]
        async with asyncio.timeout(30):
            while not await check():
                await asyncio.sleep(0.01)

    store.save_progress = gated  # type: ignore[method-assign]
    progress = Progress(store, interval_s=0.01)
    ids = await streaming_replies(store, 3)
    for i, (_, r) in enumerate(ids):
        progress.note(r, f"part {i}", 1)

    async def first_batch_started() -> bool:
        return bool(writes)

    await until(first_batch_started)
    assert writes == [{r: (f"part {i}", 1) for i, (_, r) in enumerate(ids)}]
    progress.note(ids[0][1], "more", 2)  # pending for the next batch...
    settled = asyncio.create_task(progress.settle(ids[0][1]))  # ...dropped; then it waits for the batch in flight
    await asyncio.sleep(0.05)
    assert not settled.done()
    written.set()
    await settled
    await store.finish_reply(
        ids[0][1],
        content="final",
        status="complete",
        finish_reason="stop",
        prompt_tokens=1,
        cached_tokens=0,
        completion_tokens=3,
        ttft_ms=1.0,
        tokens_per_s=1.0,
    )
    progress.note(ids[1][1], "later", 2)

    async def later_stored() -> bool:
        return (await stored_reply(store, ids[1][0])).content == "later"

    await until(later_stored)
    await progress.close()
    assert [list(w) for w in writes] == [[r for _, r in ids], [ids[1][1]]]
    final = await stored_reply(store, ids[0][0])
    assert (final.content, final.status) == ("final", "complete")


async def test_export_import_round_trip_keeps_every_branch_with_new_ids(store: Store) -> None:
    s = await store.create_session(ME, "trip", "sys", {"temperature": 0.0, "top_p": 1.0, "max_tokens": 7})
    _, (u, r) = await store.start_reply(s.id, ME, parent_id=None, user_content="hi")  # type: ignore[misc]
    await store.finish_reply(
        r.id,
        content="hello",
        status="complete",
        finish_reason="stop",
        prompt_tokens=3,
        cached_tokens=0,
        completion_tokens=1,
        ttft_ms=1.0,
        tokens_per_s=None,
    )
    await store.start_reply(s.id, ME, parent_id=u.id)  # a second reply, left streaming
    await store.select(s.id, ME, r.id)
    exported = await store.export_session(s.id, ME)
    assert exported is not None and exported["forge_export"] == 2
    assert [(m["role"], m["content"], m["active"]) for m in exported["messages"]] == [
        ("user", "hi", True),
        ("assistant", "hello", True),
        ("assistant", "", False),
    ]

    body = decode(json.dumps(exported), Export)
    imported = await store.import_session(OTHER, exported["session"], body.tree())
    assert imported.id != s.id
    assert (imported.title, imported.system_prompt, imported.settings) == ("trip", "sys", s.settings)
    assert await store.get_history(imported.id, ME) is None  # it belongs to the importer
    _, msgs = await store.get_history(imported.id, OTHER)  # type: ignore[misc]
    assert [(m.role, m.content, len(m.siblings)) for m in msgs] == [
        ("user", "hi", 1),
        ("assistant", "hello", 2),
    ]
    copy = await store.export_session(imported.id, OTHER)
    assert [m["status"] for m in copy["messages"]] == ["complete", "complete", "interrupted"]  # type: ignore[index]
    assert {m["id"] for m in copy["messages"]}.isdisjoint({m["id"] for m in exported["messages"]})  # type: ignore[index]


def test_export_files_of_both_versions_become_one_tree() -> None:
    v1 = {
        "forge_export": 1,
        "session": {},
        "messages": [{"role": "user", "content": "a", "id": "x"}, {"role": "assistant", "content": "b", "id": "x"}],
    }
    assert [(m["parent"], m["active"]) for m in decode(json.dumps(v1), Export).tree()] == [(None, True), (0, True)]
    v2 = {
        "forge_export": 2,
        "session": {},
        "messages": [
            {"id": "u", "parent_id": None, "role": "user", "content": "q", "active": False},
            {"id": "a1", "parent_id": "u", "role": "assistant", "content": "1", "active": True},
            {"id": "a2", "parent_id": "u", "role": "assistant", "content": "2", "active": True},  # the last marked wins
            {"id": "u2", "parent_id": None, "role": "user", "content": "q2", "active": False},  # none marked: the last
            {"id": "u3", "parent_id": None, "role": "user", "content": "q3", "active": False},
            {"role": "assistant", "content": "no parent_id: after the message before it"},
        ],
    }
    assert [(m["parent"], m["active"]) for m in decode(json.dumps(v2), Export).tree()] == [
        (None, False),
        (0, False),
        (0, True),
        (None, False),
        (None, True),
        (4, True),
    ]
    for messages, param in [
        ([{"id": "a", "parent_id": "b", "role": "user", "content": "x"}], "messages[0].parent_id"),
        ([{"id": "a", "role": "user", "content": "x"}, {"id": "a", "role": "user", "content": "y"}], "messages[1].id"),
    ]:
        with pytest.raises(ServiceError) as exc:
            decode(json.dumps({"forge_export": 2, "session": {}, "messages": messages}), Export).tree()
        assert (exc.value.code, exc.value.param) == ("invalid_parameter", param)


async def test_sessions_of_another_owner_are_invisible(store: Store) -> None:
    mine = await store.create_session(ME, "mine", None, DEFAULT_SETTINGS)
    assert await store.list_sessions(OTHER) == []
    assert await store.get_session(mine.id, OTHER) is None
    assert await store.update_session(mine.id, OTHER, title="taken") is None
    assert await store.start_reply(mine.id, OTHER, parent_id=None, user_content="x") is None
    assert await store.delete_session(mine.id, OTHER) is False
    assert await store.export_session(mine.id, OTHER) is None
    assert await store.get_history(mine.id, ME) == (mine, [])  # untouched


async def test_concurrent_settings_updates_all_land(store: Store) -> None:
    sessions = [await store.create_session(ME, f"s{i}", None, DEFAULT_SETTINGS) for i in range(8)]
    patches = [{"temperature": 1.5}, {"top_p": 0.5}, {"max_tokens": 7}]
    await asyncio.gather(*(store.update_session(s.id, ME, settings=p) for s in sessions for p in patches))
    for s in sessions:
        merged = (await store.get_session(s.id, ME)).settings  # type: ignore[union-attr]
        assert merged == {"temperature": 1.5, "top_p": 0.5, "max_tokens": 7}, "an update was lost"


def test_settings_from_env_and_overrides() -> None:
    env = {
        "FORGE_PORT": "9001",
        "FORGE_DATABASE_URL": "sqlite+aiosqlite:///x.db",
        "FORGE_API_KEY": "k",
        "FORGE_THREADS": "2",
        "FORGE_MODEL": "/m.gguf",
    }
    s = Settings.from_env(env, port=None, model="default")
    assert (s.port, s.database_url, s.api_keys, s.threads, s.model) == (
        9001,
        "sqlite+aiosqlite:///x.db",
        ("k",),
        2,
        "default",
    )
    assert Settings.from_env({"FORGE_API_KEY": "a, b"}).api_keys == ("a", "b")
    for env, flags in [
        ({"FORGE_API_KEY": ""}, {}),
        ({"FORGE_API_KEY": "a,,b"}, {}),
        ({}, {"api_keys": [""]}),
        ({"FORGE_ADMIN_TOKEN": ""}, {}),
    ]:
        with pytest.raises(ValueError, match="empty"):  # an empty key never turns auth off
            Settings.from_env(env, **flags)
    assert Settings.from_env({}).database_url == "sqlite+aiosqlite:///./data/forge.db"
    assert Settings.from_env({}).default_max_tokens == 512
    assert Settings.from_env({"FORGE_DEFAULT_MAX_TOKENS": "64"}).default_max_tokens == 64
    with pytest.raises(ValueError, match="FORGE_PORT"):
        Settings.from_env({"FORGE_PORT": "eighty"})
    with pytest.raises(ValueError, match="max_waiting"):
        Settings.from_env({}, max_waiting=0)
    with pytest.raises(ValueError, match="unknown setting"):
        Settings.from_env({}, colour="red")


def test_replica_settings() -> None:
    assert Settings.from_env({}, host="10.0.0.5", port=8002).replica == "10.0.0.5:8002"  # the default name
    assert Settings.from_env({"FORGE_REPLICA_NAME": "r1", "FORGE_LEASE_TTL_S": "2.5"}).replica == "r1"
    for flags, refused in [
        ({"replica_name": ""}, "replica_name"),
        ({"replica_name": "a\nb"}, "replica_name"),
        ({"replica_name": "r" * 201}, "replica_name"),
        ({"lease_ttl_s": "nan"}, "lease_ttl_s"),
        ({"lease_ttl_s": "0"}, "lease_ttl_s"),
        ({"lease_ttl_s": "inf"}, "lease_ttl_s"),
    ]:
        with pytest.raises(ValueError, match=refused):
            Settings.from_env({}, **flags)


def test_session_fields_name_the_field_they_refuse() -> None:
    assert decode(b'{"settings": {"temperature": 0}}', SessionFields).new_session(DEFAULT_SETTINGS)["settings"] == dict(
        DEFAULT_SETTINGS, temperature=0.0
    )
    cases = [
        ({"temperature": 2.5}, "settings.temperature"),
        ({"temperature": "hot"}, "settings.temperature"),
        ({"top_p": 0}, "settings.top_p"),
        ({"max_tokens": -3}, "settings.max_tokens"),
        ({"max_tokens": 1.5}, "settings.max_tokens"),
        ({"max_tokens": True}, "settings.max_tokens"),
        ({"max_tokens": 10**400}, "settings.max_tokens"),
        ({"seed": 1}, "settings.seed"),
        ([], "settings"),
    ]
    for value, param in cases:
        with pytest.raises(ServiceError) as exc:
            decode(json.dumps({"settings": value}), SessionFields)
        assert exc.value.param == param, value
        assert param in exc.value.message
