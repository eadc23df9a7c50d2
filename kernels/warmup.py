"""Build the kernels ``kernels.qr`` runs by default ahead of their first call.

A kernel's first build takes seconds (gcc -O3 on the checked source); the cache
($CAPQR_CACHE) keeps it for every later process.  ``python -m capqr warmup`` calls
:func:`precompile`, which builds them on several compilers at once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

DTYPES = ("float32", "float64")


def _getters(dtypes: list[str] | tuple[str, ...], raw: bool
             ) -> list[tuple[str, Callable[[], Any]]]:
    """(label, getter) for each group of kernels kernels.qr's default variant launches:
    the very functions it gets them through (the per-matrix kernel and the panel steps,
    the group look-ahead panel, the tall and small paths, the copy that checks the input), so that
    what is built ahead is what it runs, and its in-process caches hold them afterwards."""
    from . import parallel
    from .qr import _kernel  # the module: the package's `qr` is the function

    out: list[tuple[str, Callable[[], Any]]] = []
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
        for checked in (True, False) if raw else (True,):
            mode = "checked" if checked else "raw"
            out.append((f"qrt, qrt_step {dtype} {mode}",
                        partial(parallel.kernels_for, dtype, checked)))
            out.append((f"qrt_gstep {dtype} {mode}",
                        partial(parallel.group_kernel_for, dtype, checked)))
            out.append((f"qrt_coop {dtype} {mode}",
                        partial(parallel.coop_kernel_for, dtype, checked)))
            if dtype == "float32":   # the tall and small paths factor float32 only
                out.append((f"qrt_tall {dtype} {mode}",
                            partial(parallel.tall_kernel_for, dtype, checked)))
                out.append((f"qr_small {dtype} {mode}",
                            partial(parallel.small_kernel_for, checked)))
        out.append((f"copy {dtype} checked", partial(_kernel, "copy", dtype, True)))
    return out


def precompile(dtypes: list[str] | tuple[str, ...] = DTYPES, *,
               raw: bool = False, jobs: int | None = None, progress: bool = False
               ) -> list[Any]:
    """Compile the kernels ``kernels.qr`` uses by default for ``dtypes`` (and their raw
    baselines with ``raw``) into the cache, ``jobs`` compilers at once (default: the
    worker pool's size); the compiled kernels.  ``progress`` prints a line per group to stderr."""
    from .. import runtime

    todo = _getters(dtypes, raw)
    jobs = max(1, jobs or runtime.threads())
    t0 = time.monotonic()
    if progress:
        runtime.build.cold_start_said()
        print(f"capqr: building {len(todo)} groups of kernels on {jobs} compilers, cached in "
              f"{runtime.build.cache_dir()}", file=sys.stderr, flush=True)

    def build(job: tuple[str, Callable[[], Any]]) -> tuple[Any, ...]:
        label, get = job
        got = get()
        if progress:
            print(f"  {label} ready after {time.monotonic() - t0:.1f} s", file=sys.stderr,
                  flush=True)
        return got if isinstance(got, tuple) else (got,)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [k for group in pool.map(build, todo) for k in group]
