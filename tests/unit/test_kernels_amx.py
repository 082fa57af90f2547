"""The AMX product (kernels/numba_amx.py): its exact bf16 splits everywhere, its tiles where the CPU has them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernels import numba_amx, numba_layout
from kernels.numba_amx import GROUP, PARTS, ROWS, TILE
from kernels.numba_backend import NumbaBackend
from kernels.routes import AMX_MIN_ROWS, MATVEC_MAX_ROWS
from kernels.weight import Weight, pack_q4, unpack_q4

needs_amx = pytest.mark.skipif(
    not numba_amx.available(),
    reason="no AMX tiles here: the CPU lacks AMX-BF16 "
    "(Intel Sapphire Rapids or newer) or Linux did not grant the tile state",
)


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


@needs_amx
@pytest.mark.parametrize("kind", ["q4", "q8"])
@pytest.mark.parametrize("T", [1, 15, 16, 17, 64, 65, 130])
@pytest.mark.parametrize("n, k", [(4, 32), (37, 96), (100, 1056)], ids=["4x32", "37x96", "100x1056"])
def test_amx_product_matches_float64(kind, T, n, k):
    rng = np.random.default_rng(T * 1000 + n)
    w = weight(kind, n, k, rng)
    b = NumbaBackend(2).prepare_linear(w).blocked
    x = rng.standard_normal((T, k)).astype(np.float32)
    out = np.full((T, n), np.nan, np.float32)
    minv, mf = b.min_operand()
    numba_amx.matmul_amx(b.data, b.scale, minv, mf, kind == "q4", x, out, numba_amx.CONFIG, 2)
    terms = np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T
    err = np.abs(out - x.astype(np.float64) @ w.dequantize().astype(np.float64).T)
    assert (err <= 4e-7 * terms + 1e-30).all(), err.max()  # float32 rounding of the sums, nothing coarser


@needs_amx
def test_backend_routes_many_rows_of_float16_scaled_weights_to_amx(monkeypatch):
    rng = np.random.default_rng(2)
    be = NumbaBackend(2)
    without = NumbaBackend(2, caps=dataclasses.replace(be.caps, amx=False))  # the same CPU, its tiles unused
    calls = []
    real = numba_amx.matmul_amx
    monkeypatch.setattr(numba_amx, "matmul_amx", lambda *a: calls.append(a[5].shape[0]) or real(*a))
    half = weight("q4", 40, 64, rng)
    wide = Weight(
        "q8", rng.integers(-128, 128, (40, 64), dtype=np.int8), rng.random((40, 2), dtype=np.float32), None, GROUP
    )  # float32 scales
    assert be.prepare_linear(wide).blocked.scale.dtype == np.float32
    for w in (half, wide):
        lin = be.prepare_linear(w)
        for T in (AMX_MIN_ROWS - 1, AMX_MIN_ROWS, MATVEC_MAX_ROWS + 1):
            x = rng.standard_normal((T, 64)).astype(np.float32)
            assert (be.route(T, lin).kernel == "amx_tiles") == (w is half and T >= AMX_MIN_ROWS)
            want = without.linear(x, without.prepare_linear(w))
            np.testing.assert_allclose(be.linear(x, lin), want, rtol=1e-5, atol=1e-5)
    assert calls == [AMX_MIN_ROWS, MATVEC_MAX_ROWS + 1]
