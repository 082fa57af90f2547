"""The admission glue shared by chat turns and /v1 requests: admission's refusals (app/domain/admission.py) as
ServiceErrors with `retry_after_s`, and each admitted generation's wait in the metrics."""

from __future__ import annotations

from collections.abc import Callable

from app.domain.admission import Admission, QueueFull, QueueTimeout, Ticket
from app.domain.errors import ServiceError
from app.metrics import Metrics


class Admitter:
    """Places for generations in the engine: `enter`, then `wait` when not granted at once; `release` at the end."""

    def __init__(self, admission: Admission, metrics: Metrics) -> None:
        self.admission = admission
        self.metrics = metrics
        metrics.bind_admission(admission)

    def enter(self, owner: str, cost: int = 1) -> Ticket:
        """A place for one generation of `cost` sequences: granted at once, or waiting (then `wait`).
        ServiceError("queue_full") when the queue is full."""
        try:
            ticket = self.admission.enter(owner, cost)
        except QueueFull as e:
            raise ServiceError("queue_full", f"the server is busy: {e}", retry_after_s=e.retry_after_s) from None
        if ticket.granted:
            self.metrics.admitted(0.0)
        return ticket

    async def wait(self, ticket: Ticket) -> None:
        """Until `ticket` is admitted; ServiceError("queue_timeout") past the deadline. Cancelled, it leaves
        the queue."""
        if ticket.granted:
            return
        try:
            await self.admission.wait(ticket)
        except QueueTimeout as e:
            raise ServiceError("queue_timeout", f"the server is busy: {e}", retry_after_s=e.retry_after_s) from None
        self.metrics.admitted(ticket.waited_s)

    async def admit(self, owner: str, cost: int = 1, queued: Callable[[], None] | None = None) -> Ticket:
        """`enter`, then `wait` (telling `queued` first) when it could not be admitted at once."""
        ticket = self.enter(owner, cost)
        if not ticket.granted:
            if queued is not None:
                queued()
            await self.wait(ticket)
        return ticket

    def release(self, ticket: Ticket | None) -> None:
        """The generation ended, or never started: give its place back (or leave the queue)."""
        if ticket is not None:
            self.admission.withdraw(ticket)
