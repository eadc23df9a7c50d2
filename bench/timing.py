"""Wall-clock timing: interleaved A/B(/C) rounds and summary statistics.

Interleaving (A, B, C, then B, C, A, ...) spreads slow drift (thermal state,
other processes on a shared machine) evenly over the variants being compared,
so a ratio of medians is not biased by *when* each variant happened to run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Runner(Protocol):
    """One benchmarked thing: ``reset()`` (untimed) restores inputs, ``run()`` is timed."""

    def reset(self) -> None: ...

    def run(self) -> None: ...


@dataclass
class Sample:
    """Timings of one variant (seconds)."""

    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    def as_dict(self) -> dict[str, float | int | list[float]]:
        """JSON form: median/min/max seconds, repeat count and raw samples."""
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max,
                "repeats": len(self.times), "samples_s": list(self.times)}


def time_once(r: Runner) -> float:
    """Reset (untimed), then time one ``run()``."""
    r.reset()
    t0 = time.perf_counter()
    r.run()
    return time.perf_counter() - t0


#: Pause before each timed call when variants come from different libraries:
#: OpenBLAS's threads spin for about 2^28 cycles (~0.1 s) after a call returns, so
#: a call started right after scipy's runs on cores those threads still hold (on
#: the 16-core H200 host capqr's n=1024 QR measured 27.6 GF/s interleaved without
#: a pause, 61 GF/s alone; on the 2-core Xeon VM, 2026-12-07 at ea553f5 with nothing
#: else of ours running, its 65536x64 QR, median of 5, took
#: 50.6 ms alone, 103.8 ms right after an sgeqrf, 64.9 ms 0.1 s after one and 52.1 ms
#: 0.3 s after; torch.geqrf left no such trace).  Every variant waits the same,
#: outside the timing.
SETTLE_S = 0.25


def interleaved(runners: dict[str, Runner], repeats: int, warmup: int = 1,
                tick: Callable[[], None] | None = None,
                settle_s: float = 0.0) -> dict[str, Sample]:
    """Time every runner ``repeats`` times in rotating order after ``warmup`` untimed rounds.

    Round r runs the variants starting at index r mod k, so no variant is
    always first (cold caches) or always last.  ``settle_s``: untimed pause
    before each timed call (see SETTLE_S).
    """
    names = list(runners)
    for _ in range(warmup):
        for n in names:
            time_once(runners[n])
    out = {n: Sample() for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            if settle_s > 0:
                time.sleep(settle_s)
            out[n].times.append(time_once(runners[n]))
        if tick is not None:
            tick()
    return out


def pick_repeats(seconds_per_run: float, budget_s: float, lo: int, hi: int) -> int:
    """Repeats that fit ``budget_s``, clamped to [lo, hi] (lo wins: never fewer than lo)."""
    if seconds_per_run <= 0:
        return hi
    return max(lo, min(hi, int(budget_s / seconds_per_run)))


def geomean(xs: list[float]) -> float:
    """Geometric mean of positive numbers (nan for an empty list)."""
    import math

    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    if not xs:
        return float("nan")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))
