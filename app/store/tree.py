"""A session's messages as a tree: the chosen branch, and choosing another.

Siblings are the messages sharing a parent (the first messages of a session share none), oldest first;
exactly one of each group is `active`. Following the active ones from the root gives the branch the
session shows and the next turn continues.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.store.models import Message
from app.store.records import MessageRecord


def _children(rows: Sequence[Message]) -> dict[str | None, list[Message]]:
    groups: dict[str | None, list[Message]] = {}
    for row in sorted(rows, key=lambda r: r.ordinal):
        groups.setdefault(row.parent_id, []).append(row)
    return groups


def chosen_branch(rows: Sequence[Message]) -> list[MessageRecord]:
    """The chosen messages from the root down, each with its `siblings` (the ids of every message sharing its
    parent, itself included, oldest first)."""
    groups = _children(rows)
    out: list[MessageRecord] = []
    parent: str | None = None
    while group := groups.get(parent):
        chosen = next((r for r in reversed(group) if r.active), group[-1])
        out.append(MessageRecord.of(chosen, [r.id for r in group]))
        parent = chosen.id
    return out


def choose(rows: Sequence[Message], message_id: str) -> bool:
    """Make `message_id` and its ancestors the chosen ones of their siblings (the loaded rows change; the
    session writes them back). False when no row has that id."""
    by_id = {r.id: r for r in rows}
    if message_id not in by_id:
        return False
    groups = _children(rows)
    row: Message | None = by_id[message_id]
    while row is not None:
        for sibling in groups[row.parent_id]:
            sibling.active = sibling is row
        row = by_id.get(row.parent_id) if row.parent_id is not None else None
    return True
