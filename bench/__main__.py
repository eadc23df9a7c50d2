"""``python -m capqr.bench``: overhead, QR peers, collector and GPU benchmarks -> JSON,
PNGs, latest.md.

Options: ``--quick`` (tiny sizes, one repeat: the CI smoke run), ``--sizes 256,512``
(square QR sizes), ``--only overhead|peers|gc|gpu`` (repeatable), ``--out DIR``
(default ``$CAPQR_BENCH_OUT`` or ./bench-results: no tracked file changes), and
``--update-docs`` (the tables into docs/benchmarks.md, the plots into bench/results/).
The GPU section (bench/gpu_bench.py) runs when ``runtime.cuda.available()``;
otherwise it prints why and the report shows the newest committed GPU result.
The progress bar counts steps and shows no time estimate: the steps differ in cost by
orders of magnitude, so an extrapolation from the first ones says nothing.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from . import machine, micro, overhead, peers, qr, report
from .outdir import default_out

SECTIONS = ("overhead", "peers", "gc", "gpu")
#: GPU section of a quick run: one small shape, few repeats.
GPU_QUICK_ARGS = ["--shapes", "20x32", "--repeat", "2"]
#: The committed results (the newest GPU result is read from here when no GPU is usable).
COMMITTED = Path(__file__).resolve().parent / "results"
#: Steps, elapsed time and the current step; no remaining-time estimate (see above).
BAR_FORMAT = "{desc}: {n_fmt}/{total_fmt} steps |{bar}| {elapsed} elapsed{postfix}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(prog="python -m capqr.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, one repeat (CI smoke run, < 60 s)")
    ap.add_argument("--sizes", default="",
                    help="comma-separated square QR sizes, e.g. 256,1024 (overrides defaults)")
    ap.add_argument("--only", action="append", choices=SECTIONS,
                    help="run only this section (repeatable)")
    ap.add_argument("--out", default="",
                    help="output directory (default $CAPQR_BENCH_OUT, else ./bench-results)")
    ap.add_argument("--update-docs", action="store_true",
                    help="also write the tables into docs/benchmarks.md and the plots into "
                         "bench/results/ (tracked files; full runs only)")
    return ap.parse_args(argv)


def _gc_bench(quick: bool) -> Any:
    """bench/gc_bench.py's ``run(quick)``; a failure is reported in the results, not fatal."""
    from . import gc_bench

    try:
        return gc_bench.run(quick=quick)
    except Exception as e:  # noqa: BLE001 - a failing section is reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def _gpu_bench(quick: bool, out: Path) -> list[dict[str, Any]]:
    """Run bench/gpu_bench.py into ``out`` when a GPU is usable; else say why and return []."""
    try:
        from ..runtime import cuda

        ok, why = cuda.available()
    except Exception as e:  # noqa: BLE001 - no cffi/libcuda: the section is skipped, not fatal
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        print(f"gpu: skipped, no usable GPU ({why})")
        return []
    from . import gpu_bench

    name = f"gpu-{datetime.date.today().isoformat()}{'-quick' if quick else ''}.json"
    path = gpu_bench.main((GPU_QUICK_ARGS if quick else []) + ["--out", str(out / name)])
    return report.load_gpu_file(path, rerun=True) if path else []


def run(argv: list[str] | None = None) -> dict[str, Path]:
    """Run the selected sections and write the results; returns the written paths."""
    ns = parse_args(argv)
    only = set(ns.only or SECTIONS)
    sizes = [int(s) for s in ns.sizes.split(",") if s.strip()] or None
    quick = ns.quick
    if ns.update_docs and quick:
        raise SystemExit("--update-docs takes a full run's results, not --quick ones")
    t0 = time.perf_counter()
    res: dict[str, Any] = {"quick": quick, "argv": sys.argv[1:] if argv is None else argv,
                           "meta": machine.describe()}

    ov_cases = []
    if "overhead" in only:
        ov_cases = qr.overhead_cases(quick, sizes) + micro.cases(quick)
    gc_case = qr.gc_case(quick) if "gc" in only else None
    shapes = peers.shapes(quick, sizes) if "peers" in only else []
    total = len(ov_cases) + (gc_case is not None) + len(shapes) + ("gc" in only)
    repeats = 1 if quick else overhead.REPEATS

    with tqdm(total=total, desc="bench", unit="step", dynamic_ncols=True,
              bar_format=BAR_FORMAT) as bar:
        if ov_cases or gc_case is not None:
            res["overhead"] = overhead.run(ov_cases, gc_case, repeats, bar)
        if shapes:
            impls = {**qr.peer_impls(), **peers.PEERS}

            def validate(name: str, a: Any, runner: Any) -> dict[str, Any] | None:
                return qr.check(a, runner) if name.startswith("capqr:") else None

            res["peers"] = peers.run(quick, impls, sizes, bar, validate, qr.peer_limits())
        if "gc" in only:
            bar.set_postfix_str("gc_bench")
            res["gc_bench"] = _gc_bench(quick)
            bar.update(1)

    out = Path(ns.out) if ns.out else default_out()
    res["gpu"] = (_gpu_bench(quick, out) if "gpu" in only else []) or \
        report.load_gpu(COMMITTED)
    res["meta"]["loadavg_end"] = machine.loadavg()
    res["elapsed_s"] = time.perf_counter() - t0
    paths = report.write(res, out, ns.update_docs)
    for t in res["targets"]:
        print(f"{t['target']}: {t['value']} (goal {t['goal']}): {t['status']}")
    print(f"wrote {', '.join(str(p) for p in paths.values())} in {res['elapsed_s']:.0f} s")
    return paths


if __name__ == "__main__":
    run()
