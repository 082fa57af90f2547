"""One sequence being generated: its tokens, its blocks and how far its KV is computed."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from engine.call_repeats import CallRepeats
    from engine.pooling import Pooled
    from engine.speculative import Drafter
    from engine.structured import Matcher
    from engine.tokenizer import IncrementalDetokenizer
    from engine.types import GenerationRequest


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """Sample `index` of a request. `token_ids` is prompt + accepted output; KV exists for the
    first `num_computed` of them. `draft` holds proposed next tokens (speculative decoding)
    that the next step verifies; they are never part of `token_ids` until accepted.
    The scheduler moves it between queues; the block manager owns `block_table`; the engine
    appends accepted tokens."""

    seq_id: int
    request: GenerationRequest
    index: int
    token_ids: list[int]
    prompt_len: int
    rng: np.random.Generator | None
    detok: IncrementalDetokenizer
    matcher: Matcher | None = None  # structured output: the grammar state after token_ids
    drafter: Drafter | None = None  # speculative decoding: None when off for this request
    draft: list[int] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    deadline: float | None = None
    pooled: Pooled | None = None  # an embedding's input: its prompt is pooled, nothing is sampled
    calls: CallRepeats | None = None  # tool calls: what of the text may leave (no repeated call)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0  # prompt tokens served by the prefix cache (first admission)
    admitted: bool = False
    first_scheduled: float | None = None
    first_token: float | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def remaining(self) -> int:
        """Tokens whose KV still has to be computed before the next sample."""
        return len(self.token_ids) - self.num_computed
