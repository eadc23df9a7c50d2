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
 * touch memory are the checked accessors (checks.h, included below).  cap_from_int() builds a cap
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
 * that calls a same-source function (runtime/compiler/hoist/, entry_polls: together
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

/* rt_obj, rt_arg, rt_fault_rec: cap_abi.h (layouts in capabilities/abi.py STRUCTS). */

/* One element of a cap table (dtype RT_DT_CAP). */
typedef struct rt_capslot {
    char *p;
    rt_obj *obj;
} rt_capslot;

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


/* ---- the CPU lane's side of checks.h (capabilities/checks.h says what each is) */
#define RT_CTX rt_block *b,
#define RT_CTX_ARG b,
typedef const char *rt_array_ref;  /* a local array, by the name its fault reports */
/* The failure paths: out of line and cold, so the hot loop keeps only a
 * compare and a never-taken branch. */
#define RT_COLD_FN __attribute__((noinline, cold, noreturn)) static
RT_COLD_FN void rt_fail_local(rt_block *b, const char *a, int64_t i, int32_t line)
{
    b->api->fault_local(b, a, i, line);
}
RT_COLD_FN void rt_fail(rt_block *b, cap_t c, int64_t i, int32_t S, int32_t access, int32_t line)
{
    b->api->fault(b, c, i, S, access, line);
}
#define RT_FAULT_CAP(c, i, S, acc, line) rt_fail(b, c, i, S, acc, line)
#define RT_FAULT_LOCAL(a, i, line) rt_fail_local(b, a, i, line)
#define RT_FAULT_DIV(line) b->api->fault_div(b, line)
#if defined(RT_RAW) || defined(RT_RAW_POLL)
#define RT_UNCHECKED 1
#endif
#define RT_RAW_OFFSET(p, k, S) ((p) + (k) * (S))
#include "checks.h"   /* accessors, rt_len/rt_offset, local-array, tile and division checks */


#ifndef RT_UNCHECKED
/* ====================== checked mode ===================================== */

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
 * accesses check the header's current bounds, the dtype, and slot alignment
 * (a misaligned origin would read p as obj). */
RT_INLINE int rt_slot_ok(cap_t t, int64_t i, int store)
{
    rt_obj *o = t.obj;
    uint64_t len;
    if (!o || o->dtype != RT_DT_CAP) return 0;
    len = store ? __atomic_load_n(&o->wlen, __ATOMIC_ACQUIRE)
                : __atomic_load_n(&o->rlen, __ATOMIC_ACQUIRE);
    return RT_INB(t, i, RT_SLOT_BYTES, len) && (RT_OFF(t, i, RT_SLOT_BYTES) % RT_SLOT_BYTES) == 0;
}
RT_INLINE cap_t rt_load_cap(rt_block *b, cap_t t, int64_t i, int32_t line)
{
    if (!rt_slot_ok(t, i, 0)) rt_fail(b, t, i, RT_SLOT_BYTES, RT_ACC_LOAD, line);
    return b->api->load_cap(b, &((const rt_capslot *)(t.p))[i]);
}
RT_INLINE void rt_store_cap(rt_block *b, cap_t t, int64_t i, cap_t v, int32_t line)
{
    if (!rt_slot_ok(t, i, 1)) rt_fail(b, t, i, RT_SLOT_BYTES, RT_ACC_STORE, line);
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
#define rt_range_ok(c, e0, d, span, S, st) 1
#define rt_range2_ok(c, e00, di, si, dj, sj, S, st) 1
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


/* Tile copies between a cap and a local array (cap_tile_load_T / _store_T):
 * RT_TILE_CHECK (checks.h) first, then a row at a time, with one pollcheck per
 * row: the cap is a variable, so it stays rooted. */
#define RT_DEFINE_TILE(T, CT)                                                         \
    RT_INLINE void rt_tile_load_##T(rt_block *b, cap_t c, int64_t off, int64_t ld,      \
                                    int64_t rows, int64_t cols, void *arr, int64_t n,   \
                                    rt_array_ref a, int64_t aoff, int64_t ald,          \
                                    int32_t line)                                       \
    {                                                                                 \
        int64_t r, k;                                                                 \
        RT_TILE_CHECK((int32_t)sizeof(CT), 0);                                        \
        for (r = 0; r < rows; r++) {                                                  \
            const CT *src = (const CT *)c.p + (off + r * ld);                         \
            CT *dst = (CT *)arr + (aoff + r * ald);                                   \
            for (k = 0; k < cols; k++) dst[k] = src[k];                               \
            rt_pollcheck(b);                                                          \
        }                                                                             \
    }                                                                                 \
    RT_INLINE void rt_tile_store_##T(rt_block *b, cap_t c, int64_t off, int64_t ld,     \
                                     int64_t rows, int64_t cols, void *arr, int64_t n,  \
                                     rt_array_ref a, int64_t aoff, int64_t ald,         \
                                     int32_t line)                                      \
    {                                                                                 \
        int64_t r, k;                                                                 \
        RT_TILE_CHECK((int32_t)sizeof(CT), 1);                                        \
        for (r = 0; r < rows; r++) {                                                  \
            CT *dst = (CT *)c.p + (off + r * ld);                                     \
            const CT *src = (const CT *)arr + (aoff + r * ald);                       \
            for (k = 0; k < cols; k++) dst[k] = src[k];                               \
            rt_pollcheck(b);                                                          \
        }                                                                             \
    }
RT_DEFINE_TILE(f32, float)
RT_DEFINE_TILE(f64, double)

#ifdef __cplusplus
}
#endif
#endif /* CAPQR_CAP_H */
