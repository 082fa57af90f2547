"""The AMX products (kernels/numba_amx.py: float, kernels/numba_amx_i8.py: int8): their data layouts everywhere, the
tile kernels on the CPU's tiles where it has them, and on emulated tiles (kernels/simd_amx.py) on every CPU; the
emulation itself against the instructions' definitions."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from kernels import numba_amx, numba_amx_i8, numba_layout, simd_amx
from kernels.numba_amx import GROUP, PARTS, ROWS, TILE
from kernels.numba_backend import NumbaBackend
from kernels.reference import int8_product, quantize_activations
from kernels.routes import AMX_MIN_ROWS, INT8_AMX_MAX_ROWS, MATVEC_MAX_ROWS
from kernels.weight import Weight, pack_q4, unpack_q4

NO_AMX = (
    "no AMX tiles here: the CPU lacks AMX-BF16/INT8 (Intel Sapphire Rapids or newer) or Linux did not grant the "
    "tile state; the emulated case checks the same kernel"
)
# The CPU's tiles (None) where it has them, emulated ones everywhere.
TILES = [
    pytest.param(None, id="cpu-tiles", marks=pytest.mark.skipif(not simd_amx.available(), reason=NO_AMX)),
    pytest.param("emulated", id="emulated-tiles"),
]


def tiles_for(mode: str | None) -> np.ndarray | None:
    """The kernels' `tiles` argument: one emulated state for each thread numba may run them on."""
    return None if mode is None else simd_amx.soft_tiles(numba.config.NUMBA_NUM_THREADS)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def half_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values that are float16 values, as GGUF's Q4_0/Q4_1/Q8_0 scales and mins are."""
    return (rng.standard_normal(shape) * 0.05).astype(np.float16).astype(np.float32)


def weight(kind: str, n: int, k: int, rng: np.random.Generator) -> Weight:
    g = k // GROUP
    if kind == "q4":
        return Weight(
            "q4",
            pack_q4(rng.integers(0, 16, (n, k), dtype=np.uint8)),
            half_values(rng, (n, g)),
            half_values(rng, (n, g)),
            GROUP,
        )
    return Weight("q8", rng.integers(-128, 128, (n, k), dtype=np.int8), half_values(rng, (n, g)), None, GROUP)


@pytest.mark.parametrize("T", [16, 37])
def test_activation_split_is_exact_and_laid_out_as_b_tiles(T):
    rng = np.random.default_rng(0)
    K = 96
    x = (rng.standard_normal((T, K)) * np.exp(rng.uniform(-30, 30, (T, K)))).astype(np.float32)
    x[0, :5] = [0.0, -0.0, 1.0, np.float32(3.4e38), np.float32(-1.0e-30)]  # parts stay normal floats down to ~1e-31
    TB, ng = -(-T // ROWS), K // GROUP
    xs = np.empty(PARTS * TB * ng * TILE, np.uint16)
    xsum = np.empty(TB * ng * ROWS, np.float32)
    numba_amx.split_rows(x, xs, xsum)

    parts = bf16_values(xs).reshape(PARTS, TB, ng, ROWS, ROWS, 2).astype(np.float64)
    # B tile (tb, g): row kp, column 2 t + e  <-  x[16 tb + t, 32 g + 2 kp + e]
    whole = parts.sum(axis=0).transpose(0, 3, 1, 2, 4).reshape(TB * ROWS, K)
    np.testing.assert_array_equal(whole[:T], x.astype(np.float64))  # the three parts add up to x exactly
    assert not whole[T:].any()
    sums = x.reshape(T, ng, GROUP).sum(axis=2, dtype=np.float64)
    got = xsum.reshape(TB, ng, ROWS).transpose(0, 2, 1).reshape(TB * ROWS, ng)
    bound = GROUP * 2.0**-24 * np.abs(x).reshape(T, ng, GROUP).sum(axis=2, dtype=np.float64)
    assert (np.abs(got[:T] - sums) <= bound).all()  # float32 sums of each group
    assert not got[T:].any()


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_weight_tiles_are_the_integers_exactly(kind):
    rng = np.random.default_rng(1)
    n, k = 22, 64  # the second 16-row tile runs past the layout's 24 rows
    w = weight(kind, n, k, rng)
    b = numba_layout.block_rows(w)  # the four-row order AMX CPUs keep (an AVX-512 VNNI one blocks q4 by 16)
    q = unpack_q4(w.data) if kind == "q4" else w.data
    for nb in range(2):
        for g in range(k // GROUP):
            a = np.full(TILE, 0xFFFF, np.uint16)
            numba_amx._q_tile(b.data, kind == "q4", 24, k // GROUP, nb, g, a)
            got = bf16_values(a).reshape(ROWS, GROUP)
            rows = range(nb * ROWS, min(n, nb * ROWS + ROWS))
            np.testing.assert_array_equal(got[: len(rows)], q[rows.start : rows.stop, g * GROUP : (g + 1) * GROUP])
            assert not got[len(rows) :].any()  # padding rows of the layout and rows past it


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("kind", ["q4", "q8"])
@pytest.mark.parametrize("T", [1, 15, 16, 17, 64, 65, 130])
@pytest.mark.parametrize("n, k", [(4, 32), (37, 96), (100, 1056)], ids=["4x32", "37x96", "100x1056"])
def test_amx_product_matches_float64(kind, T, n, k, tiles):
    rng = np.random.default_rng(T * 1000 + n)
    w = weight(kind, n, k, rng)
    b = NumbaBackend(2).prepare_linear(w).blocked
    x = rng.standard_normal((T, k)).astype(np.float32)
    out = np.full((T, n), np.nan, np.float32)
    minv, mf = b.min_operand()
    q = b.data.view(np.uint8)  # q8's bytes too, as the backend passes them
    numba_amx.matmul_amx(
        q, b.scale, minv, mf, kind == "q4", x, out, numba_amx.CONFIG, numba.get_num_threads(), tiles_for(tiles)
    )
    terms = np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T
    err = np.abs(out - x.astype(np.float64) @ w.dequantize().astype(np.float64).T)
    assert (err <= 4e-7 * terms + 1e-30).all(), err.max()  # float32 rounding of the sums, nothing coarser


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("kind", ["q4", "q4 zero 8", "q8"])
@pytest.mark.parametrize("T", [1, 16, 17, 33, 64, 65, 130])
@pytest.mark.parametrize("n, k", [(4, 32), (37, 96), (100, 1056)], ids=["4x32", "37x96", "100x1056"])
def test_amx_int8_product_is_the_int8_model(kind, T, n, k, tiles):
    rng = np.random.default_rng(T * 1000 + n + 7)
    w = weight(kind.split()[0], n, k, rng)
    if kind == "q4 zero 8":  # GGUF Q4_0: no mins, the scales times -8 in their place
        w = Weight("q4", w.data, w.scale, None, GROUP, zero=8)
    b = NumbaBackend(2).prepare_linear(w).blocked
    x = (rng.standard_normal((T, k)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    x[0, :GROUP] = 0  # a block whose int8 scale is 0
    out = np.full((T, n), np.nan, np.float32)
    minv, mf = b.min_operand()
    numba_amx_i8.matmul_amx_i8(
        b.data.view(np.uint8),
        b.scale,
        minv,
        mf,
        b.kind == "q4",
        x,
        out,
        numba_amx_i8.CONFIG,
        numba.get_num_threads(),
        tiles_for(tiles),
    )
    want = int8_product(x, w)
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    # float32 rounding of each group's terms; the int8 model itself is ~1% off the exact product
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 * np.abs(exact).max())


def test_int8_b_tiles_hold_four_bytes_of_sixteen_rows_a_row():
    rng = np.random.default_rng(4)
    T, K = 19, 96
    TB, ng = 2, 3
    x = (rng.standard_normal((T, K)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    x[0, :GROUP] = 0
    xq, xd = np.empty((T, K), np.int8), np.empty((T, ng), np.float32)
    xsum = np.empty((T, ng), np.float32)
    xb = np.full(TB * ng * numba_amx_i8.B_BYTES, 99, np.int8)
    xdt, xst = np.full(TB * ng * ROWS, 9, np.float32), np.full(TB * ng * ROWS, 9, np.float32)
    numba_amx_i8.pack_b(x, xq, xd, xsum, xb, xdt, xst)
    want_q, want_d = quantize_activations(x)  # the int8 model's activations
    np.testing.assert_array_equal(xq, want_q)
    np.testing.assert_allclose(xd, want_d, rtol=2e-7)  # max / 127, as a product with the reciprocal
    np.testing.assert_allclose(xsum, want_d * want_q.reshape(T, ng, GROUP).sum(axis=2), rtol=1e-6)
    tiles = xb.reshape(TB, ng, GROUP // 4, ROWS, 4)  # tile (tb, g): row k4, bytes 4 t .. 4 t + 3
    padded = np.zeros((TB * ROWS, K), np.int8)
    padded[:T] = xq
    for tb in range(TB):
        for g in range(ng):
            block = padded[tb * ROWS : (tb + 1) * ROWS, g * GROUP : (g + 1) * GROUP]  # [t, 32]
            np.testing.assert_array_equal(tiles[tb, g], block.reshape(ROWS, GROUP // 4, 4).transpose(1, 0, 2))
    for got, src in ((xdt, xd), (xst, xsum)):
        want = np.zeros((TB * ROWS, ng), np.float32)
        want[:T] = src
        np.testing.assert_array_equal(got.reshape(TB, ng, ROWS), want.reshape(TB, ROWS, ng).transpose(0, 2, 1))


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_int8_a_tiles_are_the_weights_integers(kind):
    rng = np.random.default_rng(6)
    n, k = 22, 64
    w = weight(kind, n, k, rng)
    b = numba_layout.block_rows(w)
    q = unpack_q4(w.data) if kind == "q4" else w.data
    for nb in range(2):
        for g in range(k // GROUP):
            a = np.full(numba_amx_i8.A_BYTES, 77, np.int8)
            numba_amx_i8.a_tile(b.data, kind == "q4", 24, k // GROUP, nb, g, a)
            got = a.reshape(ROWS, GROUP)
            rows = range(nb * ROWS, min(n, nb * ROWS + ROWS))
            np.testing.assert_array_equal(got[: len(rows)], q[rows.start : rows.stop, g * GROUP : (g + 1) * GROUP])
            assert not got[len(rows) :].any()


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_backend_routes_many_rows_of_float16_scaled_weights_to_the_tiles(tiles, activations):
    rng = np.random.default_rng(2)
    be = NumbaBackend(2, activations, caps=dataclasses.replace(NumbaBackend(2).caps, amx=True), emulate_amx=bool(tiles))
    without = NumbaBackend(2, activations, caps=dataclasses.replace(be.caps, amx=False))  # the same CPU, no tiles
    calls = []
    kernel = "amx_i8" if activations == "q8" else "amx_tiles"
    real = be.kernels[kernel]
    be.kernels[kernel] = lambda b, x, out, threads: calls.append(x.shape[0]) or real(b, x, out, threads)
    first = INT8_AMX_MAX_ROWS + 1 if activations == "q8" else AMX_MIN_ROWS
    half = weight("q4", 40, 64, rng)
    wide = Weight(
        "q8", rng.integers(-128, 128, (40, 64), dtype=np.int8), rng.random((40, 2), dtype=np.float32), None, GROUP
    )  # float32 scales
    assert be.prepare_linear(wide).blocked.scale.dtype == np.float32
    for w in (half, wide):
        lin = be.prepare_linear(w)
        for T in (first - 1, first, MATVEC_MAX_ROWS + 1):
            x = rng.standard_normal((T, 64)).astype(np.float32)
            on_tiles = w is half and first <= T
            assert be.route(T, lin).kernel.startswith("amx") == on_tiles
            want = without.linear(x, without.prepare_linear(w))  # the int8 model or the exact product, as `be`'s
            np.testing.assert_allclose(be.linear(x, lin), want, rtol=1e-5, atol=1e-5)
    assert calls == [first, MATVEC_MAX_ROWS + 1]


# ---- the emulation against the instructions' definitions ---------------------------------------------


def _emulated(shapes: dict[int, tuple[int, int]]) -> np.ndarray:
    st = simd_amx.soft_tiles(1)
    simd_amx._soft_config(st[0], simd_amx.config(shapes))
    return st


def _put(st: np.ndarray, reg: int, data: np.ndarray) -> None:
    """Tile `reg` = data's rows (bytes), through the emulated load."""
    rows = data.reshape(data.shape[0], -1).view(np.uint8)
    simd_amx._soft_load(st[0], reg, rows.reshape(-1), 0, rows.shape[1])


def _get(st: np.ndarray, reg: int, dtype: type, shape: tuple[int, int]) -> np.ndarray:
    out = np.zeros(shape, dtype)
    flat = out.reshape(-1)
    simd_amx._soft_store(st[0], reg, flat, 0, shape[1] * out.itemsize)
    return out


@pytest.mark.parametrize("a_signed", [False, True], ids=["tdpbusd", "tdpbssd"])
def test_emulated_int8_tile_product_is_the_instructions(a_signed):
    rng = np.random.default_rng(8)
    M, K, N = 13, 40, 11  # ragged: rows, bytes, columns below the tiles' most
    st = _emulated({0: (M, 4 * N), 4: (M, K), 7: (K // 4, 4 * N)})
    a = rng.integers(-128, 128, (M, K), dtype=np.int8) if a_signed else rng.integers(0, 256, (M, K), dtype=np.uint8)
    b = rng.integers(-128, 128, (K // 4, 4 * N), dtype=np.int8)
    c0 = rng.integers(-(2**20), 2**20, (M, N), dtype=np.int32)
    _put(st, 4, a)
    _put(st, 7, b)
    _put(st, 0, c0)
    simd_amx._soft_i8(st[0], 0, 4, 7, a_signed)
    # Intel's definition: C[m, n] += sum_k sum_i A[m, 4k + i] * B[k, 4n + i]
    want = c0 + np.einsum(
        "mki,kni->mn", a.astype(np.int64).reshape(M, K // 4, 4), b.astype(np.int64).reshape(K // 4, N, 4)
    )
    np.testing.assert_array_equal(_get(st, 0, np.int32, (M, N)), want)


def test_emulated_bf16_tile_product_is_the_instructions():
    rng = np.random.default_rng(9)
    M, K, N = 16, 64, 16
    st = _emulated({1: (M, 4 * N), 4: (M, K), 7: (K // 4, 4 * N)})
    a = (rng.standard_normal((M, K // 2)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = (rng.standard_normal((K // 4, 2 * N)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    _put(st, 4, a)
    _put(st, 7, b)
    simd_amx._soft_zero(st[0], 1)
    simd_amx._soft_bf16(st[0], 1, 4, 7)
    av, bv = bf16_values(a).astype(np.float64), bf16_values(b).astype(np.float64)
    # C[m, n] += sum_k A[m, 2k] B[k, 2n] + A[m, 2k + 1] B[k, 2n + 1]
    want = np.einsum("mke,kne->mn", av.reshape(M, K // 4, 2), bv.reshape(K // 4, N, 2))
    np.testing.assert_allclose(_get(st, 1, np.float32, (M, N)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fault",
    [
        "no configuration",
        "a tile left out",
        "A's depth is not B's rows",
        "C's width is not B's",
        "a tile named twice",
        "rows past the array",
        "stride under a row",
    ],
)
def test_emulated_tiles_raise_where_the_cpu_faults(fault):
    st = _emulated({0: (16, 64), 4: (16, 32), 7: (8, 64), 5: (16, 64), 6: (4, 64)})
    mem = np.zeros(1024, np.uint8)
    with pytest.raises(ValueError, match="AMX"):
        if fault == "no configuration":
            simd_amx._soft_release(st[0])
            simd_amx._soft_zero(st[0], 0)
        elif fault == "a tile left out":
            simd_amx._soft_zero(st[0], 3)
        elif fault == "A's depth is not B's rows":
            simd_amx._soft_i8(st[0], 0, 5, 7, False)  # A 64 bytes deep, B 8 rows
        elif fault == "C's width is not B's":
            simd_amx._soft_i8(st[0], 6, 4, 7, False)  # C 4 rows, A 16
        elif fault == "a tile named twice":
            simd_amx._soft_i8(st[0], 0, 4, 4, True)
        elif fault == "rows past the array":
            simd_amx._soft_load(st[0], 0, mem, 1, 64)  # 16 rows of 64 bytes from byte 1 of 1024
        else:
            simd_amx._soft_load(st[0], 0, mem, 0, 32)


# Compiled for a Sapphire Rapids target (AVX-512 and AMX: 16-lane vectors, as on an AMX CPU) in a fresh process
# with its own cache, whatever CPU runs the test: nothing is run, only compiled and read.
SPR_FEATURES = (
    "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+popcnt,+sse4.2,+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl,"
    "+avx512vnni,+avx512bf16,+amx-tile,+amx-int8,+amx-bf16,+evex512"
)
SPR_COMPILE = """
import json
from numba import types
from kernels import numba_amx, numba_amx_i8
from kernels.simd import LANES
arr = types.Array
operands = (arr(types.uint8, 1, "C"), arr(types.uint16, 1, "C"), arr(types.uint16, 1, "C"), types.float32,
            types.boolean, arr(types.float32, 2, "C"), arr(types.float32, 2, "C"), arr(types.uint8, 1, "C"), types.intp)
ops = ("ldtilecfg", "tileloadd", "tdpbusd", "tdpbssd", "tdpbf16ps", "tilezero", "tilestored", "tilerelease")
found = {"lanes": LANES}
for fn in (numba_amx_i8.matmul_amx_i8, numba_amx.matmul_amx):
    sig = (*operands, types.none)
    fn.compile(sig)
    asm = fn.inspect_asm(sig)
    found[fn.__name__] = sorted({op for op in ops if op in asm} | ({"zmm"} if "zmm" in asm else set()))
print(json.dumps(found))
"""


def test_the_cpu_kernels_assemble_to_the_tile_instructions_for_an_amx_cpu(tmp_path):
    # The CPU's specializations (tiles None) of both kernels hold the tile instructions and 16-lane vectors when
    # compiled for an AMX CPU (what runs on the tiles is checked on one, or emulated everywhere above).
    env = {**os.environ, "NUMBA_CPU_NAME": "sapphirerapids", "NUMBA_CPU_FEATURES": SPR_FEATURES}
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-c", SPR_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["lanes"] == 16
    common = ["ldtilecfg", "tileloadd", "tilerelease", "tilestored", "tilezero", "zmm"]
    assert found["matmul_amx_i8"] == sorted([*common, "tdpbssd", "tdpbusd"])
    assert found["matmul_amx"] == sorted([*common, "tdpbf16ps"])
