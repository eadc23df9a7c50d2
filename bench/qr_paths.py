"""``python -m capqr.bench.qr_paths``: which path of the ``parallel`` QR variant is fastest
for one float32 n x n matrix on this machine's worker pool.

The paths (kernels/parallel.py): ``steps`` (one launch per panel, column tiles on every
worker), ``oneblock`` (the whole matrix on one block, one launch), ``tall`` (rows shared
out between every worker, one launch) and ``coop`` (the steps in one launch, a group of
the workers, parallel.group_workers).  Each size (n for n x n, or MxN) runs the paths
(--paths, default all four) interleaved after a checking run and a warm-up run of each
(checked builds, through ``parallel.run`` on a fresh copy, the copy untimed) and reports
the median of --repeats;
``kernels.parallel.use_steps`` takes ``steps`` from the work of an STEPS_MIN_N-square
matrix on, and this is what that threshold is read from; ``default`` names the path
``kernels.parallel.default_path`` picks.

Writes ``qr-paths-<date>-<host>.json`` and ``.txt`` into --out.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import machine
from .outdir import default_out

SIZES = (128, 192, 256, 384, 512, 640, 768, 1024)
PATHS: dict[str, dict[str, Any]] = {"steps": {"steps": True}, "oneblock": {"steps": False},
                                    "tall": {"tall": True}, "coop": {"coop": True}}


def parse_size(spec: str) -> tuple[int, int]:
    """``"n"`` (an n x n matrix) or ``"MxN"`` as (m, n)."""
    m, _, n = spec.strip().partition("x")
    return int(m), int(n or m)


def measure(n: int, repeats: int, paths: tuple[str, ...] = tuple(PATHS),
            m: int | None = None) -> dict[str, Any]:
    """One size (m x n, m = n by default): each of ``paths`` checked once, then
    ``repeats`` interleaved timed runs."""
    from ..kernels import check, parallel

    m = n if m is None else m
    a = np.random.default_rng(n).standard_normal((1, m, n)).astype(np.float32)
    row: dict[str, Any] = {"n": n if m == n else f"{m}x{n}", "loadavg_start": machine.loadavg()}
    times: dict[str, list[float]] = {p: [] for p in paths}
    # two untimed rounds: the first checks every path, the second lets the pool settle
    # (the first timed run of each path was 10-50x the rest on a fresh 16-core host)
    for i in range(repeats + 2):
        for p in paths:
            kw = PATHS[p]
            h = a.copy()
            tau = np.zeros((1, min(m, n)), np.float32)
            t0 = time.perf_counter()
            parallel.run(h, tau, "float32", None, parallel.TW_MAX, True, None, None, **kw)
            dt = time.perf_counter() - t0
            if i == 0:
                rep = check(a, h, tau)
                if not rep.ok:
                    raise AssertionError(f"path {p} at {row['n']} fails the checker: {rep}")
            elif i > 1:
                times[p].append(dt)
    for p, ts in times.items():
        row[p] = {"median_s": float(np.median(ts)), "min_s": min(ts), "samples_s": ts}
    row["fastest"] = min(paths, key=lambda p: row[p]["median_s"])
    row["loadavg_end"] = machine.loadavg()
    return row


def _load1(avg: list[float] | None) -> str:
    return "?" if not avg else f"{avg[0]:.2f}"


HEADER = (f"{'n':>6} {'steps ms':>10} {'oneblock ms':>12} {'tall ms':>10} {'coop ms':>10}"
          f"  fastest  use_steps  default     load")


def _ms(row: dict[str, Any], path: str, width: int) -> str:
    """A path's median in ms, or "-" where it was not measured."""
    return f"{1e3 * row[path]['median_s']:>{width}.3f}" if path in row else f"{'-':>{width}}"


def _line(row: dict[str, Any]) -> str:
    """One size's row of the table (printed as it is measured, and in the .txt)."""
    return (f"{row['n']:>6} {_ms(row, 'steps', 10)} {_ms(row, 'oneblock', 12)} "
            f"{_ms(row, 'tall', 10)} {_ms(row, 'coop', 10)}"
            f"  {row['fastest']:<8} {row['use_steps']!s:<9}  {row['default']:<10}  "
            f"{_load1(row['loadavg_start'])}->{_load1(row['loadavg_end'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.qr_paths", description=__doc__)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="comma-separated n, or MxN for an m x n matrix (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per path and size")
    ap.add_argument("--paths", default=",".join(PATHS),
                    help="comma-separated paths to time (default %(default)s)")
    ap.add_argument("--threads", type=int, default=None,
                    help="worker pool size ($CAPQR_THREADS; default: all cpus)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default $CAPQR_BENCH_OUT or ./bench-results)")
    ns = ap.parse_args(argv)
    if ns.threads:
        os.environ["CAPQR_THREADS"] = str(ns.threads)  # read when the runtime loads
    from .. import runtime
    from ..kernels import parallel

    threads = runtime.threads()
    paths = tuple(ns.paths.split(","))
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        ap.error(f"--paths: unknown {unknown}; choose from {', '.join(PATHS)}")
    rows = []
    print(HEADER, flush=True)
    for m, n in map(parse_size, ns.sizes.split(",")):
        row = measure(n, ns.repeats, paths, m)
        row["use_steps"] = parallel.use_steps(1, m, n, parallel.default_nb(m, n), threads)
        row["default"] = parallel.default_path(1, m, n, "float32", threads)
        rows.append(row)
        print(_line(row), flush=True)
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": machine.host(), "git": machine.git_commit(),
            "source_digest": machine.source_digest(), "threads": threads,
            "steps_min_n": parallel.steps_min_n(threads), "repeats": ns.repeats,
            "paths": list(paths)}
    out = ns.out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"qr-paths-{meta['date'][:10]}-{meta['host']['label']}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [HEADER, *map(_line, rows)]
    lines.append(f"host {meta['host']['label']} ({meta['host']['cpu_model']}); {threads} "
                 f"workers; STEPS_MIN_N {meta['steps_min_n']}; median of {ns.repeats}")
    (out / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / stem}.json and .txt", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
