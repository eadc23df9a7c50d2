"""QR speed side by side: capqr kernels vs LAPACK (scipy), torch.geqrf and numpy, same run.

All float32, row-major numpy input of shape (batch, n, n) (square: batch 1,
passed as (n, n)).  GF/s uses LAPACK's count 2mn^2 - 2n^3/3 per m x n matrix
(m >= n).  The machine's practical ceiling is the measured numpy float32
matmul rate at n=2048 (OpenBLAS sgemm); every row also reports its fraction
of it.  Implementations of one shape run interleaved so background load on
this shared machine hits them alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels.parallel import qr_flops
from .timing import SETTLE_S, Runner, interleaved, pick_repeats, time_once

SQUARE = {"full": (256, 512, 1024, 2048, 4096), "quick": (64, 128)}
BATCHED = {"full": ((20, 32), (40, 176), (40, 352), (640, 512), (60, 1024), (8, 2048),
                    (2, 4096)),
           "quick": ((20, 32),)}
#: Repeats per shape: at least MIN_REPEATS, at most MAX_REPEATS, fewer than the
#: maximum only where all implementations together would exceed SHAPE_BUDGET_S.
MIN_REPEATS, MAX_REPEATS, SHAPE_BUDGET_S = 3, 7, 40.0
#: When one round of all implementations takes longer than this, the warm-up
#: round counts as the first sample (first-run effects are negligible there)
#: so the biggest shapes fit the full run's time limit.
LONG_ROUND_S = 10.0

Impl = Callable[[np.ndarray], Runner]


class _Call:
    """A Runner around a zero-argument function (peers never modify their input)."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def reset(self) -> None:
        pass

    def run(self) -> None:
        self.fn()


def scipy_impl(a: np.ndarray) -> Runner:
    """scipy.linalg.qr(mode="raw"): LAPACK sgeqrf (OpenBLAS), one call per matrix."""
    import scipy.linalg as sl

    mats = [a] if a.ndim == 2 else list(a)
    return _Call(lambda: [sl.qr(x, mode="raw", check_finite=False) for x in mats])


def torch_impl(a: np.ndarray) -> Runner:
    """torch.geqrf on CPU (MKL), batched natively."""
    import torch

    t = torch.from_numpy(a)
    return _Call(lambda: torch.geqrf(t))


def numpy_impl(a: np.ndarray) -> Runner:
    """numpy.linalg.qr(mode="raw") (its bundled LAPACK sgeqrf), batched natively."""
    return _Call(lambda: np.linalg.qr(a, mode="raw"))


PEERS: dict[str, Impl] = {"scipy": scipy_impl, "torch": torch_impl, "numpy": numpy_impl}


def sgemm_rate(n: int = 2048, repeats: int = 5) -> dict[str, Any]:
    """Measured float32 matmul GF/s at n x n (numpy -> OpenBLAS sgemm): the practical ceiling."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty_like(a)
    np.matmul(a, b, out=c)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        ts.append(time.perf_counter() - t0)
    med = float(np.median(ts))
    return {"n": n, "median_s": med, "min_s": min(ts), "repeats": repeats,
            "gflops": 2.0 * n**3 / med / 1e9, "gflops_best": 2.0 * n**3 / min(ts) / 1e9}


def shapes(quick: bool, sizes: list[int] | None = None) -> list[tuple[str, int, int]]:
    """(label, batch, n) for every benchmarked shape; ``sizes`` overrides the square ones."""
    mode = "quick" if quick else "full"
    sq = sizes if sizes else SQUARE[mode]
    out = [(f"n={n}", 1, n) for n in sq]
    out += [(f"({b},{n})", b, n) for b, n in BATCHED[mode]]
    return out


def _input(batch: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(batch * 100003 + n)
    a = rng.standard_normal((batch, n, n), dtype=np.float32)
    return a[0] if batch == 1 else a


Validate = Callable[[str, np.ndarray, Runner], "dict[str, Any] | None"]


def measure_shape(label: str, batch: int, n: int, impls: dict[str, Impl], sgemm_gflops: float,
                  quick: bool, validate: Validate | None = None,
                  max_flops: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Time every implementation on one shape (interleaved); one row per implementation.

    ``max_flops[name]`` skips an implementation above that much work (the
    row says so) - for slow kernels that cannot be the best anyway.
    ``validate(name, a, runner)`` may check the last result (untimed) and
    returns a dict stored as the row's ``check`` (its ``passed`` decides
    whether the row can be the "best capqr" of the shape).
    """
    a = _input(batch, n)
    flops = batch * qr_flops(n, n)
    runners: dict[str, Runner] = {}
    rows: dict[str, dict[str, Any]] = {}
    warm: dict[str, float] = {}
    for name, make in impls.items():
        rows[name] = {"shape": label, "batch": batch, "n": n, "impl": name, "flops": flops}
        limit = (max_flops or {}).get(name)
        if limit is not None and flops > limit:
            rows[name]["skipped"] = f"above {limit:.0e} flops (time budget)"
            continue
        try:
            r = make(a)
            warm[name] = time_once(r)  # warm-up run; also sizes the repeat count
            runners[name] = r
        except ModuleNotFoundError as e:  # an optional peer that is not installed
            rows[name]["skipped"] = f"{e.name} not installed"
        except Exception as e:  # noqa: BLE001 - one failing implementation must not end the run
            rows[name]["error"] = f"{type(e).__name__}: {e}"[:300]
    round_s = sum(warm.values())
    repeats = 1 if quick else pick_repeats(round_s, SHAPE_BUDGET_S, MIN_REPEATS, MAX_REPEATS)
    warm_counted = round_s > LONG_ROUND_S and not quick
    samples = (interleaved(runners, repeats - warm_counted, warmup=0, settle_s=SETTLE_S)
               if runners else {})
    for name, s in samples.items():
        if warm_counted:
            s.times.insert(0, warm[name])
        gf = flops / s.median / 1e9
        rows[name].update(s.as_dict())
        rows[name].update({"gflops": gf, "gflops_best": flops / s.min / 1e9,
                           "frac_sgemm": gf / sgemm_gflops if sgemm_gflops else math.nan,
                           "capped": repeats < MAX_REPEATS and not quick,
                           "warmup_counted": warm_counted})
        rep = validate(name, a, runners[name]) if validate is not None else None
        if rep is not None:
            rows[name]["check"] = rep
            rows[name]["check_passed"] = rep.get("passed")
    return list(rows.values())


def compare(rows: list[dict[str, Any]], baseline: str = "scipy") -> list[dict[str, Any]]:
    """Per shape: best passing capqr implementation vs ``baseline`` (speedup = their t / ours)."""
    out = []
    for label in dict.fromkeys(r["shape"] for r in rows):
        sel = [r for r in rows if r["shape"] == label and "gflops" in r]
        ours = [r for r in sel if r["impl"].startswith("capqr:")
                and r.get("check_passed") is not False]
        base = next((r for r in sel if r["impl"] == baseline), None)
        if not ours or base is None:
            continue
        best = max(ours, key=lambda r: r["gflops"])
        out.append({"shape": label, "n": best["n"], "batch": best["batch"], "best": best["impl"],
                    "gflops": best["gflops"], f"{baseline}_gflops": base["gflops"],
                    "speedup": best["gflops"] / base["gflops"],
                    # fastest run vs fastest run: less sensitive to background load
                    "speedup_best": best["gflops_best"] / base["gflops_best"]})
    return out


def run(quick: bool, impls: dict[str, Impl], sizes: list[int] | None = None,
        progress: Any = None, validate: Validate | None = None,
        max_flops: dict[str, float] | None = None) -> dict[str, Any]:
    """Measure the sgemm ceiling, then every shape with every implementation."""
    def tick() -> None:
        if progress is not None:
            progress.update(1)

    if progress is not None:
        progress.set_postfix_str("sgemm ceiling")
    ceiling = sgemm_rate(512 if quick else 2048, 1 if quick else 5)
    rows: list[dict[str, Any]] = []
    for label, batch, n in shapes(quick, sizes):
        if progress is not None:
            progress.set_postfix_str(f"peers {label}")
        rows += measure_shape(label, batch, n, impls, ceiling["gflops"], quick, validate,
                              max_flops)
        tick()
    return {"dtype": "float32", "flops_formula": "2mn^2 - 2n^3/3 per matrix",
            "sgemm": ceiling, "shape_budget_s": SHAPE_BUDGET_S, "long_round_s": LONG_ROUND_S,
            "max_flops": max_flops or {},
            "repeats_range": [MIN_REPEATS, MAX_REPEATS], "rows": rows,
            "vs_scipy": compare(rows)}


def main(argv: list[str] | None = None) -> None:
    """``python -m capqr.bench.peers``: the QR peers section of ``python -m capqr.bench`` alone."""
    import argparse
    import json

    from . import qr

    ap = argparse.ArgumentParser(prog="python -m capqr.bench.peers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (smoke)")
    ap.add_argument("--sizes", default="",
                    help="comma-separated square sizes, e.g. 256,1024 (default: "
                         f"{','.join(map(str, SQUARE['full']))})")
    ap.add_argument("--out", default="", help="write the results to this JSON file")
    ns = ap.parse_args(argv)
    sizes = [int(s) for s in ns.sizes.split(",") if s.strip()] or None

    def validate(name: str, a: np.ndarray, runner: Runner) -> dict[str, Any] | None:
        return qr.check(a, runner) if name.startswith("capqr:") else None

    res = run(ns.quick, {**qr.peer_impls(), **PEERS}, sizes, None, validate, qr.peer_limits())
    for r in res["rows"]:
        gf = r.get("gflops")
        print(f"{r['shape']:>10} {r['impl']:>20} "
              + (f"{gf:8.1f} GF/s" if gf else r.get("skipped") or r.get("error", "")))
    for v in res["vs_scipy"]:
        print(f"{v['shape']:>10} best capqr {v['best']} {v['speedup']:.2f}x scipy")
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
