"""A client's command rate: a token bucket."""

from __future__ import annotations

import time


class TokenBucket:
    """`rate` commands a second, bursts of twice that."""

    def __init__(self, rate: float) -> None:
        self.rate, self.capacity = rate, 2 * rate
        self.tokens, self.at = self.capacity, time.monotonic()

    def take(self) -> bool:
        """Spend one token; False (nothing spent) when none is left."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
