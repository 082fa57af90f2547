"""Tokenizer (HF `tokenizers` underneath) built from GGUF metadata or a HF model directory,
plus the incremental, UTF-8-safe, stop-string-aware detokenizer used in the step loop.

Decoding never goes through `tokenizers`: every token's raw bytes are tabled once, so
`decode` and the incremental detokenizer agree byte for byte and a step costs a lookup.
"""
from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers import Tokenizer as HFTokenizer


class TokenizerError(ValueError):
    """The tokenizer description is unusable (unknown type, pre-tokenizer, missing file ...)."""


# GGUF token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp pre-tokenizer names (tokenizer.ggml.pre) -> our pre-tokenizer family
_LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_PRE_FAMILY = {
    "default": "gpt2", "gpt2": "gpt2", "gpt-2": "gpt2", "olmo": "gpt2", "phi-2": "gpt2",
    "smollm": "digits", "starcoder": "digits", "refact": "digits",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3", "dbrx": "llama3", "smaug-bpe": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# Chat content is wrapped in these (Supplementary Private Use Area) where it spells a special token, so that
# `encode_chat` reads it as text; content loses any of these two characters it carries.
_CONTENT_OPEN, _CONTENT_CLOSE = "\U000F0000", "\U000F0001"
_BYTE_DECODE = str.maketrans({c: chr(b) for b, c in _bytes_to_unicode().items()})
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _bytelevel_bytes(token: str) -> bytes:
    # Like tokenizers' ByteLevel decoder: map every char back to its byte; a token with a char
    # outside the map (an added token such as "<|im_start|>" in non-ASCII) is taken as UTF-8.
    try:
        return token.translate(_BYTE_DECODE).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")


def _sentencepiece_bytes(token: str) -> bytes:
    m = _BYTE_TOKEN.fullmatch(token)
    if m:
        return bytes([int(m.group(1), 16)])
    return token.replace("\u2581", " ").encode("utf-8")


class Tokenizer:
    """Encode/decode text for one model. Build with `from_gguf_metadata` or `from_hf_dir`."""

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

    # -- building ---------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, fields: dict[str, Any]) -> Tokenizer:
        """Build from GGUF `tokenizer.ggml.*` metadata (plain values: lists, arrays, scalars).

        Supports byte-level BPE ("gpt2", with the pre-tokenizer named by tokenizer.ggml.pre) and
        SentencePiece BPE ("llama": scores, <0xXX> byte fallback, ▁ for spaces).
        """
        kind = fields.get("tokenizer.ggml.model")
        tokens = fields.get("tokenizer.ggml.tokens")
        if kind is None or tokens is None:
            raise TokenizerError("GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens missing)")
        tokens = list(tokens)
        n = len(tokens)
        types = fields.get("tokenizer.ggml.token_type")
        types = [_NORMAL] * n if types is None else [int(t) for t in types]
        if len(types) != n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        bos = _opt_id(fields.get("tokenizer.ggml.bos_token_id"), n)
        eos = _opt_id(fields.get("tokenizer.ggml.eos_token_id"), n)
        unk = _opt_id(fields.get("tokenizer.ggml.unknown_token_id"), n)
        vocab = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)  # first id wins on duplicates, as in llama.cpp

        if kind == "gpt2":
            merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
            pre = str(fields.get("tokenizer.ggml.pre", "default"))
            family = _PRE_FAMILY.get(pre)
            if family is None:
                raise TokenizerError(f"unsupported tokenizer pre-tokenizer {pre!r} (tokenizer.ggml.pre)")
            tk = HFTokenizer(models.BPE(vocab, merges, ignore_merges=family == "llama3"))
            tk.pre_tokenizer = _gpt2_pre_tokenizer(family)
            tk.decoder = decoders.ByteLevel()
            table = [_bytelevel_bytes(t) if ty in (_NORMAL, _BYTE, _UNUSED) else t.encode("utf-8") for t, ty in zip(tokens, types)]
            add_bos_default, strip = False, False
        elif kind == "llama":
            scores = fields.get("tokenizer.ggml.scores")
            if scores is None:
                raise TokenizerError("SentencePiece GGUF tokenizer has no tokenizer.ggml.scores")
            add_prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
            tk = HFTokenizer(
                models.BPE(
                    vocab,
                    _merges_from_scores(tokens, [float(s) for s in scores], vocab),
                    unk_token=tokens[unk] if unk is not None else None,
                    fuse_unk=True,
                    byte_fallback=True,
                )
            )
            norm = [normalizers.Replace(" ", "\u2581")]
            tk.normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if add_prefix else []) + norm)
            dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            tk.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if add_prefix else []))
            table = [_sentencepiece_bytes(t) if ty in (_NORMAL, _BYTE, _UNUSED) else t.encode("utf-8") for t, ty in zip(tokens, types)]
            add_bos_default, strip = True, add_prefix
        else:
            raise TokenizerError(f"unsupported tokenizer model {kind!r} (tokenizer.ggml.model); supported: gpt2, llama")

        specials = [i for i, ty in enumerate(types) if ty in (_CONTROL, _UNKNOWN)]
        tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in specials])
        user = [i for i, ty in enumerate(types) if ty == _USER_DEFINED]
        if user:
            tk.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
        add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", add_bos_default))
        add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False))
        _set_post_processor(tk, tokens, bos if add_bos else None, eos if add_eos else None)
        return cls(tk, table, specials, bos, eos, strip)

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """Build from a HF model directory: tokenizer.json (+ tokenizer_config.json, config.json)."""
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise TokenizerError(f"{path} has no tokenizer.json")
        try:
            spec = json.loads(tj.read_text(encoding="utf-8"))
            tk = HFTokenizer.from_str(json.dumps(spec))
        except Exception as exc:
            raise TokenizerError(f"cannot read {tj}: {exc}") from exc
        cfg = _read_json(path / "tokenizer_config.json")
        model_cfg = _read_json(path / "config.json")

        added = tk.get_added_tokens_decoder()
        specials = {i for i, t in added.items() if t.special}
        n = max(tk.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        texts = [tk.id_to_token(i) or "" for i in range(n)]
        dec = spec.get("decoder") or {}
        dec_types = {d.get("type") for d in dec.get("decoders", [dec])} if dec else set()
        strip = False
        if "ByteLevel" in dec_types:
            table = [t.encode("utf-8") if i in added else _bytelevel_bytes(t) for i, t in enumerate(texts)]
        elif dec_types & {"ByteFallback", "Metaspace", "Replace"}:
            table = [t.encode("utf-8") if i in added else _sentencepiece_bytes(t) for i, t in enumerate(texts)]
            for d in dec.get("decoders", [dec]):
                if d.get("type") == "Strip" and d.get("content") == " " and d.get("start", 0) >= 1:
                    strip = True
                if d.get("type") == "Metaspace" and (d.get("add_prefix_space") or d.get("prepend_scheme") in ("always", "first")):
                    strip = True
        else:  # e.g. WordPiece: let the library spell each token
            table = [tk.decode([i], skip_special_tokens=False).encode("utf-8") for i in range(n)]

        def token_id(key: str, fallback: Any) -> int | None:
            v = cfg.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                return tk.token_to_id(v)
            return fallback if isinstance(fallback, int) else None

        eos_fallback = model_cfg.get("eos_token_id")
        if isinstance(eos_fallback, list):
            eos_fallback = eos_fallback[0] if eos_fallback else None
        bos = token_id("bos_token", model_cfg.get("bos_token_id"))
        eos = token_id("eos_token", eos_fallback)
        return cls(tk, table, specials, bos, eos, strip)

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

    def _chat_encoder(self) -> "_ChatEncoder":
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
        text = self._rendered.sub(lambda m: m.group(1) if m.group(1) is not None else self._alias[m.group(2)],
                                  rendered)
        return [self._real.get(i, i) for i in self._plain.encode(text, add_special_tokens=False).ids]


def _opt_id(v: Any, n: int) -> int | None:
    if v is None:
        return None
    v = int(v)
    return v if 0 <= v < n else None


def _read_json(p: Path) -> dict:
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot parse {p}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _gpt2_pre_tokenizer(family: str) -> pre_tokenizers.PreTokenizer:
    if family == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if family == "digits":  # llama.cpp "smollm"/"starcoder": every \p{N} alone, then GPT-2's regex
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
    regex = _LLAMA3_RE if family == "llama3" else _QWEN2_RE
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _merges_from_scores(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """SentencePiece BPE ranks merges by the merged piece's score (as transformers' GGUF converter)."""
    merges = []
    for piece, pid in vocab.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((scores[pid], vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    return [(m[3], m[4]) for m in merges]


def _set_post_processor(tk: HFTokenizer, tokens: list[str], bos: int | None, eos: int | None) -> None:
    if bos is None and eos is None:
        return
    single = " ".join(([tokens[bos]] if bos is not None else []) + ["$A"] + ([tokens[eos]] if eos is not None else []))
    pair = " ".join(([tokens[bos]] if bos is not None else []) + ["$A", "$B:1"] + ([tokens[eos]] if eos is not None else []))
    special = [(tokens[i], i) for i in {bos, eos} if i is not None]
    tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


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
