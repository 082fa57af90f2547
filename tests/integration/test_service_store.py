"""Persistence layer against a real SQLite file migrated by Alembic (no model needed)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.api.errors import ServiceError
from app.api.fields import DEFAULT_SETTINGS, session_settings
from app.config import Settings
from app.store import Store
from app.store.migrate import head_revision, upgrade

REPO = Path(__file__).resolve().parents[2]


def url_for(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
async def store(tmp_path: Path):
    url = url_for(tmp_path / "forge.db")
    upgrade(url)
    s = Store(url)
    yield s
    await s.close()


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


def test_workers_migrating_at_once_all_succeed(tmp_path: Path) -> None:
    db = tmp_path / "race.db"
    go = tmp_path / "go"
    workers = 3
    script = (
        "import os, sys, time\n"
        "from app.store.migrate import upgrade\n"
        f"open(os.path.join({str(tmp_path)!r}, 'ready-' + sys.argv[1]), 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
        f"upgrade({url_for(db)!r})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], cwd=REPO, stderr=subprocess.PIPE)
             for i in range(workers)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < workers and time.monotonic() < deadline:
        time.sleep(0.01)  # every worker has imported; now they race
    go.touch()
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * workers, errors
    con = sqlite3.connect(db)
    assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(head_revision(),)]
    con.close()


async def test_sessions_list_newest_first_rename_and_delete_with_messages(store: Store, tmp_path: Path) -> None:
    a = await store.create_session("a", None, DEFAULT_SETTINGS)
    b = await store.create_session("b", "be brief", DEFAULT_SETTINGS)
    c = await store.create_session("c", None, DEFAULT_SETTINGS)
    assert [s["id"] for s in await store.list_sessions()] == [c["id"], b["id"], a["id"]]
    renamed = await store.update_session(a["id"], title="renamed")
    assert renamed is not None and renamed["title"] == "renamed"
    assert [s["id"] for s in await store.list_sessions()] == [a["id"], c["id"], b["id"]]
    assert await store.update_session("nope", title="x") is None

    await store.start_reply(b["id"], user_content="hello")
    session, messages = await store.get_history(b["id"])  # type: ignore[misc]
    assert session["system_prompt"] == "be brief" and len(messages) == 2
    assert await store.delete_session(b["id"]) is True
    assert await store.delete_session(b["id"]) is False
    assert await store.get_history(b["id"]) is None
    con = sqlite3.connect(tmp_path / "forge.db")
    assert con.execute("SELECT count(*) FROM messages WHERE session_id = ?", (b["id"],)).fetchone()[0] == 0
    con.close()


async def test_reply_lifecycle_edit_and_truncate(store: Store) -> None:
    s = await store.create_session("t", None, DEFAULT_SETTINGS)
    started = await store.start_reply(s["id"], user_content="one")
    assert started is not None
    _, u1, r1 = started
    assert (u1["position"], u1["role"], u1["status"]) == (0, "user", "complete")
    assert (r1["position"], r1["role"], r1["status"], r1["content"]) == (1, "assistant", "streaming", "")

    await store.save_progress(r1["id"], "partial", 3)
    _, msgs = await store.get_history(s["id"])  # type: ignore[misc]
    assert (msgs[1]["content"], msgs[1]["completion_tokens"], msgs[1]["status"]) == ("partial", 3, "streaming")

    done = await store.finish_reply(r1["id"], content="partial reply", status="complete", finish_reason="stop",
                                    prompt_tokens=10, cached_tokens=4, completion_tokens=5, ttft_ms=12.5,
                                    tokens_per_s=30.0)
    assert done is not None and (done["status"], done["cached_tokens"], done["ttft_ms"]) == ("complete", 4, 12.5)

    _, u2, _ = await store.start_reply(s["id"], user_content="two")  # type: ignore[misc]
    assert u2 is not None and u2["position"] == 2
    # Edit the first user message: everything after it goes, a new reply follows it.
    _, none, r_new = await store.start_reply(s["id"], edit=(u1["id"], "one, edited"), keep_through=0)  # type: ignore[misc]
    assert none is None
    _, msgs = await store.get_history(s["id"])  # type: ignore[misc]
    assert [(m["position"], m["role"], m["content"]) for m in msgs] == [(0, "user", "one, edited"), (1, "assistant", "")]
    assert msgs[1]["id"] == r_new["id"]

    assert await store.start_reply("missing", user_content="x") is None
    assert await store.finish_reply("missing", content="", status="stopped", finish_reason="abort", prompt_tokens=None,
                                    cached_tokens=None, completion_tokens=None, ttft_ms=None, tokens_per_s=None) is None


async def test_mark_interrupted_only_touches_streaming_replies(store: Store) -> None:
    s = await store.create_session("t", None, DEFAULT_SETTINGS)
    _, _, r = await store.start_reply(s["id"], user_content="q")  # type: ignore[misc]
    await store.save_progress(r["id"], "half a rep", 4)
    assert await store.mark_interrupted(older_than_s=3600) == 0  # recent: a live worker may own it
    assert await store.mark_interrupted() == 1
    _, msgs = await store.get_history(s["id"])  # type: ignore[misc]
    assert [(m["status"], m["content"]) for m in msgs] == [("complete", "q"), ("interrupted", "half a rep")]
    assert await store.mark_interrupted() == 0


async def test_export_import_round_trip_gives_new_ids(store: Store) -> None:
    s = await store.create_session("trip", "sys", {"temperature": 0.0, "top_p": 1.0, "max_tokens": 7})
    _, _, r = await store.start_reply(s["id"], user_content="hi")  # type: ignore[misc]
    exported = await store.export_session(s["id"])
    assert exported is not None and exported["forge_export"] == 1
    imported = await store.import_session(exported)
    assert imported["id"] != s["id"]
    assert (imported["title"], imported["system_prompt"], imported["settings"]) == ("trip", "sys", s["settings"])
    _, msgs = await store.get_history(imported["id"])  # type: ignore[misc]
    assert [(m["role"], m["content"]) for m in msgs] == [("user", "hi"), ("assistant", "")]
    assert msgs[1]["status"] == "interrupted"  # was streaming: nothing generates it in the copy
    assert {m["id"] for m in msgs}.isdisjoint({m["id"] for m in exported["messages"]})

    bad = dict(exported, messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]\.role"):
        await store.import_session(bad)
    bad = dict(exported, messages=[{"role": "user", "content": "x", "prompt_tokens": -1}])
    with pytest.raises(ValueError, match=r"messages\[0\]\.prompt_tokens"):
        await store.import_session(bad)
    assert len(await store.list_sessions()) == 2  # the refused imports left nothing behind


def test_settings_from_env_and_overrides() -> None:
    env = {"FORGE_PORT": "9001", "FORGE_DATABASE_URL": "sqlite+aiosqlite:///x.db", "FORGE_API_KEY": "k",
           "FORGE_THREADS": "2", "FORGE_MODEL": "/m.gguf"}
    s = Settings.from_env(env, port=None, model="default")
    assert (s.port, s.database_url, s.api_key, s.threads, s.model) == (9001, "sqlite+aiosqlite:///x.db", "k", 2, "default")
    assert Settings.from_env({}).database_url == "sqlite+aiosqlite:///./data/forge.db"
    with pytest.raises(ValueError, match="FORGE_PORT"):
        Settings.from_env({"FORGE_PORT": "eighty"})
    with pytest.raises(ValueError, match="max_waiting"):
        Settings.from_env({}, max_waiting=0)
    with pytest.raises(ValueError, match="unknown setting"):
        Settings.from_env({}, colour="red")


def test_session_settings_checks_name_the_field() -> None:
    assert session_settings({"temperature": 0}) == dict(DEFAULT_SETTINGS, temperature=0.0)
    cases = [({"temperature": 2.5}, "settings.temperature"), ({"temperature": "hot"}, "settings.temperature"),
             ({"top_p": 0}, "settings.top_p"), ({"max_tokens": -3}, "settings.max_tokens"),
             ({"max_tokens": 1.5}, "settings.max_tokens"), ({"max_tokens": True}, "settings.max_tokens"),
             ({"seed": 1}, "settings.seed"), ([], "settings")]
    for value, param in cases:
        with pytest.raises(ServiceError) as exc:
            session_settings(value)
        assert exc.value.param == param, value
        assert param in exc.value.message
