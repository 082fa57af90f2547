"""The start-up parity gate (kernels/gate.py): each route the prepared weights take, checked once against the
NumPy reference; a planted wrong kernel is caught, retired, and its products go to the next route."""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import replace

import numpy as np
import pytest

import kernels
from kernels import gate
from kernels.cpu import CpuCaps
from kernels.gate import sample_activations, sample_weight
from kernels.numba_backend import NumbaBackend
from kernels.numpy_backend import NumpyBackend
from kernels.reference import exact_product
from kernels.routes import INT8_AMX_MAX_ROWS, ROW_CLASSES, Form, Route, gguf_forms

HERE = CpuCaps.detect()


def model_forms(caps: CpuCaps) -> list[Form]:
    """The default model's forms (Q4_1 matrices, a Q8_0 head) and a Q4_0 file's, as this CPU holds them."""
    forms = gguf_forms(caps)
    return [forms["Q4_1"], forms["Q4_0"], forms["Q8_0"]]


# This CPU's routes, and an AMX CPU's on the tiles (emulated where this CPU has none: the id says so).
CPUS = ["this-cpu", "amx-cpu-tiles" if HERE.amx else "amx-emulated-tiles"]


def prepared(activations: str = "f32", cpu: str = "this-cpu") -> tuple[NumbaBackend, list]:
    amx = cpu != "this-cpu"
    be = NumbaBackend(2, activations, caps=replace(HERE, amx=HERE.amx or amx), emulate_amx=amx and not HERE.amx)
    rng = np.random.default_rng(5)
    lins = [be.prepare_linear(sample_weight(f, rng)) for f in model_forms(be.caps)]
    assert be.forms == set(model_forms(be.caps))
    return be, lins


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_the_gate_checks_every_route_the_weights_take_and_all_pass(activations, cpu):
    be, lins = prepared(activations, cpu)
    checks = be.check_routes()
    taken = {(lin.form.label, str(be.route(rows, lin))) for lin in lins for rows in ROW_CLASSES}
    assert {(c.form, c.route) for c in checks} == taken
    assert all(c.ok and c.error <= gate.BOUND for c in checks), [str(c) for c in checks]
    assert not be.retired and be.route_checks == checks


def _planted(real, where: str):
    """A kernel that is right but for one value: what a misread group or a stale scale looks like, at its least."""

    def wrong(b, x, out, threads):
        real(b, x, out, threads)
        out[-1, 3] += 1e-3 * np.abs(out).max()

    wrong.__name__ = f"wrong_{where}"
    return wrong


@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_a_planted_wrong_kernel_fails_the_gate_and_its_products_take_the_next_route(activations, caplog):
    be, lins = prepared(activations)
    decode = be.route(1, lins[0])  # the default model's decode route on this CPU
    be.kernels[decode.kernel] = _planted(be.kernels[decode.kernel], decode.kernel)
    with caplog.at_level(logging.WARNING, logger="forge.kernels"):
        checks = be.check_routes()
    failed = [c for c in checks if not c.ok]
    assert failed and {c.route for c in failed} == {str(decode)}
    assert decode.kernel in be.retired
    assert any(decode.kernel in r.message and "failed its check" in r.message for r in caplog.records)
    replacement = be.route(1, lins[0])
    assert replacement.kernel != decode.kernel and failed[0].replaced_by == str(replacement)
    assert any(c.ok and c.route == str(replacement) for c in checks)  # the replacement was checked in turn
    w = sample_weight(lins[0].form, np.random.default_rng(9))
    lin = be.prepare_linear(w)
    x = sample_activations(np.random.default_rng(3), 1)
    want = exact_product(x, w)
    assert np.abs(be.linear(x, lin) - want).max() <= 2e-2 * np.abs(want).max()  # int8 or exact: right, not planted


@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_a_planted_wrong_tile_kernel_fails_the_gate_on_an_amx_cpu(activations, caplog):
    # The tiles' kernels on an AMX CPU (emulated tiles where this CPU has none): a wrong int8 tile kernel gives
    # its prompts to the float tiles; wrong float tiles give theirs to the panels.
    be, lins = prepared(activations, CPUS[1])
    many = INT8_AMX_MAX_ROWS + 1
    tiles = be.route(many, lins[0])
    assert tiles.kernel == ("amx_i8" if activations == "q8" else "amx_tiles")
    be.kernels[tiles.kernel] = _planted(be.kernels[tiles.kernel], tiles.kernel)
    with caplog.at_level(logging.WARNING, logger="forge.kernels"):
        checks = be.check_routes()
    assert {c.route for c in checks if not c.ok} == {str(tiles)}
    replacement = be.route(many, lins[0])
    assert replacement == (Route("amx_tiles", "f32", 4) if activations == "q8" else Route("panels", "f32", 4))
    assert any(c.ok and c.route == str(replacement) for c in checks)
    assert any(tiles.kernel in r.message and str(replacement) in r.message for r in caplog.records)


def test_a_kernel_that_raises_is_retired_like_a_wrong_one():
    be, lins = prepared()
    decode = be.route(1, lins[2])

    def boom(b, x, out, threads):
        raise FloatingPointError("planted")

    be.kernels[decode.kernel] = boom
    checks = be.check_routes()
    assert any(not c.ok and c.error == float("inf") and c.route == str(decode) for c in checks)
    assert be.route(1, lins[2]).kernel != decode.kernel


def test_with_no_route_left_the_gate_refuses_to_serve(monkeypatch):
    be, lins = prepared()
    broken = np.zeros((1, 1), np.float32)
    for kernel in list(be.kernels):
        be.kernels[kernel] = _planted(be.kernels[kernel], kernel)
    monkeypatch.setattr(be, "_panels_gemm", lambda x, w: broken)  # the last route, wrong too
    with pytest.raises(RuntimeError, match="no kernel route left"):
        be.check_routes()


def test_the_numpy_reference_passes_its_own_gate():
    checks = NumpyBackend().check_routes()
    assert len(checks) == len(gate.GPU_FORMS) * len(gate.GPU_ROWS) and all(c.ok for c in checks)


class _StandInGpu(NumpyBackend):
    """A stand-in for a GPU backend (no GPU here): the NumPy reference's products, one value off when `wrong`."""

    name = "cupy"
    device_name = "stand-in GPU"
    wrong = False

    def linear(self, x, w, bias=None):
        out = super().linear(x, w, bias)
        if self.wrong:
            out[0, 0] += 1.0
        return out

    def check_routes(self):
        return gate.check_products(self)  # as CupyBackend's: the GPU bound


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong"])
def test_auto_never_picks_a_stand_in_gpu_whose_products_fail_the_gate(monkeypatch, wrong):
    monkeypatch.setattr(kernels, "cupy_unavailable_reason", lambda: None)
    stand_in = types.ModuleType("kernels.cupy_backend")
    stand_in.CupyBackend = type("CupyBackend", (_StandInGpu,), {"wrong": wrong})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kernels.cupy_backend", stand_in)
    chosen = kernels.get_backend("auto", threads=2)
    if wrong:
        assert chosen.name == "numba" and "failed the parity check" in chosen.choice
        with pytest.raises(kernels.BackendUnavailable, match="failed the parity check"):
            kernels.get_backend("cupy")
    else:
        assert chosen.name == "cupy" and "stand-in GPU" in chosen.choice
