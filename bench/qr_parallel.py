"""``python -m capqr.bench.qr_parallel``: checked capqr QR (default variant) vs scipy sgeqrf on the
CPU, core scaling for one n=4096 matrix, a step profile of the parallel schedule, checked/raw
of the parallel kernels, launch cost.

One command for any host (a few minutes on 2 cores, about 3 on 16):

    python -m capqr.bench.qr_parallel [--quick] [--out DIR]

writes ``cpu-parallel-<date>-<host>.json`` and prints the tables.  capqr and
scipy run interleaved in this process (same load for both); each row has the
median and the fastest run.  Scaling runs one subprocess per worker count
(CAPQR_THREADS sizes the pool once per process), in interleaved rounds.

The step profile says where the time of one matrix goes: the single-core
cost of a panel item (update of the next panel's columns, then its
factorisation: the critical path) and of a 64-wide tile at a few row
counts, a model of the step sequence from those costs (each launch's items
dealt to W workers in order, plus the launch cost) for 1, 2 and all workers,
and a traced run on all workers (launches, time inside them, host gaps).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import machine
from .outdir import default_out
from .peers import qr_flops, scipy_impl
from .timing import SETTLE_S, interleaved, pick_repeats, time_once

SQUARE = {"full": (1024, 2048, 4096), "quick": (256,)}
BATCHED = {"full": ((20, 32), (40, 176), (40, 352), (640, 512), (60, 1024), (8, 2048),
                    (2, 4096)),
           "quick": ((20, 32), (3, 200))}
SHAPE_BUDGET_S, MIN_REPEATS, MAX_REPEATS = 12.0, 3, 9
SCALING_N = {"full": 4096, "quick": 384}


class _Capqr:
    def __init__(self, a: np.ndarray, checked: bool = True, variant: str = "auto"):
        from .. import kernels

        self.a, self.checked, self.variant, self.fn = a, checked, variant, kernels.qr
        self.out: Any = None

    def reset(self) -> None:
        pass

    def run(self) -> None:
        self.out = self.fn(self.a, variant=self.variant, checked=self.checked)


def _input(batch: int, n: int) -> np.ndarray:
    a = np.random.default_rng(batch * 100003 + n).standard_normal((batch, n, n),
                                                                 dtype=np.float32)
    return a[0] if batch == 1 else a


def _check(a: np.ndarray, out: Any) -> dict[str, Any]:
    from .. import kernels

    h, tau = out
    a3, h3, t3 = (a, h, tau) if a.ndim == 3 else (a[None], h[None], tau[None])
    k = max(1, min(4, int(8 * (1024 / a3.shape[-1]) ** 3), a3.shape[0]))
    rep = kernels.check(a3[:k], h3[:k], t3[:k])
    return {"passed": bool(rep.ok), "matrices_checked": k,
            "worst": {key: float(v) for key, v in rep.worst().items()}}


def peers(quick: bool, only: list[str] | None = None,
          min_repeats: int = MIN_REPEATS, settle_s: float = SETTLE_S) -> list[dict[str, Any]]:
    """capqr vs scipy, interleaved, per shape (``only``: labels such as "n=1024", "(8,2048)");
    ``settle_s`` pause before each timed call (bench.timing.SETTLE_S)."""
    mode = "quick" if quick else "full"
    shapes = [(f"n={n}", 1, n) for n in SQUARE[mode]]
    shapes += [(f"({b},{n})", b, n) for b, n in BATCHED[mode]]
    if only:
        shapes = [s for s in shapes if s[0] in only]
    rows = []
    for label, batch, n in shapes:
        a = _input(batch, n)
        flops = batch * qr_flops(n, n)
        runners = {"capqr": _Capqr(a), "scipy": scipy_impl(a)}
        warm = {k: time_once(r) for k, r in runners.items()}
        reps = 1 if quick else pick_repeats(sum(warm.values()), SHAPE_BUDGET_S, min_repeats,
                                            MAX_REPEATS)
        s = interleaved(runners, reps, warmup=0, settle_s=settle_s)
        row: dict[str, Any] = {"shape": label, "batch": batch, "n": n, "flops": flops,
                               "repeats": reps, "settle_s": settle_s,
                               "check": _check(a, runners["capqr"].out)}
        for k, smp in s.items():
            row[k] = {"median_s": smp.median, "min_s": smp.min,
                      "gflops": flops / smp.median / 1e9, "gflops_best": flops / smp.min / 1e9}
        row["ratio"] = row["scipy"]["median_s"] / row["capqr"]["median_s"]
        row["ratio_best"] = row["scipy"]["min_s"] / row["capqr"]["min_s"]
        rows.append(row)
        print(f"{label:>12}  capqr {row['capqr']['gflops']:7.1f} GF/s "
              f"(best {row['capqr']['gflops_best']:6.1f})  scipy {row['scipy']['gflops']:7.1f} "
              f"(best {row['scipy']['gflops_best']:6.1f})  ratio {row['ratio']:5.2f}x "
              f"(best {row['ratio_best']:5.2f}x)  "
              f"check {'ok' if row['check']['passed'] else 'FAIL'}",
              flush=True)
    return rows


_SCALE_SCRIPT = """
import json, sys, time
import numpy as np
from capqr import kernels, runtime
n, reps = int(sys.argv[1]), int(sys.argv[2])
a = np.random.default_rng(n).standard_normal((n, n), dtype=np.float32)
kernels.qr(a)  # the same call untimed first: one-time costs (kernels, first touch) stay out
ts = []
for _ in range(reps):
    t0 = time.perf_counter(); kernels.qr(a); ts.append(time.perf_counter() - t0)
print(json.dumps({"threads": runtime.threads(), "times_s": ts}))
"""


def _run_with_workers(script: str, threads: int, *argv: object) -> dict[str, Any]:
    """Run ``script`` in a fresh process with a pool of ``threads`` workers (the pool
    size is fixed per process); its last line of output is JSON."""
    env = dict(os.environ, CAPQR_THREADS=str(threads))
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", script, *map(str, argv)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# What the cores alone allow: every worker runs the same vector FMA loop on
# registers and L1 only (no shared memory traffic, no synchronisation), and the
# time of one block alone over the time of a block while every worker runs one
# is the efficiency ceiling that clocks and power set for any kernel (all-core
# turbo below single-core turbo).
_CLOCK_KERNEL = """
KERNEL void clock_spin(cap_t out, int64_t iters)
{
    float acc[64];
    for (int64_t k = 0; k < 64; k++)
        acc[k] = (float)k;
    for (int64_t i = 0; i < iters; i++)
        for (int64_t k = 0; k < 64; k++)
            acc[k] = fmaf(acc[k], 0.999999f, 1e-6f);
    float s = 0.0f;
    for (int64_t k = 0; k < 64; k++)
        s += acc[k];
    cap_store_f32(out, rt_block_idx(), s);
}
"""
_CLOCK_SCRIPT = """
import json, sys, time
import numpy as np
from capqr import capabilities, runtime
from capqr.bench.qr_parallel import _CLOCK_KERNEL
iters = int(sys.argv[1])
k = runtime.compile(_CLOCK_KERNEL, "clock_spin")
w = runtime.threads()
out = capabilities.alloc((w,), np.float32)
runtime.launch(k, [out], args=(iters // 10,), grid=w)
ts = []
for _ in range(3):
    t0 = time.perf_counter(); runtime.launch(k, [out], args=(iters,), grid=w)
    ts.append(time.perf_counter() - t0)
print(json.dumps({"threads": w, "block_s": min(ts)}))
"""


def _ceiling(script: str, threads: int, *argv: object) -> dict[str, Any]:
    """``script``'s block time in a pool of one worker over its time with a block on
    each of ``threads`` workers."""
    one = _run_with_workers(script, 1, *argv)
    all_ = _run_with_workers(script, threads, *argv)
    if "error" in one or "error" in all_:
        return {"error": one.get("error") or all_.get("error")}
    return {"threads": threads, "one_block_s": one["block_s"], "all_blocks_s": all_["block_s"],
            "ceiling": one["block_s"] / all_["block_s"]}


def clock_ceiling(threads: int, quick: bool) -> dict[str, Any]:
    """Time of the FMA loop (_CLOCK_KERNEL) for one block alone over its time with a
    block on each of ``threads`` workers: the scaling ceiling of this machine."""
    return _ceiling(_CLOCK_SCRIPT, threads, 5_000_000 if quick else 50_000_000)


# What the trailing update allows: every worker updates its own 64-column tile of
# one m x n matrix with a 64-column panel (larfb_tile, as qrt_step's tiles do;
# V and T are zeros, which costs the same arithmetic), repeatedly; one block
# alone against one per worker.  Below the clock ceiling, the difference is the
# memory system: the tiles' C traffic and the shared panel V.
_TILE_KERNEL = """
KERNEL void tile_rate(cap_t a, cap_t work, int64_t m, int64_t n, int64_t reps)
{
    cap_t V = work;
    cap_t T = cap_offset_f32(work, m * 64);
    int64_t c0 = 64 * rt_block_idx();
    for (int64_t r = 0; r < reps; r++)
        larfb_tile(V, 64, 64, T, 64, a, n, 0, c0, 64, m);
}
"""
_TILE_SCRIPT = """
import json, sys, time
import numpy as np
from capqr import capabilities, runtime
from capqr.bench.qr_parallel import _TILE_KERNEL
from capqr.kernels import sources
from capqr.kernels.qr import aligned_empty
m, reps, off = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
k = runtime.compile(sources.source("qrt") + _TILE_KERNEL, "tile_rate")
w = runtime.threads()
n = max(m, 64 * w)   # an m x n matrix, a tile per worker: rows as far apart as in QR
buf = aligned_empty((m * n + 16,), np.float32)   # the matrix starts off bytes past a line
a = capabilities.wrap(buf[off // 4:off // 4 + m * n])
work = capabilities.alloc((m * 64 + 64 * 64,), np.float32)
runtime.launch(k, [a, work], args=(m, n, 1), grid=w)
ts = []
for _ in range(3):
    t0 = time.perf_counter(); runtime.launch(k, [a, work], args=(m, n, reps), grid=w)
    ts.append((time.perf_counter() - t0) / reps)
print(json.dumps({"threads": w, "block_s": min(ts)}))
"""


def tile_ceiling(threads: int, quick: bool, offset: int = 0) -> dict[str, Any]:
    """One 64-column tile update of m = SCALING_N rows (_TILE_KERNEL) alone over its
    time with one per worker at once: the scaling ceiling of the trailing update
    on this machine, clocks and memory together.  ``offset``: bytes the matrix
    starts past a cache line (kernels.qr's copy: 0; numpy's large arrays: often 16;
    then a tile row of 256 bytes spans five lines, not four)."""
    m = SCALING_N["quick" if quick else "full"]
    out = _ceiling(_TILE_SCRIPT, threads, m, max(20, 800_000_000 // (4 * m * 64 * 64)), offset)
    if "error" not in out:
        out["rows"] = m
        out["offset_bytes"] = offset
        out["one_block_gflops"] = 4 * m * 64 * 64 / out["one_block_s"] / 1e9
    return out


def scaling(quick: bool, rounds: int = 3) -> list[dict[str, Any]]:
    """GF/s of one n x n matrix with 1, 2 and all workers: one subprocess per
    worker count and round, the counts interleaved round by round."""
    n = SCALING_N["quick" if quick else "full"]
    cores = os.cpu_count() or 1
    counts = sorted({1, min(2, cores), cores})
    times: dict[int, list[float]] = {t: [] for t in counts}
    errors: dict[int, str] = {}
    for r in range(1 if quick else rounds):
        for threads in counts[r % len(counts):] + counts[:r % len(counts)]:
            res = _run_with_workers(_SCALE_SCRIPT, threads, n, 1)
            if "error" in res:
                errors[threads] = res["error"]
            else:
                times[threads] += res["times_s"]
    out = []
    for threads in counts:
        ts = times[threads]
        if not ts:
            out.append({"threads": threads, "error": errors.get(threads, "no run")})
            continue
        med = float(np.median(ts))
        out.append({"threads": threads, "n": n, "median_s": med, "min_s": min(ts),
                    "times_s": ts, "gflops": qr_flops(n, n) / med / 1e9,
                    "gflops_best": qr_flops(n, n) / min(ts) / 1e9})
    base = next((r for r in out if r.get("threads") == 1 and "gflops" in r), None)
    for r in out:
        if base is not None and "gflops" in r:
            r["efficiency"] = r["gflops"] / (r["threads"] * base["gflops"])
            r["efficiency_best"] = r["gflops_best"] / (r["threads"] * base["gflops_best"])
        print(f"scaling n={n}: {r.get('threads')} workers {r.get('gflops', float('nan')):6.1f} "
              f"GF/s (best {r.get('gflops_best', float('nan')):6.1f}), efficiency "
              f"{r.get('efficiency', float('nan')):.2f} (goal >= 0.8)", flush=True)
    if cores > 1:
        clock = clock_ceiling(cores, quick)
        out[-1]["clock"] = clock
        print(f"scaling ceiling with {cores} workers: {clock.get('ceiling', float('nan')):.2f} "
              "(a vector FMA loop on registers, one block alone vs one per worker)", flush=True)
        for offset in (0, 16):
            tile = tile_ceiling(cores, quick, offset)
            out[-1]["tile" if offset == 0 else f"tile_off{offset}"] = tile
            print(f"scaling ceiling with {cores} workers: {tile.get('ceiling', float('nan')):.2f} "
                  f"(a 64-column tile update of {tile.get('rows')} rows, matrix {offset} bytes "
                  f"past a line, {tile.get('one_block_gflops', float('nan')):.1f} GF/s alone, "
                  f"{tile.get('all_blocks_s', float('nan')) * 1e3:.3f} ms with one per "
                  "worker; one block alone vs one per worker)", flush=True)
    return out


# Single-core costs of the two kinds of step items, in the dialect, through the
# checked pipeline like the kernels themselves: what = 0 is qrt_step's look-ahead
# item (the next nb columns, m rows, copied into the slot, updated by a panel,
# factored below its first nb rows, copied back), what = 1 one 64-wide tile
# update with such a panel.
_PROFILE_KERNEL = """
KERNEL void prof_item_f32(cap_t a, cap_t tau, cap_t work, int64_t m, int64_t n, int64_t nb,
                          int64_t what, int64_t reps)
{
    cap_t V = work;
    cap_t T = cap_offset_f32(V, m * nb);
    cap_t Pn = cap_offset_f32(T, nb * nb + m);
    cap_t Tn = cap_offset_f32(Pn, m * nb);
    cap_t X = cap_offset_f32(Tn, nb * nb);
    for (int64_t r = 0; r < reps; r++) {
        if (what == 0) {
            for (int64_t t = 0; t < m; t++)
                for (int64_t p = 0; p < nb; p++)
                    cap_store_f32(Pn, t * nb + p, cap_load_f32(a, t * n + nb + p));
            larfb_tile(V, nb, nb, T, nb, Pn, nb, 0, 0, nb, m);
            panel_qr(cap_offset_f32(Pn, nb * nb), nb, m - nb, nb, cap_offset_f32(tau, nb), Tn,
                     nb, 1, X);
            for (int64_t t = 0; t < m; t++)
                for (int64_t p = 0; p < nb; p++)
                    cap_store_f32(a, t * n + nb + p, cap_load_f32(Pn, t * nb + p));
        } else {
            larfb_tile(V, nb, nb, T, nb, a, n, 0, 2 * nb, 64, m);
        }
    }
}
"""


def _item_costs(n: int, nb: int, rows: list[int]) -> dict[int, tuple[float, float]]:
    """{rows: (look-ahead item s, 64-wide tile update s)} on one worker (fastest of 5)."""
    from .. import capabilities, runtime
    from ..kernels import sources

    k = runtime.compile(sources.source("qrt") + _PROFILE_KERNEL, "prof_item_f32")
    out = {}
    for mr in rows:
        a = np.random.default_rng(mr).standard_normal((mr, max(n, 3 * nb)), dtype=np.float32)
        ac = capabilities.wrap(a, name="a")
        tc = capabilities.alloc((2 * nb,), np.float32)
        wc = capabilities.alloc((2 * (mr * nb + nb * nb + mr),), np.float32)
        reps = max(1, int(4096 / mr))
        best = []
        for what in (0, 1):
            runtime.launch(k, [ac, tc, wc], args=(mr, a.shape[1], nb, what, 1), grid=1)
            ts = []
            for _ in range(5):
                t0 = time.perf_counter()
                runtime.launch(k, [ac, tc, wc], args=(mr, a.shape[1], nb, what, reps), grid=1)
                ts.append((time.perf_counter() - t0) / reps)
            best.append(min(ts))
        out[mr] = (best[0], best[1])
        for c in (ac, tc, wc):
            c.free()
    return out


def _interp(costs: dict[int, tuple[float, float]], mr: int, which: int) -> float:
    """Cost at mr rows: piecewise linear between measured row counts, proportional below."""
    xs = sorted(costs)
    if mr <= xs[0]:
        return costs[xs[0]][which] * mr / xs[0]
    for lo, hi in zip(xs, xs[1:], strict=False):
        if mr <= hi:
            f = (mr - lo) / (hi - lo)
            return costs[lo][which] * (1 - f) + costs[hi][which] * f
    return costs[xs[-1]][which] * mr / xs[-1]


def _narrow(cw: int) -> float:
    """A cw-wide tile's cost in 64-wide tiles (tile.c packs V whatever the width:
    measured on one core, cw = 16 costs about 0.65 of a full tile, cw = 32 0.8)."""
    return 0.5 + 0.5 * cw / 64


def model(n: int, nb: int, workers: int, costs: dict[int, tuple[float, float]],
          launch_s: float) -> dict[str, float]:
    """Time of the step sequence for one n x n matrix on ``workers``: each launch's items
    (kernels/parallel.py's order: the panel item, then the tiles) go to the worker that
    frees first; a launch ends with its last item, plus ``launch_s``."""
    import heapq

    from ..kernels import parallel

    # j = -1: the first panel alone (the item without its update)
    first = max(_interp(costs, n, 0) - _interp(costs, n, 1), 0.5 * _interp(costs, n, 0))
    total = first + launch_s
    chain = first
    work = chain
    for j in range(0, n, nb):
        mr, jn = n - j, j + nb
        items = []
        if jn < n:
            items.append(_interp(costs, mr, 0) * min(nb, n - jn) / nb)
            chain += items[0]
        cs = jn + nb if jn < n else j + nb
        for c0 in range(cs, n, parallel.TW_MAX):
            items.append(_interp(costs, mr, 1) * _narrow(min(64, n - c0)))
        if not items:
            continue
        free = [0.0] * workers
        for it in items:
            heapq.heappush(free, heapq.heappop(free) + it)
        total += max(free) + launch_s
        work += sum(items)
    return {"time_s": total, "gflops": qr_flops(n, n) / total / 1e9, "critical_path_s": chain,
            "work_s": work}


def profile(quick: bool) -> list[dict[str, Any]]:
    """Where one matrix's time goes: item costs, the schedule model for 1, 2 and all
    workers, and a traced run on all workers."""
    from .. import runtime
    from ..kernels import parallel

    sizes = (384,) if quick else (1024, 2048, 4096)
    w = runtime.threads()
    launch = launch_cost().get(f"grid={w}", {}).get("us_min", 50.0) * 1e-6
    rows_out = []
    for n in sizes:
        nb = parallel.default_nb(n, n)
        costs = _item_costs(n, nb, sorted({n, max(nb + 1, n // 2), max(nb + 1, n // 4),
                                           max(nb + 1, n // 8)}))
        pred = {str(t): model(n, nb, t, costs, launch) for t in sorted({1, min(2, w), w})}
        a = _input(1, n)
        h = np.array(a[None])
        tau = np.zeros((1, n), np.float32)
        trace: list = []
        parallel.run(np.array(h), tau.copy(), "float32", nb, parallel.TW_MAX, True, None, None)
        t0 = time.perf_counter()
        parallel.run(h, tau, "float32", nb, parallel.TW_MAX, True, None, None, trace=trace)
        wall = time.perf_counter() - t0
        inside = sum(s for _, _, s in trace)
        steps = [s for _, _, s in trace]
        row = {"n": n, "nb": nb, "workers": w, "launch_s": launch,
               "item_cost_s": {str(k): {"lookahead_item": v[0], "tile64": v[1]}
                               for k, v in costs.items()},
               "model": pred,
               "traced": {"wall_s": wall, "gflops": qr_flops(n, n) / wall / 1e9,
                          "launches": len(trace), "inside_launches_s": inside,
                          "host_gaps_s": wall - inside, "step_s_first": steps[0] if steps else 0,
                          "step_s_median": float(np.median(steps)) if steps else 0,
                          "step_s_max": max(steps) if steps else 0}}
        rows_out.append(row)
        p_n, t_n = costs[n]
        print(f"profile n={n} nb={nb}: one worker at {n} rows: look-ahead item (update + "
              f"factor the next panel) {p_n * 1e3:.2f} ms, 64-wide tile {t_n * 1e3:.2f} ms "
              f"(item = {p_n / t_n:.1f} tiles)", flush=True)
        for t, m in pred.items():
            print(f"    model {t:>3} workers: {m['time_s'] * 1e3:8.1f} ms {m['gflops']:7.1f} GF/s "
                  f"(critical path {m['critical_path_s'] * 1e3:.1f} ms, work / workers "
                  f"{m['work_s'] / int(t) * 1e3:.1f} ms)", flush=True)
        tr = row["traced"]
        print(f"    traced {w:>3} workers: {tr['wall_s'] * 1e3:8.1f} ms {tr['gflops']:7.1f} GF/s; "
              f"{tr['launches']} launches, {tr['inside_launches_s'] * 1e3:.1f} ms inside them, "
              f"{tr['host_gaps_s'] * 1e3:.2f} ms between; step first/median/max "
              f"{tr['step_s_first'] * 1e3:.2f}/{tr['step_s_median'] * 1e3:.2f}/"
              f"{tr['step_s_max'] * 1e3:.2f} ms", flush=True)
    return rows_out


def overhead(quick: bool) -> list[dict[str, Any]]:
    """Checked vs raw build of the parallel kernels (same source, same call path)."""
    cases = [("(20,32)", 20, 32), ("(40,176)", 40, 176), ("n=1024", 1, 1024)]
    if quick:
        cases = [("(4,32)", 4, 32), ("n=256", 1, 256)]
    rows = []
    for label, batch, n in cases:
        a = _input(batch, n)
        runners = {"checked": _Capqr(a, True), "raw": _Capqr(a, False)}
        warm = {k: time_once(r) for k, r in runners.items()}
        reps = 1 if quick else pick_repeats(sum(warm.values()), 6.0, 5, 41)
        s = interleaved(runners, reps, warmup=0)
        row = {"shape": label, "repeats": reps,
               "checked_median_s": s["checked"].median, "raw_median_s": s["raw"].median,
               "ratio": s["checked"].median / s["raw"].median,
               "ratio_best": s["checked"].min / s["raw"].min}
        rows.append(row)
        print(f"checked/raw {label:>10}: {row['ratio']:.3f} (fastest runs {row['ratio_best']:.3f})",
              flush=True)
    return rows


def launch_cost() -> dict[str, Any]:
    """Microseconds per launch of an empty kernel, grid 1 and grid = workers, back to
    back and (``idle``) each after 2 ms without launches, when the workers sleep
    (median of 200; runtime/csrc/launch.c wakes fewer of them for short launches)."""
    from .. import capabilities, runtime

    k = runtime.compile("KERNEL void empty(cap_t x, int64_t n)\n"
                        "{ if (n < 0) cap_store_f32(x, 0, 1.0f); }", "empty")
    x = capabilities.alloc((16,), np.float32)
    out = {}
    for g in sorted({1, runtime.threads()}):
        for _ in range(100):
            runtime.launch(k, [x], args=(1,), grid=g)
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(500):
                runtime.launch(k, [x], args=(1,), grid=g)
            best.append((time.perf_counter() - t0) / 500 * 1e6)
        out[f"grid={g}"] = {"us_min": min(best), "us_median": float(np.median(best))}
        idle = []
        for _ in range(200):
            time.sleep(0.002)
            t0 = time.perf_counter()
            runtime.launch(k, [x], args=(1,), grid=g)
            idle.append((time.perf_counter() - t0) * 1e6)
        out[f"grid={g} idle"] = {"us_min": min(idle), "us_median": float(np.median(idle))}
    print(f"launch cost (us): {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> Path:
    """Run the selected sections; writes the JSON and returns its path."""
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.qr_parallel",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one repeat (smoke)")
    ap.add_argument("--out", default="",
                    help="output directory (default $CAPQR_BENCH_OUT, else ./bench-results)")
    ap.add_argument("--skip", action="append", default=[],
                    choices=("peers", "scaling", "profile", "overhead", "launch"),
                    help="leave out a section (repeatable)")
    ap.add_argument("--shapes", default="",
                    help='comma-free list of shape labels, e.g. "n=1024 (8,2048)" (default: all)')
    ap.add_argument("--min-repeats", type=int, default=MIN_REPEATS,
                    help="fewest timed runs per shape (the warm-up run is extra)")
    ap.add_argument("--settle", type=float, default=SETTLE_S,
                    help="seconds to pause before each timed call of the capqr-vs-scipy "
                         "rounds (default %(default)s: OpenBLAS threads spin ~0.1 s after a "
                         "call); 0 times them back to back")
    ns = ap.parse_args(argv)
    from .. import runtime

    t0 = time.perf_counter()
    res: dict[str, Any] = {"meta": machine.describe(), "workers": runtime.threads(),
                           "quick": ns.quick, "date": _dt.date.today().isoformat()}
    if "launch" not in ns.skip:
        res["launch_us"] = launch_cost()
    if "peers" not in ns.skip:
        res["peers"] = peers(ns.quick, ns.shapes.split() or None, max(1, ns.min_repeats),
                             max(0.0, ns.settle))
    if "overhead" not in ns.skip:
        res["checked_over_raw"] = overhead(ns.quick)
    if "scaling" not in ns.skip:
        res["scaling"] = scaling(ns.quick)
    if "profile" not in ns.skip:
        res["profile"] = profile(ns.quick)
    res["meta"]["loadavg_end"] = machine.loadavg()
    res["elapsed_s"] = time.perf_counter() - t0
    out = Path(ns.out) if ns.out else default_out()
    out.mkdir(parents=True, exist_ok=True)
    tag = "-quick" if ns.quick else ("-part" if ns.shapes or ns.skip else "")
    path = out / f"cpu-parallel-{res['date']}-{res['meta']['machine']['label']}{tag}.json"
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path} in {res['elapsed_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
