"""The admission glue shared by chat turns and /v1 requests: admission's refusals (app/domain/admission.py) as
ServiceErrors with `retry_after_s`, and each admitted generation's wait in the metrics.

With `--max-concurrent-per-key` and replicas sharing the database (`slots`), a generation also holds its units in
the key's slots there (app.store.key_slots), so the cap holds across replicas: once the fair queue grants it, it
takes them, re-trying every SLOT_RETRY_S while the key's other generations (on any replica) fill the cap, until
the queue's deadline. Without the cap nothing here touches the database."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.domain.admission import Admission, QueueFull, QueueTimeout, Ticket
from app.domain.errors import ServiceError
from app.metrics import Metrics
from app.store.key_slots import KeySlots, Slot

log = logging.getLogger("forge.chat")

SLOT_RETRY_S = 0.1  # between takes of a key's slot while the key is at its cap on other replicas
RELEASE_TRIES = 3


@dataclass(slots=True, eq=False)
class Place:
    """One generation's place with the cap held across replicas: its `ticket` in this process's queue and, once
    `granted`, its `slot` in the database."""

    ticket: Ticket
    slot: Slot | None = None

    @property
    def granted(self) -> bool:
        return self.ticket.granted and self.slot is not None

    @property
    def owner(self) -> str:
        return self.ticket.owner

    @property
    def cost(self) -> int:
        return self.ticket.cost


Held = Ticket | Place


class Admitter:
    """Places for generations in the engine: `enter`, then `wait` when not granted at once; `release` at the end."""

    def __init__(
        self, admission: Admission, metrics: Metrics, slots: KeySlots | None = None, replica: str | None = None
    ) -> None:
        self.admission = admission
        self.metrics = metrics
        # The database's slots only with a cap and a replica name (else one process: the queue's cap is enough).
        self.slots = slots if admission.per_owner is not None and replica is not None else None
        self.replica = replica or ""
        self._releasing: set[asyncio.Task] = set()

    def enter(self, owner: str, cost: int = 1) -> Held:
        """A place for one generation of `cost` sequences: granted at once, or waiting (then `wait`).
        ServiceError("queue_full") when the queue is full. With the cap across replicas it is never granted
        at once: `wait` takes the key's slot."""
        try:
            ticket = self.admission.enter(owner, cost)
        except QueueFull as e:
            raise ServiceError("queue_full", f"the server is busy: {e}", retry_after_s=e.retry_after_s) from None
        if self.slots is not None:
            return Place(ticket)
        if ticket.granted:
            self.metrics.admitted(0.0)
        return ticket

    async def wait(self, held: Held) -> None:
        """Until `held` is admitted; ServiceError("queue_timeout") past the deadline. Cancelled, it leaves
        the queue."""
        if held.granted:
            return
        ticket = held.ticket if isinstance(held, Place) else held
        try:
            await self.admission.wait(ticket)
        except QueueTimeout as e:
            raise ServiceError("queue_timeout", f"the server is busy: {e}", retry_after_s=e.retry_after_s) from None
        if isinstance(held, Place):
            try:
                await self._take(held)
            except BaseException:
                self.admission.withdraw(ticket)
                raise
        self.metrics.admitted(max(0.0, self.admission.clock() - ticket.enqueued))

    async def admit(self, owner: str, cost: int = 1, queued: Callable[[], None] | None = None) -> Held:
        """`enter`, then `wait` (telling `queued` first) when it could not be admitted at once."""
        held = self.enter(owner, cost)
        if isinstance(held, Place) and held.ticket.granted:
            try:
                if await self._try(held):  # a free slot: admitted at once, no `queued`
                    self.metrics.admitted(0.0)
            except BaseException:
                self.admission.withdraw(held.ticket)
                raise
        if not held.granted:
            if queued is not None:
                queued()
            await self.wait(held)
        return held

    def release(self, held: Held | None) -> None:
        """The generation ended, or never started: give its place back (or leave the queue)."""
        if held is None:
            return
        if isinstance(held, Place):
            self.admission.withdraw(held.ticket)
            slot, held.slot = held.slot, None
            if slot is not None and self.slots is not None:
                task = asyncio.get_running_loop().create_task(self._free(slot))
                self._releasing.add(task)
                task.add_done_callback(self._releasing.discard)
            return
        self.admission.withdraw(held)

    # -- the key's slots across replicas ------------------------------------------------------

    async def _try(self, place: Place) -> bool:
        assert self.slots is not None and self.admission.per_owner is not None
        place.slot = await self.slots.take(place.owner, self.replica, place.cost, self.admission.per_owner)
        return place.slot is not None

    async def _take(self, place: Place) -> None:
        """The key's slot for a place the queue granted, re-tried until the queue's deadline."""
        deadline = place.ticket.enqueued + self.admission.timeout_s
        while not await self._try(place):
            if self.admission.clock() + SLOT_RETRY_S > deadline:
                self.admission.stats.refused_timeout += 1
                raise ServiceError(
                    "queue_timeout",
                    f"the server is busy: waited {self.admission.timeout_s:g} s for one of this key's "
                    f"{self.admission.per_owner} places (held on other replicas); retry later",
                    retry_after_s=self.admission.retry_after_s(),
                )
            await asyncio.sleep(SLOT_RETRY_S)

    async def _free(self, slot: Slot) -> None:
        """Release a slot, retried a few times: the heartbeat renews every slot of this replica, so one left
        behind holds a place of its key until the replica stops."""
        assert self.slots is not None
        for attempt in range(RELEASE_TRIES):
            try:
                await self.slots.release(slot)
                return
            except Exception:
                log.exception("could not release a slot of key %s (attempt %d)", slot.owner, attempt + 1)
                await asyncio.sleep(0.2 * (attempt + 1))
