"""Search (`GET /api/search`) with `httpx` against the real server: titles and message text of every branch,
only the caller's, user input taken as text. Sessions are made by importing exports (no model time). The same
behaviour from the store on SQLite (FTS5) and PostgreSQL (tsvector + GIN), and each indexed way against the
scan (LIKE)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from app.store import Store
from app.store.migrate import upgrade
from app.store.search import search_fts, search_like, search_tsv
from tests.integration.conftest import OTHER_KEY, ServerProcess

THEIRS = {"Authorization": f"Bearer {OTHER_KEY}"}


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=60, headers=server.auth) as client:
        yield client


def imported(
    http: httpx.Client, title: str, *contents: str, headers: dict[str, str] | None = None, branch: str | None = None
) -> dict[str, Any]:
    """A session holding `contents` as one conversation (user, assistant, ...); `branch`: a second reply to the
    first question, not the chosen one."""
    messages = [
        {"id": str(i), "parent_id": str(i - 1) if i else None, "role": "assistant" if i % 2 else "user", "content": c}
        for i, c in enumerate(contents)
    ]
    if branch is not None:
        messages.append({"id": "b", "parent_id": "0", "role": "assistant", "content": branch, "active": False})
    r = http.post(
        "/api/sessions/import",
        headers=headers,
        json={"forge_export": 2, "session": {"title": title}, "messages": messages},
    )
    assert r.status_code == 201, r.text
    return r.json()


def found(http: httpx.Client, q: str, headers: dict[str, str] | None = None, **params: Any) -> list[dict[str, Any]]:
    r = http.get("/api/search", params={"q": q, **params}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_search_finds_titles_and_messages_of_every_branch_for_their_owner(http: httpx.Client) -> None:
    word = "zq" + uuid.uuid4().hex[:8]  # unique to this test: the shared server holds other sessions
    a = imported(
        http,
        f"Notes on {word}",
        "What lives in the Atlantic?",
        f"Whales, mostly. Also {word} fish.",
        branch=f"An older answer about {word.upper()} crabs",
    )
    b = imported(http, "Unrelated", f"Tell me about {word}s and Café culture", "Sure.")
    theirs = imported(http, f"Their {word}", f"{word} too", headers=THEIRS)

    hits = found(http, word)
    # the title first, then the messages (the un-chosen branch's reply too)
    assert hits[0]["session"]["id"] == a["id"] and hits[0]["message"] is None
    assert sorted(
        (h["session"]["id"] == a["id"], h["message"]["position"], h["message"]["role"]) for h in hits[1:]
    ) == [(False, 0, "user"), (True, 1, "assistant"), (True, 1, "assistant")]
    assert len(hits) == 4 and theirs["id"] not in {h["session"]["id"] for h in hits}
    for h in hits:  # each highlight covers the word as written (prefix matches cover the whole token)
        marked = [h["snippet"][s:e] for s, e in h["highlights"]]
        assert marked and all(m.lower().startswith(word) for m in marked), h
    assert [h["session"]["id"] for h in found(http, word, THEIRS)] == [theirs["id"], theirs["id"]]

    # several words: all of them; the last one also as a prefix; accents and case folded
    assert [h["session"]["id"] for h in found(http, f"cafe {word[:5]}")] == [b["id"]]
    assert found(http, f"{word} nowhere-to-be-found") == []
    assert len(found(http, word, limit=2)) == 2


@pytest.mark.parametrize(
    "q",
    ['"', "'", "*", "a OR b", "NEAR(a b)", "title:x", "^x", "x AND", "(", "-x", "x\\", "%", "_", "NOT", '" OR "" = "'],
)
def test_search_input_is_text_not_query_syntax(http: httpx.Client, q: str) -> None:
    hits = found(http, q)
    for h in hits:  # whatever it finds holds the words
        assert h["highlights"], h


def test_search_refusals(http: httpx.Client) -> None:
    for params, param in [
        ({}, "q"),
        ({"q": "  "}, "q"),
        ({"q": "x" * 201}, "q"),
        ({"q": "x", "limit": "0"}, "limit"),
        ({"q": "x", "limit": "51"}, "limit"),
        ({"q": "x", "limit": "ten"}, "limit"),
    ]:
        r = http.get("/api/search", params=params)
        assert r.status_code == 400, params
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_parameter", param)
    assert httpx.get(f"{http.base_url}/api/search", params={"q": "x"}).status_code == 401  # no key


async def test_both_ways_of_searching_find_the_same(database_url: str) -> None:
    """The indexed way (SQLite FTS5, PostgreSQL tsvector) and the way other databases take (LIKE) agree on whole
    words."""
    url = database_url
    indexed = search_fts if url.startswith("sqlite") else search_tsv
    upgrade(url)
    store = Store(url)
    try:
        s = await store.create_session("me", "Weekend plans", None, {})
        _, (u, _) = await store.start_reply(s.id, "me", parent_id=None, user_content="Hiking near the lake")
        await store.create_session("other", "Weekend plans", None, {})
        async with store.sessionmaker() as db:
            for query, expected in [
                ("weekend", [(s.id, None)]),
                ("LAKE hiking", [(s.id, u.id)]),
                ("lake OR sea", []),
                ('"', []),
            ]:
                for way in (indexed, search_like):
                    hits = await way(db, "me", query, 10)
                    assert [(h["session"]["id"], h["message"] and h["message"]["id"]) for h in hits] == expected, way
                    assert all(h["highlights"] for h in hits)
    finally:
        await store.close()


def tree(*contents: str, branch: str | None = None) -> list[dict[str, Any]]:
    """Store.import_session's messages: `contents` as one conversation; `branch` a second, unchosen reply to the
    first message."""
    out = [
        {
            "role": "assistant" if i % 2 else "user",
            "content": c,
            "status": "complete",
            "parent": i - 1 if i else None,
            "active": True,
        }
        for i, c in enumerate(contents)
    ]
    if branch is not None:
        out.append({"role": "assistant", "content": branch, "status": "complete", "parent": 0, "active": False})
    return out


async def test_search_behaves_alike_on_each_database(database_url: str) -> None:
    """What the HTTP tests above check on the server's SQLite, from the store on each database: titles first,
    messages of every branch best first, the owner's only, accents and case folded, the last word a prefix,
    highlights over the words as written, input taken as text."""
    upgrade(database_url)
    store = Store(database_url)
    word = "zqword"
    try:
        a = await store.import_session(
            "me",
            {"title": f"Notes on {word}", "system_prompt": None, "settings": {}},
            tree(
                "What lives in the Atlantic?",
                f"Whales, mostly. Also {word} fish.",
                branch=f"An older answer about {word.upper()} crabs",
            ),
        )
        b = await store.import_session(
            "me",
            {"title": "Unrelated", "system_prompt": None, "settings": {}},
            tree(f"{word} {word}!", "Café culture, " + "and much more, " * 20 + word),
        )
        c = await store.import_session(
            "them", {"title": f"Their {word}", "system_prompt": None, "settings": {}}, tree(f"{word} too")
        )
        hits = await store.search("me", word, 10)
        assert hits[0]["session"]["id"] == a.id and hits[0]["message"] is None
        assert len(hits) == 5 and {h["session"]["id"] for h in hits} == {a.id, b.id}
        assert hits[1]["session"]["id"] == b.id and hits[1]["message"]["position"] == 0  # twice in few words
        for h in hits:
            marked = [h["snippet"][s:e] for s, e in h["highlights"]]
            assert marked and all(m.lower().startswith(word) for m in marked), h
        assert [(h["session"]["id"], h["message"]["position"]) for h in await store.search("me", "CAFE cultu", 10)] == [
            (b.id, 1)
        ]
        assert [h["session"]["id"] for h in await store.search("them", word, 10)] == [c.id, c.id]
        assert await store.search("me", f"{word} nowhere", 10) == []
        assert len(await store.search("me", word, 2)) == 2
        for q in [
            '"',
            "'",
            "*",
            "a OR b",
            "NEAR(a b)",
            "title:x",
            "x AND",
            "(",
            "-x",
            "x\\",
            "%",
            "_",
            "a:*",
            "a&!b|c",
            "<->",
            "'' OR ''",
        ]:
            assert all(h["highlights"] for h in await store.search("me", q, 10)), q
    finally:
        await store.close()
