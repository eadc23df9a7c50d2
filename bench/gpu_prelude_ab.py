"""``python -m capqr.bench.gpu_prelude_ab``: what a part of the checked build costs, A/B
in one process, interleaved run by run.

The default plan's kernels are compiled raw, checked as committed (v0), and checked once
per variant: regex edits of the lowered CUDA text (runtime/cuda/prelude.cuh, inlined at
its top, and the kernel) and/or of the NVRTC options (each source tagged with the
variant's name, so it gets its own cache key).  For every shape
the builds then run in turn, ``--repeat`` times, each run timed with CUDA events around
the launch sequence (the input restored outside), so clock or load drifts hit all builds
alike; then each build's sequence is profiled (GPU ms per kernel kind, median of
``--profile`` runs).  Variants (measurement only: none is a safe prelude):

- ``no-barrier-test``: rt_sync_threads and rt_block_all without the test of
  ``__rt_bfault`` after the barrier (a faulted block's survivors would run on to their
  next poll instead of leaving at their next barrier);
- ``no-polls``: that, and RT_POLL / RT_POLL_NOW compiled out (no cancel);
- ``no-tile-checks``: tile copies without their range check;
- ``no-prologue``: the kernel entry without its read of the sequence record and its
  barrier (every thread sets the block's shared words itself);
- ``no-loop-guards``: every versioned loop takes its fast (and quiet) copy without
  evaluating its guard or span test;
- ``no-nest-guard``: a versioned nest's outlined guard call is not made (its fast copy
  runs);
- ``free-regs``: the committed prelude, each kind's ``--maxrregcount`` raised to what its
  block size allows (65536 / threads, at most 255): the checked build's registers
  against its spills.

(``no-tile-polls``, measured at 86809e7, is now the prelude: rt_tile_copy does not poll.)

Prints the median ms per shape and build and the per-kind GPU ms, and writes them as
JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .gpu_bench import parse_shapes, qr_buffers, time_qr

#: variant -> (pattern, replacement) edits of the lowered CUDA text of every kind (the
#: prelude, inlined at its top, and the kernel), applied in order
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "no-barrier-test": [(r'(?m)^    if \(__rt_bfault\) asm volatile\("exit;"\);.*\n', "")],
    # tile copies without their range check (capabilities/checks.h RT_TILE_CHECK)
    "no-tile-checks": [(r"(?m)^(#define RT_TILE_CHECK\(S, st\))  +\\$",
                        r"#define RT_TILE_CHECK(S, st) (void)n; (void)a; (void)line\n"
                        r"#define RT_TILE_CHECK_UNUSED(S, st) \\")],
    "no-prologue": [(r"(?ms)^#define RT_PROLOGUE\(seq, launch\) do \{.*?\} while \(0\)$",
                     "#define RT_PROLOGUE(seq, launch) do { __rt_bseq = (seq); "
                     "__rt_blaunch = (launch); __rt_bfault = 0; } while (0)")],
    # every versioned loop takes its fast copy, quiet where it has one: the guards and
    # spans computed per loop, not the copies' code, are what this prices
    "no-loop-guards": [(r"if \((?=\(*(?:__h\d+_ok|rt_div\(__h\d+_span))", "if (1 || ")],
    # the outlined guard of a whole versioned nest (runtime/compiler/hoist/nest_guard.py)
    "no-nest-guard": [(r"rt_(block|warp)_all\(__rtg", r"rt_\1_all(1 || __rtg")],
    "free-regs": [],
}
VARIANTS["no-polls"] = VARIANTS["no-barrier-test"] + [
    (r"(?m)^#define RT_POLL\(pc\) rt_poll\(pc\)$", "#define RT_POLL(pc) ((void)(pc))"),
    (r"(?m)^#define RT_POLL_NOW\(\) rt_poll_slow\(\).*$", "#define RT_POLL_NOW() ((void)0)")]
#: variants whose kinds' register caps are raised to what their block allows
FREE_REGS = frozenset({"free-regs"})
KINDS = ("panel", "panel_small", "steps", "update_z", "update_apply", "preg32")


def variant_kernels(variant: str, blocks: dict[str, int]) -> dict:
    """The KINDS compiled checked from the edited lowered text and options (the kinds'
    compiles run in threads: NVRTC releases the GIL).  ``blocks``: threads per block of
    each kind, for FREE_REGS variants.  An edit that matches no kind's text is an error."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    from ..kernels import gpu as g
    from ..runtime import cuda
    from ..runtime.cuda import kernel

    edits = VARIANTS[variant]
    hits = [0] * len(edits)
    real = kernel.CudaTarget.lower

    def lower(self, verified, entry):
        out = real(self, verified, entry)
        text = out.text
        for e, (pat, rep) in enumerate(edits):
            text, n = re.subn(pat, rep, text)
            hits[e] += n
        return dataclasses.replace(out, text=text)

    def build(kind: str):
        src, name, options = g._kernel_spec(kind)
        if variant in FREE_REGS:
            options = tuple(o for o in options if not o.startswith("--maxrregcount")) + (
                f"--maxrregcount={min(255, 65536 // blocks.get(kind, 1024))}",)
        return cuda.compile(src + f"\n/* variant {variant} */\n", name, checked=True,
                            options=options)

    kernel.CudaTarget.lower = lower
    try:
        with ThreadPoolExecutor(max_workers=len(KINDS)) as pool:
            built = dict(zip(KINDS, pool.map(build, KINDS), strict=True))
    finally:
        kernel.CudaTarget.lower = real
    for (pat, _rep), n in zip(edits, hits, strict=True):
        if n == 0:
            raise SystemExit(f"variant {variant}: {pat!r} matches nothing in the kernels")
    print(f"variant {variant}: edits matched {hits} times", flush=True)
    return built


@contextmanager
def using(g, ks: dict) -> Iterator[None]:
    """kernels.gpu.qr_launch (and gpu_bench._profile) take ``ks`` as both builds' kernels
    while inside; the real blocked_kernels again after."""
    real = g.blocked_kernels
    g.blocked_kernels = lambda checked=True: ks
    try:
        yield
    finally:
        g.blocked_kernels = real


def profile(g, builds: dict, A0, A, tau, ws, n: int, runs: int) -> dict[str, dict[str, float]]:
    """build -> kernel kind -> median GPU ms over ``runs`` profiled sequences
    (gpu_bench._profile: CUDA events between the launches), each build's plan as
    kernels.gpu.qr_launch makes it."""
    from .gpu_bench import _profile, restore

    out = {}
    for b, ks in builds.items():
        per: dict[str, list[float]] = {}
        # as qr_launch plans it: the steps kernel's group is what its build fits
        plan = g.launch_plan(A.shape[0], n, "auto", ks["steps"].max_group(g.STEP_BLOCK),
                             smem=g.device_smem())
        with using(g, ks):
            for _ in range(runs):
                restore(A0, A)
                for kind, ms in _profile(g, A, tau, ws, plan, checked=b != "raw")[
                        "gpu_ms_by_kernel"].items():
                    per.setdefault(kind, []).append(ms)
        out[b] = {k: statistics.median(v) for k, v in per.items()}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.gpu_prelude_ab",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="no-barrier-test",
                    help=f"comma-separated, of: {', '.join(sorted(VARIANTS))}")
    ap.add_argument("--shapes", default="20x32,40x176,40x352,640x512,60x1024,8x2048,2x4096")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", type=int, default=3, help="profiled runs per build")
    ap.add_argument("--out", default="gpu-prelude-ab.json")
    ns = ap.parse_args(argv)
    variants = [v for v in ns.variant.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    from ..kernels import gpu as g
    from ..runtime.cuda import driver as drv

    shapes = parse_shapes(ns.shapes)
    blocks = {s.kernel: s.block for b, n in shapes for s in g.launch_plan(b, n)}
    builds = {"raw": {k: g.blocked_kernels(False)[k] for k in KINDS},
              "v0": {k: g.blocked_kernels(True)[k] for k in KINDS},
              **{v: variant_kernels(v, blocks) for v in variants}}
    names = list(builds)
    start, end = drv.Event(), drv.Event()
    rows = []
    for batch, n in shapes:
        a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
        times: dict[str, list[float]] = {b: [] for b in builds}
        bits = {}
        with qr_buffers(a) as (A0, A, tau, ws):
            for it in range(ns.repeat + 1):
                k = it % len(names)
                for b in names[k:] + names[:k]:
                    with using(g, builds[b]):
                        ms = time_qr(A0, A, tau, ws, n, start, end, checked=b != "raw")
                    if it:
                        times[b].append(ms)
                    if it == ns.repeat:     # the result's digest, once per build
                        bits[b] = hashlib.sha1(A.numpy().tobytes()).hexdigest()
            kinds = profile(g, builds, A0, A, tau, ws, n, ns.profile) if ns.profile else {}
        row = {"batch": batch, "n": n, **{f"{b}_ms": statistics.median(t)
                                           for b, t in times.items()},
               "same_bits": len(set(bits.values())) == 1, "gpu_ms_by_kernel": kinds}
        rows.append(row)
        raw = row["raw_ms"]
        print(f"({batch},{n}) raw {raw:.3f} ms; " + "  ".join(
            f"{b} {row[b + '_ms']:.3f} ({row[b + '_ms'] / raw:.3f}x)" for b in names[1:])
            + f"  same bits {row['same_bits']}", flush=True)
        for kind in sorted(kinds.get("raw", {})):
            r = kinds["raw"][kind]
            print(f"    {kind:13s} raw {r:.3f} ms; " + "  ".join(
                f"{b} {kinds[b][kind] / r:.3f}x" for b in names[1:]), flush=True)
    Path(ns.out).write_text(json.dumps({"device": drv.device().name, "variants": variants,
                                        "repeat": ns.repeat, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
