"""``python -m bench.qr_parallel``: checked capqr QR (default variant) vs scipy sgeqrf on the
CPU, core scaling for one n=4096 matrix, checked/raw of the parallel kernels, launch cost.

One command for any host (a few minutes on 2 cores, well under 4 on 16):

    python -m bench.qr_parallel [--quick] [--out bench/results]

writes ``cpu-parallel-<date>-<host>.json`` and prints the tables.  capqr and
scipy run interleaved in this process (same load for both); each row has the
median and the fastest run.  Scaling runs one subprocess per worker count
(CAPQR_THREADS sizes the pool once per process).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import machine
from .peers import qr_flops, scipy_impl
from .timing import interleaved, pick_repeats, time_once

SQUARE = {"full": (1024, 2048, 4096), "quick": (256,)}
BATCHED = {"full": ((20, 32), (40, 176), (40, 352), (640, 512), (60, 1024), (8, 2048),
                    (2, 4096)),
           "quick": ((20, 32), (3, 200))}
SHAPE_BUDGET_S, MIN_REPEATS, MAX_REPEATS = 12.0, 3, 9
SCALING_N = {"full": 4096, "quick": 384}
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


class _Capqr:
    def __init__(self, a: np.ndarray, checked: bool = True, variant: str = "auto"):
        import kernels

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
    import kernels

    h, tau = out
    a3, h3, t3 = (a, h, tau) if a.ndim == 3 else (a[None], h[None], tau[None])
    k = max(1, min(4, int(8 * (1024 / a3.shape[-1]) ** 3), a3.shape[0]))
    rep = kernels.check(a3[:k], h3[:k], t3[:k])
    return {"passed": bool(rep.ok), "matrices_checked": k,
            "worst": {key: float(v) for key, v in rep.worst().items()}}


def peers(quick: bool, only: list[str] | None = None,
          min_repeats: int = MIN_REPEATS) -> list[dict[str, Any]]:
    """capqr vs scipy, interleaved, per shape (``only``: labels such as "n=1024", "(8,2048)")."""
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
        s = interleaved(runners, reps, warmup=0)
        row: dict[str, Any] = {"shape": label, "batch": batch, "n": n, "flops": flops,
                               "repeats": reps, "check": _check(a, runners["capqr"].out)}
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
import kernels, runtime
n, reps = int(sys.argv[1]), int(sys.argv[2])
a = np.random.default_rng(n).standard_normal((n, n), dtype=np.float32)
kernels.qr(a[:256, :256])
ts = []
for _ in range(reps):
    t0 = time.perf_counter(); kernels.qr(a); ts.append(time.perf_counter() - t0)
print(json.dumps({"threads": runtime.threads(), "times_s": ts}))
"""


def scaling(quick: bool) -> list[dict[str, Any]]:
    """GF/s of one n x n matrix with 1, 2 and all workers (one subprocess each)."""
    n = SCALING_N["quick" if quick else "full"]
    cores = os.cpu_count() or 1
    out = []
    for threads in sorted({1, min(2, cores), cores}):
        env = dict(os.environ, CAPQR_THREADS=str(threads))
        root = Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
        p = subprocess.run([sys.executable, "-c", _SCALE_SCRIPT, str(n), "1" if quick else "3"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            out.append({"threads": threads, "error": p.stderr[-500:]})
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        ts = r["times_s"]
        med = float(np.median(ts))
        out.append({"threads": r["threads"], "n": n, "median_s": med, "min_s": min(ts),
                    "gflops": qr_flops(n, n) / med / 1e9,
                    "gflops_best": qr_flops(n, n) / min(ts) / 1e9})
    base = next((r for r in out if r.get("threads") == 1 and "gflops" in r), None)
    for r in out:
        if base is not None and "gflops" in r:
            r["efficiency"] = r["gflops"] / (r["threads"] * base["gflops"])
            r["efficiency_best"] = r["gflops_best"] / (r["threads"] * base["gflops_best"])
        print(f"scaling n={n}: {r.get('threads')} workers {r.get('gflops', float('nan')):6.1f} "
              f"GF/s (best {r.get('gflops_best', float('nan')):6.1f}), efficiency "
              f"{r.get('efficiency', float('nan')):.2f}", flush=True)
    return out


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
    """Microseconds per launch of an empty kernel, grid 1 and grid = workers."""
    import capabilities
    import runtime

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
    print(f"launch cost (us): {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m bench.qr_parallel",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one repeat (smoke)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output directory")
    ap.add_argument("--skip", action="append", default=[],
                    choices=("peers", "scaling", "overhead", "launch"))
    ap.add_argument("--shapes", default="",
                    help='comma-free list of shape labels, e.g. "n=1024 (8,2048)" (default: all)')
    ap.add_argument("--min-repeats", type=int, default=MIN_REPEATS,
                    help="fewest timed runs per shape (the warm-up run is extra)")
    ns = ap.parse_args(argv)
    import runtime

    t0 = time.perf_counter()
    res: dict[str, Any] = {"meta": machine.describe(), "workers": runtime.threads(),
                           "quick": ns.quick, "date": _dt.date.today().isoformat()}
    if "launch" not in ns.skip:
        res["launch_us"] = launch_cost()
    if "peers" not in ns.skip:
        res["peers"] = peers(ns.quick, ns.shapes.split() or None, max(1, ns.min_repeats))
    if "overhead" not in ns.skip:
        res["checked_over_raw"] = overhead(ns.quick)
    if "scaling" not in ns.skip:
        res["scaling"] = scaling(ns.quick)
    res["meta"]["loadavg_end"] = machine.loadavg()
    res["elapsed_s"] = time.perf_counter() - t0
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "-quick" if ns.quick else ("-part" if ns.shapes or ns.skip else "")
    path = out / f"cpu-parallel-{res['date']}-{socket.gethostname()}{tag}.json"
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path} in {res['elapsed_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
