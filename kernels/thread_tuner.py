"""How many kernel threads a step should use, chosen from the steps' own timings.

On a quiet machine every core helps, and kernel threads that spin briefly between the ~120
parallel launches of a decode step make all cores worth it. When another process takes a core,
the team waits at every launch for the thread that shares that core, and a step gets slower than
on one thread fewer. No fixed setting is right for both, so the backend tries them: steps are
grouped by size (rows, in powers of two), each group runs on the setting with the lower recent
step time, and every `probe_every`-th step of a group runs on the other one so that its time stays
current. A probe costs at most one slower step in `probe_every`, and a group's first
`probe_every` - 1 steps run on all threads. While the other setting's recent steps were `far`
(1.25x) or more behind, it is probed `far_every` times less often: such a probe costs a much slower
step for little news (with two settings far apart on every step size, frequent probes cost a few
percent of the throughput). A probe that comes out faster than the chosen setting replaces its
older times, so that a setting that was slow while another process held a core is taken back at once.

The settings are all the threads, and one fewer (which leaves a taken core to its taker): on
2 cores, 2 and 1. The thread count does not change any result (every output row is computed by one
thread in a fixed order), only the time.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Group:
    steps: int = 0
    seconds: dict[int, deque[float]] = field(default_factory=dict)


class ThreadTuner:
    """`choose(rows)` before a step, `record(rows, threads, seconds)` after it."""

    def __init__(
        self, threads: int, probe_every: int = 16, window: int = 3, far: float = 1.25, far_every: int = 4
    ) -> None:
        self.options = sorted({threads, max(1, threads - 1)}, reverse=True)
        self.probe_every, self.window = probe_every, window
        self.far, self.far_every = far, far_every
        self._groups: dict[int, _Group] = {}

    def choose(self, rows: int) -> int:
        """The thread count for a step of `rows` activation rows: all threads until a probe has timed
        the other setting, then the faster of the two."""
        group = self._group(rows)
        group.steps += 1
        best = self._best(group)
        if len(self.options) == 1:
            return best
        other = next(n for n in self.options if n != best)
        every = self.probe_every
        if (
            other in group.seconds
            and best in group.seconds
            and self._median(group, other) >= self.far * self._median(group, best)
        ):
            every *= self.far_every
        return other if group.steps % every == 0 else best

    def record(self, rows: int, threads: int, seconds: float) -> None:
        group = self._group(rows)
        best = self._best(group)
        times = group.seconds.setdefault(threads, deque(maxlen=self.window))
        if threads != best and best in group.seconds and seconds < self._median(group, best):
            times.clear()  # a probe faster than the chosen setting: its older, slower times are stale
        times.append(seconds)

    def _group(self, rows: int) -> _Group:
        return self._groups.setdefault(max(rows, 1).bit_length(), _Group())

    def _median(self, group: _Group, threads: int) -> float:
        return statistics.median(group.seconds[threads])

    def _best(self, group: _Group) -> int:
        """The setting with the lower recent median step time; all threads until one is timed."""
        timed = [n for n in self.options if n in group.seconds]
        return min(timed, key=lambda n: self._median(group, n)) if timed else self.options[0]
