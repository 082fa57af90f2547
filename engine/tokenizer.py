"""Tokenizer (HF `tokenizers` underneath): encoding, chat encoding without role injection, decoding, and the
incremental, UTF-8-safe, stop-string-aware detokenizer used in the step loop. Built from a model's files by
engine/loader/tokenizer_build.py.

Decoding never goes through `tokenizers`: every token's raw bytes are tabled once, so
`decode` and the incremental detokenizer agree byte for byte and a step costs a lookup.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Sequence

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer


class TokenizerError(ValueError):
    """The tokenizer description is unusable (unknown type, pre-tokenizer, missing file ...)."""


# Chat content is wrapped in these (Supplementary Private Use Area) where it spells a special token, so that
# `encode_chat` reads it as text; content loses any of these two characters it carries.
_CONTENT_OPEN, _CONTENT_CLOSE = "\U000f0000", "\U000f0001"


class Tokenizer:
    """Encode/decode text for one model. Built by engine/loader/tokenizer_build.py (`from_gguf_metadata`,
    `from_hf_dir`) from a token table: every token's raw bytes."""

    def __init__(
        self,
        tk: HFTokenizer,
        token_bytes: list[bytes],
        special_ids: Iterable[int],
        bos_id: int | None,
        eos_id: int | None,
        strip_leading_space: bool = False,
    ) -> None:
        self._tk = tk
        self._bytes = token_bytes
        self.vocab_size: int = len(token_bytes)
        self.special_ids: frozenset[int] = frozenset(special_ids)
        self.bos_id, self.eos_id = bos_id, eos_id
        self.bos_token = self._token_text(bos_id)
        self.eos_token = self._token_text(eos_id)
        # SentencePiece models print a leading "▁" on the first word; decoding drops that one space
        self.strip_leading_space = strip_leading_space
        # skip_special table: the same bytes, but b"" for special tokens
        self._bytes_skip = [b"" if i in self.special_ids else b for i, b in enumerate(token_bytes)]
        self._chat: _ChatEncoder | None = None  # built on first use

    def _token_text(self, token_id: int | None) -> str | None:
        if token_id is None or not 0 <= token_id < len(self._bytes):
            return None
        return self._bytes[token_id].decode("utf-8", errors="replace")

    # -- use ----------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Text -> ids. Special tokens written in `text` (e.g. "<|im_start|>") become their single id.

        add_special adds what the model's post-processor adds (BOS for SentencePiece Llamas).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self._tk.encode(text, add_special_tokens=add_special).ids

    def escape_content(self, text: str) -> str:
        """Chat content to render into a template: the special tokens it spells stay text in `encode_chat`."""
        return self._chat_encoder().escape(text)

    def encode_chat(self, rendered: str) -> list[int]:
        """A rendered chat template -> ids: the template's own special tokens become their ids; content
        that went through `escape_content` is plain text, whatever it spells (no role injection)."""
        return self._chat_encoder().encode(rendered)

    def _chat_encoder(self) -> _ChatEncoder:
        if self._chat is None:
            self._chat = _ChatEncoder(self._tk, self.special_ids)
        return self._chat

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids -> text; invalid UTF-8 becomes U+FFFD. Equals the incremental detokenizer's output."""
        table = self._bytes_skip if skip_special else self._bytes
        try:
            data = b"".join([table[i] for i in ids])
        except (IndexError, TypeError) as exc:
            raise ValueError(f"token id out of range [0, {self.vocab_size}) in {list(ids)[:20]}") from exc
        text = data.decode("utf-8", errors="replace")
        if self.strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """Raw bytes of one token; b"" for a special token when skip_special."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} out of range [0, {self.vocab_size})")
        return (self._bytes_skip if skip_special else self._bytes)[token_id]

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's spelling of a token (e.g. "Ġhello"), not its text."""
        return self._tk.id_to_token(token_id)

    @property
    def hf(self) -> HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (e.g. for constrained decoding vocab scans)."""
        return self._tk


class _ChatEncoder:
    """Encodes rendered chat text in one pass (so pieces merge exactly as `encode` would merge them) with
    a copy of the tokenizer that reads special-token strings as text, plus one alias added token per
    special token: the template's specials are swapped for their aliases, whose ids map back."""

    def __init__(self, tk: HFTokenizer, special_ids: frozenset[int]) -> None:
        specials = {tok: i for i in special_ids if (tok := tk.id_to_token(i))}
        self._plain = HFTokenizer.from_str(tk.to_str())
        self._plain.encode_special_tokens = True
        aliases = {tok: f"{_CONTENT_OPEN}{i}{_CONTENT_OPEN}" for tok, i in specials.items()}
        self._plain.add_tokens([AddedToken(a, special=False, normalized=False) for a in aliases.values()])
        self._alias = aliases
        self._real = {self._plain.token_to_id(a): specials[tok] for tok, a in aliases.items()}
        names = "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) or "(?!)"
        self._special = re.compile(names)
        self._rendered = re.compile(f"{_CONTENT_OPEN}({names}){_CONTENT_CLOSE}|({names})")

    def escape(self, text: str) -> str:
        text = text.replace(_CONTENT_OPEN, "").replace(_CONTENT_CLOSE, "")
        return self._special.sub(lambda m: _CONTENT_OPEN + m.group(0) + _CONTENT_CLOSE, text)

    def encode(self, rendered: str) -> list[int]:
        text = self._rendered.sub(lambda m: m.group(1) if m.group(1) is not None else self._alias[m.group(2)], rendered)
        return [self._real.get(i, i) for i in self._plain.encode(text, add_special_tokens=False).ids]


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that are always whole characters.

    Holds back an incomplete UTF-8 sequence and any tail that could still grow into one of
    the stop strings. When a stop string appears, the text ends just before it and
    `stopped` becomes True; later pushes return "". All deltas + finish() == decode(ids)
    (cut before the first stop string).
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = (), skip_special: bool = True) -> None:
        self._table = tokenizer._bytes_skip if skip_special else tokenizer._bytes
        self._n = len(self._table)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = tokenizer.strip_leading_space
        self._started = False  # some text was decoded (the leading-space strip is behind us)
        self._stops = [s for s in stop if s]
        self._held = ""  # decoded text that may be the start of a stop string
        self._parts: list[str] = []
        self._text: str | None = ""
        self.stopped = False

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        if self._text is None:
            self._text = "".join(self._parts)
        return self._text

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now safe to show (maybe "")."""
        if self.stopped:
            return ""
        if not 0 <= token_id < self._n:
            raise ValueError(f"token id {token_id} out of range [0, {self._n})")
        return self._feed(self._utf8.decode(self._table[token_id]))

    def finish(self) -> str:
        """Flush what is held: an incomplete character becomes U+FFFD, a held stop prefix is released."""
        if self.stopped:
            return ""
        return self._feed(self._utf8.decode(b"", final=True), final=True)

    def _feed(self, new: str, final: bool = False) -> str:
        if new and not self._started:
            self._started = True
            if self._strip and new.startswith(" "):
                new = new[1:]
        text = self._held + new
        if not text:
            return ""
        if self._stops:
            cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                self._held = ""
                return self._emit(text[:cut])
            keep = 0 if final else self._stop_prefix_len(text)
            self._held = text[len(text) - keep :] if keep else ""
            return self._emit(text[: len(text) - keep])
        return self._emit(text)

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _emit(self, delta: str) -> str:
        if delta:
            self._parts.append(delta)
            self._text = None
        return delta
