"""The capqr ABI facts, written once.

Both lanes include the C text this module generates, capabilities/cap_abi.h:
cap.h includes it for cffi-built kernels and the runtime core, and the CUDA
device prelude (runtime/cuda/prelude.cuh) for the GPU.  The checks built on
these facts are hand-written once for both lanes: capabilities/guards.h (loop and
tile range guards, included by cap_abi.h) and capabilities/checks.h.
Python code takes its constants from here.  A fix to the bounds predicate,
a new fault code or dtype therefore lands in both lanes by construction.

``python -m capqr.capabilities.abi`` rewrites cap_abi.h; a test checks that the
committed file matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DType:
    """An element type of a buffer: dialect suffix, RT_DT code, byte size, numpy name."""

    suffix: str
    code: int
    size: int
    numpy: str | None


DTYPES: tuple[DType, ...] = (
    DType("f16", 1, 2, "float16"),
    DType("f32", 2, 4, "float32"),
    DType("f64", 3, 8, "float64"),
    DType("i32", 4, 4, "int32"),
    DType("i64", 5, 8, "int64"),
    DType("u8", 6, 1, "uint8"),
    DType("cap", 7, 16, None),  # cap tables: rt_capslot {p, obj} pairs
)
DT_BY_SUFFIX: dict[str, DType] = {d.suffix: d for d in DTYPES}
#: element size by dialect suffix (cap_load_f32 -> 4)
ELEM_SIZE: dict[str, int] = {d.suffix: d.size for d in DTYPES}
#: suffixes with checked scalar accessors (cap_load_T / cap_store_T)
SCALAR_SUFFIXES: tuple[str, ...] = ("f16", "f32", "f64", "i32", "i64")
CAP_DT_CODE = DT_BY_SUFFIX["cap"].code

#: rt_api.abi_version: a kernel module built against another layout refuses to run
#: (bump it with any change to a struct below or to rt_api).
RT_ABI_VERSION = 5
#: Bytes of a buffer name in rt_obj.name and rt_fault_rec.buffer, the NUL included:
#: the host truncates names to NAME_MAX - 1 bytes before they reach the collector.
NAME_MAX = 48


def c_name(name: str) -> bytes:
    """``name`` as the collector stores it: UTF-8, cut to NAME_MAX - 1 bytes at a character
    boundary (a cut inside a character would make the fault's name differ from the
    handle's)."""
    return name.encode()[:NAME_MAX - 1].decode(errors="ignore").encode()
#: Shadow slots of one rt_frame: cap_t params + locals + call spills of a kernel
#: function (the verifier refuses a function that needs more).
FRAME_SLOTS_MAX = 64


@dataclass(frozen=True)
class Fault:
    """A fault kind: C enum name, code, and the reason CapabilityFault reports."""

    name: str
    code: int
    reason: str


FAULTS: tuple[Fault, ...] = (
    Fault("OOB", 1, "out-of-bounds"),
    Fault("READONLY", 2, "read-only"),
    Fault("FREED", 3, "freed"),
    Fault("NOBOUNDS", 4, "no-bounds"),
    Fault("LOCAL", 5, "local-array"),
    Fault("TIMEOUT", 6, "timeout"),
    Fault("CANCELLED", 7, "cancelled"),
    Fault("ALLOC", 8, "alloc"),
    Fault("ARG", 9, "argument"),
    Fault("DIVZERO", 10, "division-by-zero"),
    Fault("TYPE", 11, "type"),
    Fault("GROUP", 12, "group"),
)
FAULT_CODE: dict[str, int] = {f.name: f.code for f in FAULTS}
FAULT_REASON: dict[int, str] = {f.code: f.reason for f in FAULTS}

ACCESS: dict[int, str | None] = {0: None, 1: "load", 2: "store"}
PERM_R, PERM_W = 1, 2

#: rt_obj.flags bits (the host object header, capabilities/cap.h):
#: FREED      explicit free() happened;
#: EXTERNAL   payload owned by numpy/torch (host or CUDA tensor): the sweep
#:            queues its release, the host drops the reference;
#: PAYLOAD_GONE payload released (the header may live on);
#: DEVICE     payload is GPU memory the collector owns: the sweep queues its
#:            release, the host calls cuMemFree.
OBJ_FLAGS: tuple[tuple[str, int], ...] = (("FREED", 1), ("EXTERNAL", 2), ("PAYLOAD_GONE", 4),
                                          ("DEVICE", 8))
OBJ_FLAG: dict[str, int] = dict(OBJ_FLAGS)

#: Every collector-owned payload starts on a multiple of PAYLOAD_ALIGN bytes (a cache
#: line; gc/blocks.c), and kernels.qr gives its working copy and its padded rows the
#: same alignment, so neighbouring tiles of different workers share no line.
PAYLOAD_ALIGN = 64

#: |index| must stay below 2**IDX_LIMIT_LOG2 so that index * elsize cannot wrap.
IDX_LIMIT_LOG2 = 58

#: A hull guard takes a line of first indices A + l*q, l in [0, D], by its two
#: ends when D <= LINE_MAX_SPAN and |q| < 2**IDX_LIMIT_LOG2 (rt_line_ok), so that
#: |A + l*q| < 2**63: every member is exact and between the ends (runtime/compiler/lines.py).
LINE_MAX_SPAN = 16

#: cap_t words in order; the last one is the owner: the object header on the
#: CPU, a tag on the GPU (bits 0-31: argument slot + 1, 0 for cap_from_int;
#: bit 32: the buffer was freed).
CAP_WORDS: tuple[str, ...] = ("p", "lo", "rlen", "wlen", "owner")
CAP_BYTES = 8 * len(CAP_WORDS)
GPU_TAG_FREED = 1 << 32

@dataclass(frozen=True)
class Field:
    """One member of a struct shared by C and cffi: C type, name (with any array
    extent, spelled with the RT_ macro), comment (C only)."""

    ctype: str
    name: str
    comment: str = ""


@dataclass(frozen=True)
class Struct:
    """A struct (or union) layout the C sources and runtime/core.py's cffi cdef both
    declare; ``tag`` is the struct tag and typedef name."""

    tag: str
    doc: str
    fields: tuple[Field, ...]
    kind: str = "struct"


#: What a fault record says on either lane, in this order at the start of each lane's
#: record (rt_fault_rec on the host, rt_gpu_fault on the device), so one field list
#: describes a fault wherever it happened.
FAULT_FIELDS: tuple[Field, ...] = (
    Field("int32_t", "kind", "RT_FAULT_* (0: none)"),
    Field("int32_t", "access", "RT_ACC_*"),
    Field("int64_t", "block", "block index that faulted"),
    Field("int64_t", "index", "element index of the access"),
    Field("int64_t", "elsize", "element size of the access"),
    Field("int64_t", "offset", "byte offset of the origin from the object start"),
    Field("int32_t", "line", "kernel source line"),
    Field("int32_t", "thread", "GPU lane: thread index; CPU: -1"),
)

#: Host-lane layouts, written once: cap_abi.h typedefs them for cap.h and gc.h, and
#: runtime/core.py declares them to cffi from the same lists (cffi_structs), so the
#: Python side reads the fields the C side writes.
STRUCTS: tuple[Struct, ...] = (
    Struct("rt_obj", "The object header.  Owned by the collector (gc/), never moves.", (
        Field("char *", "base", "payload start"),
        Field("uint64_t", "nbytes", "payload size as allocated"),
        Field("uint64_t", "rlen", "readable bytes from base; 0 once freed"),
        Field("uint64_t", "wlen", "writable bytes from base; 0 if read-only or freed"),
        Field("uint32_t", "dtype", "RT_DT_* of the elements"),
        Field("uint32_t", "perms", "RT_PERM_*"),
        Field("uint32_t", "flags", "RT_OBJ_* (atomic updates)"),
        Field("uint32_t", "mark", "collector mark epoch (atomic)"),
        Field("int32_t", "pins", "Python handles holding it (atomic)"),
        Field("int32_t", "holds", "running launches holding it as an argument (atomic)"),
        Field("uint64_t", "id", "allocation serial number (debugging, stats)"),
        Field("struct rt_obj *", "next", "collector's list of all objects"),
        Field("char", "name[RT_NAME_MAX]", "buffer name shown in faults"),
    )),
    Struct("rt_arg", "Kernel arguments as the launcher passes them.", (
        Field("cap_t", "cap"),
        Field("int64_t", "i64"),
        Field("double", "f64"),
        Field("float", "f32"),
    ), kind="union"),
    Struct("rt_fault_rec", "A fault as the runtime records it (the first of a launch).",
           FAULT_FIELDS + (
        Field("uint64_t", "obj_id"),
        Field("char", "buffer[RT_NAME_MAX]", "buffer name (or local array name)"),
    )),
    Struct("gc_stats_t", "Collector statistics (gc_get_stats, gc/stats.c).", (
        Field("uint64_t", "cycles"),
        Field("uint64_t", "objects_live"),
        Field("uint64_t", "bytes_live"),
        Field("uint64_t", "objects_freed_total", "headers reclaimed"),
        Field("uint64_t", "bytes_freed_total", "payload bytes released"),
        Field("uint64_t", "bytes_allocated_total"),
        Field("uint64_t", "objects_allocated_total"),
        Field("uint64_t", "handshakes"),
        Field("double", "handshake_p50_us"),
        Field("double", "handshake_p99_us"),
        Field("double", "handshake_max_us"),
        Field("double", "mark_seconds_total"),
        Field("double", "sweep_seconds_total"),
        Field("uint64_t", "threshold_bytes", "heap size that triggers the next cycle"),
        Field("int32_t", "stw", "CAPQR_GC_STW mode"),
        Field("int32_t", "verify", "CAPQR_GC_VERIFY mode"),
        Field("uint64_t", "verify_failures"),
        Field("int32_t", "running", "a cycle is in progress"),
        Field("int32_t", "enabled"),
    )),
    Struct("gc_release_rec", "One deferred release (gc_drain_*_releases, gc/heap.c).", (
        Field("uint64_t", "id", "the object's serial (rt_obj.id)"),
        Field("uint64_t", "handle", "payload address (host pointer or device address)"),
        Field("uint64_t", "nbytes"),
    )),
)
#: Device-lane layouts: cap_abi.h declares them for the CUDA prelude (in the device's
#: builtin types, DEVICE_CTYPES), cffi reads them from the same lists (GPU_FAULT_DECL).
#:
#: rt_gpu_fault is the GPU lane's launch-sequence record: one device allocation owned by
#: the runtime and passed to every checked kernel (a hidden trailing parameter), so the
#: kernels of all modules share it.  ``flag`` is set by the first refused access (or the
#: first block that sees ``cancel``) of the sequence; the fault fields (FAULT_FIELDS, as
#: on the host) describe that event, ``slot`` names its buffer (the argument slot, or
#: -(id + 1) for a local array) and ``launch`` is the index of its launch in the
#: sequence.  Every kernel exits at entry while ``flag`` or ``cancel`` is set, so nothing
#: after the first fault runs.  ``cancel`` is written by the host when a deadline
#: passes.  The host resets the record when a sequence starts and reads it once at the
#: sync.  ``group`` and ``group_gen`` are the grid barrier of a cooperative launch
#: (rt_group_sync): arrivals in the low 32 bits of ``group``, blocks that returned in the
#: high 32, ``group_gen`` counts completed rounds; the last block to return zeroes
#: ``group`` for the next cooperative launch of the sequence.
DEVICE_STRUCTS: tuple[Struct, ...] = (
    Struct("rt_gpu_fault", "The GPU lane's launch-sequence record (capabilities/abi.py).",
           FAULT_FIELDS + (
        Field("int32_t", "slot", "argument slot of the buffer; -(id + 1): local array id"),
        Field("int32_t", "launch", "index of the faulting launch in its sequence"),
        Field("int32_t", "flag", "set (atomicCAS) by the first event of the sequence"),
        Field("int32_t", "cancel", "set by the host at a deadline"),
        Field("uint64_t", "group", "grid barrier: arrivals | returned blocks << 32"),
        Field("uint32_t", "group_gen", "grid barrier: completed rounds"),
        Field("uint32_t", "group_pad"),
    )),
)
STRUCT: dict[str, Struct] = {st.tag: st for st in STRUCTS + DEVICE_STRUCTS}
#: The fixed-width types the layouts use, as the device spells them (NVRTC has no
#: <stdint.h>); the CUDA lowering maps the dialect's typedefs with the same table.
DEVICE_CTYPES: dict[str, str] = {"int32_t": "int", "uint32_t": "unsigned int",
                                 "int64_t": "long long", "uint64_t": "unsigned long long"}
#: The macros array extents use, with their values (cffi's cdef takes no macros).
_EXTENTS: dict[str, int] = {"RT_NAME_MAX": NAME_MAX}


def _decl(f: Field) -> str:
    sep = "" if f.ctype.endswith("*") else " "
    return f"{f.ctype}{sep}{f.name};"


def _c_struct(st: Struct, ctypes: dict[str, str] | None = None) -> str:
    lines = [f"/* {st.doc} */", f"typedef {st.kind} {st.tag} {{"]
    for f in st.fields:
        d = _decl(Field(ctypes.get(f.ctype, f.ctype), f.name) if ctypes else f)
        lines.append(f"    {d:<27} /* {f.comment} */" if f.comment else f"    {d}")
    lines.append(f"}} {st.tag};")
    return "\n".join(lines) + "\n"


def c_structs() -> str:
    """The host-lane typedefs of STRUCTS (cap_abi.h)."""
    return "\n".join(_c_struct(st) for st in STRUCTS)


def device_c_structs() -> str:
    """The device-lane typedefs of DEVICE_STRUCTS (cap_abi.h), in the device's types."""
    return "\n".join(_c_struct(st, DEVICE_CTYPES) for st in DEVICE_STRUCTS)


def cffi_structs(*tags: str) -> str:
    """cffi cdef declarations of the named STRUCTS, from the same field lists as the C
    typedefs; complete (no ``...``), so cffi also checks every offset against the
    compiled C at build time."""
    out = []
    for tag in tags:
        st = STRUCT[tag]
        body = []
        for f in st.fields:
            d = _decl(f)
            for macro, value in _EXTENTS.items():
                d = d.replace(macro, str(value))
            body.append(f"    {d}")
        out.append(f"typedef {st.kind} {st.tag} {{\n" + "\n".join(body) + f"\n}} {st.tag};\n")
    return "".join(out)



_HEADER_NAME = "cap_abi.h"
HEADER_PATH = Path(__file__).resolve().parent / _HEADER_NAME


def _enum(prefix: str, items: list[tuple[str, int]]) -> str:
    body = ", ".join(f"{prefix}{n} = {v}" for n, v in items)
    return f"enum {{ {body} }};\n"


def c_header() -> str:
    """The shared C fragment (valid C11 and CUDA C++; RT_DEVICE_LANE selects the GPU form)."""
    dts = _enum("RT_DT_", [(d.suffix.upper(), d.code) for d in DTYPES])
    faults = _enum("RT_FAULT_", [("NONE", 0)] + [(f.name, f.code) for f in FAULTS])
    acc = _enum("RT_ACC_", [(v.upper(), k) for k, v in ACCESS.items() if v])
    objf = _enum("RT_OBJ_", list(OBJ_FLAGS))
    return f"""/* Generated by capabilities/abi.py (python -m capqr.capabilities.abi): do not edit.
 * The ABI facts shared by the CPU lane (cap.h) and the GPU lane (runtime/cuda/prelude.cuh). */
#ifndef CAPQR_CAP_ABI_H
#define CAPQR_CAP_ABI_H

#ifdef RT_DEVICE_LANE
typedef unsigned long long rt_u64;
typedef long long rt_i64;
typedef int rt_i32;
typedef unsigned short rt_u16;
#define RT_CAP_OWNER unsigned long long tag;  /* slot + 1 | freed << 32 */
#define RT_TAG_SLOT_MASK 0x{GPU_TAG_FREED - 1:x}ull   /* the tag's argument slot + 1 */
#define RT_TAG_FREED 0x{GPU_TAG_FREED:x}ull       /* the tag's "freed" bit */
#define RT_ABI_FN static __device__ __forceinline__
#else
typedef uint64_t rt_u64;
typedef int64_t rt_i64;
typedef int32_t rt_i32;
typedef uint16_t rt_u16;
struct rt_obj;
#define RT_CAP_OWNER struct rt_obj *obj;      /* NULL for a cap made from an integer */
#define RT_ABI_FN static inline __attribute__((always_inline))
#endif

{dts}enum {{ RT_PERM_R = {PERM_R}, RT_PERM_W = {PERM_W} }};
{faults}enum {{ RT_OK = 0 }};
{acc}/* rt_obj.flags (meanings: capabilities/abi.py OBJ_FLAGS) */
{objf}/* Collector payloads start on a multiple of this many bytes (a cache line). */
#define RT_PAYLOAD_ALIGN {PAYLOAD_ALIGN}
/* rt_api.abi_version; name bytes in rt_obj / rt_fault_rec; shadow slots per frame */
#define RT_ABI_VERSION {RT_ABI_VERSION}
#define RT_NAME_MAX {NAME_MAX}
#define RT_FRAME_SLOTS_MAX {FRAME_SLOTS_MAX}
/* Bytes of one cap-table slot (rt_capslot {{p, obj}}): the element size of RT_DT_CAP. */
#define RT_SLOT_BYTES {DT_BY_SUFFIX["cap"].size}

/* A capability as a kernel holds it: {CAP_BYTES} bytes, by value.  p is the current
 * origin (what cap_to_int returns), lo the object start, rlen/wlen the
 * readable/writable bytes from lo (a snapshot). */
typedef struct cap_t {{
    char *p;
    char *lo;
    rt_u64 rlen;
    rt_u64 wlen;
    RT_CAP_OWNER
}} cap_t;

#ifndef RT_LIKELY
#define RT_LIKELY(x) __builtin_expect(!!(x), 1)
#define RT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#endif
/* Indices beyond +-2^{IDX_LIMIT_LOG2} could wrap i*sizeof(T); they are out of every buffer. */
#define RT_IDX_LIMIT ((rt_u64)1 << {IDX_LIMIT_LOG2})
#define RT_I64_MAX 9223372036854775807LL
/* int range: what a 32-bit loop counter or index part may take (loop guards) */
#define RT_I32_MIN (-2147483647 - 1)
#define RT_I32_MAX 2147483647

/* In bounds iff the byte offset off = (p - lo) + i*S (mod 2^64: exactly the
 * address the access would touch) satisfies off < len and off + S <= len.
 * off < len first, so a "negative" off (huge unsigned) can never wrap the
 * second sum back into range.  |i| < RT_IDX_LIMIT is required on top, so an
 * index whose i*S wraps into the buffer is still refused.  All operands are
 * in registers (the bounds are a by-value snapshot). */
#define RT_OFF(c, i, S) ((rt_u64)((c).p - (c).lo) + (rt_u64)(i) * (rt_u64)(S))
#define RT_INB(c, i, S, LEN)                                                     \\
    (RT_LIKELY(((rt_u64)(i) + RT_IDX_LIMIT) < 2 * RT_IDX_LIMIT) &&               \\
     RT_LIKELY(RT_OFF(c, i, S) < (LEN)) && RT_LIKELY(RT_OFF(c, i, S) + (S) <= (LEN)))
/* An origin moved by an absurd k keeps zero bounds (every access refused). */
#define RT_OFFSET_SANE(k) ((((rt_u64)(k)) + RT_IDX_LIMIT) < 2 * RT_IDX_LIMIT)

#ifndef RT_DEVICE_LANE
/* ---- host-lane layouts (also declared to cffi by runtime/core.py) ---- */
{c_structs()}#else
/* ---- device-lane layouts (also declared to cffi by runtime/cuda/sequence.py) ---- */
{device_c_structs()}#endif

#include "guards.h"   /* loop-versioning guards and tile range checks (hand-written) */

#endif /* CAPQR_CAP_ABI_H */
"""


#: cffi's declaration of the GPU lane's sequence record (runtime/cuda/sequence.py,
#: tests/emulate_cuda.py).
GPU_FAULT_DECL = cffi_structs("rt_gpu_fault")


def write_header() -> None:
    """Rewrite cap_abi.h from this module."""
    HEADER_PATH.write_text(c_header())


if __name__ == "__main__":
    write_header()
    print(f"wrote {HEADER_PATH}")
