"""``python -m bench``: overhead, QR peers and collector benchmarks -> JSON, PNGs, latest.md.

Options: ``--quick`` (tiny sizes, one repeat: the CI smoke run), ``--sizes 256,512``
(square QR sizes), ``--only overhead|peers|gc`` (repeatable), ``--out DIR``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from . import machine, micro, overhead, peers, qr, report

SECTIONS = ("overhead", "peers", "gc")
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, one repeat (CI smoke run, < 60 s)")
    ap.add_argument("--sizes", default="",
                    help="comma-separated square QR sizes, e.g. 256,1024 (overrides defaults)")
    ap.add_argument("--only", action="append", choices=SECTIONS,
                    help="run only this section (repeatable)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output directory")
    return ap.parse_args(argv)


def _gc_bench(quick: bool) -> Any:
    """bench/gc_bench.py's ``run(quick)`` (the collector agent's benchmark), if present."""
    try:
        mod = importlib.import_module("bench.gc_bench")
    except ImportError as e:
        return {"error": f"bench/gc_bench.py not importable: {e}"}
    fn = getattr(mod, "run", None)
    if fn is None:
        return {"error": "bench/gc_bench.py has no run(quick)"}
    try:
        return fn(quick=quick)
    except Exception as e:  # noqa: BLE001 - a failing section is reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def run(argv: list[str] | None = None) -> dict[str, Path]:
    """Run the selected sections and write the results; returns the written paths."""
    ns = parse_args(argv)
    only = set(ns.only or SECTIONS)
    sizes = [int(s) for s in ns.sizes.split(",") if s.strip()] or None
    quick = ns.quick
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

    with tqdm(total=total, desc="bench", unit="step", dynamic_ncols=True) as bar:
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

    res["gpu"] = report.load_gpu(DEFAULT_OUT)
    res["meta"]["loadavg_end"] = machine.loadavg()
    res["elapsed_s"] = time.perf_counter() - t0
    paths = report.write(res, Path(ns.out))
    for t in res["targets"]:
        print(f"{t['target']}: {t['value']} (goal {t['goal']}): {t['status']}")
    print(f"wrote {', '.join(str(p) for p in paths.values())} in {res['elapsed_s']:.0f} s")
    return paths


if __name__ == "__main__":
    run()
