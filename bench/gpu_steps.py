"""Where the GPU QR's time goes: pure kernel time per launch kind vs. the whole sequence.

``python -m capqr.bench.gpu_steps --shapes 2x4096 --tall-rows 256`` factors one
random batch launch by launch, each launch timed alone with CUDA events around
the kernel only (``runtime.cuda.time_launch``, one run, so the factorization
proceeds as in ``kernels.gpu.qr_launch``), and prints per kind of launch the
count and summed kernel milliseconds, next to the wall time of the same plan
run as a normal launch sequence.  The difference is what the host adds per
launch (argument packing, fault-record reset and read-back, stream syncs).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def profile(batch: int, n: int, tall_rows: int | None | str, checked: bool = True) -> dict:
    """Per-kind kernel milliseconds and the sequence's wall milliseconds for one shape."""
    from .. import kernels
    from ..kernels import gpu as g
    from ..runtime import cuda
    from ..runtime.cuda import driver as drv

    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    A = cuda.to_device(a, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    ws = g.Workspace.alloc(batch, n, prefix="")
    ks = g.blocked_kernels(checked)
    plan = g.launch_plan(batch, n, tall_rows)
    g.qr_launch(A, tau, ws, n, checked=checked, tall_rows=tall_rows)  # compile and warm up
    A.copy_from(a)
    drv.check(drv.lib().cuCtxSynchronize(), "cuCtxSynchronize")
    t0 = time.perf_counter()
    g.qr_launch(A, tau, ws, n, checked=checked, tall_rows=tall_rows)
    wall = (time.perf_counter() - t0) * 1e3
    A.copy_from(a)
    kinds: dict[str, dict[str, float]] = {}
    for step in plan:
        ms = cuda.time_launch(ks[step.kernel], ws.caps(step, A, tau), args=step.args,
                              grid=step.grid, block=step.block, repeat=1, warmup=0,
                              group=step.group)[0]
        k = kinds.setdefault(step.kernel, {"launches": 0, "kernel_ms": 0.0})
        k["launches"] += 1
        k["kernel_ms"] += ms
    ok = bool(kernels.check(a, A.numpy(), tau.numpy()).ok)
    for c in (A, tau):
        c.free()
    ws.free()
    total = sum(k["kernel_ms"] for k in kinds.values())
    return {"batch": batch, "n": n, "tall_rows": tall_rows, "checked": checked,
            "launches": len(plan), "sequence_wall_ms": wall, "kernel_ms": total,
            "host_us_per_launch": (wall - total) / len(plan) * 1e3, "kinds": kinds,
            "check_ok": ok}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="2x4096,8x2048,60x1024",
                    help="comma-separated BATCHxN shapes (default %(default)s)")
    ap.add_argument("--tall-rows", default="none,256",
                    help="comma list of numbers, 'none' (one block per matrix for every "
                         "panel) or 'auto'")
    ap.add_argument("--out", default="", help="write the results to this JSON file")
    ns = ap.parse_args(argv)
    rows = []
    for s in ns.shapes.split(","):
        b, n = (int(v) for v in s.split("x"))
        for tr in ns.tall_rows.split(","):
            r = profile(b, n, tr if tr == "auto" else None if tr == "none" else int(tr))
            rows.append(r)
            per = ", ".join(f"{k} {v['launches']}x {v['kernel_ms']:.2f} ms"
                            for k, v in r["kinds"].items())
            print(f"({b},{n}) tall_rows={tr}: sequence {r['sequence_wall_ms']:.2f} ms, "
                  f"kernels {r['kernel_ms']:.2f} ms, host {r['host_us_per_launch']:.1f} "
                  f"us/launch, check {'ok' if r['check_ok'] else 'FAILED'}; {per}", flush=True)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
