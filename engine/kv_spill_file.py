"""One spilled KV block as a file: a header naming the KV layout, the block's chain digest and its tokens, then the
block's K/V bytes, all covered by a CRC-32. Reading checks everything it can: a file of another model or layout, of
another block, truncated or altered, is refused (None), never half-trusted."""

from __future__ import annotations

import hashlib
import struct
import zlib
from array import array

MAGIC = b"FORGEKV1"
_HEAD = struct.Struct("<8s32s16sIQI")  # magic, layout digest, block digest, token count, payload bytes, crc32
SUFFIX = ".kvb"


def block_digest(parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
    """The stable content key of a full block: its tokens chained to its parent's digest (the whole prefix).
    Unlike the prefix cache's in-memory key it is the same in every process, so files outlive a restart."""
    return hashlib.blake2b((parent or b"") + array("i", tokens).tobytes(), digest_size=16).digest()


def layout_digest(layout: str) -> bytes:
    return hashlib.sha256(layout.encode()).digest()


def encode(layout: bytes, digest: bytes, tokens: tuple[int, ...], payload: memoryview) -> list[bytes | memoryview]:
    """The file's parts, in order (written one after another: the payload is not copied)."""
    toks = array("i", tokens).tobytes()
    crc = zlib.crc32(payload, zlib.crc32(toks, zlib.crc32(MAGIC + layout + digest)))
    return [_HEAD.pack(MAGIC, layout, digest, len(tokens), payload.nbytes, crc), toks, payload]


def decode(
    data: bytes | bytearray, layout: bytes, digest: bytes, tokens: tuple[int, ...], payload_bytes: int
) -> memoryview | None:
    """The payload of a file holding exactly this block of this layout, or None."""
    if len(data) != _HEAD.size + 4 * len(tokens) + payload_bytes:
        return None  # truncated, or another shape
    magic, lay, dig, n, size, crc = _HEAD.unpack_from(data)
    if magic != MAGIC or lay != layout or dig != digest or n != len(tokens) or size != payload_bytes:
        return None
    view = memoryview(data)
    toks, payload = view[_HEAD.size : _HEAD.size + 4 * n], view[_HEAD.size + 4 * n :]
    if toks.tobytes() != array("i", tokens).tobytes():
        return None
    if zlib.crc32(payload, zlib.crc32(toks, zlib.crc32(MAGIC + lay + dig))) != crc:
        return None
    return payload


def file_size(num_tokens: int, payload_bytes: int) -> int:
    return _HEAD.size + 4 * num_tokens + payload_bytes
