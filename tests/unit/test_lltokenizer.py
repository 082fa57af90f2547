"""engine/lltokenizer.py: llguidance's tokenizer built from our own, on the real default model's
byte-level vocabulary, checked byte for byte against our decoding and against the tokenizer
llguidance builds from the tokenizer's JSON; other vocabularies take the JSON path."""

from __future__ import annotations

import json
import random

import llguidance
import numpy as np
import pytest
from _gguf_helpers import default_loaded

from engine.lltokenizer import build_lltokenizer, byte_level_vocab
from engine.loader.tokenizer_build import from_gguf_metadata
from engine.tokenizer import Tokenizer

PIECES = [
    "hello",
    " world",
    "def f(x):\n    return x * 2\n",
    '{"a": [1, 2.5e-3, null]}',
    "\t\r\n  ",
    "<|im_end|>",
    "naïve café",
    "Straße",
    "日本語のテキスト",
    "Привет",
    "مرحبا",
    "😀",
    "👍🏽",
    "🇫🇷",
    "👨\u200d👩\u200d👧",
    "\u00a0\u2028",
    "0123456789",
    "\\u00e9",
    "ĠĊ",
    "\x00\x7f",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return default_loaded().tokenizer


@pytest.fixture(scope="module")
def vocab(tok) -> tuple[list[bytes], list[int]]:
    got = byte_level_vocab(tok.hf)
    assert got is not None, "the default model's vocabulary is byte-level BPE"
    return got


@pytest.fixture(scope="module")
def pair(tok) -> tuple[llguidance.LLTokenizer, llguidance.LLTokenizer]:
    """(built from our tokenizer, built by llguidance from the tokenizer's JSON)."""
    eos = [tok.eos_id]
    return build_lltokenizer(tok, tok.vocab_size, eos), llguidance.LLTokenizer(
        tok.hf.to_str(), n_vocab=tok.vocab_size, eos_token=eos
    )


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        parts = rng.choices(PIECES, k=rng.randint(1, 6))
        parts += [
            "".join(
                chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0x2FFF), rng.randint(0x1F300, 0x1FAFF)]))
                for _ in range(rng.randint(0, 8))
            )
        ]
        rng.shuffle(parts)
        texts.append("".join(parts))
    return texts


def test_every_token_has_the_bytes_our_tokenizer_decodes_it_to(tok, vocab):
    tokens, special = vocab
    assert len(tokens) == tok.vocab_size
    assert [i for i, b in enumerate(tokens) if b != tok.token_bytes(i)] == []
    assert set(special) == set(tok.special_ids)
    # Tokens holding part of a character: their bytes, where the library's decode of the lone id says U+FFFD.
    partial = [
        i for i, b in enumerate(tokens) if b.decode("utf-8", errors="replace") != b.decode("utf-8", errors="ignore")
    ]
    assert len(partial) > 100
    assert all("\ufffd" in tok.hf.decode([i]) for i in partial)


def test_joined_token_bytes_are_what_the_text_was_and_what_hf_decodes(tok, vocab):
    tokens = vocab[0]
    for text in random_texts(200, seed=1):
        ids = tok.encode(text)
        assert b"".join(tokens[i] for i in ids) == text.encode("utf-8")
    # Every other id in runs of 64 arbitrary ids, split characters included: the library's ByteLevel decoder agrees.
    normal = np.random.default_rng(2).permutation(sorted(set(range(tok.vocab_size)) - tok.special_ids))
    for start in range(0, len(normal), 64):
        ids = normal[start : start + 64].tolist()
        assert tok.hf.decode(ids) == b"".join(tokens[i] for i in ids).decode("utf-8", errors="replace")


def test_llguidance_sees_the_same_vocabulary_as_from_the_json(tok, vocab, pair):
    new, old = pair
    assert (new.vocab_size, new.eos_tokens) == (old.vocab_size, old.eos_tokens)
    for i in range(tok.vocab_size):
        assert new.decode_bytes([i]) == old.decode_bytes([i]) == vocab[0][i], i
        assert new.is_special_token(i) == old.is_special_token(i), i


def test_llguidance_tokenizes_and_decodes_as_from_the_json(tok, pair):
    new, old = pair
    texts = random_texts(300, seed=3)
    for text in texts:
        data = text.encode("utf-8")
        ids = new.tokenize_bytes(data)
        assert ids == old.tokenize_bytes(data) == tok.encode(text), text
        assert new.tokenize_str(text, parse_special=True) == old.tokenize_str(text, parse_special=True), text
        assert new.decode_bytes(ids) == old.decode_bytes(ids) == data
    # Invalid UTF-8 (a character cut in two) goes through llguidance's greedy fallback in both.
    for text in texts[:100]:
        cut = text.encode("utf-8")[:-1]
        assert new.tokenize_bytes(cut) == old.tokenize_bytes(cut)


def test_masks_along_a_json_schema_reply_are_those_of_the_json_built_tokenizer(tok, pair):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "age", "tags"],
    }
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    )
    reply = tok.encode(json.dumps({"name": "Zoë 😀", "age": 36, "tags": ["math", "日本"]}, ensure_ascii=False))
    for _ in range(2):  # the second pass tokenizes the forced text again (from the cache, in ours)
        new, old = (llguidance.LLMatcher(t, grammar, log_level=0) for t in pair)
        for token in reply:
            assert new.compute_bitmask() == old.compute_bitmask()
            assert new.consume_token(token) and old.consume_token(token)
        assert new.compute_bitmask() == old.compute_bitmask() and new.is_accepting()


def test_ids_past_the_vocabulary_are_never_allowed_and_masks_agree(tok):
    padded = tok.vocab_size + 7
    masks = []
    for lltok in (
        build_lltokenizer(tok, padded, [tok.eos_id]),
        llguidance.LLTokenizer(tok.hf.to_str(), n_vocab=padded, eos_token=[tok.eos_id]),
    ):
        assert lltok.vocab_size == padded
        matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_regex(r"[\s\S]*"), log_level=0)
        masks.append(np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8))
    new, old = masks
    assert not new[tok.vocab_size :].any()
    assert np.count_nonzero(new) > 40_000  # any text: most tokens
    np.testing.assert_array_equal(new, old)


def test_a_sentencepiece_vocabulary_takes_the_json_path():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "i", "▁h", "▁hi", "é"]
    fields = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array([0.0] * 259 + [-float(i) for i in range(6)], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([2, 3, 3] + [6] * 256 + [1] * 6, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    t = from_gguf_metadata(fields)
    assert byte_level_vocab(t.hf) is None
    lltok = build_lltokenizer(t, t.vocab_size, [2])
    ids = [i for i in range(3, t.vocab_size) if t.token_bytes(i) != b"\xff"]  # 0xFF: llguidance's special-token marker
    assert [lltok.decode_bytes([i]) for i in ids] == [t.token_bytes(i) for i in ids]
    # llguidance tokenizes grammar text without the "▁" our encoder prepends: why this kind keeps its path.
    assert lltok.tokenize_str("hi") == [tokens.index("h"), tokens.index("i")] != t.encode("hi")
