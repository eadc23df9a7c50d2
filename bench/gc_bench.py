"""Collector benchmark: soft-handshake latency with 2 and 8 busy threads,
mutator throughput with cycles running back to back vs the collector
disabled, sustained kernel allocation rate, and the churn scenario (a fixed
live set whose slots every worker keeps replacing: peak RSS over the
baseline against the live bytes, at two run lengths, and allocation
throughput).

Each measurement runs in a fresh process (the worker count, CAPQR_THREADS,
is fixed at import).  ``python -m capqr.bench.gc_bench [--quick]`` prints JSON;
``python -m capqr.bench.gc_bench --churn`` runs only the churn scenario and writes
gc-churn-<date>.json (machine, load, commit) into --out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SPIN_SRC = """
KERNEL void spin(cap_t flag)
{
    int64_t k = 0;
    while (cap_load_i64(flag, 0) == 0) { k++; }
}
"""

# Mutator work: a long loop of loads/stores with a pollcheck per iteration.
WORK_SRC = """
KERNEL void work(cap_t x, int64_t n, int64_t reps)
{
    int64_t b = rt_block_idx();
    double acc = 0.0;
    for (int64_t r = 0; r < reps; r++) {
        for (int64_t i = 0; i < n; i++) {
            acc = acc * 0.999 + cap_load_f64(x, i);
            if (acc > 1e300) acc = 0.0;
        }
        cap_store_f64(x, (b + r) % n, acc * 1e-9);
    }
}
"""

ALLOC_SRC = """
KERNEL void churn(cap_t keep, int64_t iters, int64_t n)
{
    int64_t b = rt_block_idx();
    cap_t t = cap_alloc_cap(4);
    for (int64_t it = 0; it < iters; it++) {
        cap_t x = cap_alloc_f32(n);
        cap_store_f32(x, 0, 1.0f);
        cap_store_cap(t, it % 4, x);
    }
    cap_store_cap(keep, b, t);
}
"""

# Every worker replaces random slots of one table holding the live set.
CHURN_SRC = """
KERNEL void fill(cap_t table, int64_t nslots, int64_t n)
{
    for (int64_t i = 0; i < nslots; i++) {
        cap_t x = cap_alloc_f32(n);
        cap_store_f32(x, 0, 1.0f);
        cap_store_cap(table, i, x);
    }
}

KERNEL void churn(cap_t table, int64_t iters, int64_t nslots, int64_t n)
{
    int64_t s = rt_block_idx() * 7919 + 17;
    for (int64_t it = 0; it < iters; it++) {
        s = (s * 1103515245 + 12345) % 2147483648;
        cap_t x = cap_alloc_f32(n);
        cap_store_f32(x, 0, 1.0f);
        cap_store_cap(table, (s / 16) % nslots, x);
    }
}
"""

HANDSHAKE_CHILD = r"""
import json, sys, threading, time
import numpy as np
from capqr import capabilities, runtime
import capqr.runtime.core  # noqa: F401 (loads the submodule)
from capqr.runtime.core import lib
n, secs = int(sys.argv[1]), float(sys.argv[2])
k = runtime.compile(SPIN_SRC, "spin")
flag = capabilities.alloc(1, np.int64)
th = threading.Thread(target=lambda: runtime.launch(k, [flag], grid=n, timeout=120))
th.start()
while lib.rt_core_kernels_running() < n:
    time.sleep(0.001)
runtime.gc_collect()
lib.gc_reset_handshake_stats()
t0 = time.perf_counter(); cycles = 0
while time.perf_counter() - t0 < secs:
    runtime.gc_collect(); cycles += 1
s = runtime.gc_stats()
obs = runtime.core.ffi.new("double[3]")
lib.gc_handshake_observed_us(obs)
flag.numpy()[0] = 1
th.join()
print(json.dumps(dict(busy_threads=n, cycles=cycles, handshake_p50_us=s["handshake_p50_us"],
                      handshake_p99_us=s["handshake_p99_us"],
                      handshake_max_us=s["handshake_max_us"],
                      collector_observed_p50_us=obs[0], collector_observed_p99_us=obs[1])))
"""

THROUGHPUT_CHILD = r"""
import json, sys, threading, time
import numpy as np
from capqr import capabilities, runtime
reps = int(sys.argv[1]); rounds = int(sys.argv[2])
k = runtime.compile(WORK_SRC, "work")
nthr = runtime.threads()
x = capabilities.alloc(4096, np.float64)
x.numpy()[:] = 1.0
def once():
    t = time.perf_counter()
    runtime.launch(k, [x], args=(4096, reps), grid=nthr, timeout=300)
    return time.perf_counter() - t
once()
def measure(running):
    stop = [False]; cycles = [0]
    def hammer():
        while not stop[0]:
            runtime.gc_collect(); cycles[0] += 1
    th = None
    if running:
        th = threading.Thread(target=hammer); th.start()
    ts = [once() for _ in range(rounds)]
    stop[0] = True
    if th: th.join()
    return min(ts), cycles[0]
runtime.gc_set_enabled(False)
# interleave to cancel drift; best of rounds each
d1, _ = measure(False); r1, c1 = measure(True); d2, _ = measure(False); r2, c2 = measure(True)
runtime.gc_set_enabled(True)
d, r = min(d1, d2), min(r1, r2)
print(json.dumps(dict(threads=nthr, seconds_disabled=d, seconds_running=r,
                      cycles_while_running=c1 + c2, throughput_ratio=d / r)))
"""

ALLOC_CHILD = r"""
import json, sys, threading, time
import numpy as np
from capqr import capabilities, runtime
iters = int(sys.argv[1])
k = runtime.compile(ALLOC_SRC, "churn")
nthr = runtime.threads()
grid = 4 * nthr
keep = capabilities.alloc(grid, "cap")
peak = [0]; stop = [False]
def watch():
    while not stop[0]:
        peak[0] = max(peak[0], runtime.gc_stats()["bytes_live"]); time.sleep(0.002)
w = threading.Thread(target=watch); w.start()
s0 = runtime.gc_stats(); t = time.perf_counter()
runtime.launch(k, [keep], args=(iters, 64), grid=grid, timeout=300)
dt = time.perf_counter() - t
stop[0] = True; w.join()
s1 = runtime.gc_stats()
objs = s1["objects_allocated_total"] - s0["objects_allocated_total"]
byts = s1["bytes_allocated_total"] - s0["bytes_allocated_total"]
print(json.dumps(dict(threads=nthr, objects=objs, seconds=dt, objects_per_s=objs / dt,
                      mib_per_s=byts / dt / 2**20, cycles=s1["cycles"] - s0["cycles"],
                      peak_live_mib=peak[0] / 2**20,
                      mark_s=s1["mark_seconds_total"] - s0["mark_seconds_total"],
                      sweep_s=s1["sweep_seconds_total"] - s0["sweep_seconds_total"])))
"""


CHURN_CHILD = r"""
import json, resource, sys, time
import numpy as np
from capqr import capabilities, runtime
total, nslots, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
fill = runtime.compile(CHURN_SRC, "fill")
churn = runtime.compile(CHURN_SRC, "churn")
nthr = runtime.threads()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
def peak_rss():
    # VmHWM belongs to this process's own memory map; ru_maxrss would carry
    # over the parent's peak across the vfork + exec that started us
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
table = capabilities.alloc(nslots, "cap", name="live")
runtime.gc_collect(); runtime.gc_collect()
base = rss()
runtime.launch(fill, [table], args=(nslots, n), timeout=600)
runtime.gc_collect(); runtime.gc_collect()
live = runtime.gc_stats()["bytes_live"]          # payload bytes of the live set
live_rss = rss() - base                           # what it costs in resident memory
from capqr.runtime.core import lib
occ_live = lib.gc_heap_occupancy()
lib.gc_heap_peak(1)
s0 = runtime.gc_stats(); t = time.perf_counter()
runtime.launch(churn, [table], args=(total // nthr, nslots, n), grid=nthr, timeout=600)
dt = time.perf_counter() - t
s1 = runtime.gc_stats()
peak = peak_rss() - base
objs = s1["objects_allocated_total"] - s0["objects_allocated_total"]
print(json.dumps(dict(threads=nthr, allocations=objs, seconds=dt, allocs_per_s=objs / dt,
                      live_payload_mib=live / 2**20, live_rss_mib=live_rss / 2**20,
                      peak_rss_over_base_mib=peak / 2**20,
                      peak_over_live_rss=peak / max(live_rss, 1),
                      live_occupancy_mib=occ_live / 2**20,
                      peak_occupancy_mib=lib.gc_heap_peak(0) / 2**20,
                      goal_mib=lib.gc_heap_goal() / 2**20,
                      cycles=s1["cycles"] - s0["cycles"],
                      threshold_mib=s1["threshold_bytes"] / 2**20,
                      mark_s=s1["mark_seconds_total"] - s0["mark_seconds_total"],
                      sweep_s=s1["sweep_seconds_total"] - s0["sweep_seconds_total"])))
"""


def _child(code: str, args: list, threads: int | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if threads:
        env["CAPQR_THREADS"] = str(threads)
    prelude = (f"SPIN_SRC = {SPIN_SRC!r}\nWORK_SRC = {WORK_SRC!r}\nALLOC_SRC = {ALLOC_SRC!r}\n"
               f"CHURN_SRC = {CHURN_SRC!r}\n")
    p = subprocess.run([sys.executable, "-c", prelude + code, *map(str, args)], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"gc_bench child failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def churn(quick: bool = False) -> list:
    """16384 live float32[256] buffers, all workers replacing random slots;
    two run lengths, so a bound that holds only for short runs shows."""
    lengths = (250_000, 1_000_000) if quick else (1_000_000, 6_000_000)
    return [_child(CHURN_CHILD, [n, 16384, 256]) for n in lengths]


def run(quick: bool = False) -> dict:
    secs = 1.0 if quick else 3.0
    out = {"cpus": os.cpu_count()}
    out["handshake"] = [_child(HANDSHAKE_CHILD, [n, secs], threads=n) for n in (2, 8)]
    # Mutators on cpus-1 workers, so the collector thread has a core (as a
    # concurrent collector assumes); also the fully subscribed case.
    cpus = os.cpu_count() or 1
    out["throughput"] = _child(THROUGHPUT_CHILD, [2000 if quick else 8000, 3 if quick else 5],
                               threads=max(1, cpus - 1))
    out["throughput_all_cores"] = _child(THROUGHPUT_CHILD, [2000 if quick else 8000, 3],
                                         threads=cpus)
    out["allocation"] = _child(ALLOC_CHILD, [5000 if quick else 50000])
    out["churn"] = churn(quick)
    out["goals"] = {
        "handshake_p99_under_100us": {str(h["busy_threads"]): h["handshake_p99_us"] < 100
                                      for h in out["handshake"]},
        "mutator_slowdown_under_5pct": out["throughput"]["throughput_ratio"] > 0.95,
    }
    return out


def churn_report(quick: bool = False, out_dir: Path | None = None) -> Path:
    """Run the churn scenario and write its JSON (with machine, load, commit) into
    ``out_dir`` (default: bench.outdir.default_out())."""
    import datetime
    import platform

    from .machine import cpu_model, git_commit

    load0 = os.getloadavg()
    runs = churn(quick)
    now = datetime.datetime.now(datetime.timezone.utc)
    res = {"datetime_utc": now.isoformat(timespec="seconds"), "host": platform.node(),
           "cpu_model": cpu_model(), "cpus": os.cpu_count(), "git": git_commit(),
           "loadavg_start": load0, "loadavg_end": os.getloadavg(),
           "scenario": "16384 live float32[256] in one cap table; every worker replaces "
                       "random slots with fresh buffers",
           "gc_ratio": float(os.environ.get("CAPQR_GC_RATIO", "1.25")),
           "runs": runs,
           "bound_peak_over_live_le_3": all(r["peak_over_live_rss"] <= 3.0 for r in runs)}
    from .outdir import default_out

    out_dir = out_dir or default_out()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"gc-churn-{now.date().isoformat()}.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m capqr.bench.gc_bench``: the collector benchmark as JSON on stdout, or the churn
    scenario into a file."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m capqr.bench.gc_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--churn", action="store_true",
                    help="run only the churn scenario and write gc-churn-<date>.json")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for --churn's JSON (default $CAPQR_BENCH_OUT, else "
                         "./bench-results)")
    ns = ap.parse_args(argv)
    if ns.churn:
        print(churn_report(quick=ns.quick, out_dir=ns.out))
    else:
        print(json.dumps(run(quick=ns.quick), indent=2))


if __name__ == "__main__":
    main()
