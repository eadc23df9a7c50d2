"""``python -m capqr.bench.gpu_prelude_ab``: what a part of the checked prelude costs, A/B
in one process, interleaved run by run.

The default plan's kernels are compiled three times: raw, checked with the prelude as
committed (v0), and checked with a variant of runtime/cuda/prelude.cuh (each source
tagged with the variant's name, so it gets its own cache key).  For every shape the
three builds then run in turn, ``--repeat`` times, each run timed with CUDA events
around the launch sequence (the input restored outside), so clock or load drifts hit
all three alike.  Variants (measurement only: none is a safe prelude):

- ``no-barrier-test``: rt_sync_threads and rt_block_all without the test of
  ``__rt_bfault`` after the barrier (a faulted block's survivors would run on to their
  next poll instead of leaving at their next barrier);
- ``no-polls``: that, and RT_POLL / RT_POLL_NOW compiled out (no cancel).

Prints the median ms per shape and build, and writes them as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import numpy as np

from .gpu_bench import time_qr

#: variant -> (pattern, replacement) edits of prelude.cuh, applied in order
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "no-barrier-test": [(r'(?m)^    if \(__rt_bfault\) asm volatile\("exit;"\);.*\n', "")],
}
VARIANTS["no-polls"] = VARIANTS["no-barrier-test"] + [
    (r"(?m)^#define RT_POLL\(pc\) rt_poll\(pc\)$", "#define RT_POLL(pc) ((void)(pc))"),
    (r"(?m)^#define RT_POLL_NOW\(\) rt_poll_slow\(\).*$", "#define RT_POLL_NOW() ((void)0)")]
KINDS = ("panel", "panel_small", "steps", "update_z", "update_apply", "preg32")


def variant_kernels(variant: str) -> dict:
    """The KINDS compiled checked against the edited prelude."""
    from ..kernels import gpu as g
    from ..runtime import cuda
    from ..runtime.cuda import lower

    text = lower.PRELUDE_PATH.read_text()
    for pat, rep in VARIANTS[variant]:
        text, n = re.subn(pat, rep, text)
        if n == 0:
            raise SystemExit(f"variant {variant}: {pat!r} matches nothing in the prelude")
    saved = lower.device_prelude
    lower.device_prelude = lambda: lower.inline_includes(text)
    try:
        ks = {}
        for kind in KINDS:
            src, name, options = g._kernel_spec(kind)
            ks[kind] = cuda.compile(src + f"\n/* prelude variant {variant} */\n", name,
                                    checked=True, options=options)
        return ks
    finally:
        lower.device_prelude = saved


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.gpu_prelude_ab",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="no-barrier-test")
    ap.add_argument("--shapes", default="40x176,40x352,640x512,8x2048,2x4096")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="gpu-prelude-ab.json")
    ns = ap.parse_args(argv)
    from ..kernels import gpu as g
    from ..runtime import cuda
    from ..runtime.cuda import driver as drv

    builds = {"raw": {k: g.blocked_kernels(False)[k] for k in KINDS},
              "v0": {k: g.blocked_kernels(True)[k] for k in KINDS},
              ns.variant: variant_kernels(ns.variant)}
    real = g.blocked_kernels
    start, end = drv.Event(), drv.Event()
    rows = []
    for shape in ns.shapes.split(","):
        batch, n = (int(v) for v in shape.split("x"))
        a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
        A0 = cuda.to_device(a, perms="r", name="A0")
        A = cuda.alloc_device(a.shape, np.float32, name="A")
        tau = cuda.alloc_device((batch, n), np.float32, name="tau")
        ws = g.Workspace.alloc(batch, n, prefix="")
        times: dict[str, list[float]] = {b: [] for b in builds}
        bits = {}
        try:
            for it in range(ns.repeat + 1):
                order = list(builds)[it % 3:] + list(builds)[:it % 3]
                for b in order:
                    g.blocked_kernels = lambda checked=True, b=b: builds[b]
                    ms = time_qr(A0, A, tau, ws, n, start, end, checked=b != "raw")
                    if it:
                        times[b].append(ms)
                    bits[b] = A.numpy().tobytes()
        finally:
            g.blocked_kernels = real
            ws.free()
            for c in (A0, A, tau):
                c.free()
        row = {"batch": batch, "n": n, **{f"{b}_ms": statistics.median(t)
                                           for b, t in times.items()},
               "same_bits": len(set(bits.values())) == 1}
        rows.append(row)
        print(f"({batch},{n}) raw {row['raw_ms']:.3f}  v0 {row['v0_ms']:.3f}  "
              f"{ns.variant} {row[ns.variant + '_ms']:.3f} ms  v0/raw "
              f"{row['v0_ms'] / row['raw_ms']:.3f}  {ns.variant}/raw "
              f"{row[ns.variant + '_ms'] / row['raw_ms']:.3f}  same bits {row['same_bits']}",
              flush=True)
    Path(ns.out).write_text(json.dumps({"device": drv.device().name, "variant": ns.variant,
                                        "repeat": ns.repeat, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
