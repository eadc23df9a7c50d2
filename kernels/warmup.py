"""Build the kernels ``kernels.qr`` runs by default ahead of their first call.

A kernel's first build takes seconds (gcc -O3 on the checked source); the cache
($CAPQR_CACHE) keeps it for every later process.  ``python -m capqr warmup`` calls
:func:`precompile`, which builds them on several compilers at once.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import sources

#: (family, entry names by dtype suffix) of what kernels.qr's default variant launches:
#: the per-matrix kernel and the panel steps, the group look-ahead panel (float32, many
#: workers) and the copy that checks the input.
_DEFAULT = (("qrt", ("qrt_{s}", "qrt_step_{s}")), ("qrt_group", ("qrt_gstep_{s}",)),
            ("copy", ("copy_{s}",)))


def default_kernels(dtypes: list[str] | tuple[str, ...] = ("float32", "float64"),
                    raw: bool = False) -> list[tuple[str, str, bool]]:
    """(source, entry, checked) of every kernel :func:`precompile` builds."""
    out = []
    for dtype in dtypes:
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, not {dtype!r}")
        s = "f64" if dtype == "float64" else "f32"
        for family, names in _DEFAULT:
            src = sources.source(family, dtype)
            for checked in (True, False) if raw else (True,):
                out.extend((src, n.format(s=s), checked) for n in names)
    return out


def precompile(dtypes: list[str] | tuple[str, ...] = ("float32", "float64"), *,
               raw: bool = False, jobs: int | None = None, progress: bool = False
               ) -> list[Any]:
    """Compile the kernels ``kernels.qr`` uses by default for ``dtypes`` (and their raw
    baselines with ``raw``) into the cache, ``jobs`` compilers at once (default: the
    cores); the compiled kernels.  ``progress`` prints a line per kernel to stderr."""
    from .. import runtime

    todo = default_kernels(dtypes, raw)
    jobs = max(1, jobs or os.cpu_count() or 1)
    t0 = time.monotonic()
    if progress:
        runtime.build.cold_start_said()
        print(f"capqr: building {len(todo)} kernels on {jobs} compilers, cached in "
              f"{runtime.build.cache_dir()}", file=sys.stderr, flush=True)

    def build(job: tuple[str, str, bool]) -> Any:
        src, name, checked = job
        k = runtime.compile(src, name, checked=checked)
        if progress:
            print(f"  {name} ({'checked' if checked else 'raw'}) ready after "
                  f"{time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        return k

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(build, todo))
