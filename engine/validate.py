"""`RequestValidator`: what a request must satisfy before it is queued: prompt ids in the vocabulary, room in
the context, valid sampling parameters, a constraint that compiles, and KV for all its samples at once."""

from __future__ import annotations

from engine.kv_cache import BlockManager
from engine.pooling import POOLINGS
from engine.structured import Grammars
from engine.types import GenerationRequest, InvalidRequest

MAX_EMBEDDING_INPUTS = 2048  # inputs one embedding request may carry


class RequestValidator:
    """Checks only: nothing is allocated from a request's numbers."""

    __slots__ = ("vocab_size", "max_context", "blocks", "grammars")

    def __init__(self, vocab_size: int, max_context: int, blocks: BlockManager, grammars: Grammars) -> None:
        self.vocab_size, self.max_context, self.blocks, self.grammars = vocab_size, max_context, blocks, grammars

    def __call__(self, req: GenerationRequest) -> None:
        """Raise InvalidRequest for anything that can never run (compiling its constraint, if any)."""
        ids = req.prompt_token_ids
        vocab = self.vocab_size
        if not ids:
            raise InvalidRequest("prompt is empty", param="prompt")
        if min(ids) < 0 or max(ids) >= vocab:
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if len(ids) >= self.max_context:
            raise InvalidRequest(
                f"prompt has {len(ids)} tokens; this engine's context is {self.max_context}", param="messages"
            )
        req.params.validate(vocab)
        if req.timeout_s is not None and not req.timeout_s > 0:
            raise InvalidRequest("timeout must be > 0 seconds", param="timeout")
        self.check_fits(len(ids), req.params.n, req.params.max_tokens)
        if req.params.response_format is not None:
            self.grammars.compile(req.params.response_format)

    def check_fits(self, prompt_len: int, n: int, max_tokens: int) -> None:
        """Refuse n samples that could never hold their KV at once: each holds a block for every
        `block_size` of its tokens but the last (one that reaches the context's end stops there), and
        the prompt's full blocks are computed once and shared (the prefix cache always leaves the
        prompt's last token to compute, so its block is each sample's own)."""
        bs, total = self.blocks.block_size, self.blocks.num_blocks

        def blocks(length: int) -> int:
            shared = (prompt_len - 1) // bs
            return shared + n * (-(-(min(length, self.max_context) - 1) // bs) - shared)

        need = blocks(prompt_len + max_tokens)
        if need > total:
            param = "max_tokens" if blocks(prompt_len + 1) <= total else "n"
            raise InvalidRequest(
                f"{n} samples of a {prompt_len}-token prompt plus up to {max_tokens} tokens need {need} KV blocks of "
                f"{bs} tokens; this engine holds {total}: ask for fewer samples (n) or a shorter reply (max_tokens)",
                param=param,
            )

    def embedding(self, inputs: list[list[int]], pooling: str, truncate: bool = False) -> list[list[int]]:
        """An embedding request's inputs as they will run: each non-empty, in the vocabulary and at most the
        context long (longer ones keep their first `max_context` tokens when `truncate`, else are refused)."""
        if pooling not in POOLINGS:
            raise InvalidRequest(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}", param="pooling")
        if not isinstance(inputs, list) or not 1 <= len(inputs) <= MAX_EMBEDDING_INPUTS:
            raise InvalidRequest(f"input must hold 1 to {MAX_EMBEDDING_INPUTS} items", param="input")
        out = []
        for i, ids in enumerate(inputs):
            if not isinstance(ids, list) or not ids:
                raise InvalidRequest(f"input[{i}] is empty", param="input")
            if not all(type(t) is int and 0 <= t < self.vocab_size for t in ids):
                raise InvalidRequest(f"input[{i}]: token ids must be integers in [0, {self.vocab_size})", param="input")
            if len(ids) > self.max_context:
                if not truncate:
                    raise InvalidRequest(
                        f"input[{i}] has {len(ids)} tokens; this engine's context is {self.max_context} "
                        "(ask for truncation to cut it)",
                        param="input",
                    )
                ids = ids[: self.max_context]
            out.append(ids)
        return out
