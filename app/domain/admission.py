"""Admission: who generates next when the engine is full.

Every generation (a chat turn, a /v1 request) holds `cost` units of the engine's capacity (its
sequences: a request with n samples costs n) from admission until it ends. Past capacity, requests wait
in one bounded queue that is served round-robin by owner (API key): an owner with a thousand waiting
requests gets one turn in the rotation like an owner with one. A waiting request leaves the queue when
it is granted, when its deadline passes (QueueTimeout) or when its waiter is cancelled (the client went
away). Only a full queue (QueueFull) refuses at once. An optional per-owner cap keeps an owner's further
requests waiting (never refused) while it holds that many.

No HTTP here: callers turn the two refusals into their own answers, with `retry_after_s`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

HOLD_EWMA = 0.2  # weight of the newest grant's holding time in the running mean behind retry_after_s


class Refused(Exception):
    """Not admitted; try again in `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(Refused):
    """The waiting queue holds `queue_size` requests already."""


class QueueTimeout(Refused):
    """The request waited its whole deadline without being admitted."""


@dataclass(slots=True, eq=False)
class Ticket:
    """One request's place: waiting until `granted`, then holding `cost` units until released."""

    owner: str
    cost: int
    enqueued: float
    future: asyncio.Future | None = None  # set while waiting
    granted: bool = False
    granted_at: float = 0.0
    released: bool = False

    @property
    def waited_s(self) -> float:
        return max(0.0, self.granted_at - self.enqueued) if self.granted else 0.0


@dataclass(slots=True)
class AdmissionStats:
    """Counters since start (for /metrics)."""

    granted: int = 0
    queued: int = 0  # granted or not, requests that had to wait
    refused_full: int = 0
    refused_timeout: int = 0
    withdrawn: int = 0  # waiters that went away
    wait_s_total: float = 0.0


@dataclass(slots=True)
class Admission:
    """The bounded, owner-fair queue in front of the engine.

    `capacity`: units that may be held at once (the engine's sequences per step); `queue_size`: requests
    that may wait; `timeout_s`: how long one may wait; `per_owner`: units one owner may hold (None: no cap).
    """

    capacity: int
    queue_size: int = 1024
    timeout_s: float = 60.0
    per_owner: int | None = None
    clock: Callable[[], float] = time.monotonic
    stats: AdmissionStats = field(default_factory=AdmissionStats)
    in_use: int = 0
    _held: dict[str, int] = field(default_factory=dict)  # owner -> units held
    _waiting: dict[str, deque[Ticket]] = field(default_factory=dict)  # owner -> its waiting tickets, oldest first
    _ring: deque[str] = field(default_factory=deque)  # owners with waiting tickets, next to serve first
    _depth: int = 0
    _hold_s: float = 1.0  # running mean of how long a grant is held

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {self.queue_size}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.per_owner is not None and self.per_owner < 1:
            raise ValueError(f"per_owner must be >= 1, got {self.per_owner}")

    @property
    def depth(self) -> int:
        """Requests waiting now."""
        return self._depth

    def held_by(self, owner: str) -> int:
        return self._held.get(owner, 0)

    # -- entering -------------------------------------------------------------------------

    def enter(self, owner: str, cost: int = 1) -> Ticket:
        """A ticket, granted at once when there is room and nobody it would overtake waits (only owners at
        their cap may); else waiting in the queue (see `wait`). Raises QueueFull when the queue holds
        `queue_size` requests."""
        cost = max(1, min(cost, self.capacity))  # a request bigger than the engine still runs, alone
        ticket = Ticket(owner=owner, cost=cost, enqueued=self.clock())
        if self._fits(ticket) and all(self._capped(self._waiting[o][0]) for o in self._ring):
            self._grant(ticket)  # nobody waits, or only owners at their cap: no one is overtaken
            return ticket
        if self._depth >= self.queue_size:
            self.stats.refused_full += 1
            raise QueueFull(
                f"{self._depth} requests are already waiting for the engine; retry later", self.retry_after_s()
            )
        ticket.future = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(owner)
        if queue is None:
            queue = self._waiting[owner] = deque()
            self._ring.append(owner)
        queue.append(ticket)
        self._depth += 1
        self.stats.queued += 1
        self._pump()  # a capped owner's ticket may wait while others' run
        return ticket

    async def wait(self, ticket: Ticket) -> None:
        """Until `ticket` is granted. Raises QueueTimeout once it has waited `timeout_s`; cancelled, it
        leaves the queue (or gives back what was just granted)."""
        if ticket.granted:
            return
        assert ticket.future is not None
        remaining = ticket.enqueued + self.timeout_s - self.clock()
        try:
            if remaining > 0:
                await asyncio.wait({ticket.future}, timeout=remaining)
        except asyncio.CancelledError:
            self.withdraw(ticket)
            raise
        if not ticket.granted:
            self._remove(ticket)
            self.stats.refused_timeout += 1
            raise QueueTimeout(
                f"waited {self.timeout_s:g} s for the engine without being admitted; retry later", self.retry_after_s()
            )

    async def admit(self, owner: str, cost: int = 1) -> Ticket:
        """`enter` then `wait`: a granted ticket (release it when the generation ends)."""
        ticket = self.enter(owner, cost)
        await self.wait(ticket)
        return ticket

    def withdraw(self, ticket: Ticket) -> None:
        """The waiter went away: out of the queue, or its grant given back."""
        if ticket.granted:
            self.release(ticket)
        elif self._remove(ticket):
            self.stats.withdrawn += 1

    def release(self, ticket: Ticket) -> None:
        """The generation ended: its units go to the next waiters. Safe to call more than once."""
        if not ticket.granted or ticket.released:
            return
        ticket.released = True
        self.in_use -= ticket.cost
        held = self._held[ticket.owner] - ticket.cost
        if held > 0:
            self._held[ticket.owner] = held
        else:
            del self._held[ticket.owner]
        self._hold_s += HOLD_EWMA * (max(0.0, self.clock() - ticket.granted_at) - self._hold_s)
        self._pump()

    def retry_after_s(self) -> int:
        """Whole seconds until a retry has a fair chance: the queue ahead served at the recent pace."""
        turns = (self._depth + 1) / self.capacity
        return max(1, min(int(math.ceil(self.timeout_s)), int(math.ceil(turns * self._hold_s))))

    # -- inside ---------------------------------------------------------------------------

    def _fits(self, ticket: Ticket) -> bool:
        return self.in_use + ticket.cost <= self.capacity and not self._capped(ticket)

    def _capped(self, ticket: Ticket) -> bool:
        # One request bigger than the cap still runs, when its owner holds nothing else.
        return self.per_owner is not None and self.held_by(ticket.owner) + ticket.cost > max(
            self.per_owner, ticket.cost
        )

    def _grant(self, ticket: Ticket) -> None:
        ticket.granted, ticket.granted_at = True, self.clock()
        self.in_use += ticket.cost
        self._held[ticket.owner] = self.held_by(ticket.owner) + ticket.cost
        self.stats.granted += 1
        self.stats.wait_s_total += ticket.waited_s
        if ticket.future is not None and not ticket.future.done():
            ticket.future.set_result(None)

    def _pump(self) -> None:
        """Grant waiting tickets round-robin by owner while they fit. The owner whose turn it is keeps it
        while its oldest ticket does not fit the free units (no overtaking by smaller requests); owners at
        their cap are passed over until they release."""
        passed = 0
        while self._ring and passed < len(self._ring):
            owner = self._ring[0]
            ticket = self._waiting[owner][0]
            if self._capped(ticket):
                self._ring.rotate(-1)
                passed += 1
                continue
            if self.in_use + ticket.cost > self.capacity:
                return
            self._pop(owner)
            self._grant(ticket)
            passed = 0

    def _pop(self, owner: str) -> None:
        queue = self._waiting[owner]
        queue.popleft()
        self._depth -= 1
        self._ring.popleft()
        if queue:
            self._ring.append(owner)  # the back of the rotation
        else:
            del self._waiting[owner]

    def _remove(self, ticket: Ticket) -> bool:
        queue = self._waiting.get(ticket.owner)
        if queue is None or ticket not in queue:
            return False
        queue.remove(ticket)
        self._depth -= 1
        if not queue:
            del self._waiting[ticket.owner]
            self._ring.remove(ticket.owner)
        self._pump()  # it may have been the head that blocked the others
        return True
