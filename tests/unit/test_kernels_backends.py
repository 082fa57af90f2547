"""The backends' shared face: every backend class offers the whole Backend protocol (warm_up
included), the CPU backends compose kernels/host_ops.py instead of inheriting one another, and the
numba backend's process-wide settings are made by get_backend, not by importing it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kernels
from kernels.cupy_backend import CupyBackend
from kernels.numba_backend import NumbaBackend
from kernels.numpy_backend import NumpyBackend

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_METHODS = sorted(
    name for name, value in vars(kernels.Backend).items() if callable(value) and not name.startswith("_")
)


def test_the_protocol_names_warm_up():
    assert "warm_up" in PROTOCOL_METHODS and "linear" in PROTOCOL_METHODS


@pytest.mark.parametrize("cls", [NumpyBackend, NumbaBackend, CupyBackend], ids=lambda c: c.__name__)
def test_every_backend_class_offers_every_protocol_method(cls):
    missing = [name for name in PROTOCOL_METHODS if not callable(getattr(cls, name, None))]
    assert not missing, f"{cls.__name__} lacks {missing}"
    assert isinstance(cls.name, str) and cls.name


def test_the_numba_backend_composes_the_host_ops_rather_than_inheriting_the_reference():
    assert not issubclass(NumbaBackend, NumpyBackend)
    from kernels import host_ops

    for name in ("rope", "write_kv", "argmax_rows", "empty_kv_cache", "apply_token_bitmask"):
        assert getattr(NumbaBackend, name) is getattr(host_ops, name) is getattr(NumpyBackend, name)


def test_numpy_warm_up_is_a_no_op_that_reports_nothing():
    seen: list = []
    assert NumpyBackend().warm_up(lambda *a: seen.append(a)) is None
    assert seen == []


def test_numba_warm_up_reports_each_stage_in_order_and_again_the_same():
    be = NumbaBackend(threads=1)
    seen: list[tuple[int, int, str]] = []
    be.warm_up(lambda i, n, what: seen.append((i, n, what)))
    n = len(seen)
    assert n >= 5 and [s[0] for s in seen] == list(range(1, n + 1)) and {s[1] for s in seen} == {n}
    assert all(isinstance(s[2], str) and s[2] for s in seen)
    again: list[tuple[int, int, str]] = []
    be.warm_up(lambda i, n, what: again.append((i, n, what)))
    assert again == seen
    be.warm_up()  # no progress callback


_PROBE = """
import json, os, sys
import numba
layer0, spin0 = numba.config.THREADING_LAYER, os.environ.get("GOMP_SPINCOUNT")
import kernels.numba_backend
after_import = (numba.config.THREADING_LAYER, os.environ.get("GOMP_SPINCOUNT"))
from threadpoolctl import threadpool_info
blas_after_import = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
import kernels
kernels.get_backend("numba", 1)
after_get = (numba.config.THREADING_LAYER, os.environ.get("GOMP_SPINCOUNT"))
blas_after_get = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
print(json.dumps([[layer0, spin0], after_import, after_get, blas_after_import, blas_after_get]))
"""


def test_importing_the_numba_backend_changes_no_process_setting_and_get_backend_makes_them():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "2", "HOME": str(Path.home())}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after_import, after_get, blas_import, blas_get = json.loads(done.stdout.strip().splitlines()[-1])
    assert before[1] is None  # the probe starts clean
    assert after_import == before
    assert after_get == ["threadsafe", "3000"]
    if blas_import:  # an OpenBLAS is loaded: its threads are the environment's until get_backend
        assert blas_import == [2] * len(blas_import) and blas_get == [1] * len(blas_get)


def test_a_user_set_spincount_wins(monkeypatch):
    from kernels.numba_backend import configure_process

    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    configure_process()
    import os

    assert os.environ["GOMP_SPINCOUNT"] == "7"


def test_the_shared_host_ops_give_the_same_results_on_both_cpu_backends():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2, 8), dtype=np.float32)
    cos, sin = NumpyBackend.rope_cos_sin(np.ones(4, np.float32), np.arange(3))
    a, b = NumpyBackend().rope(x.copy(), cos, sin), NumbaBackend(1).rope(x.copy(), cos, sin)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, x)  # it did rotate
