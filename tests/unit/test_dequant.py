"""engine/loader/quant.py's NumPy dequantizers against llama.cpp's gguf-py reference."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.loader import quant, resolve_model_path
from engine.loader.gguf_file import read_gguf
from engine.loader.quant import GGML_TYPES, SUPPORTED_TYPES, dequantize

QUANTIZED = sorted(t for t in SUPPORTED_TYPES if GGML_TYPES[t].block_size > 1)


def _reference(raw: np.ndarray, type_id: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(type_id))


def test_supported_set_covers_the_common_gguf_types():
    names = {GGML_TYPES[t].name for t in SUPPORTED_TYPES}
    assert {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"} <= names


def test_block_sizes_agree_with_gguf_py():
    for tid, t in GGML_TYPES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tid)] == (t.block_size, t.type_size), t.name


def random_blocks(type_id: int, rows: int, blocks_per_row: int, rng: np.random.Generator) -> np.ndarray:
    """Random raw blocks [rows, bytes]; every block but the last has finite half-float scales
    (random scale bytes can be NaN/inf halves: keep most finite so values are compared, not NaNs)."""
    t = GGML_TYPES[type_id]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row * t.type_size), dtype=np.uint8)
    f16_at = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 10: [80, 82], 11: [108], 12: [0, 2], 13: [0, 2], 14: [208]}[
        type_id
    ]
    blocks = raw.reshape(rows * blocks_per_row, t.type_size)
    for at in f16_at:
        blocks[:-1, at : at + 2] = rng.standard_normal(len(blocks) - 1).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


@pytest.mark.parametrize("type_id", QUANTIZED, ids=lambda t: GGML_TYPES[t].name)
def test_random_blocks_bit_equal_to_gguf_py(type_id):
    t = GGML_TYPES[type_id]
    rows, blocks_per_row = 7, 3
    raw = random_blocks(type_id, rows, blocks_per_row, np.random.default_rng(type_id))
    want = _reference(raw, type_id)
    got = dequantize(raw, type_id, (rows, blocks_per_row * t.block_size))
    assert got.dtype == np.float32 and got.flags.c_contiguous
    assert got.shape == want.shape
    assert np.isfinite(got[:-1]).all()
    np.testing.assert_array_equal(got, want)  # NaN-aware, bit-for-bit otherwise


@pytest.mark.parametrize("type_id", QUANTIZED, ids=lambda t: GGML_TYPES[t].name)
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:overflow:RuntimeWarning")
def test_chunk_boundaries_do_not_matter(type_id, monkeypatch):
    t = GGML_TYPES[type_id]
    raw = np.random.default_rng(1).integers(0, 256, size=(37 * t.type_size,), dtype=np.uint8)
    whole = dequantize(raw, type_id, (37 * t.block_size,))
    monkeypatch.setattr(quant, "_CHUNK_VALUES", 5 * t.block_size)  # 8 chunks, the last one partial
    np.testing.assert_array_equal(dequantize(raw, type_id, (37 * t.block_size,)), whole)


@pytest.mark.parametrize("type_id, np_dtype", [(0, np.float32), (1, np.float16)])
def test_float_types(type_id, np_dtype):
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np_dtype)
    got = dequantize(x.view(np.uint8), type_id, (3, 5))
    np.testing.assert_array_equal(got, x.astype(np.float32))
    assert got.dtype == np.float32
    assert not np.shares_memory(got, x)


def test_bf16_is_the_top_half_of_float32():
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    got = dequantize(bits.view(np.uint8), 30, (64,))
    np.testing.assert_array_equal(got, _reference(bits.view(np.uint8), 30).reshape(-1))
    np.testing.assert_array_equal(got.view(np.uint32) & 0xFFFF, 0)
    assert np.abs(got - x).max() <= np.abs(x).max() * 2**-7


def test_unsupported_type_and_wrong_sizes_raise():
    with pytest.raises(ValueError, match="IQ2_XXS"):
        dequantize(np.zeros(66, np.uint8), 16, (256,))
    with pytest.raises(ValueError, match="unknown type id 99"):
        dequantize(np.zeros(4, np.uint8), 99, (1,))
    with pytest.raises(ValueError, match="needs 40 bytes, got 39"):
        dequantize(np.zeros(39, np.uint8), 3, (64,))
    with pytest.raises(ValueError, match="whole number of Q4_0 blocks"):
        dequantize(np.zeros(18, np.uint8), 2, (31,))


def test_default_model_tensors_bit_equal_to_gguf_py():
    """Every tensor type in the real default model file (Q8_0 embeddings, Q4_1 matrices, F32 norms)."""
    g = read_gguf(resolve_model_path("default"))
    seen = set()
    for t in g.tensors.values():
        if t.type_id in seen and not t.name.startswith("blk.29."):
            continue  # one tensor per type, plus all of the last layer
        seen.add(t.type_id)
        rows = g.raw(t.name).reshape(t.shape[0] if len(t.shape) > 1 else 1, -1)
        if t.name == "token_embd.weight":
            rows = rows[::53]  # a spread of the 49152 rows keeps this quick
        shape = (rows.shape[0], *t.shape[1:]) if len(t.shape) > 1 else t.shape
        want = _reference(rows, t.type_id).reshape(shape)
        np.testing.assert_array_equal(dequantize(rows, t.type_id, shape), want, err_msg=t.name)
    assert {GGML_TYPES[i].name for i in seen} == {"Q8_0", "Q4_1", "F32"}
