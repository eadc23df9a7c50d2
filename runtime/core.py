"""The runtime core extension: worker pool, fault path and the collector.

Built once by cffi from runtime/csrc/*.c and gc/*.c and cached by content
hash (see build.py); importing this module starts the worker pool.
"""

from __future__ import annotations

import os

from ..capabilities import abi
from .build import CAP_INCLUDE, CSRC, GC_DIR, build_module, compiler_id, content_hash

CDEF = r"""
typedef struct rt_obj {
    char *base;
    uint64_t nbytes;
    uint64_t rlen;
    uint64_t wlen;
    uint32_t dtype;
    uint32_t perms;
    uint32_t flags;
    uint32_t mark;
    int32_t pins;
    int32_t holds;
    uint64_t id;
    char name[RT_NAME_MAX];
    ...;
} rt_obj;

typedef struct { char *p; ...; } cap_t;
typedef union { cap_t cap; int64_t i64; double f64; float f32; } rt_arg;

typedef struct {
    int32_t kind;
    int32_t access;
    int64_t block;
    int64_t index;
    int64_t elsize;
    int64_t offset;
    int32_t line;
    int32_t thread;
    uint64_t obj_id;
    char buffer[RT_NAME_MAX];
} rt_fault_rec;

typedef struct {
    uint64_t cycles;
    uint64_t objects_live;
    uint64_t bytes_live;
    uint64_t objects_freed_total;
    uint64_t bytes_freed_total;
    uint64_t bytes_allocated_total;
    uint64_t objects_allocated_total;
    uint64_t handshakes;
    double handshake_p50_us;
    double handshake_p99_us;
    double handshake_max_us;
    double mark_seconds_total;
    double sweep_seconds_total;
    uint64_t threshold_bytes;
    int32_t stw;
    int32_t verify;
    uint64_t verify_failures;
    int32_t running;
    int32_t enabled;
    ...;
} gc_stats_t;

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

int gc_init(void);
rt_obj *gc_alloc(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name);
rt_obj *gc_wrap(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name);
int gc_free(rt_obj *o);
void gc_pin(rt_obj *o);
void gc_unpin(rt_obj *o);
void gc_hold(rt_obj *o);
void gc_unhold(rt_obj *o);
void gc_collect(void);
void gc_set_enabled(int enabled);
void gc_set_threshold(double ratio, uint64_t floor_bytes);
void gc_get_stats(gc_stats_t *out);
int gc_is_live_id(uint64_t id);
uint64_t gc_count_objects(void);
""".replace("RT_NAME_MAX", str(abi.NAME_MAX))  # cffi's cdef takes no macros

CDEF_EXTRA_FILE = GC_DIR / "gc_cdef.h"  # optional: extra declarations the collector exports


def _sources() -> list:
    return sorted(CSRC.glob("*.c")) + sorted(GC_DIR.glob("*.c"))


def _headers() -> list:
    return (sorted(CSRC.glob("*.h")) + sorted(GC_DIR.glob("*.h"))
            + [CAP_INCLUDE / "cap.h", CAP_INCLUDE / "cap_abi.h"])


def _load():
    srcs = _sources()
    cdef = CDEF
    if CDEF_EXTRA_FILE.exists():
        cdef += CDEF_EXTRA_FILE.read_text()
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
