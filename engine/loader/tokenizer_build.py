"""Tokenizers from a model's files: GGUF `tokenizer.ggml.*` metadata (byte-level BPE with llama.cpp's
pre-tokenizer names, SentencePiece BPE) or a HF model directory (tokenizer.json and its configs), each with
its table of every token's raw bytes (what engine/tokenizer.py decodes from)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from engine.tokenizer import Tokenizer, TokenizerError

# GGUF token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp pre-tokenizer names (tokenizer.ggml.pre) -> our pre-tokenizer family
_LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501
_QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_FAMILY = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "olmo": "gpt2",
    "phi-2": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "dbrx": "llama3",
    "smaug-bpe": "llama3",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
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


def from_gguf_metadata(fields: dict[str, Any]) -> Tokenizer:
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
    vocab: dict[str, int] = {}
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
        table = [
            _bytelevel_bytes(t) if ty in (_NORMAL, _BYTE, _UNUSED) else t.encode("utf-8")
            for t, ty in zip(tokens, types)
        ]
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
        table = [
            _sentencepiece_bytes(t) if ty in (_NORMAL, _BYTE, _UNUSED) else t.encode("utf-8")
            for t, ty in zip(tokens, types)
        ]
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
    return Tokenizer(tk, table, specials, bos, eos, strip)


def from_hf_dir(path: str | Path) -> Tokenizer:
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
            if d.get("type") == "Metaspace" and (
                d.get("add_prefix_space") or d.get("prepend_scheme") in ("always", "first")
            ):
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
    return Tokenizer(tk, table, specials, bos, eos, strip)


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
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
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
    pair = " ".join(
        ([tokens[bos]] if bos is not None else []) + ["$A", "$B:1"] + ([tokens[eos]] if eos is not None else [])
    )
    special = [(tokens[i], i) for i in {bos, eos} if i is not None]
    tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
