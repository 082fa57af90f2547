"""kernels/thread_tuner.py: the CPU backend's thread count follows the steps' measured times."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.thread_tuner import ThreadTuner


def run(tuner: ThreadTuner, steps: int, cost: dict[int, float], rows: int = 1) -> list[int]:
    """`steps` steps whose time on n threads is cost[n]; the thread counts chosen."""
    chosen = []
    for _ in range(steps):
        n = tuner.choose(rows)
        tuner.record(rows, n, cost[n])
        chosen.append(n)
    return chosen


def test_settings_are_all_threads_and_one_fewer():
    assert ThreadTuner(2).options == [2, 1]
    assert ThreadTuner(16).options == [16, 15]
    assert ThreadTuner(1).options == [1]


def test_starts_on_all_threads_then_keeps_the_faster_and_probes_the_other():
    tuner = ThreadTuner(2, probe_every=8)
    chosen = run(tuner, 64, {2: 0.006, 1: 0.0070})  # close: probed every 8th step
    assert chosen[:7] == [2] * 7  # no probe before the 8th step: a short run pays nothing
    assert [i for i, n in enumerate(chosen, 1) if n == 1] == list(range(8, 65, 8))  # only the probes


def test_probes_a_setting_far_behind_four_times_less_often():
    tuner = ThreadTuner(2, probe_every=8)
    chosen = run(tuner, 96, {2: 0.006, 1: 0.010})  # 1.67x apart
    assert [i for i, n in enumerate(chosen, 1) if n == 1] == [8, 32, 64, 96]


def test_moves_to_the_faster_setting_after_its_first_probe():
    tuner = ThreadTuner(2, probe_every=8)
    chosen = run(tuner, 64, {2: 0.010, 1: 0.006})
    assert chosen[:8] == [2] * 7 + [1]
    assert chosen[8:] == [1] * 23 + [2] + [1] * 31 + [2]


def test_follows_a_busy_core_and_comes_back_when_it_is_gone():
    tuner = ThreadTuner(2, probe_every=8, window=3)
    run(tuner, 32, {2: 0.006, 1: 0.010})
    busy = run(tuner, 64, {2: 0.050, 1: 0.011})  # another process took a core
    assert busy.index(1) <= 2  # two slow steps move the median
    assert busy[-40:].count(2) <= 40 // 32 + 1  # two threads only as probes, far apart
    quiet = run(tuner, 64, {2: 0.006, 1: 0.010})
    back = quiet.index(2)  # the first probe of two threads comes out faster: taken back at once
    assert back < 8 * 4 and quiet[back + 1 :].count(1) <= 64 // 32


def test_one_slow_probe_does_not_flip_the_choice():
    tuner = ThreadTuner(2, probe_every=4, window=3)
    run(tuner, 16, {2: 0.006, 1: 0.010})
    tuner.record(1, 2, 0.5)  # a single outlier (the machine hiccuped)
    assert run(tuner, 3, {2: 0.006, 1: 0.010}) == [2, 2, 2]


def test_step_sizes_are_tuned_apart():
    """Prefill-sized steps may prefer another setting than single-row decode steps."""
    tuner = ThreadTuner(2, probe_every=5)
    decode = run(tuner, 20, {2: 0.006, 1: 0.010}, rows=1)
    prefill = run(tuner, 20, {2: 0.9, 1: 0.5}, rows=500)
    assert decode == [2] * 4 + [1] + [2] * 14 + [1]  # probes: step 5, then (far behind) step 20
    assert prefill == [2] * 4 + [1] * 15 + [2]


@pytest.mark.parametrize("threads", [1, 2])
def test_numba_backend_results_do_not_depend_on_the_thread_count(threads):
    """The tuner may switch threads at any step: a product's result must not change with them."""
    from kernels.numba_backend import NumbaBackend
    from kernels.weight import Weight, pack_q4

    rng = np.random.default_rng(0)
    w = Weight(
        "q4",
        pack_q4(rng.integers(0, 16, (203, 256), dtype=np.uint8)),
        rng.random((203, 8), dtype=np.float32),
        rng.random((203, 8), dtype=np.float32),
        32,
    )
    be = NumbaBackend(threads=2)
    lin = be.prepare_linear(w)
    x = rng.standard_normal((5, 256), dtype=np.float32)
    be.begin_step()
    want = be.linear(x, lin)
    be.tuner.options = [threads]  # force the setting under test
    be.begin_step(5)
    assert be.active_threads == threads
    got = be.linear(x, lin)
    be.end_step(0.001)
    np.testing.assert_array_equal(got, want)
