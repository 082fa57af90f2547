"""llguidance's tokenizer for one model, built from our own tokenizer.

Given the tokenizer's JSON, llguidance parses and keeps a second full HF tokenizer in Rust
(~37 MB for SmolLM2). For a byte-level BPE vocabulary (GPT-2 style: SmolLM2, Llama 3, Qwen2) we
instead hand it each token's exact bytes and our tokenizer's `encode` through its
`TokenizerWrapper` (~17 MB). Token bytes come from the vocabulary itself: a token's string maps
through GPT-2's byte <-> character table; an added token is its literal UTF-8. Added tokens that
are special, or that look like "<...>", are marked special, as llguidance's own loaders do.
Any other kind of tokenizer (SentencePiece's "▁" + <0xNN> byte fallback, WordPiece, ...) takes
the JSON path unchanged.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import llguidance
from tokenizers import decoders, models

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

    from engine.tokenizer import Tokenizer


def build_lltokenizer(tokenizer: Tokenizer, n_vocab: int, eos_ids: list[int]) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for `tokenizer`, over `n_vocab` ids (ids past the tokenizer's
    vocabulary have no bytes and are never allowed), ending on any of `eos_ids`."""
    vocab = byte_level_vocab(tokenizer.hf)
    if vocab is None:
        return llguidance.LLTokenizer(tokenizer.hf.to_str(), n_vocab=n_vocab, eos_token=eos_ids)
    tokens, special_ids = vocab
    tokens += [b""] * (n_vocab - len(tokens))  # the wrapper's vocabulary is its token list: n_vocab is not read
    wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, tokens, special_ids))
    return llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=eos_ids)


def byte_level_vocab(tk: HFTokenizer) -> tuple[list[bytes], list[int]] | None:
    """(the bytes of every token id, the ids llguidance should treat as special) for a byte-level
    BPE tokenizer; None for any other kind, or when a token string is not byte-level."""
    if not isinstance(tk.model, models.BPE) or not isinstance(tk.decoder, decoders.ByteLevel):
        return None
    added = tk.get_added_tokens_decoder()
    n = max(tk.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
    to_byte = _char_to_byte()
    tokens = []
    for i in range(n):
        if i in added:
            tokens.append(added[i].content.encode("utf-8"))
            continue
        text = tk.id_to_token(i)
        if text is None or any(c not in to_byte for c in text):
            return None
        tokens.append(bytes([to_byte[c] for c in text]))
    special = [i for i, t in added.items() if t.special or (t.content.startswith("<") and t.content.endswith(">"))]
    return tokens, sorted(special)


def _char_to_byte() -> dict[str, int]:
    """GPT-2's byte-level table, inverted: printable bytes stand for themselves, the other 68
    bytes (controls, space, 0x7f-0xa0, 0xad) take the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    rest = [b for b in range(256) if b not in table.values()]
    table.update({chr(0x100 + k): b for k, b in enumerate(rest)})
    return table


class _Vocabulary:
    """What `llguidance.TokenizerWrapper` reads: token bytes, BOS/EOS, special ids, and a call that
    tokenizes a str (it passes str once a bytes argument is refused, as `Tokenizer.encode` does).

    llguidance tokenizes the text a grammar forces next (e.g. '", "age": ') while it computes masks,
    the same few strings step after step: cached, so that a mask costs no Python call."""

    def __init__(self, tokenizer: Tokenizer, tokens: list[bytes], special_ids: list[int]) -> None:
        self.tokens = tokens
        self.special_token_ids = special_ids
        self.eos_token_id = tokenizer.eos_id  # LLTokenizer's eos_token overrides it
        self.bos_token_id = tokenizer.bos_id
        self._encode = lru_cache(maxsize=4096)(lambda text: tuple(tokenizer.encode(text)))

    def __call__(self, text: str) -> tuple[int, ...]:
        return self._encode(text)
