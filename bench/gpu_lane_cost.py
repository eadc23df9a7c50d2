"""Host cost of the GPU lane's two modes: direct (the driver in this process) and isolated
(``CAPQR_CUDA_ISOLATE=1``: every driver call a message to the lane's device process).

Per mode, in a process of its own: the median over repeats of enqueueing LAUNCHES
``sync=False`` launches of a one-store kernel and syncing them (per launch), of one
synchronous launch, and of a 4 KB ``to_device`` + ``numpy()`` round trip.

Usage: python -m capqr.bench.gpu_lane_cost [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .machine import host

LAUNCHES = 1000
PROBE = r"""
import json, statistics, time
import numpy as np
from capqr.runtime import cuda

k = cuda.compile('''
KERNEL void put(cap_t x, int64_t i, float v)
{
    cap_store_f32(x, i, v);
}
''', "put")
x = cuda.alloc_device(1024, np.float32, name="x")
host = np.ones(1024, np.float32)


def med(f, reps=7):
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def many():
    for i in range(LAUNCHES):
        cuda.launch(k, [x], args=(i % 1024, 1.0), grid=1, block=32, sync=False)
    cuda.sync()


out = {"async_launch_us": med(many) / LAUNCHES * 1e6,
       "sync_launch_us": med(lambda: cuda.launch(k, [x], args=(0, 1.0), grid=1,
                                                 block=32)) * 1e6,
       "round_trip_4kb_us": med(lambda: cuda.to_device(host).numpy()) * 1e6}
print(json.dumps(out))
""".replace("LAUNCHES", str(LAUNCHES))


def measure(isolate: bool) -> dict:
    env = dict(os.environ, CAPQR_CUDA_ISOLATE="1" if isolate else "0")
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       env=env, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"the {'isolated' if isolate else 'direct'} probe failed:\n"
                         f"{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="", help="also write the result as JSON here")
    a = ap.parse_args(argv)
    res = {"machine": host(), "direct": measure(False), "isolated": measure(True)}
    for what in ("async_launch_us", "sync_launch_us", "round_trip_4kb_us"):
        d, i = res["direct"][what], res["isolated"][what]
        print(f"{what:>18}  direct {d:8.1f}  isolated {i:8.1f}  ({i / d:.2f}x)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
