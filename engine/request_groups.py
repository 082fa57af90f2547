"""`RequestGroups`: each running request's sequences (its `n` samples), the siblings that wait for the
leader's prompt blocks, and the deadlines.

A request with n > 1 schedules its sample 0 alone; its siblings are held here until that leader has
computed the prompt (then they go to the front of the waiting queue and find its blocks in the prefix
cache), or until the leader ends first (they go on without it). An embedding request's inputs are fed to
the scheduler `EMBED_WINDOW` at a time, so that a large one neither fills the waiting queue nor starves
others. A request ends when its last sequence does.
"""

from __future__ import annotations

from collections import deque

from engine.sequence import Sequence

EMBED_WINDOW = 32  # an embedding request's inputs in the scheduler at once


class RequestGroups:
    """Request id -> its live sequences; the step thread's only."""

    __slots__ = ("_groups", "_pending", "_backlog", "_num_deadlines")

    def __init__(self) -> None:
        self._groups: dict[str, list[Sequence]] = {}  # request id -> its live sequences
        self._pending: dict[str, list[Sequence]] = {}  # n > 1: siblings waiting for the prompt's blocks
        self._backlog: dict[str, deque[Sequence]] = {}  # embedding inputs not yet given to the scheduler
        self._num_deadlines = 0  # live requests with a deadline: `expired` has nothing to scan without one

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._groups

    def get(self, request_id: str) -> list[Sequence] | None:
        """A request's live sequences (None once it ended)."""
        return self._groups.get(request_id)

    def ids(self) -> list[str]:
        return list(self._groups)

    def add(self, seqs: list[Sequence], share_prompt: bool = True) -> list[Sequence]:
        """Hold a new request's sequences; returns those to schedule now. Samples of one prompt
        (`share_prompt`) wait for sample 0; an embedding request's inputs all go at once."""
        rid = seqs[0].request_id
        self._groups[rid] = list(seqs)
        self._num_deadlines += seqs[0].deadline is not None
        if share_prompt and len(seqs) > 1:
            self._pending[rid] = list(seqs[1:])
            return seqs[:1]
        if len(seqs) > EMBED_WINDOW:
            self._backlog[rid] = deque(seqs[EMBED_WINDOW:])
            return list(seqs[:EMBED_WINDOW])
        return list(seqs)

    def remove(self, seq: Sequence) -> list[Sequence]:
        """Take an ended sequence out; returns the siblings that must now be scheduled (sample 0 ended
        before releasing them: it failed alone, or stopped at its first token), front first."""
        rid = seq.request_id
        group = self._groups.get(rid, [])
        if seq in group:
            group.remove(seq)
        if not group and self._groups.pop(rid, None) is not None:
            self._pending.pop(rid, None)
            self._backlog.pop(rid, None)
            self._num_deadlines -= seq.deadline is not None
        elif self._pending.get(rid) and seq.index == 0:
            return self._pending.pop(rid)
        return []

    def end(self, request_id: str) -> list[Sequence]:
        """Every live sequence of a request, to be finished (its held siblings are dropped with them)."""
        self._pending.pop(request_id, None)
        self._backlog.pop(request_id, None)
        return list(self._groups.get(request_id, []))

    def ready_siblings(self) -> list[list[Sequence]]:
        """The held siblings whose leader computed the prompt (or ended), each request's in order."""
        ready = []
        for rid in list(self._pending):
            group = self._groups.get(rid)
            leader = group[0] if group else None
            if leader is None or leader.index != 0 or leader.num_computed >= leader.prompt_len:
                ready.append(self._pending.pop(rid))
        return ready

    def refill(self) -> list[Sequence]:
        """Embedding inputs to give the scheduler now: each request's next ones, up to its window."""
        out: list[Sequence] = []
        for rid, backlog in list(self._backlog.items()):
            in_flight = len(self._groups[rid]) - len(backlog)
            while backlog and in_flight < EMBED_WINDOW:
                out.append(backlog.popleft())
                in_flight += 1
            if not backlog:
                del self._backlog[rid]
        return out

    def expired(self, now: float) -> list[str]:
        """Requests whose deadline has passed."""
        if not self._num_deadlines:
            return []
        return [
            rid for rid, group in self._groups.items() if group[0].deadline is not None and now >= group[0].deadline
        ]

    @property
    def has_pending(self) -> bool:
        return bool(self._pending or self._backlog)

    @property
    def num_pending(self) -> int:
        """Sequences held back (siblings, embedding inputs): they count as waiting."""
        return sum(map(len, list(self._pending.values()))) + sum(map(len, list(self._backlog.values())))
