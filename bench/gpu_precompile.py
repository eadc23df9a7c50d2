"""Compile the GPU QR kernels of some shapes' plans into the cache, many at once.

NVRTC builds one kernel at a time per process, and a fresh device host has an empty
cache ($CAPQR_CACHE/cuda), so a bench's first shapes would spend their time budget
compiling.  ``python -m capqr.bench.gpu_precompile --shapes 20x32,2x4096 --reg both``
builds every launch kind those plans use, checked and raw, in parallel processes;
later processes load the cubins from the cache.  Without a GPU it says why and exits 0.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor


def kinds(shapes: list[tuple[int, int]], regs: tuple[bool | None, ...],
          per_matrix: tuple[bool | None, ...] = (None,)) -> list[str]:
    """The launch kinds of the plans of ``shapes`` with the register panel and the
    per-matrix launch as each of ``regs`` and ``per_matrix`` says (None: the default)."""
    from ..kernels import gpu as g

    return sorted({s.kernel for b, n in shapes for reg in regs for pm in per_matrix
                   for s in g.launch_plan(b, n, reg=reg, per_matrix=pm)})


def _build(job: tuple[str, bool]) -> tuple[str, bool, float, int, int]:
    """Compile one kind; (kind, checked, seconds, registers, local-memory bytes)."""
    from ..kernels import gpu as g
    from ..runtime import cuda
    from ..runtime.cuda import driver as drv

    kind, checked = job
    t0 = time.monotonic()
    source, name, options = g._kernel_spec(kind)
    k = cuda.compile(source, name, checked=checked, options=options)
    spent = time.monotonic() - t0
    local = drv.ffi().new("int *")
    drv.check(drv.lib().cuFuncGetAttribute(local, drv.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                           k.live_function()), "cuFuncGetAttribute")
    return kind, checked, spent, k.registers(), local[0]


def main(argv: list[str] | None = None) -> None:
    """Compile the kinds (each in a process of its own) and print one line per kernel;
    without a GPU, say why and compile nothing."""
    from .gpu_bench import CONTEST_SHAPES, gpu_missing, parse_shapes

    ap = argparse.ArgumentParser(prog="python -m capqr.bench.gpu_precompile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="", help="e.g. 20x32,40x176 (default: contest shapes)")
    ap.add_argument("--reg", choices=("default", "on", "off", "both"), default="both",
                    help="plans with the register panel on, off, both or as kernels.gpu says")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1),
                    help="compiler processes at once (default: the cores, at most 12)")
    ap.add_argument("--per-matrix", choices=("default", "both"), default="default",
                    help="plans with the per-matrix launch as kernels.gpu says, or with and "
                         "without it (its 1024 class alone takes minutes to compile)")
    ns = ap.parse_args(argv)
    shapes = parse_shapes(ns.shapes) if ns.shapes else list(CONTEST_SHAPES)
    why = gpu_missing()
    if why:
        print(f"gpu_precompile: skipped: {why}")
        return
    regs = {"default": (None,), "on": (True,), "off": (False,), "both": (True, False)}[ns.reg]
    pms = {"default": (None,), "both": (True, False)}[ns.per_matrix]
    jobs = [(k, c) for k in kinds(shapes, regs, pms) for c in (True, False)]
    t0 = time.monotonic()
    # spawned, not forked: gpu_missing() initialised the driver in this process, and
    # a forked child cannot use it (every compile failed that way on an H100)
    with ProcessPoolExecutor(max_workers=ns.jobs,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for kind, checked, s, nregs, local in pool.map(_build, jobs):
            print(f"  {kind:16s} {'checked' if checked else 'raw':7s} {s:6.1f} s  "
                  f"{nregs} registers, {local} bytes local", flush=True)
    print(f"{len(jobs)} kernels in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
