"""Messages between replicas over a real PostgreSQL's LISTEN/NOTIFY (app/store/notify_pg.py): a message far over
NOTIFY's payload limit, with multi-byte characters across chunk borders, arrives whole and in order at the other
process's listener, and not at the sender's own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.store.db import make_engine
from app.store.notify_pg import PgNotify
from tests.postgres import Postgres

MIXED = "aé€😀" * 4000  # 40 000 bytes: several chunks, each border next to a multi-byte character


async def test_a_large_message_arrives_whole_in_order_and_not_back_at_its_sender(postgres: Postgres) -> None:
    engine = make_engine(postgres.database())
    got: dict[str, list[tuple[str, str]]] = {"a": [], "b": []}
    arrived = asyncio.Event()

    def on(name: str) -> Callable[[str, str], None]:
        def received(sender: str, text: str) -> None:
            got[name].append((sender, text))
            if name == "b" and len(got["b"]) == 3:
                arrived.set()

        return received

    a = PgNotify(engine, on("a"), lambda: None)
    b = PgNotify(engine, on("b"), lambda: None)
    try:
        await a.start()
        await b.start()
        messages = ["first", MIXED, "third"]
        for m in messages:
            a.send(m)
        await asyncio.wait_for(arrived.wait(), 10.0)
        assert got["b"] == [(a.sender, m) for m in messages]
        assert got["a"] == []
    finally:
        await a.close()
        await b.close()
        await engine.dispose()
