"""Messages of any size over PostgreSQL's NOTIFY, whose payload must stay under 8000 bytes and be valid text.

A message is cut into chunks of at most `limit` UTF-8 bytes, never inside a character, each behind a header
`<sender> <number> <index> <count> ` (the sender's messages are numbered from 1). PostgreSQL delivers one
connection's notifications in the order it committed them, so a listener puts a sender's chunks together in
order; anything else (a chunk missing, repeated or out of turn, as after a reconnect) drops that message and
never delivers a message twice. Numbered chunks are never identical, so PostgreSQL's folding of identical
payloads within a transaction never drops one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAYLOAD_LIMIT = 7999  # PostgreSQL refuses a payload of 8000 bytes or more (the default build)


def cut(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` UTF-8 bytes each, cut only between characters."""
    assert limit >= 4, limit  # room for the longest character
    data = text.encode()
    pieces: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte: the cut is inside a character
            end -= 1
        pieces.append(data[start:end].decode())
        start = end
    return pieces or [""]


def frame(sender: str, number: int, text: str, limit: int = PAYLOAD_LIMIT) -> list[str]:
    """The payloads carrying message `number` of `sender`, each at most `limit` bytes."""
    assert sender and " " not in sender and sender.isascii(), sender
    base = f"{sender} {number} "
    # The header's room: the longest index and count the message could need (bytes / 1 byte per chunk).
    room = limit - len(base) - 2 * (len(str(len(text.encode()))) + 1)
    pieces = cut(text, room)
    return [f"{base}{i} {len(pieces)} {p}" for i, p in enumerate(pieces)]


@dataclass(slots=True)
class _Partial:
    number: int
    count: int
    parts: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Reassembler:
    """Puts chunks back together per sender. `add` returns (sender, message) once a message is whole."""

    last: dict[str, int] = field(default_factory=dict)  # sender -> its last message delivered
    partial: dict[str, _Partial] = field(default_factory=dict)
    dropped: int = 0  # messages given up (a chunk missing or out of order)

    def add(self, payload: str) -> tuple[str, str] | None:
        try:
            sender, number_s, index_s, count_s, body = payload.split(" ", 4)
            number, index, count = int(number_s), int(index_s), int(count_s)
        except ValueError:
            self.dropped += 1
            return None
        if number <= self.last.get(sender, 0):  # delivered (or given up) already
            return None
        held = self.partial.get(sender)
        if held is not None and (held.number != number or len(held.parts) != index or held.count != count):
            del self.partial[sender]  # the message being put together lost a chunk
            self.dropped += 1
            held = None
        if held is None:
            if index != 0:  # the start of this message was missed
                self.last[sender] = number
                self.dropped += 1
                return None
            held = self.partial[sender] = _Partial(number, count)
        held.parts.append(body)
        if len(held.parts) < count:
            return None
        del self.partial[sender]
        self.last[sender] = number
        return sender, "".join(held.parts)

    def forget(self) -> None:
        """A reconnect: chunks of messages under way are lost for good."""
        self.dropped += len(self.partial)
        self.partial.clear()
