"""``python -m capqr.bench.cpu_peers``: checked capqr QR vs LAPACK sgeqrf (scipy) and torch.geqrf
(MKL) on the CPU, with the same thread count for all three.

Shapes: square n x n, the contest's (batch, n) batches of n x n matrices, and two tall-skinny
m x n matrices, float32.  Per shape the three run interleaved (capqr, scipy, torch, then
scipy, torch, capqr, ...) after one warm-up round, and each reports the median of its
repeats; the speedup is the best peer's median over capqr's.  Threads: capqr's worker pool
is sized by $CAPQR_THREADS when the runtime loads (once per process, so it is set here
before the first import), scipy's OpenBLAS by threadpoolctl, torch by torch.set_num_threads.
scipy gets its best case: sgeqrf on a Fortran-ordered copy it may overwrite (the copy is
refreshed outside the timing), with the optimal workspace from an lwork=-1 query; capqr's
time includes kernels.qr's own input copy; torch.geqrf takes the row-major array as is.

Writes ``cpu-parallel-<date>-<host>.json`` and ``.txt`` (the table) into --out.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..kernels.parallel import qr_flops
from . import machine
from .outdir import default_out
from .timing import SETTLE_S, geomean

#: (label, batch, m, n): batch 1 is one m x n matrix.
Shape = tuple[str, int, int, int]
SQUARES = tuple((f"n={n}", 1, n, n) for n in (256, 512, 1024, 2048, 4096))
BATCHES = tuple((f"({b},{n})", b, n, n) for b, n in (
    (20, 32), (40, 176), (40, 352), (640, 512), (60, 1024), (8, 2048), (2, 4096)))
TALL = (("8192x256", 1, 8192, 256), ("65536x64", 1, 65536, 64))
ALL_SHAPES: tuple[Shape, ...] = SQUARES + BATCHES + TALL
QUICK_LABELS = ("n=256", "n=512", "(20,32)", "(40,176)", "8192x256")
IMPLS = ("capqr", "scipy", "torch")
#: Repeats per shape after the warm-up round: as many as the shape's share of the time
#: budget allows, within these bounds; a shape whose round would not fit what is left of
#: the budget is skipped (and listed as such), the smallest shapes run first.
MIN_REPEATS, MAX_REPEATS = 1, 7
QUICK_MAX_REPEATS = 3
BUDGET_S = {"full": 270.0, "quick": 50.0}
#: Matrices of a batch that kernels.check verifies after the timing (untimed).
CHECK_MATRICES = 2


def batch_flops(batch: int, m: int, n: int) -> float:
    """LAPACK xGEQRF flops of ``batch`` m x n matrices (kernels.parallel.qr_flops each)."""
    return batch * qr_flops(m, n)


def select(labels: list[str] | None, quick: bool) -> list[Shape]:
    """The shapes to run, in ALL_SHAPES order; unknown labels are an error."""
    want = list(labels) if labels else (list(QUICK_LABELS) if quick else None)
    if want is None:
        return list(ALL_SHAPES)
    known = {s[0] for s in ALL_SHAPES}
    bad = [w for w in want if w not in known]
    if bad:
        raise SystemExit(f"unknown shape(s) {bad}; known: {' '.join(sorted(known))}")
    return [s for s in ALL_SHAPES if s[0] in want]


def _input(batch: int, m: int, n: int) -> np.ndarray:
    a = np.random.default_rng(batch * 100003 + m * 17 + n).standard_normal(
        (batch, m, n), dtype=np.float32)
    return a[0] if batch == 1 else a


class Capqr:
    """kernels.qr (checked, default variant); keeps the last result for the check."""

    def __init__(self, a: np.ndarray):
        from .. import kernels

        self.a, self.qr, self.out = a, kernels.qr, None

    def reset(self) -> None:
        pass

    def run(self) -> None:
        self.out = self.qr(self.a)


class ScipySgeqrf:
    """scipy.linalg.lapack.sgeqrf per matrix on Fortran-ordered copies it overwrites."""

    def __init__(self, a: np.ndarray):
        from scipy.linalg import lapack

        self.f = lapack.sgeqrf
        self.src = [np.asfortranarray(x) for x in (a[None] if a.ndim == 2 else a)]
        self.buf = [x.copy(order="F") for x in self.src]
        _, _, work, info = self.f(self.buf[0], lwork=-1)
        if info != 0:
            raise RuntimeError(f"sgeqrf workspace query: info={info}")
        self.lwork = int(work[0])

    def reset(self) -> None:
        for b, s in zip(self.buf, self.src, strict=True):
            b[...] = s

    def run(self) -> None:
        for b in self.buf:
            info = self.f(b, lwork=self.lwork, overwrite_a=1)[3]
            if info != 0:
                raise RuntimeError(f"sgeqrf info={info}")


class TorchGeqrf:
    """torch.geqrf on the CPU, batched natively."""

    def __init__(self, a: np.ndarray):
        import torch

        self.t, self.geqrf = torch.from_numpy(a), torch.geqrf

    def reset(self) -> None:
        pass

    def run(self) -> None:
        self.geqrf(self.t)


MAKERS: dict[str, Callable[[np.ndarray], Any]] = {
    "capqr": Capqr, "scipy": ScipySgeqrf, "torch": TorchGeqrf}


def _time(r: Any) -> float:
    r.reset()
    t0 = time.perf_counter()
    r.run()
    return time.perf_counter() - t0


def _check(a: np.ndarray, out: Any) -> dict[str, Any]:
    """kernels.check of capqr's result on the first CHECK_MATRICES matrices (untimed)."""
    from .. import kernels

    h, tau = out
    a3, h3, t3 = (a, h, tau) if a.ndim == 3 else (a[None], h[None], tau[None])
    k = min(CHECK_MATRICES, a3.shape[0])
    rep = kernels.check(a3[:k], h3[:k], t3[:k])
    return {"passed": bool(rep.ok), "matrices_checked": k}


def measure(shape: Shape, repeats_for: Callable[[float], int], settle_s: float
            ) -> dict[str, Any]:
    """One shape: warm-up round, then interleaved repeats; a row with every impl's times."""
    label, batch, m, n = shape
    a = _input(batch, m, n)
    row: dict[str, Any] = {"shape": label, "batch": batch, "m": m, "n": n,
                           "flops": batch_flops(batch, m, n), "loadavg_start": machine.loadavg()}
    runners, warm = {}, {}
    for name in IMPLS:
        try:
            r = MAKERS[name](a)
            warm[name] = _time(r)
            runners[name] = r
        except ModuleNotFoundError as e:
            row[name] = {"skipped": f"{e.name} not installed"}
        except Exception as e:  # noqa: BLE001 - an unsupported shape is a row, not a crash
            row[name] = {"unsupported": f"{type(e).__name__}: {e}"[:300]}
    reps = repeats_for(sum(warm.values()))
    times: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for i in range(reps):
        for name in names[i % len(names):] + names[:i % len(names)]:
            # OpenBLAS and OpenMP threads spin a while after a call: let them park so
            # the next library starts on idle cores
            time.sleep(settle_s)
            times[name].append(_time(runners[name]))
    for name, ts in times.items():
        med = float(np.median(ts)) if ts else warm[name]
        row[name] = {"median_s": med, "min_s": min(ts or [med]), "repeats": len(ts),
                     "samples_s": ts, "warmup_s": warm[name],
                     "gflops": row["flops"] / med / 1e9}
    if "capqr" in runners:
        row["capqr"]["check"] = _check(a, runners["capqr"].out)
    row["loadavg_end"] = machine.loadavg()
    row.update(speedups(row))
    return row


def speedups(row: dict[str, Any]) -> dict[str, Any]:
    """capqr's speedup over the best measured peer of a row (best peer median / capqr's)."""
    peers = {k: row[k]["median_s"] for k in IMPLS[1:] if "median_s" in row.get(k, {})}
    if "median_s" not in row.get("capqr", {}) or not peers:
        return {}
    best = min(peers, key=lambda k: peers[k])
    return {"best_peer": best, "speedup_vs_best_peer": peers[best] / row["capqr"]["median_s"]}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geomean speedups over the shapes where capqr and a peer both ran."""
    out: dict[str, Any] = {}
    for peer in IMPLS[1:]:
        sp = [r[peer]["median_s"] / r["capqr"]["median_s"] for r in rows
              if "median_s" in r.get(peer, {}) and "median_s" in r.get("capqr", {})]
        out[f"geomean_vs_{peer}"] = geomean(sp) if sp else None
    sp = [r["speedup_vs_best_peer"] for r in rows if "speedup_vs_best_peer" in r]
    out["geomean_vs_best_peer"] = geomean(sp) if sp else None
    out["shapes_compared"] = len(sp)
    return out


def _cell(d: dict[str, Any]) -> str:
    if "median_s" in d:
        return f"{d['median_s'] * 1e3:10.2f}"
    return f"{'unsupported' if 'unsupported' in d else 'skipped':>10}"


def table(res: dict[str, Any]) -> str:
    """The text table: ms per impl, GF/s of capqr, speedup over the best peer, load."""
    head = (f"{'shape':>10} {'capqr ms':>10} {'scipy ms':>10} {'torch ms':>10} "
            f"{'capqr GF/s':>10} {'best peer':>9} {'speedup':>8} {'reps':>4} {'check':>5}  load")
    lines = [head]
    for r in res["rows"]:
        if "skipped" in r:
            lines.append(f"{r['shape']:>10}  skipped: {r['skipped']}")
            continue
        c = r.get("capqr", {})
        gf = f"{c['gflops']:10.1f}" if "gflops" in c else f"{'-':>10}"
        sp = r.get("speedup_vs_best_peer")
        chk = c.get("check", {}).get("passed")
        chk_s = "-" if chk is None else ("ok" if chk else "FAIL")
        lines.append(
            f"{r['shape']:>10} " + " ".join(_cell(r.get(k, {})) for k in IMPLS)
            + f" {gf} {r.get('best_peer', '-'):>9} "
            + (f"{sp:7.2f}x" if sp else f"{'-':>8}")
            + f" {c.get('repeats', 0):4d} {chk_s:>5}"
            + f"  {r['loadavg_start'][0] if r['loadavg_start'] else '?'}"
            + f"->{r['loadavg_end'][0] if r['loadavg_end'] else '?'}")
    s = res["summary"]
    lines.append("geomean speedup of capqr: " + ", ".join(
        f"vs {k.removeprefix('geomean_vs_').replace('_', ' ')} "
        + (f"{v:.2f}x" if v else "n/a") for k, v in s.items() if k.startswith("geomean")))
    for r in res["rows"]:
        for k in IMPLS:
            if "unsupported" in r.get(k, {}):
                lines.append(f"{k} at {r['shape']}: unsupported ({r[k]['unsupported']})")
    m, th = res["meta"], res["meta"]["threads"]
    lines.append(f"host {m['machine']['label']} ({m['cpu_model']}, {th['cpu_count']} cpus); "
                 f"threads: capqr {th['capqr_workers']}, scipy/OpenBLAS {res['threads']}, "
                 f"torch {th['torch']}; load average (1/5/15 min) before "
                 f"{m['loadavg_start']}, after {m['loadavg_end']}; {res['elapsed_s']:.0f} s"
                 f" (budget {res['budget_s']:.0f} s)")
    return "\n".join(lines) + "\n"


class Budget:
    """Shares ``total_s`` over the shapes: each gets what is left over the shapes left,
    and one whose warm-up and first round (estimated from the rates of the shape before,
    the nearest in size since the shapes run cheapest first) would not fit is skipped."""

    def __init__(self, total_s: float, quick: bool):
        self.t0, self.total, self.quick = time.perf_counter(), total_s, quick
        self.s_per_flop = 0.0  # one round of all impls, seconds per flop of the shape

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.t0)

    def fits(self, flops: float) -> bool:
        # the warm-up round plus one timed round
        return 2 * flops * self.s_per_flop <= self.left()

    def repeats(self, round_s: float, shapes_left: int) -> int:
        share = self.left() / max(1, shapes_left)
        hi = QUICK_MAX_REPEATS if self.quick else MAX_REPEATS
        return max(MIN_REPEATS, min(hi, int(share / max(round_s, 1e-6))))

    def learn(self, row: dict[str, Any]) -> None:
        self.s_per_flop = sum(row[k]["median_s"] for k in IMPLS
                              if "median_s" in row.get(k, {})) / row["flops"]


def run(shapes: list[Shape], threads: int, budget_s: float, quick: bool,
        settle_s: float) -> dict[str, Any]:
    """Measure ``shapes`` (cheapest first) within ``budget_s``; rows in ``shapes`` order."""
    from threadpoolctl import threadpool_limits

    try:
        import torch

        torch.set_num_threads(threads)
    except ModuleNotFoundError:
        pass
    budget = Budget(budget_s, quick)
    rows: dict[str, dict[str, Any]] = {}
    order = sorted(shapes, key=lambda s: batch_flops(*s[1:]))
    with threadpool_limits(limits=threads, user_api="blas"):
        meta = machine.describe()
        for i, s in enumerate(order):
            if not budget.fits(batch_flops(*s[1:])):
                rows[s[0]] = {"shape": s[0], "batch": s[1], "m": s[2], "n": s[3],
                              "skipped": f"time budget ({budget.left():.0f} s left of "
                                         f"{budget_s:.0f} s)"}
                print(f"{s[0]:>10}  skipped: {rows[s[0]]['skipped']}", flush=True)
                continue
            row = measure(s, lambda rs, i=i: budget.repeats(rs, len(order) - i), settle_s)
            budget.learn(row)
            rows[s[0]] = row
            print(f"{s[0]:>10}  " + "  ".join(
                f"{k} {row[k]['median_s'] * 1e3:.2f} ms" if "median_s" in row.get(k, {})
                else f"{k} {next(iter(row.get(k, {'-': ''})))}" for k in IMPLS)
                + (f"  speedup {row['speedup_vs_best_peer']:.2f}x vs {row['best_peer']}"
                   if "speedup_vs_best_peer" in row else ""), flush=True)
    meta["loadavg_end"] = machine.loadavg()
    ordered = [rows[s[0]] for s in shapes]
    return {"meta": meta, "threads": threads, "quick": quick, "budget_s": budget_s,
            "settle_s": settle_s, "rows": ordered, "summary": summary(ordered),
            "method": "interleaved rounds after one warm-up round, median of the repeats; "
                      "speedup = best peer median / capqr median"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.cpu_peers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"shapes {' '.join(QUICK_LABELS)}, at most {QUICK_MAX_REPEATS} repeats, "
                         f"budget {BUDGET_S['quick']:.0f} s")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for every implementation (default: all cpus; "
                         "$CAPQR_THREADS if set)")
    ap.add_argument("--max-seconds", type=float, default=0.0,
                    help="time budget of the whole run; shapes that no longer fit are skipped "
                         f"(default {BUDGET_S['full']:.0f}, quick {BUDGET_S['quick']:.0f})")
    ap.add_argument("--shapes", default="",
                    help='space-separated shape labels, e.g. "n=1024 (8,2048) 65536x64" '
                         "(default: all; quick: a small subset)")
    ap.add_argument("--settle", type=float, default=SETTLE_S,
                    help="untimed pause in seconds before each timed call, so that OpenBLAS's "
                         f"spinning threads park (default {SETTLE_S}, bench.timing.SETTLE_S)")
    ap.add_argument("--out", default="",
                    help=f"output directory (default ${'CAPQR_BENCH_OUT'} or ./bench-results)")
    ap.add_argument("--tag", default="",
                    help="appended to the file names, e.g. 16threads")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Run the comparison; writes the JSON and the text table, returns the JSON path."""
    ns = parse_args(argv)
    env_threads = int(os.environ.get("CAPQR_THREADS", "0") or 0)
    threads = ns.threads or env_threads or (os.cpu_count() or 1)
    if "runtime.core" in sys.modules and env_threads != threads:
        raise SystemExit("the capqr pool is already started: set CAPQR_THREADS before import")
    # the pool size is read once, when the runtime loads (runtime/core.py)
    os.environ["CAPQR_THREADS"] = str(threads)
    from .. import runtime

    if runtime.threads() != threads:
        raise SystemExit(f"capqr runs {runtime.threads()} workers, not {threads}")
    quick = ns.quick
    budget = ns.max_seconds or BUDGET_S["quick" if quick else "full"]
    t0 = time.perf_counter()
    res = run(select(ns.shapes.split() or None, quick), threads, budget, quick, ns.settle)
    res["elapsed_s"] = time.perf_counter() - t0
    out = Path(ns.out) if ns.out else default_out()
    out.mkdir(parents=True, exist_ok=True)
    date = _dt.date.today().isoformat()
    stem = f"cpu-parallel-{date}-{res['meta']['machine']['label']}"
    stem += ("-quick" if quick else "") + (f"-{ns.tag}" if ns.tag else "")
    path = out / f"{stem}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    text = table(res)
    (out / f"{stem}.txt").write_text(text)
    print(text + f"wrote {path} and {path.with_suffix('.txt')}", flush=True)
    return path


if __name__ == "__main__":
    main()
