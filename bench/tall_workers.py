"""``python -m capqr.bench.tall_workers``: the tall path's group size (how many workers
share the rows of one matrix, kernels.parallel.TALL_MAX_WORKERS / run's ``tall_workers``)
measured on this machine's worker pool.

The tall path (kernels/src/qrt_tall.c) meets at a group barrier per panel column, so
one worker descheduled stalls them all; on the H100 host's 16 vCPUs with the whole pool
in the group it was bimodal (65536 x 64: 7.5-12 or 30-48 ms).  Per shape, each group
size of --tall-workers runs, interleaved (the order rotated every round, after an
untimed checking round and a warm-up round), through each API of --apis:

* ``run``: ``parallel.run(..., tall=True, tall_workers=w)`` on a copy of the matrix (the
  copy untimed): the kernel launches alone;
* ``qr``: ``kernels.qr`` (checked) with ``parallel.TALL_MAX_WORKERS = w``: what a caller
  sees, its input copy included (the copy runs on the whole pool).

It reports the median, minimum and maximum of the samples and the fraction of them in
the slow mode: over --slow-factor (2) times that group size's minimum (``slow``), and
over that factor times the shape and API's best minimum over every group size
(``slow_best``: a group size that is always slow is slow there).  Per sample it also
records the process's involuntary context switches (getrusage: a worker preempted in
the guest, or a barrier wait's sched_yield that gave its core away) and the steal time
of /proc/stat (the hypervisor running something else on a vCPU), in clock ticks.
Every group size's result is compared bitwise with the whole pool's once, and that
one checked with ``kernels.check``.

Writes ``tall-workers-<date>-<host>.json`` and ``.txt`` into --out.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import machine
from .outdir import default_out

SHAPES = ((65536, 64), (8192, 256))
APIS = ("run", "qr")


def _steal_ticks() -> int | None:
    """Steal time of all CPUs so far (/proc/stat, clock ticks), None where unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError):
        return None


def _csw() -> tuple[int, int]:
    """(involuntary, voluntary) context switches of this process's threads so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nivcsw, r.ru_nvcsw


def topology() -> dict[str, Any]:
    """What decides how many workers can spin at once: CPUs this process may run on and
    the hyperthread siblings of cpu0 (two vCPUs of one core share its FMA units)."""
    out: dict[str, Any] = {"cpu_count": os.cpu_count()}
    try:
        out["affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["affinity"] = None
    try:
        base = Path("/sys/devices/system/cpu/cpu0/topology")
        out["cpu0_thread_siblings"] = (base / "thread_siblings_list").read_text().strip()
    except OSError:
        out["cpu0_thread_siblings"] = None
    return out


def _runner(api: str, a3: np.ndarray, w: int) -> tuple[Any, Any]:
    """(prepare, timed) callables of one sample of ``api`` with a group of ``w``."""
    from .. import kernels
    from ..kernels import parallel

    _, m, n = a3.shape
    if api == "run":
        h = np.empty_like(a3)
        tau = np.zeros((1, min(m, n)), np.float32)

        def prepare() -> None:
            np.copyto(h, a3)

        def timed() -> tuple[np.ndarray, np.ndarray]:
            parallel.run(h, tau, "float32", None, parallel.TW_MAX, True, None, None,
                         tall=True, tall_workers=w)
            return h[0], tau[0]

        return prepare, timed

    def qr_timed() -> tuple[np.ndarray, np.ndarray]:
        saved = parallel.TALL_MAX_WORKERS
        parallel.TALL_MAX_WORKERS = w
        try:
            return kernels.qr(a3[0])
        finally:
            parallel.TALL_MAX_WORKERS = saved

    return (lambda: None), qr_timed


def measure(m: int, n: int, workers: list[int], apis: list[str], samples: int,
            slow_factor: float, max_seconds: float) -> dict[str, Any]:
    """One shape: every (api, group size) checked once and warmed up once, then up to
    ``samples`` interleaved rounds (at least 15 if ``max_seconds`` runs out first)."""
    from .. import kernels, runtime
    from ..kernels import parallel

    threads = runtime.threads()
    shape = f"{m}x{n}"
    if not parallel.use_tall(1, m, n, "float32", threads):
        return {"shape": shape, "skipped": "not the tall path on this pool"}
    a3 = np.random.default_rng(m + n).standard_normal((1, m, n)).astype(np.float32)
    keys = [(api, w) for api in apis for w in workers]
    run = {k: _runner(k[0], a3, k[1]) for k in keys}
    # untimed: each result against the whole pool's, bitwise; that one by the checker
    ref_h = np.array(a3)
    ref_tau = np.zeros((1, min(m, n)), np.float32)
    parallel.run(ref_h, ref_tau, "float32", None, parallel.TW_MAX, True, None, None, tall=True)
    check_ok = bool(kernels.check(a3[0], ref_h[0], ref_tau[0]).ok)
    bitwise = {}
    for k in keys:
        prepare, timed = run[k]
        prepare()
        h, tau = timed()
        bitwise[k] = (np.asarray(h).tobytes() == ref_h[0].tobytes()
                      and np.asarray(tau).tobytes() == ref_tau[0].tobytes())
    times: dict[tuple[str, int], list[float]] = {k: [] for k in keys}
    ivcsw: dict[tuple[str, int], list[int]] = {k: [] for k in keys}
    vcsw: dict[tuple[str, int], list[int]] = {k: [] for k in keys}
    steal: dict[tuple[str, int], list[int | None]] = {k: [] for k in keys}
    load_start = machine.loadavg()
    t_start = time.monotonic()
    rounds = 0
    for i in range(samples + 1):   # round 0: warm-up, untimed
        if i > 15 and time.monotonic() - t_start > max_seconds:
            break
        order = keys[i % len(keys):] + keys[:i % len(keys)]
        for k in order:
            prepare, timed = run[k]
            prepare()
            s0, (iv0, v0) = _steal_ticks(), _csw()
            t0 = time.perf_counter()
            timed()
            dt = time.perf_counter() - t0
            s1, (iv1, v1) = _steal_ticks(), _csw()
            if i:
                times[k].append(dt)
                ivcsw[k].append(iv1 - iv0)
                vcsw[k].append(v1 - v0)
                steal[k].append(None if s0 is None or s1 is None else s1 - s0)
        rounds = i
    best = {api: min(min(times[(api, w)]) for w in workers) for api in apis}
    cells = []
    for api, w in keys:
        ts = times[(api, w)]
        lo = min(ts)
        slow = [t > slow_factor * lo for t in ts]
        iv = ivcsw[(api, w)]
        st = [s for s in steal[(api, w)] if s is not None]
        iv_slow = [c for c, s in zip(iv, slow, strict=True) if s]
        iv_fast = [c for c, s in zip(iv, slow, strict=True) if not s]
        cells.append({
            "api": api, "workers": w, "blocks": parallel.tall_blocks(m, threads, w),
            "bitwise_same": bitwise[(api, w)], "samples": len(ts),
            "median_ms": float(np.median(ts)) * 1e3, "min_ms": lo * 1e3,
            "max_ms": max(ts) * 1e3,
            "slow_frac": sum(slow) / len(ts),
            "slow_best_frac": sum(t > slow_factor * best[api] for t in ts) / len(ts),
            "ivcsw_mean_slow": float(np.mean(iv_slow)) if iv_slow else None,
            "ivcsw_mean_fast": float(np.mean(iv_fast)) if iv_fast else None,
            "steal_ticks": sum(st) if st else None,
            "samples_ms": [t * 1e3 for t in ts], "ivcsw": iv, "vcsw": vcsw[(api, w)],
            "steal": steal[(api, w)]})
    return {"shape": shape, "chunks": -(-m // parallel.tall_chunk_rows(m)),
            "checks_ok": check_ok, "rounds": rounds, "cells": cells,
            "seconds": time.monotonic() - t_start,
            "loadavg_start": load_start, "loadavg_end": machine.loadavg()}


HEADER = (f"{'shape':>10} {'api':>4} {'workers':>7} {'blocks':>6} {'median':>8} {'min':>8} "
          f"{'max':>8} {'slow':>5} {'slowbest':>8} {'ivcsw slow/fast':>16} {'steal':>6}  same")


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def lines(row: dict[str, Any]) -> list[str]:
    """The table rows of one shape (ms; fractions of the samples)."""
    if "skipped" in row:
        return [f"{row['shape']:>10} skipped: {row['skipped']}"]
    out = []
    for c in row["cells"]:
        out.append(f"{row['shape']:>10} {c['api']:>4} {c['workers']:>7} {c['blocks']:>6} "
                   f"{c['median_ms']:>8.2f} {c['min_ms']:>8.2f} {c['max_ms']:>8.2f} "
                   f"{c['slow_frac']:>5.2f} {c['slow_best_frac']:>8.2f} "
                   f"{_num(c['ivcsw_mean_slow']) + '/' + _num(c['ivcsw_mean_fast']):>16} "
                   f"{_num(c['steal_ticks'], 'd'):>6}  "
                   f"{'yes' if c['bitwise_same'] else 'NO'}")
    return out


def default_workers(threads: int) -> list[int]:
    """The pool, one fewer, three quarters and half of it (distinct, at least 1)."""
    ws = [threads, threads - 1, 3 * threads // 4, threads // 2]
    return sorted({w for w in ws if w >= 1}, reverse=True)


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.tall_workers",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tall-workers", default=None,
                    help="group sizes to compare, e.g. 16,15,12,8 (default: the pool, one "
                         "fewer, 3/4 and 1/2 of it; capped at the pool and the row chunks)")
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES),
                    help="m x n shapes, comma-separated (default %(default)s)")
    ap.add_argument("--apis", default=",".join(APIS), help="run and/or qr (see above)")
    ap.add_argument("--samples", type=int, default=21,
                    help="timed samples per group size, API and shape (at least 15)")
    ap.add_argument("--slow-factor", type=float, default=2.0,
                    help="a sample over this times the minimum is in the slow mode")
    ap.add_argument("--max-seconds", type=float, default=30.0,
                    help="per shape: no round starts after this, once 15 are done")
    ap.add_argument("--threads", type=int, default=None,
                    help="worker pool size ($CAPQR_THREADS; default: all cpus)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default $CAPQR_BENCH_OUT or ./bench-results)")
    ns = ap.parse_args(argv)
    if ns.samples < 15:
        ap.error("--samples: at least 15")
    apis = [s for s in ns.apis.split(",") if s]
    if not apis or set(apis) - set(APIS):
        ap.error(f"--apis: some of {','.join(APIS)}")
    if ns.threads:
        os.environ["CAPQR_THREADS"] = str(ns.threads)  # read when the runtime loads
    from .. import runtime

    threads = runtime.threads()
    workers = (default_workers(threads) if ns.tall_workers is None
               else [int(s) for s in ns.tall_workers.split(",") if s])
    if not workers or min(workers) < 1:
        ap.error("--tall-workers: positive ints")
    shapes = [tuple(int(x) for x in s.split("x")) for s in ns.shapes.split(",") if s]
    print(HEADER, flush=True)
    rows = []
    for m, n in shapes:
        rows.append(measure(m, n, workers, apis, ns.samples, ns.slow_factor, ns.max_seconds))
        for line in lines(rows[-1]):
            print(line, flush=True)
    host = machine.host()
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": host, "git": machine.git_commit(),
            "source_digest": machine.source_digest(), "threads": threads,
            "topology": topology(), "tall_workers": workers, "apis": apis,
            "samples": ns.samples, "slow_factor": ns.slow_factor,
            "clock_ticks_per_s": os.sysconf("SC_CLK_TCK")}
    out = ns.out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"tall-workers-{meta['date'][:10]}-{host['label']}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    ok = all(r.get("checks_ok", True) for r in rows) and all(
        c["bitwise_same"] for r in rows for c in r.get("cells", ()))
    footer = (f"host {host['label']} ({host['cpu_model']}); {threads} workers; "
              f"topology {meta['topology']}; ms, median/min/max of up to {ns.samples}; "
              f"slow: > {ns.slow_factor}x the cell's min, slowbest: > {ns.slow_factor}x the "
              f"shape and api's best min; ivcsw: involuntary context switches per sample, "
              f"mean over slow/fast samples; steal: /proc/stat ticks over the cell; "
              f"checks and bitwise {'ok' if ok else 'FAILED'}; load "
              f"{[r.get('loadavg_start') for r in rows]}; git {meta['git']}")
    text = "\n".join([HEADER, *(x for r in rows for x in lines(r)), footer])
    (out / f"{stem}.txt").write_text(text + "\n")
    print(footer)
    print(f"wrote {out / stem}.json and .txt", file=sys.stderr)
    if not ok:
        raise SystemExit(1)
    return out / f"{stem}.json"


if __name__ == "__main__":
    main()
