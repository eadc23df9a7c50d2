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
typedef struct rt_api rt_api;
"""

_HOST_API = re.compile(r"/\* ==== host API begin ====.*?\*/(.*)/\* ==== host API end ==== \*/",
                       re.S)


def host_api_cdef(header: str, prefix: str = "gc_", name: str = "gc/gc.h") -> str:
    """A C API declared once in a header between its "host API" markers (the collector's
    in gc/gc.h, the worker pool's in runtime/csrc/core.h), as cffi cdef text: the
    prototypes of ``prefix``* functions, comments dropped, one a line.  Anything else in
    that part is an error, so a typedef or macro cannot slip in unparsed."""
    m = _HOST_API.search(header)
    if m is None:
        raise RuntimeError(f"{name}: no host API markers")
    body = re.sub(r"/\*.*?\*/", " ", m.group(1), flags=re.S)
    decls = [" ".join(d.split()) for d in body.split(";") if d.strip()]
    prototype = re.compile(r"[\w\s*]+?\b" + prefix + r"\w+\s*\([^;]*\)")
    bad = [d for d in decls if not prototype.fullmatch(d)]
    if bad:
        raise RuntimeError(f"{name} host API: not a {prefix}* prototype: {bad[0]!r}")
    return "".join(d + ";\n" for d in decls)


def _sources() -> list:
    return sorted(CSRC.glob("*.c")) + sorted(GC_DIR.glob("*.c"))


def _headers() -> list:
    return (sorted(CSRC.glob("*.h")) + sorted(GC_DIR.glob("*.h"))
            + sorted(CAP_INCLUDE.glob("*.h")))


def _load():
    srcs = _sources()
    cdef = (CDEF + host_api_cdef((CSRC / "core.h").read_text(), "rt_", "runtime/csrc/core.h")
            + host_api_cdef((GC_DIR / "gc.h").read_text()))
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
    mod.lib.rt_core_init(threads, PINNED)
    return mod


def _pin_from_env() -> bool:
    """$CAPQR_PIN: "1", unset or empty pins each worker to a CPU, "0" leaves them to the
    scheduler; anything else is refused rather than read as either.  Pinned is the
    default since it never lost on the 16-core host and removed the slow mode of group
    launches there (docs/launch.md)."""
    pin = os.environ.get("CAPQR_PIN", "")
    if pin not in ("", "0", "1"):
        raise ValueError(f"CAPQR_PIN must be 0 or 1, got {pin!r}")
    return pin != "0"


#: Whether the pool's workers are pinned, each to its own CPU ($CAPQR_PIN).
PINNED = _pin_from_env()
_mod = _load()
ffi = _mod.ffi
lib = _mod.lib
