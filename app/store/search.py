"""Search over session titles and message text, for one owner.

The query is plain text: its words (letters and digits) are what is looked for, every one of them, the
last also as a prefix (for search-as-you-type); quotes, operators and column filters are just characters.
SQLite answers from the FTS5 indexes of migration 0003 (case and accents folded, ranked by bm25); PostgreSQL
from the GIN indexes over `to_tsvector('forge_search', ...)` of migration 0004 (case and accents folded, ranked
by ts_rank); other databases scan with LIKE (case folded), which needs no index and finds the same words inside
longer ones.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import and_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import ChatSession, Message
from app.store.records import SessionRecord

MAX_WORDS = 16
SNIPPET_WORDS = 12  # FTS5 snippet length in tokens
SNIPPET_CHARS = 80  # LIKE snippet: characters either side of the first match
PG_CONFIG = "forge_search"  # migration 0004's text search configuration: `simple` with accents folded
_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use marks around a match in an FTS5 snippet
_WORD = re.compile(r"\w+")


def words(query: str) -> list[str]:
    """The words of a query, at most MAX_WORDS."""
    return [w for w in _WORD.findall(query) if w.replace("_", "")][:MAX_WORDS]


def fts_query(terms: list[str]) -> str:
    """An FTS5 MATCH expression with every word a quoted string (no syntax survives), the last a prefix."""
    return " ".join(f'"{w}"' for w in terms) + "*"


async def search(db: AsyncSession, owner: str, query: str, limit: int) -> list[dict[str, Any]]:
    """Hits, sessions whose title matches first (most recent first), then messages (best first):
    `{"session": {...}, "message": {"id", "role", "position"} | None, "snippet", "highlights"}` where
    `highlights` are [start, end) character ranges of the matches inside `snippet`."""
    way = {"sqlite": search_fts, "postgresql": search_tsv}.get(db.get_bind().dialect.name, search_like)
    return await way(db, owner, query, limit)


async def search_fts(db: AsyncSession, owner: str, query: str, limit: int) -> list[dict[str, Any]]:
    """`search` over SQLite's FTS5 indexes."""
    terms = words(query)
    if not terms:
        return []
    q = fts_query(terms)
    titles = await db.execute(
        text(
            "SELECT s.id, highlight(sessions_fts, 0, :open, :close) FROM sessions_fts JOIN sessions AS s "
            "ON s.rowid = sessions_fts.rowid WHERE sessions_fts MATCH :q AND s.owner = :owner "
            "ORDER BY s.updated_at DESC LIMIT :limit"
        ),
        {"q": q, "owner": owner, "limit": limit, "open": _OPEN, "close": _CLOSE},
    )
    hits = [(sid, None, marked) for sid, marked in titles.all()]
    found = await db.execute(
        text(
            "SELECT m.session_id, m.id, snippet(messages_fts, 0, :open, :close, '…', :words) FROM messages_fts "
            "JOIN messages AS m ON m.rowid = messages_fts.rowid JOIN sessions AS s ON s.id = m.session_id "
            "WHERE messages_fts MATCH :q AND s.owner = :owner ORDER BY bm25(messages_fts) LIMIT :limit"
        ),
        {"q": q, "owner": owner, "limit": limit - len(hits), "open": _OPEN, "close": _CLOSE, "words": SNIPPET_WORDS},
    )
    hits += found.all()
    return await _shape(db, [(sid, mid, *_unmark(marked)) for sid, mid, marked in hits])


def tsquery(terms: list[str]) -> str:
    """A to_tsquery expression with every word a quoted lexeme (words hold no quotes: no syntax survives), all
    of them required, the last a prefix."""
    return " & ".join(f"'{w}'" for w in terms) + ":*"


# The expressions of migration 0004's indexes, written out so the planner matches them (a bound configuration
# would not be the index's constant).
_TITLE_TSV = f"to_tsvector('{PG_CONFIG}', s.title)"
_CONTENT_TSV = f"to_tsvector('{PG_CONFIG}', m.content)"
_HEADLINE = "StartSel={open}, StopSel={close}, MaxFragments=1, MaxWords={words}, MinWords={few}, ShortWord=0"


async def search_tsv(db: AsyncSession, owner: str, query: str, limit: int) -> list[dict[str, Any]]:
    """`search` over PostgreSQL's GIN indexes (titles by recency, messages by ts_rank)."""
    terms = words(query)
    if not terms:
        return []
    options = _HEADLINE.format(open=_OPEN, close=_CLOSE, words=SNIPPET_WORDS, few=SNIPPET_WORDS // 2)
    params = {
        "q": tsquery(terms),
        "owner": owner,
        "limit": limit,
        "all": f"StartSel={_OPEN}, StopSel={_CLOSE}, HighlightAll=true",
        "options": options,
    }
    titles = await db.execute(
        text(
            f"SELECT s.id, ts_headline('{PG_CONFIG}', s.title, q, :all) FROM sessions AS s, "
            f"to_tsquery('{PG_CONFIG}', :q) AS q WHERE {_TITLE_TSV} @@ q AND s.owner = :owner "
            "ORDER BY s.updated_at DESC LIMIT :limit"
        ),
        params,
    )
    hits = [(sid, None, marked) for sid, marked in titles.all()]
    # ts_headline is expensive: PostgreSQL computes it after the LIMIT, for the rows returned.
    found = await db.execute(
        text(
            f"SELECT m.session_id, m.id, ts_headline('{PG_CONFIG}', m.content, q, :options) FROM messages AS m "
            f"JOIN sessions AS s ON s.id = m.session_id, to_tsquery('{PG_CONFIG}', :q) AS q "
            f"WHERE {_CONTENT_TSV} @@ q AND s.owner = :owner ORDER BY ts_rank({_CONTENT_TSV}, q) DESC, m.id "
            "LIMIT :limit"
        ),
        dict(params, limit=limit - len(hits)),
    )
    hits += found.all()
    return await _shape(db, [(sid, mid, *_unmark(marked)) for sid, mid, marked in hits])


async def search_like(db: AsyncSession, owner: str, query: str, limit: int) -> list[dict[str, Any]]:
    """`search` by scanning, on any database."""
    terms = words(query)
    if not terms:
        return []

    def every(column: Any) -> Any:
        return and_(*(column.icontains(w, autoescape=True) for w in terms))

    titles = await db.execute(
        select(ChatSession.id, ChatSession.title)
        .where(ChatSession.owner == owner, every(ChatSession.title))
        .order_by(ChatSession.updated_at.desc())
        .limit(limit)
    )
    hits: list[tuple[str, str | None, str]] = [(sid, None, title) for sid, title in titles.all()]
    found = await db.execute(
        select(Message.session_id, Message.id, Message.content)
        .join(ChatSession, ChatSession.id == Message.session_id)
        .where(ChatSession.owner == owner, every(Message.content))
        .order_by(ChatSession.updated_at.desc(), Message.ordinal)
        .limit(limit - len(hits))
    )
    hits += found.all()
    return await _shape(db, [(sid, mid, *_excerpt(body, terms)) for sid, mid, body in hits])


def _unmark(marked: str) -> tuple[str, list[list[int]]]:
    """An FTS5 snippet/highlight with marks -> (plain text, match ranges)."""
    plain: list[str] = []
    ranges: list[list[int]] = []
    size = 0
    for i, part in enumerate(re.split(f"[{_OPEN}{_CLOSE}]", marked)):
        if i % 2 and part:
            ranges.append([size, size + len(part)])
        plain.append(part)
        size += len(part)
    return "".join(plain), ranges


def _excerpt(body: str, terms: list[str]) -> tuple[str, list[list[int]]]:
    """Up to SNIPPET_CHARS either side of the first match, with every match inside it."""
    patterns = [re.compile(re.escape(w), re.IGNORECASE) for w in terms]
    first = min((m.start() for p in patterns if (m := p.search(body))), default=0)
    start, end = max(0, first - SNIPPET_CHARS), min(len(body), first + SNIPPET_CHARS)
    lead, tail = ("…" if start else ""), ("…" if end < len(body) else "")
    shift = len(lead) - start
    ranges = sorted([m.start() + shift, m.end() + shift] for p in patterns for m in p.finditer(body, start, end))
    return lead + body[start:end] + tail, ranges


async def _shape(db: AsyncSession, hits: list[tuple[str, str | None, str, list[list[int]]]]) -> list[dict[str, Any]]:
    session_ids = {sid for sid, *_ in hits}
    message_ids = {mid for _, mid, *_ in hits if mid is not None}
    sessions = (
        {
            s.id: SessionRecord.of(s).to_dict()
            for s in (await db.scalars(select(ChatSession).where(ChatSession.id.in_(session_ids)))).all()
        }
        if session_ids
        else {}
    )
    messages = (
        {
            m.id: {"id": m.id, "role": m.role, "position": m.position}
            for m in (
                await db.execute(select(Message.id, Message.role, Message.position).where(Message.id.in_(message_ids)))
            ).all()
        }
        if message_ids
        else {}
    )
    return [
        {"session": sessions[sid], "message": messages[mid] if mid else None, "snippet": snippet, "highlights": ranges}
        for sid, mid, snippet, ranges in hits
    ]
