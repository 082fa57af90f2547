"""Host-side planning for the CUDA kernels (no GPU involved): launch geometry, attention work plans,
weight panels, and the device layout of every weight kind."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _tiny_model import random_weight

from kernels import cuda_launch
from kernels.cuda_launch import (
    attention_plan,
    elementwise_blocks,
    gemv_geometry,
    gemv_tiled_geometry,
    panel_rows,
    row_threads,
)
from kernels.device_weight import F16_MAX, device_layout
from kernels.nvrtc import CUDA_DIR
from kernels.row_sampling import TABLE
from kernels.weight import Weight


@pytest.mark.parametrize(
    "file,names",
    [
        ("gemv.cu", ["GEMV_WARPS", "GEMV_ROWS", "GEMV_TILE_ROWS"]),
        ("paged_attention.cu", ["PA_WARPS", "PA_ROWS", "PA_MAX_DH"]),
        ("sample.cu", ["SAMPLE_THREADS"]),
    ],
)
def test_host_constants_match_the_kernel_sources(file, names):
    defines = dict(re.findall(r"^#define (\w+) (\d+)", (CUDA_DIR / file).read_text(), re.M))
    for name in names:
        assert int(defines[name]) == getattr(cuda_launch, name), name


def test_the_sampling_table_has_the_columns_the_kernel_reads():
    defines = dict(re.findall(r"^#define (\w+) (\d+)", (CUDA_DIR / "sample.cu").read_text(), re.M))
    assert int(defines["SAMPLE_COLUMNS"]) == len(TABLE)


@pytest.mark.parametrize("n_out,n_rows", [(1, 1), (70, 1), (576, 8), (49152, 9), (3, 32)])
def test_gemv_grid_covers_every_output_and_row_once(n_out, n_rows):
    (gx, gy), (threads,) = gemv_geometry(n_out, n_rows)
    warps = threads // 32
    assert warps == cuda_launch.GEMV_WARPS
    assert (gy - 1) * warps < n_out <= gy * warps
    assert (gx - 1) * cuda_launch.GEMV_ROWS < n_rows <= gx * cuda_launch.GEMV_ROWS


@pytest.mark.parametrize("n_out,n_rows", [(1, 1), (70, 1), (576, 8), (49152, 9), (3, 32)])
def test_tiled_gemv_grid_covers_every_output_and_row_once(n_out, n_rows):
    (gx, gy), (threads,) = gemv_tiled_geometry(n_out, n_rows)
    per_block = threads // 32 * cuda_launch.GEMV_TILE_ROWS
    assert (gy - 1) * per_block < n_out <= gy * per_block
    assert (gx - 1) * cuda_launch.GEMV_ROWS < n_rows <= gx * cuda_launch.GEMV_ROWS


def test_gemv_takes_only_few_rows_and_a_grid_it_can_launch():
    with pytest.raises(AssertionError):
        gemv_geometry(10, cuda_launch.GEMV_MAX_ROWS + 1)
    assert gemv_geometry(128256, 32)[0] == (4, 32064)  # Llama 3's vocabulary: grid y stays under 65536
    with pytest.raises(AssertionError):
        gemv_geometry(65536 * cuda_launch.GEMV_WARPS, 1)


def test_thread_counts_are_whole_warps_within_limits():
    assert [row_threads(n) for n in (1, 32, 33, 288, 5000)] == [32, 32, 64, 288, 1024]
    assert elementwise_blocks(1) == 1 and elementwise_blocks(257) == 2
    assert elementwise_blocks(10**9) == cuda_launch.MAX_BLOCKS


@pytest.mark.parametrize("n_out,k,scratch", [(70, 64, 64 * 10), (49152, 576, 1 << 24), (100, 64, 64), (5, 64, 10**6)])
def test_panels_tile_the_weight(n_out, k, scratch):
    rows = panel_rows(n_out, k, scratch)
    assert 1 <= rows <= n_out and rows * k <= scratch
    assert rows == n_out or rows <= 64 or rows % 64 == 0


def test_attention_plan_splits_decode_rows_from_prefill_tiles():
    # seqs: decode, 37-row prefill, decode, 16-row prefill, 17-row prefill
    qs = np.cumsum([0, 1, 37, 1, 16, 17])
    decode, items = attention_plan(qs)
    assert decode.dtype == np.int32 and decode.tolist() == [0, 2]
    tile = cuda_launch.PA_WARPS * cuda_launch.PA_ROWS
    assert items.dtype == np.int32 and items.shape[1] == 2
    assert items.tolist() == [[1, 0], [1, tile], [1, 2 * tile], [3, 0], [4, 0], [4, tile]]
    covered = {(b, r0 + i) for b, r0 in items.tolist() for i in range(tile) if r0 + i < np.diff(qs)[b]}
    assert len(covered) == 37 + 16 + 17


def test_attention_plan_of_decode_only_and_prefill_only_steps():
    decode, items = attention_plan(np.arange(6))
    assert decode.tolist() == list(range(5)) and items.shape == (0, 2)
    decode, items = attention_plan(np.array([0, 5]))
    assert decode.shape == (0,) and items.tolist() == [[0, 0]]


@pytest.mark.parametrize("kind", ["q4", "q8", "f16", "f32"])
def test_device_layout_keeps_these_kinds_as_they_are(kind):
    w = random_weight(kind, 8, 64, np.random.default_rng(0))
    assert device_layout(w) is w


def test_bf16_becomes_float16_exactly():
    w = random_weight("bf16", 8, 64, np.random.default_rng(0))
    d = device_layout(w)
    assert d.kind == "f16" and d.data.dtype == np.float16
    np.testing.assert_array_equal(d.dequantize(), w.dequantize())


def test_bf16_beyond_float16_range_stays_float32():
    values = np.full((2, 32), 1.0, dtype=np.float32)
    values[1, 3] = 2 * F16_MAX
    w = Weight("bf16", (values.view(np.uint32) >> 16).astype(np.uint16))
    d = device_layout(w)
    assert d.kind == "f32" and d.data[1, 3] > F16_MAX
    np.testing.assert_array_equal(d.data, w.dequantize())


def test_device_layout_rejects_shapes_the_kernels_cannot_take():
    with pytest.raises(ValueError, match="multiple of 32"):
        device_layout(
            Weight("q4", np.zeros((2, 24), np.uint8), np.ones((2, 1), np.float32), np.zeros((2, 1), np.float32), 32)
        )
    with pytest.raises(ValueError, match="multiple of 16"):
        device_layout(Weight("q8", np.zeros((2, 24), np.int8), np.ones((2, 3), np.float32), None, 8))
