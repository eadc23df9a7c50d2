"""``python -m capqr.bench.tall_nb``: the tall path's panel width (kernels.parallel.TALL_NB)
measured on this machine's worker pool.

Per shape, ``kernels.qr`` (checked, the tall path) runs with each panel width of --nbs,
interleaved after one warm-up round, and reports the median and minimum of --repeats;
every width's result is checked with ``kernels.check`` once.  Writes
``tall-nb-<date>-<host>.json`` and ``.txt`` into --out.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import machine
from .outdir import default_out

SHAPES = ((65536, 64), (16384, 128), (8192, 256), (4096, 256))


def measure(m: int, n: int, nbs: list[int], repeats: int) -> dict[str, Any]:
    """One shape: each width checked once, then ``repeats`` interleaved timed runs."""
    from .. import kernels, runtime
    from ..kernels import parallel

    if not parallel.use_tall(1, m, n, "float32", runtime.threads()):
        return {"shape": f"{m}x{n}", "skipped": "not the tall path on this pool"}
    a = np.random.default_rng(m + n).standard_normal((m, n)).astype(np.float32)
    load_start = machine.loadavg()
    times: dict[int, list[float]] = {nb: [] for nb in nbs}
    checks = {}
    for nb in nbs:
        checks[nb] = bool(kernels.check(a, *kernels.qr(a, nb=nb)).ok)
    for i in range(repeats + 1):
        for nb in nbs:
            t0 = time.perf_counter()
            kernels.qr(a, nb=nb)
            if i:
                times[nb].append(time.perf_counter() - t0)
    return {"shape": f"{m}x{n}", "checks_ok": checks,
            "median_ms": {nb: float(np.median(t)) * 1e3 for nb, t in times.items()},
            "min_ms": {nb: min(t) * 1e3 for nb, t in times.items()},
            "loadavg_start": load_start, "loadavg_end": machine.loadavg()}


def table(rows: list[dict[str, Any]], nbs: list[int]) -> str:
    out = [f"{'shape':>12} " + " ".join(f"{f'nb={nb} med/min ms':>22}" for nb in nbs)
           + "  checks"]
    for r in rows:
        if "skipped" in r:
            out.append(f"{r['shape']:>12} skipped: {r['skipped']}")
            continue
        cells = " ".join(f"{r['median_ms'][nb]:>11.2f} /{r['min_ms'][nb]:>8.2f}" for nb in nbs)
        out.append(f"{r['shape']:>12} {cells}  {'ok' if all(r['checks_ok'].values()) else 'FAIL'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.tall_nb", description=__doc__)
    ap.add_argument("--nbs", default="16,32", help="panel widths to compare, e.g. 16,32")
    ap.add_argument("--repeats", type=int, default=9, help="timed runs per width and shape")
    ap.add_argument("--out", default=None,
                    help="output directory (default $CAPQR_BENCH_OUT or ./bench-results)")
    ns = ap.parse_args(argv)
    from .. import runtime

    nbs = [int(x) for x in ns.nbs.split(",")]
    rows = []
    for m, n in SHAPES:
        rows.append(measure(m, n, nbs, ns.repeats))
        print(table(rows[-1:], nbs).splitlines()[-1], flush=True)
    host = machine.host()
    res = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "host": host, "git": machine.git_commit(), "source_digest": machine.source_digest(),
           "workers": runtime.threads(), "repeats": ns.repeats, "rows": rows}
    out = Path(ns.out) if ns.out else default_out()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"tall-nb-{_dt.date.today().isoformat()}-{host['label']}"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1))
    loads = [r["loadavg_start"] for r in rows if "loadavg_start" in r]
    first_load = loads[0] if loads else "n/a"
    footer = (f"host {host['label']} ({host['cpu_model']}); {res['workers']} workers; median "
              f"and min of {ns.repeats}; load average at the first shape {first_load}, "
              f"source digest {res['source_digest']}")
    (out / f"{stem}.txt").write_text(table(rows, nbs) + "\n" + footer + "\n")
    print(table(rows, nbs))
    print(footer)
    print(f"wrote {out / stem}.json and .txt", file=sys.stderr)
    return out / f"{stem}.json"


if __name__ == "__main__":
    main()
