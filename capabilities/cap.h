/*
 * capqr C ABI — the one header shared by Python (cffi), instrumented kernels
 * and the collector (gc/).  Everything that crosses a module boundary is here.
 *
 * Objects.  Every buffer is an rt_obj: a header owned by the collector plus a
 * payload.  Objects never move.  A header outlives its payload: free() sets
 * the bounds to zero at once (later accesses trap as "freed") and the payload
 * is released when no running block can still reach it.
 *
 * Capabilities.  A kernel sees buffers only as cap_t values (Fil-C's
 * InvisiCaps, flattened): the address plus a by-value snapshot of the bounds
 * and a pointer to the owning object.  Kernel source can never name the
 * fields (the verifier rejects member access on cap_t), so the only ways to
 * touch memory are the checked accessors below.  cap_from_int() builds a cap
 * with obj == NULL and zero bounds: every access through it faults.
 *
 * Cap tables.  Buffers of dtype RT_DT_CAP hold rt_capslot {p, obj} pairs.
 * Loading from a table rebuilds the bounds from the object header, so a
 * freed object is seen as freed.  Stores go through the collector's Dijkstra
 * barrier (gc_store_barrier).
 *
 * Blocks.  The instrumenter gives every kernel function a hidden first
 * parameter `rt_block *__rt`: block index, poll flag, shadow frames, the
 * jmp_buf a fault unwinds to, and the runtime's function table (rt_api), so
 * kernel modules need no link-time dependency on the core.
 *
 * Pollchecks.  At every loop back-edge and at the entry of every function
 * that calls a same-source function (runtime/hoist.py, entry_polls: together
 * they bound the work between two polls, loops or not): one load of
 * *__rt->poll and a predictable branch.  Non-zero means "take the slow path":
 * a soft handshake requested by the collector, a timeout or a cancel (fault in
 * another block).
 *
 * Shadow frames.  cap_t locals of a running kernel are GC roots.  Each
 * function that has cap_t locals gets an rt_frame with one slot per local;
 * every assignment records the object in its slot (a plain store; stacks are
 * rescanned at handshakes, so no barrier is needed).
 *
 * Modes.  RT_RAW compiles the same kernel with raw pointers and no checks:
 * the baseline for overhead benchmarks, never the default.  RT_RAW_POLL is
 * raw plus pollchecks (to measure the pollcheck cost alone).
 */
#ifndef CAPQR_CAP_H
#define CAPQR_CAP_H

#include <stdint.h>
#include <stddef.h>
#include <setjmp.h>

#include "cap_abi.h"   /* dtype/fault codes, cap_t, the bounds predicate */

#ifdef __cplusplus
extern "C" {
#endif


/* rt_obj.flags bits RT_OBJ_*, RT_NAME_MAX, RT_FRAME_SLOTS_MAX, RT_ABI_VERSION:
 * cap_abi.h (capabilities/abi.py) */

/* The object header.  Owned by the collector (gc/), never moves. */
typedef struct rt_obj {
    char *base;                 /* payload start */
    uint64_t nbytes;            /* payload size as allocated */
    uint64_t rlen;              /* readable bytes from base; 0 once freed */
    uint64_t wlen;              /* writable bytes from base; 0 if read-only or freed */
    uint32_t dtype;             /* RT_DT_* of the elements */
    uint32_t perms;             /* RT_PERM_* */
    uint32_t flags;             /* RT_OBJ_* (atomic updates) */
    uint32_t mark;              /* collector mark epoch (atomic) */
    int32_t pins;               /* Python handles holding it (atomic) */
    int32_t holds;              /* running launches holding it as an argument (atomic) */
    uint64_t id;                /* allocation serial number (debugging, stats) */
    struct rt_obj *next;        /* collector's list of all objects */
    char name[RT_NAME_MAX];     /* buffer name shown in faults */
} rt_obj;


/* One element of a cap table (dtype RT_DT_CAP). */
typedef struct rt_capslot {
    char *p;
    rt_obj *obj;
} rt_capslot;

/* Kernel arguments as the launcher passes them. */
typedef union rt_arg {
    cap_t cap;
    int64_t i64;
    double f64;
    float f32;
} rt_arg;


/* ---- faults ------------------------------------------------------------ */
typedef struct rt_fault_rec {
    int32_t kind;               /* RT_FAULT_* (0: none) */
    int32_t access;             /* RT_ACC_* */
    int64_t block;              /* block index that faulted */
    int64_t index;              /* element index of the access */
    int64_t elsize;             /* element size of the access */
    int64_t offset;             /* byte offset of the origin from the object start */
    int32_t line;               /* kernel source line */
    int32_t thread;             /* GPU lane: thread index; CPU: -1 */
    uint64_t obj_id;
    char buffer[RT_NAME_MAX];   /* buffer name (or local array name) */
} rt_fault_rec;

/* ---- blocks, frames, the runtime function table ------------------------ */
typedef struct rt_frame {
    struct rt_frame *up;
    struct rt_block *blk;
    int32_t nslots;
    rt_obj *slots[RT_FRAME_SLOTS_MAX];
} rt_frame;

struct rt_block;
struct rt_thread;
struct rt_launch;

typedef struct rt_api {
    int32_t abi_version;
    /* record a fault and unwind the block (never returns) */
    /* c by value: taking its address in inlined checks would force every
     * kernel's caps out of registers */
    __attribute__((noreturn)) void (*fault)(struct rt_block *b, cap_t c, int64_t index,
                                            int32_t elsize, int32_t access, int32_t line);
    __attribute__((noreturn)) void (*fault_local)(struct rt_block *b, const char *array,
                                                  int64_t index, int32_t line);
    /* integer division or remainder by zero (would be SIGFPE) */
    __attribute__((noreturn)) void (*fault_div)(struct rt_block *b, int32_t line);
    /* pollcheck slow path: handshake callback, timeout, cancel */
    void (*poll)(struct rt_block *b);
    /* allocation from kernels: a fresh zeroed object; faults when out of memory */
    cap_t (*alloc)(struct rt_block *b, int64_t n, int32_t dtype, int32_t line);
    /* cap tables */
    void (*store_cap)(struct rt_block *b, rt_capslot *slot, cap_t v);
    cap_t (*load_cap)(struct rt_block *b, const rt_capslot *slot);
    /* rt_group_sync: wait for the launch's group blocks (faults outside a group) */
    void (*group_sync)(struct rt_block *b, int32_t line);
} rt_api;

typedef struct rt_block {
    int64_t block_idx;
    int64_t grid_dim;
    const volatile int32_t *poll;  /* non-zero: take the slow path */
    const rt_api *api;
    rt_frame *frames;              /* innermost shadow frame */
    struct rt_thread *thread;      /* worker (collector mutator state) */
    struct rt_launch *launch;
    jmp_buf jmp;                   /* where faults and cancels unwind to */
} rt_block;

/* The entry point every kernel module exports (generated by the instrumenter). */
typedef void (*rt_entry_fn)(rt_block *b, const rt_arg *args);

/* ---- IEEE half <-> float (storage only; arithmetic is float) ------------ */
/* Checks must vanish into the kernel's code even in large kernels, where
 * gcc's inliner would otherwise give up on growth limits. */
#define RT_INLINE static inline __attribute__((always_inline))

RT_INLINE float rt_half_to_float(uint16_t h)
{
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
}
RT_INLINE uint16_t rt_float_to_half(float f)
{
    _Float16 v = (_Float16)f;
    uint16_t h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}


__attribute__((noinline, cold, noreturn)) static void rt_fail_local(rt_block *b, const char *a,
                                                                    int64_t i, int32_t line)
{
    b->api->fault_local(b, a, i, line);
}
/* The failure paths: out of line and cold, so the hot loop keeps only a
 * compare and a never-taken branch. */
__attribute__((noinline, cold, noreturn)) static void rt_fail(rt_block *b, cap_t c, int64_t i,
                                                              int32_t S, int32_t access,
                                                              int32_t line)
{
    b->api->fault(b, c, i, S, access, line);
}

/* Unchecked accessors, used only where rt_range_ok covered the access. */
#define rt_uload_f32(c, i) (((const float *)((c).p))[i])
#define rt_ustore_f32(c, i, v) (((float *)((c).p))[i] = (v))
#define rt_uload_f64(c, i) (((const double *)((c).p))[i])
#define rt_ustore_f64(c, i, v) (((double *)((c).p))[i] = (v))
#define rt_uload_i32(c, i) (((const int32_t *)((c).p))[i])
#define rt_ustore_i32(c, i, v) (((int32_t *)((c).p))[i] = (v))
#define rt_uload_i64(c, i) (((const int64_t *)((c).p))[i])
#define rt_ustore_i64(c, i, v) (((int64_t *)((c).p))[i] = (v))
#define rt_uload_f16(c, i) rt_half_to_float(((const uint16_t *)((c).p))[i])
#define rt_ustore_f16(c, i, v) (((uint16_t *)((c).p))[i] = rt_float_to_half(v))

RT_INLINE int64_t rt_len(cap_t c, int64_t S)
{
    int64_t off = (int64_t)(c.p - c.lo);
    int64_t n = ((int64_t)c.rlen - off) / S;
    return (off < 0 || n < 0) ? 0 : n;
}

RT_INLINE int64_t rt_cap_to_int(cap_t c) { return (int64_t)(uintptr_t)c.p; }

RT_INLINE cap_t rt_cap_from_int(int64_t x)
{
    cap_t c;
    c.p = (char *)(uintptr_t)x;
    c.lo = c.p;
    c.rlen = 0;
    c.wlen = 0;
    c.obj = 0;
    return c;
}


#if !defined(RT_RAW) && !defined(RT_RAW_POLL)
/* ====================== checked mode ===================================== */


#define RT_DEFINE_ACCESS(T, CT, S)                                                \
    RT_INLINE CT rt_load_##T(rt_block *b, cap_t c, int64_t i, int32_t line)  \
    {                                                                            \
        if (!RT_INB(c, i, S, c.rlen)) rt_fail(b, c, i, S, RT_ACC_LOAD, line); \
        return ((const CT *)(c.p))[i];                                           \
    }                                                                            \
    RT_INLINE void rt_store_##T(rt_block *b, cap_t c, int64_t i, CT v, int32_t line) \
    {                                                                            \
        if (!RT_INB(c, i, S, c.wlen)) rt_fail(b, c, i, S, RT_ACC_STORE, line); \
        ((CT *)(c.p))[i] = v;                                                    \
    }

RT_DEFINE_ACCESS(f32, float, 4)
RT_DEFINE_ACCESS(f64, double, 8)
RT_DEFINE_ACCESS(i32, int32_t, 4)
RT_DEFINE_ACCESS(i64, int64_t, 8)

RT_INLINE float rt_load_f16(rt_block *b, cap_t c, int64_t i, int32_t line)
{
    if (!RT_INB(c, i, 2, c.rlen)) rt_fail(b, c, i, 2, RT_ACC_LOAD, line);
    return rt_half_to_float(((const uint16_t *)(c.p))[i]);
}
RT_INLINE void rt_store_f16(rt_block *b, cap_t c, int64_t i, float v, int32_t line)
{
    if (!RT_INB(c, i, 2, c.wlen)) rt_fail(b, c, i, 2, RT_ACC_STORE, line);
    ((uint16_t *)(c.p))[i] = rt_float_to_half(v);
}


RT_INLINE cap_t rt_offset(cap_t c, int64_t k, int64_t S)
{
    /* Moving the origin is always allowed; checks stay relative to the object.
     * Wrapping arithmetic: an absurd k yields an origin every access rejects. */
    c.p = (char *)((uint64_t)c.p + (uint64_t)k * (uint64_t)S);
    if (!RT_OFFSET_SANE(k)) { c.rlen = 0; c.wlen = 0; }
    return c;
}

RT_INLINE int64_t rt_local_idx(rt_block *b, int64_t i, int64_t n, const char *name,
                                   int32_t line)
{
    if (RT_UNLIKELY((uint64_t)i >= (uint64_t)n)) rt_fail_local(b, name, i, line);
    return i;
}

/* A pollcheck is a safepoint: the host, the collector or another block may
 * have written memory, so it is also a compiler barrier (a loop that waits
 * for a flag in a buffer really re-reads it).  Non-escaping locals stay in
 * registers. */
RT_INLINE void rt_pollcheck(rt_block *b)
{
    __asm__ __volatile__("" ::: "memory");
    if (RT_UNLIKELY(*b->poll)) b->api->poll(b);
}

RT_INLINE cap_t rt_alloc(rt_block *b, int64_t n, int32_t dt, int32_t line)
{
    return b->api->alloc(b, n, dt, line);
}

/* Cap tables: the snapshot in a table's cap_t has zero numeric bounds (so
 * cap_load_i64 & co. can never read or forge the raw slot bytes); slot
 * accesses check the header's current bounds, the dtype, and 16-byte slot
 * alignment (a misaligned origin would read p as obj). */
RT_INLINE int rt_slot_ok(cap_t t, int64_t i, int store)
{
    rt_obj *o = t.obj;
    uint64_t len;
    if (!o || o->dtype != RT_DT_CAP) return 0;
    len = store ? __atomic_load_n(&o->wlen, __ATOMIC_ACQUIRE)
                : __atomic_load_n(&o->rlen, __ATOMIC_ACQUIRE);
    return RT_INB(t, i, 16, len) && (RT_OFF(t, i, 16) & 15) == 0;
}
RT_INLINE cap_t rt_load_cap(rt_block *b, cap_t t, int64_t i, int32_t line)
{
    if (!rt_slot_ok(t, i, 0)) rt_fail(b, t, i, 16, RT_ACC_LOAD, line);
    return b->api->load_cap(b, &((const rt_capslot *)(t.p))[i]);
}
RT_INLINE void rt_store_cap(rt_block *b, cap_t t, int64_t i, cap_t v, int32_t line)
{
    if (!rt_slot_ok(t, i, 1)) rt_fail(b, t, i, 16, RT_ACC_STORE, line);
    b->api->store_cap(b, &((rt_capslot *)(t.p))[i], v);
}

/* Shadow-frame slot update: returns v so it can wrap an assignment. */
RT_INLINE cap_t rt_root(rt_frame *f, int32_t k, cap_t v)
{
    f->slots[k] = v.obj;
    return v;
}

#else
/* ====================== raw mode (baseline) ============================= */
/* The same kernel with raw pointers and no checks.  Only for benchmarks and
 * for demonstrating what an unchecked bug does (in a subprocess). */
#define RT_DEFINE_RAW(T, CT)                                                     \
    RT_INLINE CT rt_load_##T(rt_block *b, cap_t c, int64_t i, int32_t line)  \
    { (void)b; (void)line; return ((const CT *)(c.p))[i]; }                      \
    RT_INLINE void rt_store_##T(rt_block *b, cap_t c, int64_t i, CT v, int32_t line) \
    { (void)b; (void)line; ((CT *)(c.p))[i] = v; }
RT_DEFINE_RAW(f32, float)
RT_DEFINE_RAW(f64, double)
RT_DEFINE_RAW(i32, int32_t)
RT_DEFINE_RAW(i64, int64_t)
RT_INLINE float rt_load_f16(rt_block *b, cap_t c, int64_t i, int32_t line)
{ (void)b; (void)line; return rt_half_to_float(((const uint16_t *)(c.p))[i]); }
RT_INLINE void rt_store_f16(rt_block *b, cap_t c, int64_t i, float v, int32_t line)
{ (void)b; (void)line; ((uint16_t *)(c.p))[i] = rt_float_to_half(v); }
#define rt_range_ok(c, e0, d, span, S, st) 1
#define rt_range2_ok(c, e00, di, si, dj, sj, S, st) 1
RT_INLINE cap_t rt_offset(cap_t c, int64_t k, int64_t S) { c.p += k * S; return c; }
RT_INLINE int64_t rt_local_idx(rt_block *b, int64_t i, int64_t n, const char *name, int32_t line)
{ (void)b; (void)n; (void)name; (void)line; return i; }
#ifdef RT_RAW_POLL
RT_INLINE void rt_pollcheck(rt_block *b)
{
    __asm__ __volatile__("" ::: "memory");
    if (RT_UNLIKELY(*b->poll)) b->api->poll(b);
}
#else
#define rt_pollcheck(b) ((void)0)
#endif
RT_INLINE cap_t rt_alloc(rt_block *b, int64_t n, int32_t dt, int32_t line)
{ return b->api->alloc(b, n, dt, line); }
RT_INLINE cap_t rt_load_cap(rt_block *b, cap_t t, int64_t i, int32_t line)
{ (void)line; return b->api->load_cap(b, &((const rt_capslot *)(t.p))[i]); }
RT_INLINE void rt_store_cap(rt_block *b, cap_t t, int64_t i, cap_t v, int32_t line)
{ (void)line; b->api->store_cap(b, &((rt_capslot *)(t.p))[i], v); }
RT_INLINE cap_t rt_root(rt_frame *f, int32_t k, cap_t v) { f->slots[k] = v.obj; return v; }
#endif

/* Whether an expression has a signed integer type of at most 64 bits. */
#define RT_IS_INT(e) _Generic((e), long: 1, long long: 1, int: 1, short: 1, signed char: 1, \
                              default: 0)

/* Integer division that cannot trap: x86 raises SIGFPE for a zero divisor and
 * for INT64_MIN / -1, which would kill the host.  Zero faults; -1 negates
 * (wrapping).  The instrumenter routes every `/` and `%` through RT_DIV/RT_MOD,
 * which pick these only for integer operands (_Generic on the result type). */
RT_INLINE int64_t rt_idiv(rt_block *b, int64_t x, int64_t y, int32_t line)
{
    if (RT_UNLIKELY(y == 0)) b->api->fault_div(b, line);
    if (RT_UNLIKELY(y == -1)) return (int64_t)(0 - (uint64_t)x);
    return x / y;
}
RT_INLINE int64_t rt_imod(rt_block *b, int64_t x, int64_t y, int32_t line)
{
    if (RT_UNLIKELY(y == 0)) b->api->fault_div(b, line);
    if (RT_UNLIKELY(y == -1)) return 0;
    return x % y;
}
RT_INLINE uint64_t rt_udiv(rt_block *b, uint64_t x, uint64_t y, int32_t line)
{
    if (RT_UNLIKELY(y == 0)) b->api->fault_div(b, line);
    return x / y;
}
RT_INLINE uint64_t rt_umod(rt_block *b, uint64_t x, uint64_t y, int32_t line)
{
    if (RT_UNLIKELY(y == 0)) b->api->fault_div(b, line);
    return x % y;
}
#define RT_DIV(b, x, y, line) _Generic((x) / (y), double: (x) / (y), float: (x) / (y), \
    unsigned long: rt_udiv(b, (x), (y), line), unsigned int: (unsigned int)rt_udiv(b, (x), (y), line), \
    int: (int)rt_idiv(b, (x), (y), line), default: rt_idiv(b, (x), (y), line))
#define RT_MOD(b, x, y, line) _Generic((x) % (y), \
    unsigned long: rt_umod(b, (x), (y), line), unsigned int: (unsigned int)rt_umod(b, (x), (y), line), \
    int: (int)rt_imod(b, (x), (y), line), default: rt_imod(b, (x), (y), line))

/* Both modes: blocks 0 .. group-1 of a launch made with group= wait here for
 * each other (runtime/csrc/launch.c: group barrier).  A call through the api
 * table, so the compiler keeps no memory value across it. */
RT_INLINE void rt_group_sync(rt_block *b, int32_t line) { b->api->group_sync(b, line); }

/* Frame push/pop (both modes: allocation from kernels needs roots). */
RT_INLINE void rt_frame_push(rt_block *b, rt_frame *f, int32_t nslots)
{
    int32_t k;
    f->nslots = nslots;
    for (k = 0; k < nslots; k++) f->slots[k] = 0;
    f->up = b->frames;
    f->blk = b;
    __atomic_store_n(&b->frames, f, __ATOMIC_RELEASE);
}
/* Used as __attribute__((cleanup)), so every return path pops the frame;
 * a fault unwinds with longjmp and the launcher resets b->frames instead. */
RT_INLINE void rt_frame_cleanup(rt_frame *f)
{
    __atomic_store_n(&f->blk->frames, f->up, __ATOMIC_RELEASE);
}

#ifdef __cplusplus
}
#endif
#endif /* CAPQR_CAP_H */
