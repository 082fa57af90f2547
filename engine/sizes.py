"""Sizes as people write them: '1GiB', '512MiB', '2G' (the engine's KV and spill budgets)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "t": 1e12,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}


def parse_size(text: str | int) -> int:
    """'1GiB', '512MiB', '2G', 1073741824 -> bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 512MiB, 1GiB)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
