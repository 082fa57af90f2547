"""The route table (kernels/routes.py): which kernel a product takes on each CPU kind, for each weight form the
loader makes and each row count, in both activation modes. Pure policy: it runs on any CPU, simulated ones
included, and a change to it shows here as a changed row."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import routes
from kernels.cpu import SIMULATED, CpuCaps
from kernels.routes import TABLE_ROWS, Form, Route


def table(cpu: str, activations: str) -> dict[str, list[str]]:
    return {name: [str(r) for r in row] for name, row in routes.table(SIMULATED[cpu], activations).items()}


# Each row: the routes at TABLE_ROWS activation rows (1, 11, 12, 32, 33, 40, 41, 512).
M4, M4S, M8, I8 = "matvec_q4 (f32)", "matvec_q4_split (pieces)", "matvec_q8 (f32)", "matvec_i8 (int8)"
X16, X16I = "x16_split (pieces)", "x16_i8 (int8)"
P, B, A, AI8 = "panels (f32)", "blas (f32)", "amx_tiles (f32)", "amx_i8 (int8)"
FLOATS = {"F16": [P] * 8, "BF16": [P] * 8, "F32": [B] * 8}
AVX2_F32 = {
    "Q4_0": [M4] * 6 + [P] * 2,
    "Q4_1": [M4] * 6 + [P] * 2,
    "Q8_0": [M8] * 6 + [P] * 2,
    "Q4_K": [M4] * 6 + [P] * 2,
    "Q6_K": [M8] * 6 + [P] * 2,
    **FLOATS,
}
AVX2_Q8 = {"Q4_0": [I8] * 8, "Q4_1": [I8] * 8, "Q8_0": [I8] * 8, "Q4_K": [I8] * 8, "Q6_K": [M8] * 6 + [P] * 2, **FLOATS}
VNNI_F32 = {**AVX2_F32, "Q4_0": [X16] * 8, "Q4_1": [X16] * 8, "Q4_K": [X16] * 8}
VNNI_Q8 = {**AVX2_Q8, "Q4_0": [X16I] * 8, "Q4_1": [X16I] * 8, "Q4_K": [X16I] * 8}
AMX_F32 = {
    **AVX2_F32,
    "Q4_0": [M4S] * 2 + [A] * 6,  # four-row q4 as int8 pieces below the tiles
    "Q4_1": [M4S] * 2 + [A] * 6,
    "Q8_0": [M8] * 2 + [A] * 6,
    "Q4_K": [M4S] * 6 + [P] * 2,  # float32 scales: no tiles
}
AMX_Q8 = {**AVX2_Q8, "Q4_0": [I8] * 4 + [AI8] * 4, "Q4_1": [I8] * 4 + [AI8] * 4, "Q8_0": [I8] * 4 + [AI8] * 4}
EXPECTED = {
    ("avx2", "f32"): AVX2_F32,
    ("avx2", "q8"): AVX2_Q8,
    ("avx2-no-f16c", "f32"): AVX2_F32,
    ("avx2-no-f16c", "q8"): AVX2_Q8,
    ("avx512-vnni", "f32"): VNNI_F32,
    ("avx512-vnni", "q8"): VNNI_Q8,
    ("amx", "f32"): AMX_F32,
    ("amx", "q8"): AMX_Q8,
}
# Without F16C nothing keeps float16 scales, so the tiles, which read only those, would be out of reach: no AMX
# CPU lacks F16C, and the table has no such row.


@pytest.mark.parametrize(("cpu", "activations"), sorted(EXPECTED))
def test_route_table_on_each_cpu_kind(cpu, activations):
    assert TABLE_ROWS == (1, 11, 12, 32, 33, 40, 41, 512)
    assert table(cpu, activations) == EXPECTED[cpu, activations]


def test_q8_activations_are_int8_on_every_cpu():
    # README and --help say it: with --activations q8 every product over groups of 32 is int8, on every CPU kind and
    # at every row count (AMX's products of many rows on its int8 tiles); groups of 16 (Q6_K) stay float32.
    for cpu, caps in SIMULATED.items():
        for name, form in routes.gguf_forms(caps).items():
            for rows in TABLE_ROWS:
                r = routes.route(rows, form, caps, "q8")
                assert r.int8 == bool(form.stripe and form.group == 32), (cpu, name, rows, r)


def test_every_fallback_ends_on_the_panels_which_read_every_layout():
    for kernel in routes.BLOCKED_KERNELS:
        r: Route | None = Route(kernel, "f32", 16 if kernel.startswith("x16") else 4)
        seen = []
        while r is not None:
            seen.append(r.kernel)
            r = routes.fallback(r)
        assert seen[-1] == "panels" and len(seen) <= 3, seen
    assert routes.fallback(Route("amx_i8", "int8", 4)) == Route("amx_tiles", "f32", 4)  # exact, still on the tiles
    assert routes.fallback(Route("blas")) is None


def test_a_backend_refuses_capabilities_this_cpu_lacks_and_takes_narrower_ones():
    from kernels.numba_backend import NumbaBackend

    here = CpuCaps.detect()
    wider = CpuCaps(f16c=True, vnni512=True, amx=True)
    if wider.within(here):
        pytest.skip("this CPU has every capability the routes know: nothing wider to refuse")
    with pytest.raises(ValueError, match="this CPU lacks"):
        NumbaBackend(2, caps=wider)
    be = NumbaBackend(2, caps=CpuCaps())  # AVX2 without F16C: float32 scales, four-row blocks
    w = routes_weight()
    lin = be.prepare_linear(w)
    assert lin.form == Form("q4", 32, False, 4, True) and be.route(1, lin) == Route("matvec_q4", "f32", 4)


def routes_weight():
    from kernels.weight import Weight, pack_q4

    rng = np.random.default_rng(0)
    half = rng.uniform(0.01, 0.1, (8, 2)).astype(np.float16).astype(np.float32)
    return Weight("q4", pack_q4(rng.integers(0, 16, (8, 64), dtype=np.uint8)), half, half, 32)
