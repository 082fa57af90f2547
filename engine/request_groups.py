"""`RequestGroups`: each running request's sequences (its `n` samples), the siblings that wait for the
leader's prompt blocks, and the deadlines.

A request with n > 1 schedules its sample 0 alone; its siblings are held here until that leader has
computed the prompt (then they go to the front of the waiting queue and find its blocks in the prefix
cache), or until the leader ends first (they go on without it). An embedding request's inputs are fed to
the scheduler `EMBED_WINDOW` at a time, so that a large one neither fills the waiting queue nor starves
others. A request ends when its last sequence does. The sequences of a new request (`sample_sequences`) or
embedding request (`embedding_sequences`) are built here, and a step's hidden rows pooled into embeddings
(`pooled_inputs`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.call_repeats import CallRepeats
from engine.pooling import Pooled
from engine.sampling import make_rng
from engine.sequence import Sequence
from engine.speculative import Drafter
from engine.tokenizer import IncrementalDetokenizer
from engine.types import GenerationRequest

if TYPE_CHECKING:
    import numpy as np

    from engine.model_runner import SeqInput
    from engine.spec_policy import SpecPolicy
    from engine.structured import Grammars
    from engine.tokenizer import Tokenizer

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


def sample_sequences(
    req: GenerationRequest,
    arrival: float,
    seq_ids: Iterator[int],
    tokenizer: Tokenizer,
    grammars: Grammars,
    spec_policy: SpecPolicy,
    spec_mode: str,
) -> list[Sequence]:
    """A request's `n` samples, each with its own rng, detokenizer, constraint, call check and drafter (when the
    request's speculation, or `spec_mode` by default, is "ngram")."""
    params = req.params
    drafting = (params.speculative or spec_mode) == "ngram"
    return [
        Sequence(
            seq_id=next(seq_ids),
            request=req,
            index=i,
            token_ids=list(req.prompt_token_ids),
            prompt_len=len(req.prompt_token_ids),
            rng=make_rng(params.seed, i) if params.temperature > 0 else None,
            detok=IncrementalDetokenizer(tokenizer, stop=params.stop),
            matcher=grammars.matcher(params.response_format) if params.response_format else None,
            calls=CallRepeats(params.tool_format) if params.tool_format and params.tool_format.parallel else None,
            drafter=Drafter(len(req.prompt_token_ids), spec_policy.acceptance, params.temperature == 0.0)
            if drafting
            else None,
            arrival=arrival,
            deadline=arrival + req.timeout_s if req.timeout_s else None,
        )
        for i in range(params.n)
    ]


def embedding_sequences(
    request_id: str, inputs: list[list[int]], pooling: str, arrival: float, seq_ids: Iterator[int], tokenizer: Tokenizer
) -> list[Sequence]:
    """An embedding request's inputs as sequences: each a prompt computed (chunked, batched with everything else)
    and pooled (`pooling`: engine/pooling.py), nothing sampled."""
    return [
        Sequence(
            seq_id=next(seq_ids),
            request=GenerationRequest(ids, request_id=request_id),
            index=i,
            token_ids=list(ids),
            prompt_len=len(ids),
            rng=None,
            detok=IncrementalDetokenizer(tokenizer),
            arrival=arrival,
            pooled=Pooled(pooling),
        )
        for i, ids in enumerate(inputs)
    ]


def pooled_inputs(
    seqs: list[Sequence], inputs: list[SeqInput], hidden: np.ndarray
) -> Iterator[tuple[Sequence, np.ndarray]]:
    """Pool a step's hidden rows into their embeddings; yields each input computed to its end, with its vector."""
    row = 0
    for seq, x in zip(seqs, inputs):
        if seq.pooled is None:
            continue
        seq.pooled.add(hidden[row : row + len(x.hidden)], x.start)
        row += len(x.hidden)
        if seq.num_computed == seq.num_tokens:
            yield seq, seq.pooled.vector(seq.num_tokens)
