"""Overhead of capabilities: the same kernel source built checked, raw and raw_poll.

For every case the three builds run interleaved on identical inputs; the
headline ratio is median(checked) / median(raw).  ``raw_poll`` is the raw build
plus the pollchecks the instrumenter places (no bounds checks), so
raw_poll / raw is the cost of safepoint polling alone.  The collector section
times one checked kernel with the collector cycling back to back versus disabled.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from .case import MODES, Case, calibrate_inner
from .timing import Runner, Sample, geomean, interleaved, pick_repeats, time_once

REPEATS = 7
#: Cases that cannot repeat a launch inside one sample (QR overwrites its
#: input) take more samples when short, up to MAX_SAMPLES, to fill this budget.
SHORT_BUDGET_S, MAX_SAMPLES = 1.0, 51


def _ratio(a: Sample, b: Sample) -> float:
    return a.median / b.median if b.median > 0 else math.nan


def measure_case(case: Case, repeats: int, tick: Callable[[], None] | None = None
                 ) -> dict[str, Any]:
    """Time one case in every mode (interleaved); per-launch seconds and ratios.

    ``repeats`` is the minimum number of samples per mode.
    """
    runners = {m: case.make(m) for m in MODES}
    inner = 1
    if all(hasattr(r, "inner") for r in runners.values()):
        # Same launch count per sample in every mode, calibrated on the checked build.
        inner = calibrate_inner(runners["checked"])
        for r in runners.values():
            r.inner = inner  # type: ignore[attr-defined]
    elif repeats > 1:
        t = min(time_once(runners["raw"]) for _ in range(2))
        repeats = pick_repeats(t * len(runners), SHORT_BUDGET_S, repeats, MAX_SAMPLES)
    samples = interleaved(runners, repeats, warmup=1, tick=tick)
    for s in samples.values():
        s.times = [t / inner for t in s.times]
    row: dict[str, Any] = {"family": case.family, "kernel": case.kernel, "size": case.size,
                           "flops": case.flops, "launches_per_sample": inner, **case.meta}
    for m, s in samples.items():
        row[m] = s.as_dict()
    row["ratio"] = _ratio(samples["checked"], samples["raw"])
    row["ratio_min"] = samples["checked"].min / samples["raw"].min
    row["poll_ratio"] = _ratio(samples["raw_poll"], samples["raw"])
    if case.flops:
        row["gflops_checked"] = case.flops / samples["checked"].median / 1e9
        row["gflops_raw"] = case.flops / samples["raw"].median / 1e9
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric mean and worst checked/raw ratio per kernel, per family and overall."""
    def stats(sel: list[dict[str, Any]]) -> dict[str, Any]:
        rs = [r["ratio"] for r in sel]
        ps = [r["poll_ratio"] for r in sel]
        worst = max(sel, key=lambda r: r["ratio"]) if sel else None
        return {"n": len(sel), "geomean": geomean(rs), "worst": max(rs) if rs else math.nan,
                # min(checked)/min(raw): less sensitive to background load than medians
                "geomean_of_min": geomean([r["ratio_min"] for r in sel]),
                "worst_at": f"{worst['kernel']} {worst['size']}" if worst else None,
                "poll_geomean": geomean(ps)}

    out: dict[str, Any] = {"per_kernel": {}, "per_family": {}}
    for k in dict.fromkeys(f"{r['family']}/{r['kernel']}" for r in rows):
        out["per_kernel"][k] = stats([r for r in rows if f"{r['family']}/{r['kernel']}" == k])
    for fam in dict.fromkeys(r["family"] for r in rows):
        out["per_family"][fam] = stats([r for r in rows if r["family"] == fam])
    out["all"] = stats(rows)
    return out


class _Cycler:
    """A background thread running collector cycles back to back while switched on."""

    def __init__(self) -> None:
        from .. import runtime

        self._rt = runtime
        self._on = threading.Event()
        self._stop = False
        self._busy = threading.Lock()  # held for the duration of each cycle
        self._t = threading.Thread(target=self._loop, name="bench-gc-cycler", daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop:
            if not self._on.wait(0.05):
                continue
            with self._busy:
                self._rt.gc_collect()  # releases the GIL for the whole cycle

    def set(self, on: bool) -> None:
        """Switch cycling on or off; off returns only once no cycle is in flight."""
        if on:
            self._on.set()
        else:
            self._on.clear()
            with self._busy:
                pass

    def close(self) -> None:
        self.set(False)
        self._stop = True
        self._t.join()


class _GcRunner:
    """Wrap a runner: reset() puts the collector in the wanted state before the timed run."""

    def __init__(self, inner: Runner, cycler: _Cycler, running: bool):
        self.inner, self.cycler, self.running = inner, cycler, running

    def reset(self) -> None:
        from .. import runtime

        self.cycler.set(False)
        runtime.gc_set_enabled(self.running)
        self.inner.reset()
        self.cycler.set(self.running)

    def run(self) -> None:
        self.inner.run()


def measure_gc(case: Case, repeats: int, tick: Callable[[], None] | None = None
               ) -> dict[str, Any]:
    """Checked ``case`` with the collector cycling back to back vs disabled (interleaved)."""
    from .. import runtime

    base = case.make("checked")
    cycler = _Cycler()
    before = runtime.gc_stats()
    try:
        runners = {"disabled": _GcRunner(base, cycler, False),
                   "running": _GcRunner(base, cycler, True)}
        samples = interleaved(runners, repeats, warmup=1, tick=tick)
    finally:
        cycler.close()
        runtime.gc_set_enabled(True)
    after = runtime.gc_stats()
    run_time = sum(samples["running"].times)
    cycles = after["cycles"] - before["cycles"]
    return {
        "kernel": case.kernel, "size": case.size,
        "disabled": samples["disabled"].as_dict(), "running": samples["running"].as_dict(),
        "ratio": _ratio(samples["running"], samples["disabled"]),
        "cycles_during_bench": cycles,
        # cycles also run during resets and warm-up, so this is an upper bound
        "cycles_per_s_upper": cycles / run_time if run_time > 0 else math.nan,
        "handshake_p50_us": after["handshake_p50_us"],
        "handshake_p99_us": after["handshake_p99_us"],
        "handshake_max_us": after["handshake_max_us"],
        "note": "collector cycling back to back (gc_collect in a loop) vs automatic "
                "cycles disabled; on a 2-core machine the collector's threads compete "
                "with the kernel's for cores",
    }


def prebuild(cases: list[Case], jobs: int | None = None) -> int:
    """Compile every case's kernels in every mode, ``jobs`` compilers at once (default:
    the cores), before anything is timed; how many builds ran (one per build_key and
    mode).  A cold kernel cache then costs the bench its longest build per core, not
    the sum of them."""
    todo = {(c.build_key or f"{c.kernel} {c.size}", m): partial(c.build, m)
            for c in cases if c.build is not None for m in MODES}
    with ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
        for _ in pool.map(lambda build: build(), todo.values()):
            pass   # map re-raises a build's error here
    return len(todo)


def run(cases: list[Case], gc_case: Case | None, repeats: int = REPEATS,
        progress: Any = None) -> dict[str, Any]:
    """Measure every case and the collector comparison; returns the JSON section."""
    def tick() -> None:
        if progress is not None:
            progress.update(1)

    if progress is not None:
        progress.set_postfix_str("building the kernels")
    prebuild(cases + ([gc_case] if gc_case is not None else []))
    rows = []
    for c in cases:
        if progress is not None:
            progress.set_postfix_str(f"overhead {c.kernel} {c.size}")
        rows.append(measure_case(c, repeats))
        tick()
    out: dict[str, Any] = {"repeats": repeats, "rows": rows, "summary": summarize(rows)}
    if gc_case is not None:
        if progress is not None:
            progress.set_postfix_str(f"collector {gc_case.kernel} {gc_case.size}")
        out["collector"] = measure_gc(gc_case, repeats)
        tick()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m capqr.bench.overhead``: checked/raw/raw_poll of selected cases only
    (``--kernel``, ``--size``), interleaved in one process; prints one line per
    case and the summary, optionally writes the rows as JSON (``--out``)."""
    import argparse
    import json

    from . import machine, micro, qr

    ap = argparse.ArgumentParser(prog="python -m capqr.bench.overhead", description=main.__doc__)
    ap.add_argument("--kernel", action="append", help="kernel name (repeatable), e.g. blocked")
    ap.add_argument("--size", action="append", help="size label (repeatable), e.g. '(20,32)'")
    ap.add_argument("--repeats", type=int, default=15, help="minimum samples per mode")
    ap.add_argument("--out", help="write rows and summary to this JSON file")
    ns = ap.parse_args(argv)
    cases = [c for c in qr.overhead_cases(False) + micro.cases(False)
             if (not ns.kernel or c.kernel in ns.kernel) and (not ns.size or c.size in ns.size)]
    # what ran where: a copied working tree's .git may be stale, its source digest is not
    meta = {"host": machine.host(), "git": machine.git_commit(),
            "source_digest": machine.source_digest(), "loadavg_start": machine.loadavg()}
    prebuild(cases)
    rows = []
    for c in cases:
        r = measure_case(c, ns.repeats)
        rows.append(r)
        via = f" ({c.meta['path']})" if "path" in c.meta else ""
        print(f"{c.kernel:10s} {c.size:14s} checked/raw {r['ratio']:.3f} "
              f"(min/min {r['ratio_min']:.3f}){via}", flush=True)
    meta["loadavg_end"] = machine.loadavg()
    res = {"meta": meta, "rows": rows, **({"summary": summarize(rows)} if rows else {})}
    if rows:
        s = res["summary"]["all"]
        print(f"geomean {s['geomean']:.3f}  worst {s['worst']:.3f} ({s['worst_at']})  "
              f"geomean of min/min {s['geomean_of_min']:.3f}")
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
