"""Structured output: JSON object, JSON schema, regex and Lark grammar constraints as token masks.

llguidance does the work: its tokenizer is built once from ours (engine/lltokenizer.py),
each (kind, spec) is compiled once into a matcher kept in a small LRU cache, and every
sequence gets a cheap copy of it. Per step the masks of all constrained rows (drafted rows
included) are filled into one int32 bitmask [rows, ceil(vocab / 32)] (llguidance releases
the GIL), and the backend sets the logits of disallowed tokens to -inf, all rows at once. EOS is in
the mask only when the grammar accepts what was generated.

JSON is generated compactly on one line (", " and ": " separators, no other whitespace):
small models otherwise tend to pad with whitespace until max_tokens.

Anything that cannot be compiled, and JSON-schema keywords llguidance cannot enforce
(e.g. uniqueItems, not, if/then), is refused with InvalidRequest: a constraint is never
silently dropped.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance
import numpy as np

from engine.lltokenizer import build_lltokenizer
from engine.types import InvalidRequest, ResponseFormat

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict in llguidance's stubs only

    from engine.tokenizer import Tokenizer

Matcher = llguidance.LLMatcher
CACHE_SIZE = 256  # compiled constraints kept
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY_OBJECT = '{"type": "object"}'


class Grammars:
    """Compiles constraints for one model and fills their masks. Thread-safe: requests are
    checked (and compiled) on the caller's thread, masks filled on the step thread."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_ids: list[int]) -> None:
        self._tokenizer, self.vocab_size, self._eos_ids = tokenizer, vocab_size, list(eos_ids)
        self.mask_words = (vocab_size + 31) // 32
        # The mask once a grammar has ended: EOS only. llguidance writes no mask for the drafted rows
        # after a draft token that ends the grammar; they keep this one.
        words = np.zeros(self.mask_words, dtype=np.uint32)
        for t in eos_ids:
            words[t // 32] |= np.uint32(1) << np.uint32(t % 32)
        self._eos_only = words.view(np.int32)
        self._lltok: llguidance.LLTokenizer | None = None  # built on first use (~0.5 s)
        self._compiled: OrderedDict[tuple[str, str], Matcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, fmt: ResponseFormat) -> Matcher:
        """A fresh matcher for `fmt`: a cheap copy of the compiled one."""
        return self.compile(fmt).deep_copy()

    def compile(self, fmt: ResponseFormat) -> Matcher:
        """The compiled matcher for `fmt` (cached; never consume tokens with it). Raises
        InvalidRequest naming what is wrong when the constraint cannot be compiled or enforced."""
        key = (fmt.kind, fmt.spec)
        with self._lock:
            base = self._compiled.get(key)
            if base is not None:
                self._compiled.move_to_end(key)
        if base is None:
            base = self._compile(fmt)
            with self._lock:
                self._compiled[key] = base
                while len(self._compiled) > CACHE_SIZE:
                    self._compiled.popitem(last=False)
        return base

    def fill(self, work: list[tuple[Matcher, int, list[int]]], num_rows: int) -> np.ndarray:
        """The bitmask [num_rows, mask_words]: for each (matcher, row, draft) the mask after the
        matcher's tokens in that row and, for each drafted token, the mask after it in the rows
        that follow (the matcher is rolled back after). Drafts are grammar-valid (the engine
        checks them when proposing); rows after one that ends the grammar allow only EOS.

        One matcher after another on this thread (llguidance releases the GIL): a mask costs
        ~0.05 ms, and llguidance's thread pool would compete with the BLAS threads for the cores."""
        bitmask = np.tile(self._eos_only, (num_rows, 1))
        row_bytes = bitmask.strides[0]
        base = bitmask.ctypes.data
        for matcher, row, draft in work:
            matcher.unsafe_compute_mask_ptr(base + row * row_bytes, row_bytes)
            for j, token in enumerate(draft, 1):
                if not matcher.consume_token(token) or matcher.is_stopped():
                    draft = draft[:j]
                    break
                matcher.unsafe_compute_mask_ptr(base + (row + j) * row_bytes, row_bytes)
            if draft:
                matcher.rollback(len(draft))
        return bitmask

    def _compile(self, fmt: ResponseFormat) -> Matcher:
        try:
            if fmt.kind == "json_object":
                grammar = Matcher.grammar_from_json_schema(_ANY_OBJECT, defaults=_JSON_OPTIONS)
            elif fmt.kind == "json_schema":
                try:
                    schema = json.loads(fmt.spec)
                except (ValueError, RecursionError) as e:
                    raise InvalidRequest(
                        f"response_format schema is not valid JSON: {e}", param="response_format"
                    ) from None
                if not isinstance(schema, (dict, bool)):
                    raise InvalidRequest("response_format schema must be a JSON object", param="response_format")
                grammar = Matcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)
            elif fmt.kind == "regex":
                grammar = Matcher.grammar_from_regex(fmt.spec)
            elif fmt.kind == "grammar":
                grammar = Matcher.grammar_from_lark(fmt.spec)
            else:
                raise InvalidRequest(f"unknown response_format type {fmt.kind!r}", param="response_format")
        except ValueError as e:
            if isinstance(e, InvalidRequest):
                raise
            raise InvalidRequest(f"response_format {fmt.kind} cannot be used: {e}", param="response_format") from None
        tok = self._llguidance_tokenizer()
        failed, messages = Matcher.validate_grammar_with_warnings(grammar, tok)
        if failed:
            raise InvalidRequest(
                f"response_format {fmt.kind} cannot be enforced: {_one_line(messages)}", param="response_format"
            )
        matcher = Matcher(tok, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(
                f"response_format {fmt.kind} cannot be enforced: {_one_line([matcher.get_error()])}",
                param="response_format",
            )
        return matcher

    def _llguidance_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._lltok is None:
                if self._tokenizer.vocab_size > self.vocab_size:
                    raise InvalidRequest(
                        "structured output needs the tokenizer's vocabulary to fit the model's", param="response_format"
                    )
                # Ids past the tokenizer's vocabulary (padding rows of the model) are never allowed.
                self._lltok = build_lltokenizer(self._tokenizer, self.vocab_size, self._eos_ids)
            return self._lltok


def _one_line(messages: list[str]) -> str:
    """llguidance's messages span several lines (a caret under the source): one line, bounded."""
    text = " ".join(" ".join(messages).split()) or "unknown error"
    return text if len(text) <= 300 else text[:299] + "…"
