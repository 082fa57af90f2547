"""engine/tokenizer.py on the real default model (GGUF byte-level BPE, pre "smollm") and on
small synthetic vocabularies: encoding, decoding, the incremental detokenizer, stop strings."""

from __future__ import annotations

import random

import numpy as np
import pytest
from _gguf_helpers import default_loaded, write_tiny_pair

from engine.loader.tokenizer_build import from_gguf_metadata, from_hf_dir
from engine.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerError

REPLIES = [
    "Sure! Here you go 😀👍🏽🇫🇷 and a family 👨\u200d👩\u200d👧\u200d👦 ❤️ done.",
    "日本語のテキストです。中文测试：你好，世界！",
    "naïve café résumé façade — Ünïcödé: Straße, Æsir, ÅÄÖ",
    "Привет, как дела? مرحبا بالعالم ¹²³ ½ ٣ ५ Ⅻ",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return default_loaded().tokenizer


def stream(tok: Tokenizer, ids: list[int], **kw) -> tuple[list[str], str, IncrementalDetokenizer]:
    d = IncrementalDetokenizer(tok, **kw)
    deltas = [d.push(i) for i in ids]
    deltas.append(d.finish())
    return deltas, "".join(deltas), d


# -- the default model's tokenizer -------------------------------------------------------------


def test_fixture_tokenizer_cases_match_llama_cpp(tok, reference):
    cases = reference["tokenizer_cases"]["cases"]
    assert len(cases) == 22
    for c in cases:
        assert tok.encode(c["text"]) == c["llamacpp_smollm"], c["text"]


def test_round_trip_decode(tok, reference):
    for c in reference["tokenizer_cases"]["cases"]:
        assert tok.decode(tok.encode(c["text"]), skip_special=False) == c["text"]
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids) == "user\nhi"  # control tokens skipped by default


def test_prompt_text_encodes_to_fixture_prompt_ids(tok, reference):
    for p in reference["prompts"]:
        assert tok.encode(p["prompt_text"]) == p["prompt_ids"]
        assert tok.encode(p["prompt_text"], add_special=True) == p["prompt_ids"]  # add_bos_token is false


def test_fixture_generations_decode(tok, reference):
    for p in reference["prompts"]:
        assert tok.decode(p["generated_ids"], skip_special=False) == p["generated_text"]
        assert tok.decode(p["generated_ids"]) == p["generated_text_skip_special"]
        assert tok.decode(p["greedy32_no_eos_stop_ids"], skip_special=False) == p["greedy32_no_eos_stop_text"]


def test_special_tokens(tok, reference):
    summary = reference["gguf_summary"]
    assert tok.vocab_size == summary["n_tokens"] == 49152
    assert (tok.bos_id, tok.bos_token) == tuple(reversed(reference["tokenizer"]["bos"]))
    assert (tok.eos_id, tok.eos_token) == tuple(reversed(reference["tokenizer"]["eos"]))
    assert tok.special_ids == frozenset(i for i, _ in summary["control_tokens"])
    for i, text in summary["control_tokens"]:
        assert tok.encode(f"a{text}b") == tok.encode("a") + [i] + tok.encode("b")
        assert tok.token_bytes(i) == text.encode()
        assert tok.token_bytes(i, skip_special=True) == b""


def test_token_bytes_are_raw_bytes(tok):
    # "é" is two UTF-8 bytes; byte-level BPE tokens map back to them exactly
    for i in tok.encode("naïve café 😀"):
        assert tok.token_bytes(i) in "naïve café 😀".encode()
    with pytest.raises(ValueError, match="out of range"):
        tok.token_bytes(tok.vocab_size)
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([0, 10**6])
    with pytest.raises(TypeError, match="expects a str"):
        tok.encode(b"bytes")


# -- incremental detokenizer ---------------------------------------------------------------------


def test_incremental_never_breaks_characters(tok):
    split_somewhere = False
    for text in REPLIES:
        ids = tok.encode(text)
        split_somewhere |= any(_not_utf8(tok.token_bytes(i)) for i in ids)
        deltas, joined, d = stream(tok, ids)
        assert all("\ufffd" not in x for x in deltas), text
        assert joined == tok.decode(ids) == text
        assert d.text == text and not d.stopped
    assert split_somewhere, "no reply had a character split across tokens: the test would prove nothing"


def _not_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_incremental_holds_incomplete_char_then_releases(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji's 4 bytes span several tokens
    d = IncrementalDetokenizer(tok)
    assert [d.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.push(ids[-1]) == "😀"


def test_finish_flushes_incomplete_bytes_like_decode(tok):
    ids = tok.encode("😀")[:1]
    deltas, joined, _ = stream(tok, ids)
    assert deltas[0] == "" and joined == tok.decode(ids) and "\ufffd" in joined


def test_special_tokens_in_stream(tok, reference):
    p = reference["prompts"][0]
    assert stream(tok, p["generated_ids"])[1] == p["generated_text_skip_special"]
    assert stream(tok, p["generated_ids"], skip_special=False)[1] == p["generated_text"]


def test_stop_string_across_token_boundaries(tok):
    text = "The capital of France is Paris. It is lovely."
    ids = tok.encode(text)
    stop = "is Par"  # starts inside " is" and ends inside " Paris"
    assert not any(stop in tok.decode([i]) for i in ids)
    _, joined, d = stream(tok, ids + tok.encode(" more"), stop=[stop])
    assert joined == d.text == "The capital of France "
    assert d.stopped
    assert d.push(ids[0]) == "" and d.finish() == ""


def test_stop_hold_back_then_release(tok):
    ids = tok.encode("The capital of France is Paris.")
    paris = tok.encode(" Paris")
    assert len(paris) == 1 and paris[0] in ids
    d = IncrementalDetokenizer(tok, stop=["Paris!"])
    upto = ids.index(paris[0])
    for i in ids[: upto + 1]:
        d.push(i)
    assert d.text == "The capital of France is "  # "Paris" could still become "Paris!"
    rest = "".join(d.push(i) for i in ids[upto + 1 :])
    assert rest == "Paris." and not d.stopped
    assert d.finish() == "" and d.text == tok.decode(ids)


def test_finish_releases_a_held_stop_prefix(tok):
    ids = tok.encode("Answer: Par")
    deltas, joined, d = stream(tok, ids, stop=["Paris"])
    assert deltas[-1] == "Par" and joined == "Answer: Par" and not d.stopped


def test_earliest_stop_wins_and_special_text_can_stop(tok, reference):
    ids = tok.encode("alpha beta gamma")
    assert stream(tok, ids, stop=["gamma", "beta"])[1] == "alpha "
    p = reference["prompts"][0]
    joined = stream(tok, p["greedy32_no_eos_stop_ids"], stop=["<|im_end|>"], skip_special=False)[1]
    assert joined == "The capital of France is Paris."


def test_multibyte_stop_string(tok):
    ids = tok.encode("日本語のテキストです。")
    assert stream(tok, ids, stop=["テキ"])[1] == "日本語の"


def test_random_streams_equal_decode_cut_at_first_stop(tok):
    """Property: for random ids (incl. lone partial-character tokens) and stops, deltas == decode cut at the stop."""
    rng = random.Random(0)
    pool = (
        sorted({i for t in REPLIES for i in tok.encode(t)})
        + list(range(40))
        + [rng.randrange(tok.vocab_size) for _ in range(200)]
    )
    for trial in range(150):
        ids = [rng.choice(pool) for _ in range(rng.randrange(1, 40))]
        full = tok.decode(ids, skip_special=trial % 2 == 0)
        stops = []
        if trial % 3 and len(full) > 2:
            a = rng.randrange(len(full) - 1)
            stops = [full[a : a + rng.randrange(1, 5)]]
        deltas, joined, d = stream(tok, ids, stop=stops, skip_special=trial % 2 == 0)
        cut = min([full.find(s) for s in stops if s in full], default=-1)
        assert joined == (full[:cut] if cut >= 0 else full), (ids, stops)
        assert d.stopped == (cut >= 0)
        assert all("\ufffd" not in x for x in deltas[:-1] if "\ufffd" not in full)


# -- other vocabularies ----------------------------------------------------------------------------


def _spm_fields(add_space_prefix: bool = True) -> dict:
    """A SentencePiece-style (llama) GGUF vocabulary: specials, 256 byte tokens, scored pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "▁h",
        "ll",
        "llo",
        "▁he",
        "▁hello",
        "▁w",
        "or",
        "▁wor",
        "ld",
        "▁world",
        "é",
    ]
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens + pieces,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(types + [1] * len(pieces), dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def test_sentencepiece_vocab():
    fields = _spm_fields()
    t = from_gguf_metadata(fields)
    piece = {p: i for i, p in enumerate(fields["tokenizer.ggml.tokens"])}
    assert t.encode("hello world") == [piece["▁hello"], piece["▁world"]]
    assert t.encode("hello world", add_special=True) == [1, piece["▁hello"], piece["▁world"]]  # add_bos defaults on
    assert t.decode(t.encode("hello world", add_special=True)) == "hello world"
    # "ö" is not a piece: byte fallback to its two UTF-8 bytes; "é" is a piece
    ids = t.encode("héö")
    assert ids[-2:] == [3 + 0xC3, 3 + 0xB6] and piece["é"] in ids
    assert t.decode(ids) == "héö"
    # control tokens written in text are matched whole
    assert t.encode("hello</s>") == [piece["▁hello"], 2]
    assert t.special_ids == {0, 1, 2}
    for text in ["hello world", " hello", "héö wor", "héllo wörld"]:
        ids = t.encode(text)
        deltas, joined, _ = stream(t, ids)
        assert joined == t.decode(ids)
        assert all("\ufffd" not in x for x in deltas)
    assert t.decode(t.encode(" hello")) == " hello"  # only the added prefix space is dropped


def test_sentencepiece_without_space_prefix():
    t = from_gguf_metadata(_spm_fields(add_space_prefix=False))
    ids = t.encode("hello world")
    assert t.decode(ids) == "hello world" and stream(t, ids)[1] == "hello world"
    assert t.id_to_token(ids[0]) != "▁hello"


@pytest.mark.parametrize(
    "pre, text, pieces",
    [
        ("smollm", " 2024x", [" ", "2", "0", "2", "4", "x"]),
        ("default", " 2024x", [" 2024", "x"]),
        ("llama-bpe", "12345 ab", ["123", "45", " ab"]),
        ("qwen2", "12345 ab", ["1", "2", "3", "4", "5", " ab"]),
    ],
)
def test_pre_tokenizer_families(pre, text, pieces):
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": ["a", "b"],
        "tokenizer.ggml.merges": [],
    }
    got = [p for p, _ in from_gguf_metadata(fields).hf.pre_tokenizer.pre_tokenize_str(text)]
    assert [p.replace("Ġ", " ") for p in got] == pieces


def test_unknown_tokenizer_kinds_are_named():
    with pytest.raises(TokenizerError, match="'mystery-pre'"):
        from_gguf_metadata(
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "mystery-pre", "tokenizer.ggml.tokens": ["a"]}
        )
    with pytest.raises(TokenizerError, match="'bert'"):
        from_gguf_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match="no tokenizer"):
        from_gguf_metadata({})


def test_hf_dir_and_gguf_tokenizers_agree(tmp_path):
    hf_dir, gguf_path = write_tiny_pair(tmp_path, "llama")
    from engine.loader import load_model

    a, b = from_hf_dir(hf_dir), load_model(gguf_path).tokenizer
    assert (a.vocab_size, a.bos_id, a.eos_id, a.special_ids) == (b.vocab_size, b.bos_id, b.eos_id, b.special_ids)
    assert (a.bos_token, a.eos_token) == ("<|im_start|>", "<|im_end|>")
    for text in REPLIES + ["<|im_start|>user\nHello, world! 12345<|im_end|>", "def f(x):\n    return x**2"]:
        ids = a.encode(text)
        assert ids == b.encode(text)
        assert a.decode(ids, skip_special=False) == b.decode(ids, skip_special=False) == text
        assert stream(a, ids)[1] == a.decode(ids)
    assert all(a.token_bytes(i) == b.token_bytes(i) for i in range(a.vocab_size))


def test_hf_dir_without_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        from_hf_dir(tmp_path)
