"""The runtime core extension: worker pool, fault path and the collector.

Built once by cffi from runtime/csrc/*.c and gc/*.c and cached by content
hash (see build.py); importing this module starts the worker pool.
"""

from __future__ import annotations

import os
import re

from ..capabilities import abi
from .build import CAP_INCLUDE, CSRC, GC_DIR, build_module, compiler_id, content_hash

# The shared layouts come from capabilities/abi.py, which also generates their C
# typedefs (cap_abi.h); cap_t stays partial: its owner word differs per lane.
CDEF = abi.cffi_structs("rt_obj") + """
typedef struct { char *p; ...; } cap_t;
""" + abi.cffi_structs("rt_arg", "rt_fault_rec", "gc_stats_t", "gc_release_rec") + r"""
typedef struct rt_launch rt_launch;

int rt_core_init(int threads);
int rt_core_threads(void);
int64_t rt_core_kernels_running(void);
int64_t rt_core_wakes_asked(void);
const void *rt_core_api(void);
rt_launch *rt_launch_start(void *entry, const rt_arg *args, int64_t grid, int64_t group);
int rt_launch_wait(rt_launch *L, double seconds);
void rt_launch_cancel(rt_launch *L, int32_t kind);
int32_t rt_launch_result(rt_launch *L, rt_fault_rec *out, int64_t *finished);
void rt_launch_free(rt_launch *L);
void rt_arg_set_cap(rt_arg *a, rt_obj *o, int64_t offset_bytes);
void rt_arg_set_nobounds(rt_arg *a, int64_t addr);

"""

_HOST_API = re.compile(r"/\* ==== host API begin ====.*?\*/(.*)/\* ==== host API end ==== \*/",
                       re.S)
_PROTOTYPE = re.compile(r"[\w\s*]+?\bgc_\w+\s*\([^;]*\)")


def host_api_cdef(header: str) -> str:
    """The collector's host API, declared once in gc/gc.h between its "host API"
    markers, as cffi cdef text: the prototypes, comments dropped, one a line.  Anything
    else in that part is an error, so a typedef or macro cannot slip in unparsed."""
    m = _HOST_API.search(header)
    if m is None:
        raise RuntimeError("gc/gc.h: no host API markers")
    body = re.sub(r"/\*.*?\*/", " ", m.group(1), flags=re.S)
    decls = [" ".join(d.split()) for d in body.split(";") if d.strip()]
    bad = [d for d in decls if not _PROTOTYPE.fullmatch(d)]
    if bad:
        raise RuntimeError(f"gc/gc.h host API: not a gc_* prototype: {bad[0]!r}")
    return "".join(d + ";\n" for d in decls)


def _sources() -> list:
    return sorted(CSRC.glob("*.c")) + sorted(GC_DIR.glob("*.c"))


def _headers() -> list:
    return (sorted(CSRC.glob("*.h")) + sorted(GC_DIR.glob("*.h"))
            + sorted(CAP_INCLUDE.glob("*.h")))


def _load():
    srcs = _sources()
    cdef = CDEF + host_api_cdef((GC_DIR / "gc.h").read_text())
    flags = ["-O2", "-pthread", "-std=gnu11", "-fno-strict-aliasing", "-Wno-unused-function"]
    key = content_hash(
        cdef, compiler_id(), " ".join(flags),
        *[p.name + "\0" + p.read_text() for p in srcs + _headers()],
    )
    mod = build_module(
        f"_capqr_core_{key[:16]}",
        cdef,
        '#include "core.h"\n#include "gc.h"\n',
        sources=[str(p) for p in srcs],
        include_dirs=[str(CAP_INCLUDE), str(GC_DIR), str(CSRC)],
        extra_compile_args=flags,
        libraries=["pthread", "atomic"],
    )
    threads = int(os.environ.get("CAPQR_THREADS", "0") or 0)
    mod.lib.rt_core_init(threads)
    return mod


_mod = _load()
ffi = _mod.ffi
lib = _mod.lib
