"""Verified dialect AST -> CUDA C, with capability checks (or raw pointers for the baseline).

What the transformation does (pycparser AST in, CGenerator text out):

* ``cap_load_T(c, i)`` / ``cap_store_T(c, i, v)`` become inline device
  accessors ``rt_load_T(c, i, LINE)`` / ``rt_store_T(c, i, v, LINE)`` that
  compare the index against the by-value bounds of ``c`` (two compares, all in
  registers) before touching memory.  ``cap_len_T``, ``cap_offset_T``,
  ``cap_to_int``, ``cap_from_int`` and the ``rt_*`` intrinsics map to inline
  helpers; the element size is folded in at generation time.
* Subscripts of local arrays (``smem_*`` arrays live in ``__shared__``
  memory, the others per thread) are wrapped in ``rt_lidx(i, N, ID, LINE)``.
* Each loop condition gets an amortised pollcheck ``RT_POLL(__rt_pc)`` (one
  add, one test per iteration; the sequence record's cancel and fault flags
  are read every 1024th tick), so a launch past its deadline can be
  cancelled and the blocks of a faulted launch stop early.  Every function
  that calls a same-source function ticks the same counter at its entry
  (hoist.entry_polls: a DAG of loop-free helpers reaches the record too): in
  checked mode the counter is the thread's one ``unsigned int``, declared by
  the ``__global__`` wrapper and passed by reference (``rt_pc_t``) as every
  device function's hidden first parameter, so ticks add up across calls.
* A ``KERNEL`` becomes an ``extern "C" __global__`` wrapper that initialises
  the block's fault flag and calls the body, emitted as a device function (no
  other function calls a KERNEL: the verifier refuses it, since a launch
  contract holds only for the launched kernel).  In checked mode the wrapper has
  two hidden trailing parameters, the sequence record (``rt_gpu_fault *``,
  capabilities/abi.py) and the launch's index in its sequence, and exits at
  entry when the record says the sequence already faulted or was cancelled.

Launch sequences.  The record is one runtime-owned device allocation shared
by every module; it reaches the kernels as a parameter rather than a module
global set at load time because the launch index differs per launch and a
parameter is the only per-launch channel that costs no extra stream
operation (the pointer travels with it, so a module holds no hidden state).
A fault of launch k therefore stops launches k+1, ... of the sequence at
their entry, and the host reads the record once, at the sync.

Fault protocol (why it cannot deadlock).  A failed check never performs the
access.  The thread records the fault in the sequence record (first fault of
the sequence wins, by ``atomicCAS`` on its flag), sets the block-shared flag
``__rt_bfault`` and executes PTX ``exit``.  The PTX ISA specifies that
``barrier.sync`` waits only for *non-exited* threads and that an exiting
thread releases a barrier it was holding up, so the survivors' next
``rt_sync_threads()`` completes; right after that barrier every survivor sees
the flag and exits too.  Survivors that meet no further barrier simply run to
the end doing only checked accesses (or stop at a pollcheck, which also
reads the record's flag).  The host reads the record after synchronising and
raises ``CapabilityFault``.

Raw mode (``checked=False``) compiles the same AST with unchecked accessors,
no pollchecks, no entry check and no hidden parameters, and a plain
``__syncthreads()``: the overhead baseline.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from pycparser import c_ast

from ...capabilities import abi
from ..astutil import (
    Generator,
    mangle,
    rename_user_names,
    squeeze_line_directives,
    tile_call,
    user_names,
)
from ..dialect_api import MMA_ARRAY_ARGS, MMA_FUNCS, TILE_FUNCS, WARP_FUNCS
from ..hoist import (
    GPU_BARRIERS,
    GPU_BLOCK_VOTE,
    GPU_WARP_VOTE,
    QUIET_LOOPS,
    PollPoint,
    UncheckedCall,
    UncheckedRef,
    entry_polls,
    hoist_function,
    waiting_helpers,
)
from ..parse import is_user_node
from ..ranges import builtin_ranges, prove_subscripts
from ..verifier import KernelSig, VerifiedSource

ELEM = {t: abi.ELEM_SIZE[t] for t in abi.SCALAR_SUFFIXES}

FAULT_KINDS = abi.FAULT_REASON

DEVICE_PRELUDE = r"""
/* ---- capqr device runtime (generated; see runtime/cuda/instrument_cuda.py) ---- */
#pragma nv_diag_suppress 177   /* unused helpers of the runtime are expected */
#pragma nv_diag_suppress 550   /* the pollcheck counter is unused in raw mode */

/* cap_t, fault/dtype codes, RT_INB and rt_gpu_fault come from capabilities/abi.py. */
__shared__ volatile int __rt_bfault;         /* this block: a thread faulted / cancelled */
__shared__ rt_gpu_fault *__rt_bseq;          /* the sequence record (hidden kernel parameter) */
__shared__ int __rt_blaunch;                 /* this launch's index in its sequence */

static __device__ __forceinline__ float rt_h2f(unsigned short h)
{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static __device__ __forceinline__ unsigned short rt_f2h(float f)
{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

static __device__ __forceinline__ long long rt_block_idx(void) { return (long long)blockIdx.x; }
static __device__ __forceinline__ long long rt_grid_dim(void) { return (long long)gridDim.x; }
static __device__ __forceinline__ long long rt_thread_idx(void) { return (long long)threadIdx.x; }
/* The launch refuses any other block size (lane.check_block): nothing left to do here. */
#define rt_require_block_dim(n) ((void)0)
static __device__ __forceinline__ long long rt_block_dim(void) { return (long long)blockDim.x; }
/* The thread's pollcheck counter, the hidden first parameter of every device
 * function in checked mode: one count across calls (after inlining, a register). */
typedef unsigned int &rt_pc_t;

static __device__ __forceinline__ long long rt_len(cap_t c, long long S)
{
    long long off = (long long)(c.p - c.lo);
    long long n = ((long long)c.rlen - off) / S;
    return (off < 0 || n < 0) ? 0 : n;
}
static __device__ __forceinline__ cap_t rt_offset(cap_t c, long long k, long long S)
{
    c.p = (char *)((unsigned long long)c.p + (unsigned long long)k * (unsigned long long)S);
#ifndef RT_RAW
    if (!RT_OFFSET_SANE(k)) { c.rlen = 0; c.wlen = 0; }
#endif
    return c;
}
static __device__ __forceinline__ long long rt_cap_to_int(cap_t c) { return (long long)c.p; }
static __device__ __forceinline__ cap_t rt_cap_from_int(long long x)
{ cap_t c; c.p = (char *)x; c.lo = c.p; c.rlen = 0; c.wlen = 0; c.tag = 0; return c; }

#ifndef RT_RAW
/* ============================ checked mode ============================ */
/* The fault paths are inlined, not calls: a call's argument set-up and ABI kept
 * the caller's values in registers around every check site (NVRTC 13, sm_90:
 * the former gpu_qr_steps_column, 218 registers checked vs 56 raw as calls, 64
 * inlined). */
static __device__ __forceinline__ void rt_exit_block(int why)
{
    __rt_bfault = why;          /* survivors leave after their next barrier */
    __threadfence_block();
    asm volatile("exit;");     /* PTX: exited threads never hold up a barrier */
}
static __device__ __forceinline__ void rt_record(int kind, int acc, int line, long long idx,
                                                  long long S, long long off, int slot)
{
    rt_gpu_fault *r = __rt_bseq;
    if (atomicCAS(&r->flag, 0, 1) == 0) {   /* first event of the whole sequence wins */
        r->kind = kind; r->access = acc; r->line = line;
        r->block = (long long)blockIdx.x; r->thread = (int)threadIdx.x;
        r->index = idx; r->elsize = S; r->offset = off;
        r->slot = slot; r->launch = __rt_blaunch;
        __threadfence();
    }
}
static __device__ __forceinline__ void rt_fault_cap(cap_t c, long long i, int S, int acc, int line)
{
    unsigned long long tag = c.tag;
    int slot = (int)(tag & 0xffffffffull);
    int kind;
    if (slot == 0) kind = RT_FAULT_NOBOUNDS;
    else if ((tag >> 32) & 1ull) kind = RT_FAULT_FREED;
    else if (acc == RT_ACC_STORE && RT_INB(c, i, (unsigned long long)S, c.rlen))
        kind = RT_FAULT_READONLY;
    else kind = RT_FAULT_OOB;
    rt_record(kind, acc, line, i, S, (long long)(c.p - c.lo), slot - 1);
    rt_exit_block(1);
}
static __device__ __forceinline__ void rt_fault_local(long long i, int id, int line)
{
    rt_record(RT_FAULT_LOCAL, 0, line, i, 0, 0, -(id + 1));
    rt_exit_block(1);
}
static __device__ __forceinline__ void rt_poll_slow(void)
{
    rt_gpu_fault *r = __rt_bseq;
    if (*(volatile int *)&r->cancel) {      /* deadline: record which launch was running */
        rt_record(RT_FAULT_TIMEOUT, 0, 0, 0, 0, 0, -1);
        rt_exit_block(2);
    }
    if (*(volatile int *)&r->flag) rt_exit_block(2);   /* another block faulted */
}
#define RT_POLL(pc) ((((pc) += 1u) & 1023u) == 0u ? rt_poll_slow() : (void)0)
#define RT_POLL_NOW() rt_poll_slow()      /* after a quiet (versioned, short) loop */
/* Kernel entry: a launch whose sequence already faulted or was cancelled exits
 * before touching memory (the record is sticky until the host resets it). */
#define RT_PROLOGUE(seq, launch) do {                                                \
        if (threadIdx.x == 0) {                                                      \
            __rt_bseq = (seq);                                                       \
            __rt_blaunch = (launch);                                                 \
            __rt_bfault = *(volatile int *)&(seq)->flag | *(volatile int *)&(seq)->cancel; \
        }                                                                            \
        __syncthreads();                                                             \
        if (__rt_bfault) return;                                                     \
    } while (0)

static __device__ __forceinline__ void rt_sync_threads(void)
{
    __syncthreads();
    if (__rt_bfault) asm volatile("exit;");   /* a thread of this block faulted */
}
/* Outlined cover guards (runtime/hoist.py GUARD_PINS): each bound stays where it is
 * computed, so the guard needs few registers at a time. */
static __device__ __forceinline__ long long rt_pin_i64(long long x)
{
#ifdef __CUDA_ARCH__
    asm volatile("" : "+l"(x));
#endif
    return x;
}
static __device__ __forceinline__ int rt_pin_i32(int x)
{
#ifdef __CUDA_ARCH__
    asm volatile("" : "+r"(x));
#endif
    return x;
}
/* Loop versioning's block vote (runtime/hoist.py GPU_BLOCK_VOTE): a loop that waits
 * at a barrier runs its unchecked copy only if every thread's cover guard holds, so
 * the whole block takes one copy; a barrier like rt_sync_threads. */
static __device__ __forceinline__ int rt_block_all(int ok)
{
    ok = __syncthreads_and(ok);
    if (__rt_bfault) asm volatile("exit;");
    return ok;
}
/* The grid barrier's words live in the sequence record (reset with it). */
#define RT_GROUP_WORDS() (&__rt_bseq->group)
#define RT_GROUP_GEN() (&__rt_bseq->group_gen)
#define RT_GROUP_POLL() rt_poll_slow()
static __device__ __forceinline__ long long rt_lidx(long long i, long long n, int id, int line)
{
    if ((unsigned long long)i >= (unsigned long long)n) {
        rt_fault_local(i, id, line);
        __builtin_unreachable();
    }
    return i;
}
#define RT_DEFINE_ACCESS(T, CT, S, LD, ST)                                            \
    static __device__ __forceinline__ float_or_##T rt_load_##T(cap_t c, long long i, int line) \
    {                                                                                \
        if (!RT_INB(c, i, S, c.rlen)) {                                              \
            rt_fault_cap(c, i, S, RT_ACC_LOAD, line);                               \
            __builtin_unreachable();                                                 \
        }                                                                            \
        return LD(((const CT *)c.p)[i]);                                             \
    }                                                                                \
    static __device__ __forceinline__ void rt_store_##T(cap_t c, long long i, float_or_##T v, \
                                                        int line)                    \
    {                                                                                \
        if (!RT_INB(c, i, S, c.wlen)) {                                              \
            rt_fault_cap(c, i, S, RT_ACC_STORE, line);                               \
            __builtin_unreachable();                                                 \
        }                                                                            \
        ((CT *)c.p)[i] = ST(v);                                                      \
    }
#else
/* ============================ raw mode (baseline) ============================ */
#define RT_POLL(pc) ((void)0)
#define RT_POLL_NOW() ((void)0)
static __device__ __forceinline__ void rt_sync_threads(void) { __syncthreads(); }
static __device__ __forceinline__ long long rt_lidx(long long i, long long n, int id, int line)
{ return i; }
/* Raw kernels have no sequence record: the grid barrier's words are module globals
 * (zero at load; the last block of each cooperative launch zeroes them again). */
__device__ unsigned long long __rt_group_words;
__device__ unsigned int __rt_group_gen;
#define RT_GROUP_WORDS() (&__rt_group_words)
#define RT_GROUP_GEN() (&__rt_group_gen)
#define RT_GROUP_POLL() ((void)0)
#define RT_DEFINE_ACCESS(T, CT, S, LD, ST)                                            \
    static __device__ __forceinline__ float_or_##T rt_load_##T(cap_t c, long long i, int line) \
    { return LD(((const CT *)c.p)[i]); }                                             \
    static __device__ __forceinline__ void rt_store_##T(cap_t c, long long i, float_or_##T v, \
                                                        int line)                    \
    { ((CT *)c.p)[i] = ST(v); }
#endif
/* rt_group_sync(): a barrier over every block of a cooperative launch (the lane
 * launches kernels that call it with cuLaunchCooperativeKernel after checking
 * that the whole grid fits on the device at once, so every block runs).
 * Thread 0 of each block arrives for its block; the round's last arrival
 * releases it by bumping the generation.  Why it cannot hang:
 *  - a block that returns leaves the group (rt_group_leave, run by the kernel
 *    wrapper after the body), and a round counts leavers as arrived;
 *  - a fault (or the host's cancel) sets the sequence record's flag, and the
 *    waiters poll it (RT_GROUP_POLL: exit, after recording a cancel);
 *  - the verifier admits the call only under block-uniform control flow, as
 *    rt_sync_threads, so every thread of a block reaches the block barriers.
 * The __threadfence before arriving and after leaving makes the block's writes
 * of this round visible to every block after the barrier (the pattern of
 * cooperative groups' grid sync). */
static __device__ __forceinline__ void rt_group_release(unsigned long long *w, unsigned int *gen,
                                                        unsigned int arrived)
{
    atomicAdd(w, 0ull - (unsigned long long)arrived);   /* next round starts at 0 */
    __threadfence();
    atomicAdd(gen, 1u);
}
static __device__ __forceinline__ unsigned int rt_group_size(void)
{ return gridDim.x * gridDim.y * gridDim.z; }
static __device__ __forceinline__ void rt_group_sync(void)
{
    rt_sync_threads();
    if (threadIdx.x == 0) {
        unsigned long long *w = RT_GROUP_WORDS();
        unsigned int *gen = RT_GROUP_GEN();
        unsigned int g = *(volatile unsigned int *)gen;   /* before arriving: see above */
        __threadfence();
        unsigned long long old = atomicAdd(w, 1ull);
        unsigned int arrived = (unsigned int)old + 1u, left = (unsigned int)(old >> 32);
        if (arrived + left == rt_group_size()) {
            rt_group_release(w, gen, arrived);
        } else {
            /* the record's flags every 64th spin: a poll per spin made a round of 128
             * blocks 2.08 us instead of 1.80 (H200, gpu-barrier-2026-12-03.txt) */
            for (unsigned int spins = 1u; *(volatile unsigned int *)gen == g; spins++) {
                if ((spins & 63u) == 0u)
                    RT_GROUP_POLL();
                __nanosleep(32);
            }
        }
        __threadfence();
    }
    rt_sync_threads();
}
static __device__ __forceinline__ void rt_group_leave(void)
{
    __syncthreads();   /* every thread of the block still running has returned */
    if (threadIdx.x == 0) {
        unsigned long long *w = RT_GROUP_WORDS();
        __threadfence();
        unsigned long long old = atomicAdd(w, 1ull << 32);
        unsigned int arrived = (unsigned int)old, left = (unsigned int)(old >> 32) + 1u;
        if (left == rt_group_size())
            atomicExch(w, 0ull);   /* the launch's last block: clean for the next launch */
        else if (arrived != 0u && arrived + left == rt_group_size())
            rt_group_release(w, RT_GROUP_GEN(), arrived);   /* the rest were waiting for us */
    }
}
/* Integer division and remainder: a zero divisor faults "division-by-zero" with
 * its line (as on the CPU); floating-point division is left alone. */
template <class T> struct rt_is_int { enum { value = 0 }; };
template <> struct rt_is_int<int> { enum { value = 1 }; };
template <> struct rt_is_int<unsigned int> { enum { value = 1 }; };
template <> struct rt_is_int<long> { enum { value = 1 }; };
template <> struct rt_is_int<unsigned long> { enum { value = 1 }; };
template <> struct rt_is_int<long long> { enum { value = 1 }; };
template <> struct rt_is_int<unsigned long long> { enum { value = 1 }; };
#ifndef RT_RAW
static __device__ __forceinline__ void rt_fault_div(int line)
{
    rt_record(RT_FAULT_DIVZERO, 0, line, 0, 0, 0, -1);
    rt_exit_block(1);
}
#define RT_DIV_CHECK(T, y, line)                                                      \
    if (rt_is_int<T>::value && (y) == 0) { rt_fault_div(line); __builtin_unreachable(); }
#else
#define RT_DIV_CHECK(T, y, line)
#endif
template <class A, class B>
static __device__ __forceinline__ auto rt_div(A x, B y, int line) -> decltype(x / y)
{
    RT_DIV_CHECK(decltype(x / y), y, line)
    return x / y;
}
template <class A, class B>
static __device__ __forceinline__ auto rt_mod(A x, B y, int line) -> decltype(x % y)
{
    RT_DIV_CHECK(decltype(x % y), y, line)
    return x % y;
}

typedef float float_or_f16;
typedef float float_or_f32;
typedef double float_or_f64;
typedef int float_or_i32;
typedef long long float_or_i64;
#define RT_ID(x) (x)
RT_DEFINE_ACCESS(f32, float, 4, RT_ID, RT_ID)
RT_DEFINE_ACCESS(f64, double, 8, RT_ID, RT_ID)
RT_DEFINE_ACCESS(i32, int, 4, RT_ID, RT_ID)
RT_DEFINE_ACCESS(i64, long long, 8, RT_ID, RT_ID)
RT_DEFINE_ACCESS(f16, unsigned short, 2, rt_h2f, rt_f2h)

/* Loop versioning (runtime/hoist.py): rt_range_ok, rt_lrange_ok and rt_loop_span
 * come from the shared ABI fragment; covered accesses use these unchecked forms. */
template <class T> struct rt_is_sint { enum { value = 0 }; };
template <> struct rt_is_sint<signed char> { enum { value = 1 }; };
template <> struct rt_is_sint<short> { enum { value = 1 }; };
template <> struct rt_is_sint<int> { enum { value = 1 }; };
template <> struct rt_is_sint<long> { enum { value = 1 }; };
template <> struct rt_is_sint<long long> { enum { value = 1 }; };
#define RT_IS_INT(e) ((int)rt_is_sint<decltype(e)>::value)
#define rt_uload_f32(c, i) (((const float *)(c).p)[i])
#define rt_uload_f64(c, i) (((const double *)(c).p)[i])
#define rt_uload_i32(c, i) (((const int *)(c).p)[i])
#define rt_uload_i64(c, i) (((const long long *)(c).p)[i])
#define rt_uload_f16(c, i) rt_h2f(((const unsigned short *)(c).p)[i])
#define rt_ustore_f32(c, i, v) (((float *)(c).p)[i] = (v))
#define rt_ustore_f64(c, i, v) (((double *)(c).p)[i] = (v))
#define rt_ustore_i32(c, i, v) (((int *)(c).p)[i] = (v))
#define rt_ustore_i64(c, i, v) (((long long *)(c).p)[i] = (v))
#define rt_ustore_f16(c, i, v) (((unsigned short *)(c).p)[i] = rt_f2h(v))

/* ---- cooperative tile copies (cap_tile_load_T / cap_tile_store_T) ----
 * One range check per tile (rt_tile_ok, the shared ABI fragment), by every
 * thread on its own arguments; a refused tile faults, before anything is
 * copied, at the element the equivalent loop would fault on.  Then a barrier
 * (earlier uses of the array are done), the copy spread over the block
 * (consecutive threads take consecutive columns; 16-byte vectors when both
 * addresses, both strides and cols allow), and a barrier (the tile is there
 * for every thread).  Both barriers are rt_sync_threads: survivors of a fault
 * elsewhere in the block leave there. */
#ifndef RT_RAW
static __device__ __forceinline__ void rt_tile_fault(cap_t c, long long off, long long ld, int S,
                                                  int store, long long n, int id,
                                                  long long aoff, long long ald,
                                                  long long rows, long long cols, int line)
{
    long long idx = 0;
    if (rt_tile_first_fault(c, off, ld, S, store, n, aoff, ald, rows, cols, &idx) == 2)
        rt_fault_local(idx, id, line);
    else
        rt_fault_cap(c, idx, S, store ? RT_ACC_STORE : RT_ACC_LOAD, line);
}
#define RT_TILE_CHECK(S, st)                                                          \
    if (!rt_tile_ok(c, off, ld, S, st, n, aoff, ald, rows, cols)) {                   \
        rt_tile_fault(c, off, ld, S, st, n, id, aoff, ald, rows, cols, line);         \
        __builtin_unreachable();                                                      \
    }
#else
#define RT_TILE_CHECK(S, st)
#endif
/* dst[r*dld + k] = src[r*sld + k] for the rows x cols tile, spread over the block. */
template <class T, class V>
static __device__ __forceinline__ void rt_tile_copy(const T *src, long long sld, T *dst,
                                                    long long dld, long long rows,
                                                    long long cols)
{
    const long long W = (long long)(sizeof(V) / sizeof(T));
    unsigned int pc = 0u;
    (void)pc;
    if (rows <= 0 || cols <= 0) return;
    if ((((unsigned long long)src | (unsigned long long)dst) % sizeof(V)) == 0
            && sld % W == 0 && dld % W == 0 && cols % W == 0) {
        unsigned long long cw = (unsigned long long)(cols / W), nt = blockDim.x;
        unsigned long long r = threadIdx.x / cw, k = threadIdx.x % cw;
        unsigned long long dr = nt / cw, dk = nt % cw;
        while (r < (unsigned long long)rows) {
            *(V *)(dst + (long long)r * dld + (long long)k * W) =
                *(const V *)(src + (long long)r * sld + (long long)k * W);
            RT_POLL(pc);
            k += dk; r += dr;
            if (k >= cw) { k -= cw; r += 1; }
        }
    } else {
        unsigned long long cw = (unsigned long long)cols, nt = blockDim.x;
        unsigned long long r = threadIdx.x / cw, k = threadIdx.x % cw;
        unsigned long long dr = nt / cw, dk = nt % cw;
        while (r < (unsigned long long)rows) {
            dst[(long long)r * dld + (long long)k] = src[(long long)r * sld + (long long)k];
            RT_POLL(pc);
            k += dk; r += dr;
            if (k >= cw) { k -= cw; r += 1; }
        }
    }
}
#define RT_DEFINE_TILE(T, CT, V)                                                      \
    static __device__ __forceinline__ void rt_tile_load_##T(                          \
        cap_t c, long long off, long long ld, long long rows, long long cols, void *arr, \
        long long n, int id, long long aoff, long long ald, int line)                 \
    {                                                                                 \
        RT_TILE_CHECK((int)sizeof(CT), 0)                                             \
        rt_sync_threads();                                                            \
        if (rows > 0 && cols > 0)                                                     \
            rt_tile_copy<CT, V>((const CT *)c.p + off, ld, (CT *)arr + aoff, ald,     \
                                rows, cols);                                          \
        rt_sync_threads();                                                            \
    }                                                                                 \
    static __device__ __forceinline__ void rt_tile_store_##T(                         \
        cap_t c, long long off, long long ld, long long rows, long long cols, void *arr, \
        long long n, int id, long long aoff, long long ald, int line)                 \
    {                                                                                 \
        RT_TILE_CHECK((int)sizeof(CT), 1)                                             \
        rt_sync_threads();                                                            \
        if (rows > 0 && cols > 0)                                                     \
            rt_tile_copy<CT, V>((const CT *)arr + aoff, ald, (CT *)c.p + off, ld,     \
                                rows, cols);                                          \
        rt_sync_threads();                                                            \
    }
RT_DEFINE_TILE(f32, float, float4)
RT_DEFINE_TILE(f64, double, double2)

/* ---- warp shuffles and reductions ----
 * Lanes are threadIdx.x & 31; the mask of a shuffle names the lanes of this
 * warp that exist (a block whose size is not a multiple of 32 has a partial
 * last warp), so no shuffle waits for a thread that is not there.  A partner
 * lane that does not exist gives back the caller's own value.  The verifier
 * admits these only under block-uniform control flow (docs/dialect.md). */
static __device__ __forceinline__ long long rt_lane_idx(void)
{ return (long long)(threadIdx.x & 31u); }
/* The second grid dimension (1 and 0 for a one-dimensional launch). */
static __device__ __forceinline__ long long rt_block_idx_y(void) { return (long long)blockIdx.y; }
static __device__ __forceinline__ long long rt_grid_dim_y(void) { return (long long)gridDim.y; }
static __device__ __forceinline__ unsigned int rt_warp_live(void)
{
    unsigned int n = blockDim.x - (threadIdx.x & ~31u);
    return n >= 32u ? 0xffffffffu : ((1u << n) - 1u);
}
/* Loop versioning's warp vote (runtime/hoist.py GPU_WARP_VOTE): the fast copy of a
 * loop with warp collectives runs only if every live lane's guard holds. */
static __device__ __forceinline__ int rt_warp_all(int ok)
{ return __all_sync(rt_warp_live(), ok); }
#define RT_DEFINE_SHUFFLE(T, CT)                                                      \
    static __device__ __forceinline__ CT rt_shfl_xor_##T(CT v, int m)                 \
    {                                                                                 \
        unsigned int live = rt_warp_live();                                           \
        CT o = __shfl_xor_sync(live, v, m);                                           \
        return ((live >> ((threadIdx.x & 31u) ^ (unsigned int)m)) & 1u) ? o : v;      \
    }
/* Broadcast: lane src's value (src taken mod 32; a lane past the block's end has
 * no value, so the caller keeps its own). */
#define RT_DEFINE_SHUFFLE_IDX(T, CT)                                                  \
    static __device__ __forceinline__ CT rt_shfl_idx_##T(CT v, long long src)         \
    {                                                                                 \
        unsigned int live = rt_warp_live(), s = (unsigned int)src & 31u;              \
        CT o = __shfl_sync(live, v, (int)s);                                          \
        return ((live >> s) & 1u) ? o : v;                                            \
    }
RT_DEFINE_SHUFFLE(f32, float)
RT_DEFINE_SHUFFLE(f64, double)
RT_DEFINE_SHUFFLE(i64, long long)
RT_DEFINE_SHUFFLE_IDX(f32, float)
RT_DEFINE_SHUFFLE_IDX(f64, double)
RT_DEFINE_SHUFFLE_IDX(i64, long long)
/* Sum over the warp's lanes, the same value in every lane.  Butterfly from
 * stride 16 down; a missing partner adds nothing.  Lane 0's partners at each
 * stride carry classes that either exist or are entirely missing, so lane 0's
 * sum is always complete; a partial warp takes it from lane 0. */
#define RT_DEFINE_WARP_SUM(T, CT)                                                     \
    static __device__ __forceinline__ CT rt_warp_sum_##T(CT v)                        \
    {                                                                                 \
        unsigned int live = rt_warp_live(), lane = threadIdx.x & 31u;                 \
        for (unsigned int m = 16u; m > 0u; m >>= 1) {                                 \
            CT o = __shfl_xor_sync(live, v, (int)m);                                  \
            if ((live >> (lane ^ m)) & 1u) v += o;                                    \
        }                                                                             \
        if (live != 0xffffffffu) v = __shfl_sync(live, v, 0);                         \
        return v;                                                                     \
    }
RT_DEFINE_WARP_SUM(f32, float)
RT_DEFINE_WARP_SUM(f64, double)
/* ---- warp MMA on shared float tiles (rt_warp_mma_tf32, rt_warp_mma_f32) ----
 * C[16x16] += A[16xk] B[kx16], row-major tiles (element (r, c) at off + r*ld + c
 * of its array), fp32 sums, in steps of 8 through PTX wmma m16n16k8 (fragments
 * are loaded and stored by the same instructions: their layout never matters
 * here), the accumulator in registers over k.  tf32 (k = 8): A and B rounded to
 * tf32 (cvt.rna).  f32: each operand split as x = hi + lo, both tf32, and
 * hi*hi + hi*lo + lo*hi accumulated (the dropped lo*lo is below fp32 rounding):
 * fp32-accurate products on tensor cores.  Checked, by every lane and the same
 * way in each: a full warp (32 live lanes), every lane passing lane 0's offsets,
 * strides and k, k a positive multiple of 8 (below 2^20), each offset a multiple
 * of 8 floats and each stride a multiple of 4 and at least its tile's width
 * (wmma's 32-byte alignment; the arrays are 32-byte aligned), else an
 * "argument" fault whose index is the argument's position (0: the warp is not
 * full); then every element of each tile inside its array, else a local-array
 * fault at the tile's first element outside it (rows, then columns), before
 * anything is computed.  Lane 0 records; the whole warp leaves.  The common
 * case costs seven match.all and a few compares (rt_mma_tile_fast); anything
 * else takes the exact path (rt_mma_slow), which names the fault. */
#ifndef RT_RAW
static __device__ __forceinline__ void rt_mma_fault(int kind, long long idx, int id, int line)
{
    if ((threadIdx.x & 31u) == 0u)
        rt_record(kind, 0, line, idx, 0, 0, kind == RT_FAULT_LOCAL ? -(id + 1) : -1);
    rt_exit_block(1);
}
static __device__ __forceinline__ long long rt_mma_first_out(long long off, long long ld,
                                                          long long rows, long long cols,
                                                          long long n)
{
    for (long long r = 0; r < rows; r++)
        for (long long c = 0; c < cols; c++) {
            long long i;
            if (!rt_tile_index(off, ld, r, c, &i) || i < 0 || i >= n) return i;
        }
    return off;
}
/* argument position of the first contract violation of one tile (0 if none) */
static __device__ __forceinline__ int rt_mma_contract(long long off, long long ld,
                                                      long long cols, int pos)
{
    if (off & 7) return pos;
    if ((ld & 3) || ld < cols) return pos + 1;
    return 0;
}
static __device__ __forceinline__ int rt_imin(int a, int b) { return a < b ? a : b; }
/* pos if this lane's v differs from lane 0's, else 100; every lane must call it
 * (a shuffle of the full warp), so the comparisons are never short-circuited */
static __device__ __forceinline__ int rt_mma_agree(long long v, int pos)
{
    return __shfl_sync(0xffffffffu, v, 0) != v ? pos : 100;
}
/* The common case in a few instructions: offset and stride in [0, 2^20) (so
 * nothing below overflows), the tile's last element inside the array (its
 * first is off >= 0, and ld >= cols makes off + (rows-1)*ld + cols - 1 the
 * largest), the alignment contract met. */
static __device__ __forceinline__ int rt_mma_tile_fast(long long off, long long ld,
                                                       long long rows, long long cols,
                                                       long long n)
{
    return (unsigned long long)off < (1ull << 20) && (unsigned long long)ld < (1ull << 20)
        && off + (rows - 1) * ld + cols <= n && !(off & 7) && !(ld & 3) && ld >= cols;
}
/* The exact checks, in the order that names the fault; returns if none fails. */
static __device__ __forceinline__ void rt_mma_slow(
    long long c_off, long long ldc, long long a_off, long long lda, long long b_off,
    long long ldb, long long k, int a_t, long long nc, int idc, long long na, int ida,
    long long nb, int idb, int line)
{
    int bad = rt_imin(rt_imin(rt_imin(rt_mma_agree(c_off, 2), rt_mma_agree(ldc, 3)),
                              rt_imin(rt_mma_agree(a_off, 5), rt_mma_agree(lda, 6))),
                      rt_imin(rt_imin(rt_mma_agree(b_off, 8), rt_mma_agree(ldb, 9)),
                              rt_mma_agree(k, 10)));
    bad = (int)__reduce_min_sync(0xffffffffu, (unsigned int)bad);
    if (bad != 100) rt_mma_fault(RT_FAULT_ARG, bad, 0, line);
    /* from here every lane holds lane 0's arguments: every lane decides alike */
    if (k <= 0 || (k & 7) || k >= (1ll << 20)) rt_mma_fault(RT_FAULT_ARG, 10, 0, line);
    if (!rt_lrange2_ok(c_off, ldc, 15, 1, 15, nc))
        rt_mma_fault(RT_FAULT_LOCAL, rt_mma_first_out(c_off, ldc, 16, 16, nc), idc, line);
    long long ar = a_t ? k : 16, ac = a_t ? 16 : k;   /* A's tile as stored */
    if (!rt_lrange2_ok(a_off, lda, ar - 1, 1, ac - 1, na))
        rt_mma_fault(RT_FAULT_LOCAL, rt_mma_first_out(a_off, lda, ar, ac, na), ida, line);
    if (!rt_lrange2_ok(b_off, ldb, k - 1, 1, 15, nb))
        rt_mma_fault(RT_FAULT_LOCAL, rt_mma_first_out(b_off, ldb, k, 16, nb), idb, line);
    bad = rt_mma_contract(c_off, ldc, 16, 2);
    if (!bad) bad = rt_mma_contract(a_off, lda, ac, 5);
    if (!bad) bad = rt_mma_contract(b_off, ldb, 16, 8);
    if (bad) rt_mma_fault(RT_FAULT_ARG, bad, 0, line);
}
#endif
/* The tensor-core part of rt_mma, on tiles its checks passed: pc, pa, pb point at
 * the tiles' first elements.  tests/emulate_cuda.py defines RT_EMU_TENSOR_CORES
 * and models this part on the CPU; the checks it runs are these. */
#ifndef RT_EMU_TENSOR_CORES
static __device__ __forceinline__ unsigned int rt_tf32(float x)
{
    unsigned int y;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(y) : "f"(x));
    return y;
}
template <int A_COL>
static __device__ __forceinline__ void rt_wmma_step(float *d, const unsigned int *a,
                                                    const unsigned int *b)
{
    if (A_COL)
        asm volatile("wmma.mma.sync.aligned.col.row.m16n16k8.f32.tf32.tf32.f32 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
                     "{%12, %13, %14, %15}, {%0, %1, %2, %3, %4, %5, %6, %7};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
                       "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "r"(b[2]), "r"(b[3]));
    else
    asm volatile("wmma.mma.sync.aligned.row.row.m16n16k8.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
                 "{%12, %13, %14, %15}, {%0, %1, %2, %3, %4, %5, %6, %7};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "r"(b[2]), "r"(b[3]));
}
template <int SPLIT, int A_T>
static __device__ __forceinline__ void rt_mma_tiles(float *pc, long long ldc, const float *pa,
                                                    long long lda, const float *pb,
                                                    long long ldb, long long k)
{
    float d[8];
    __syncwarp();
    asm volatile("wmma.load.c.sync.aligned.row.m16n16k8.f32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]),
                   "=f"(d[6]), "=f"(d[7]) : "l"(pc), "r"((int)ldc) : "memory");
    for (long long kk = 0; kk < k; kk += 8) {
        unsigned int a[4], b[4], ah[4], bh[4], al[4], bl[4];   /* fp32 bits as loaded */
        if (A_T)    /* A^T row-major = A column-major: step k moves down A^T's rows */
            asm volatile("wmma.load.a.sync.aligned.col.m16n16k8.tf32 {%0, %1, %2, %3}, [%4], %5;"
                         : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "l"(pa + kk * lda),
                           "r"((int)lda) : "memory");
        else
            asm volatile("wmma.load.a.sync.aligned.row.m16n16k8.tf32 {%0, %1, %2, %3}, [%4], %5;"
                         : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "l"(pa + kk),
                           "r"((int)lda) : "memory");
        asm volatile("wmma.load.b.sync.aligned.row.m16n16k8.tf32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "l"(pb + kk * ldb),
                       "r"((int)ldb) : "memory");
        for (int i = 0; i < 4; i++) {
            float x = __uint_as_float(a[i]), y = __uint_as_float(b[i]);
            ah[i] = rt_tf32(x);
            bh[i] = rt_tf32(y);
            al[i] = rt_tf32(x - __uint_as_float(ah[i]));
            bl[i] = rt_tf32(y - __uint_as_float(bh[i]));
        }
        if (SPLIT) {            /* small terms first */
            rt_wmma_step<A_T>(d, al, bh);
            rt_wmma_step<A_T>(d, ah, bl);
        }
        rt_wmma_step<A_T>(d, ah, bh);
    }
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k8.f32 "
                 "[%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
                 :: "l"(pc), "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]), "f"(d[4]), "f"(d[5]),
                    "f"(d[6]), "f"(d[7]), "r"((int)ldc) : "memory");
    __syncwarp();
}
#endif
/* a_t: A is given transposed (A^T, k x 16, row-major), i.e. A column-major */
template <int SPLIT, int A_T>
static __device__ __forceinline__ void rt_mma(
    float *C, long long c_off, long long ldc, const float *A, long long a_off, long long lda,
    const float *B, long long b_off, long long ldb, long long k, long long nc,
    int idc, long long na, int ida, long long nb, int idb, int line)
{
#ifndef RT_RAW
    /* rt_warp_live() is the same in every lane of a warp: a partial warp faults whole */
    if (rt_warp_live() != 0xffffffffu) rt_mma_fault(RT_FAULT_ARG, 0, 0, line);
    int s0, s1, s2, s3, s4, s5, s6;
    __match_all_sync(0xffffffffu, c_off, &s0);
    __match_all_sync(0xffffffffu, ldc, &s1);
    __match_all_sync(0xffffffffu, a_off, &s2);
    __match_all_sync(0xffffffffu, lda, &s3);
    __match_all_sync(0xffffffffu, b_off, &s4);
    __match_all_sync(0xffffffffu, ldb, &s5);
    __match_all_sync(0xffffffffu, k, &s6);
    /* warp-uniform: the lanes agree, so they test the same tiles */
    if (!(s0 && s1 && s2 && s3 && s4 && s5 && s6 && k > 0 && !(k & 7) && k < (1ll << 20)
          && rt_mma_tile_fast(c_off, ldc, 16, 16, nc)
          && rt_mma_tile_fast(a_off, lda, A_T ? k : 16, A_T ? 16 : k, na)
          && rt_mma_tile_fast(b_off, ldb, k, 16, nb)))
        rt_mma_slow(c_off, ldc, a_off, lda, b_off, ldb, k, A_T, nc, idc, na, ida, nb, idb,
                    line);
#else
    (void)nc; (void)idc; (void)na; (void)ida; (void)nb; (void)idb; (void)line;
#endif
    rt_mma_tiles<SPLIT, A_T>(C + c_off, ldc, A + a_off, lda, B + b_off, ldb, k);
}
/* ---- end of the device runtime; kernel source follows ---- */
"""


def device_prelude() -> str:
    """The device runtime: the shared ABI fragment, then the device helpers."""
    return ("#define RT_DEVICE_LANE 1\n" + abi.c_header() + abi.GPU_FAULT_DECL + "\n"
            + DEVICE_PRELUDE)


@dataclass
class CudaSource:
    """Result of instrumentation: CUDA C text plus launch metadata."""

    text: str
    kernels: dict[str, KernelSig]
    local_arrays: list[str] = field(default_factory=list)  # fault slot -(id+1) -> name
    checked: bool = True
    #: kernel -> bytes of dynamic shared memory its launches need (see dynamic_shared)
    dynamic_smem: dict[str, int] = field(default_factory=dict)


#: Hidden trailing parameters of every checked kernel: the sequence record and
#: the launch's index in the sequence (runtime/cuda/lane.py passes them).
SEQ_PARAM, LAUNCH_PARAM = "__rt_seq", "__rt_launch"
HIDDEN_PARAMS = f"rt_gpu_fault *{SEQ_PARAM}, int {LAUNCH_PARAM}"


def entry_symbol(kernel: str) -> str:
    """The ``extern "C" __global__`` symbol of ``kernel`` (cuModuleGetFunction's name):
    the user's name in its reserved spelling, like every other user name."""
    return mangle(kernel)


#: The hidden first parameter of every device function in checked mode: the thread's
#: pollcheck counter, by reference (rt_pc_t in the prelude).
PC_NAME = "__rt_pc"
PC_PARAM = f"rt_pc_t {PC_NAME}"


def _with_counter(decl: str) -> str:
    """``void h(cap_t x)`` -> ``void h(rt_pc_t __rt_pc, cap_t x)`` (``h(void)``: the
    counter only)."""
    head, _, rest = decl.partition("(")
    params, _, tail = rest.rpartition(")")
    params = params.strip()
    if params in ("", "void"):
        return f"{head}({PC_PARAM}){tail}"
    return f"{head}({PC_PARAM}, {params}){tail}"


def _with_hidden_params(decl: str) -> str:
    """``void k(cap_t x)`` -> ``void k(cap_t x, <hidden>)`` (``k()``/``k(void)``: hidden only)."""
    head, _, params = decl.rpartition(")")[0].partition("(")
    params = params.strip()
    if params in ("", "void"):
        return f"{head}({HIDDEN_PARAMS})"
    return f"{head}({params}, {HIDDEN_PARAMS})"


def _calls(node: c_ast.Node, names: dict | frozenset | set) -> list[c_ast.FuncCall]:
    """Every call under node of a function in ``names``."""
    out: list[c_ast.FuncCall] = []

    class V(c_ast.NodeVisitor):
        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            if isinstance(n.name, c_ast.ID) and n.name.name in names and n.args is not None:
                out.append(n)
            self.generic_visit(n)

    V().visit(node)
    return out


def _children_set(node: c_ast.Node, name: str, new: c_ast.Node) -> None:
    """Replace the child pycparser reports as ``name`` (``attr`` or ``attr[i]``)."""
    if "[" in name:
        attr, idx = name[:-1].split("[")
        getattr(node, attr)[int(idx)] = new
    else:
        setattr(node, name, new)


#: dialect typedef names -> builtin C types (no <stdint.h> under NVRTC; nvcc has its own)
_TYPE_MAP = {"int64_t": ["long", "long"], "uint64_t": ["unsigned", "long", "long"],
             "int32_t": ["int"], "uint32_t": ["unsigned", "int"]}


def _map_types(node: c_ast.Node) -> None:
    if isinstance(node, c_ast.IdentifierType) and len(node.names) == 1 \
            and node.names[0] in _TYPE_MAP:
        node.names = list(_TYPE_MAP[node.names[0]])
    for _, c in node.children():
        _map_types(c)


def _call(name: str, args: list[c_ast.Node], coord) -> c_ast.FuncCall:
    return c_ast.FuncCall(c_ast.ID(name, coord), c_ast.ExprList(args, coord), coord)


def _int(v: int) -> c_ast.Constant:
    return c_ast.Constant("int", str(v))


#: CUDA's limit on a kernel's static ``__shared__`` data.  A kernel whose smem_ arrays
#: need more (with PRELUDE_SMEM for the prelude's own __shared__ variables) gets them as
#: offsets into one dynamic buffer, which the lane sizes at launch (opt-in, up to the
#: device's MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 227 KB on H100/H200).
STATIC_SMEM_LIMIT = 48 * 1024
PRELUDE_SMEM = 256
DSMEM = "__rt_dsmem"  #: the dynamic buffer's name in the generated CUDA


def _elem_bytes(decl: c_ast.Decl) -> int:
    """Bytes of one element of a local array (the dialect's numeric types)."""
    t = decl.type
    while not isinstance(t, c_ast.TypeDecl):
        t = t.type
    names = getattr(t.type, "names", [])
    wide = {"double", "long", "int64_t", "uint64_t"}
    return 8 if any(n in wide for n in names) else 4


def _smem_decls(body: c_ast.Node, dims: dict[str, list[int]]) -> list[c_ast.Decl]:
    """The declarations of the smem_ arrays under ``body``, in source order."""
    out: list[c_ast.Decl] = []

    def walk(n: c_ast.Node) -> None:
        if isinstance(n, c_ast.Decl) and n.name in dims and n.name.startswith("smem_"):
            out.append(n)
        for _, c in n.children():
            walk(c)

    walk(body)
    return out


def dynamic_shared(fn: c_ast.FuncDef, dims: dict[str, list[int]]) -> int:
    """Bytes of dynamic shared memory ``fn`` (a kernel, its smem_ declarations already
    marked ``__shared__``) needs: 0 when its smem_ arrays fit CUDA's static limit, else
    each declaration becomes a pointer of the array's row type into one extern buffer,
    at a fixed offset (its own alignment), so ``smem_a[i][j]`` reads the same element
    and every subscript keeps its check against the declared sizes (``dims``)."""
    decls = _smem_decls(fn.body, dims)
    sizes = []
    for d in decls:
        count = 1
        for k in dims[d.name]:
            count *= k
        sizes.append(count * _elem_bytes(d))
    if sum(sizes) + PRELUDE_SMEM <= STATIC_SMEM_LIMIT:
        return 0
    off = 0
    for d, nbytes in zip(decls, sizes, strict=True):
        align = max([int(s[10:-1]) for s in d.storage if s.startswith("__align__(")] or [16])
        off = -(-off // align) * align
        d.storage = [s for s in d.storage if s != "__shared__" and not s.startswith("__align__")]
        d.type = c_ast.PtrDecl([], d.type.type)  # float a[R][C] -> float (*a)[C]
        cast_type = copy.deepcopy(d.type)
        t = cast_type
        while not isinstance(t, c_ast.TypeDecl):
            t = t.type
        t.declname = None
        d.init = c_ast.Cast(c_ast.Typename(None, [], None, cast_type),
                            c_ast.BinaryOp("+", c_ast.ID(DSMEM), _int(off)))
        off += nbytes
    # 128-byte aligned (as the driver places it): every offset above keeps its alignment
    buf = c_ast.Decl(DSMEM, [], [], ["extern", "__shared__", "__align__(128)"], [],
                     c_ast.ArrayDecl(c_ast.TypeDecl(DSMEM, [], None,
                                                    c_ast.IdentifierType(["unsigned", "char"])),
                                     None, []), None, None)
    fn.body.block_items = [buf] + list(fn.body.block_items or [])
    return off


class _Rewriter:
    """Rewrites one function's body in place (API calls, array subscripts, pollchecks)."""

    def __init__(self, owner: _Instrumenter, arrays: dict[str, list[int]]):
        self.o = owner
        self.arrays = arrays
        self.has_loop = False

    def visit(self, node: c_ast.Node) -> c_ast.Node:
        if isinstance(node, PollPoint):
            return _call("RT_POLL_NOW", [], node.coord)
        if isinstance(node, c_ast.ArrayRef):
            return self.subscript(node)
        if isinstance(node, c_ast.Assignment) and node.op in ("/=", "%="):
            # x /= y -> x = x / y (the verifier admits only side-effect-free targets)
            node.rvalue = c_ast.BinaryOp(node.op[0], copy.deepcopy(node.lvalue), node.rvalue,
                                         node.coord)
            node.op = "="
        for name, child in list(node.children()):
            _children_set(node, name, self.visit(child))
        if isinstance(node, c_ast.FuncCall):
            return self.call(node)
        if isinstance(node, c_ast.BinaryOp) and node.op in ("/", "%"):
            line = node.coord.line if node.coord else 0
            return _call("rt_div" if node.op == "/" else "rt_mod",
                         [node.left, node.right, _int(line)], node.coord)
        if isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)):
            self.has_loop = True
            if isinstance(node, QUIET_LOOPS):
                return node  # polls once after itself (hoist.py)
            poll = _call("RT_POLL", [c_ast.ID("__rt_pc")], node.coord)
            cond = node.cond if node.cond is not None else _int(1)
            node.cond = c_ast.ExprList([poll, cond], node.coord)
            return node
        return node

    def subscript(self, node: c_ast.ArrayRef) -> c_ast.Node:
        # Pre-order: handle the whole chain a[i][j] at its outermost ArrayRef.
        chain = []
        base: c_ast.Node = node
        while isinstance(base, c_ast.ArrayRef):
            chain.append(base)
            base = base.name
        for ref in chain:
            ref.subscript = self.visit(ref.subscript)
        if not (isinstance(base, c_ast.ID) and base.name in self.arrays):
            chain[-1].name = self.visit(base)
            return node
        dims = self.arrays[base.name]
        chain.reverse()  # outermost dimension first
        assert len(chain) == len(dims), "the verifier refuses partial subscripts"
        aid = self.o.array_id(base.name)
        for ref, n in zip(chain, dims, strict=True):
            if isinstance(ref, UncheckedRef):
                continue  # covered by a loop guard (hoist.py)
            line = ref.coord.line if ref.coord else 0
            ref.subscript = _call("rt_lidx", [ref.subscript, _int(n), _int(aid), _int(line)],
                                  ref.coord)
        return node

    def call(self, node: c_ast.FuncCall) -> c_ast.Node:
        assert isinstance(node.name, c_ast.ID), "the verifier refuses indirect calls"
        name = node.name.name
        args = list(node.args.exprs) if node.args is not None else []
        line = node.coord.line if node.coord else 0
        coord = node.coord
        for op in ("load", "store", "len", "offset"):
            pre = f"cap_{op}_"
            if name.startswith(pre) and name[len(pre):] in ELEM:
                T = name[len(pre):]
                S = ELEM[T]
                if op in ("load", "store"):
                    if isinstance(node, UncheckedCall):  # covered by a loop guard
                        return _call(f"rt_u{op}_{T}", args, coord)
                    return _call(f"rt_{op}_{T}", args + [_int(line)], coord)
                return _call(f"rt_{op}", args + [_int(S)], coord)
        if name == "cap_to_int":
            return _call("rt_cap_to_int", args, coord)
        if name == "cap_from_int":
            return _call("rt_cap_from_int", args, coord)
        if name in ("rt_block_idx", "rt_grid_dim", "rt_thread_idx", "rt_block_dim",
                    "rt_sync_threads", "rt_lane_idx", "rt_block_idx_y",
                    "rt_grid_dim_y", "rt_group_sync", "rt_require_block_dim") \
                or (name in WARP_FUNCS and name not in MMA_FUNCS):
            return node
        if name in TILE_FUNCS:
            return self.tile(name, args, line, coord)
        if name in MMA_FUNCS:
            return self.mma(name, args, line, coord)
        assert not name.startswith("cap_alloc_") and name not in (
            "cap_load_cap", "cap_store_cap"), "the verifier refuses these for target cuda"
        if name in self.o.kernel_names:
            node.name = c_ast.ID(f"__rtk_{name}", coord)
        if self.o.checked and name in self.o.funcs:
            # the thread's pollcheck counter travels with every call (PC_PARAM)
            node.args = c_ast.ExprList([c_ast.ID(PC_NAME, coord)] + args, coord)
        return node


    def tile(self, name: str, args: list[c_ast.Node], line: int, coord) -> c_ast.Node:
        """cap_tile_OP_T(c, off, ld, rows, cols, arr, aoff, ald) -> rt_tile_OP_T with the
        shared array's flat length and fault id."""
        tc = tile_call(name, args, self.arrays)
        return _call(f"rt_tile_{tc.op}_{tc.dtype}",
                     args[:6] + [_int(tc.flat_len), _int(self.o.array_id(tc.array))]
                     + args[6:8] + [_int(line)], coord)


    def mma(self, name: str, args: list[c_ast.Node], line: int, coord) -> c_ast.Node:
        """rt_warp_mma_*(C, c_off, ldc, A, a_off, lda, B, b_off, ldb[, k]) -> rt_mma with
        k (8 for tf32), whether to split, whether A is transposed, each array's flat
        length and fault id."""
        form = MMA_FUNCS[name]
        k = args[9] if form.fp32 else _int(8)
        args = args[:9]
        extra: list[c_ast.Node] = [k]
        for k in MMA_ARRAY_ARGS:
            arr = args[k]
            assert isinstance(arr, c_ast.ID), "the verifier admits array names only"
            flat = 1
            for n in self.arrays[arr.name]:
                flat *= n
            extra += [_int(flat), _int(self.o.array_id(arr.name))]
            # a 2-D or 3-D array is one flat tile space (its flat length is the bound)
            args[k] = c_ast.Cast(c_ast.Typename(None, [], None, c_ast.PtrDecl([], c_ast.TypeDecl(
                None, [], None, c_ast.IdentifierType(["float"])))), arr)
        # (the two forms are template arguments: each call compiles only its own path)
        return _call(f"rt_mma<{int(form.fp32)}, {int(form.a_t)}>", args + extra + [_int(line)],
                     coord)


class _Instrumenter:
    def __init__(self, verified: VerifiedSource, checked: bool, hoist: bool):
        assert verified.target == "cuda", "verify(parsed, target='cuda') first"
        self.verified = verified
        self.ast = copy.deepcopy(verified.parsed.ast)  # lowering edits its own copy
        self.checked = checked
        self.hoist = hoist and checked
        self.kernel_names = set(verified.parsed.kernels)
        self.waits = waiting_helpers(self.ast, GPU_BARRIERS)
        user = [e for e in self.ast.ext if is_user_node(e)]
        self.funcs = {e.decl.name for e in user if isinstance(e, c_ast.FuncDef)}
        # functions that tick the pollcheck counter at entry (none in raw mode)
        self.entry_polls = entry_polls(self.ast) if checked else frozenset()
        self.arrays: list[str] = []
        self.gen = Generator(line_directives=True)
        # printed with their reserved spelling (astutil.USER_PREFIX); analyses keep the
        # user's names, as do fault records (array names) and kernel signatures
        self.user_names = user_names(verified.parsed.ast)
        self.dynamic: dict[str, int] = {}
        #: each function's lowered AST, as printed (runtime/cuda/census.py reads them)
        self.lowered: dict[str, c_ast.FuncDef] = {}

    def array_id(self, name: str) -> int:
        self.arrays.append(name)
        return len(self.arrays) - 1

    def local_arrays(self, fn: c_ast.FuncDef) -> dict[str, list[int]]:
        """The verifier's local arrays of ``fn``; smem_ arrays get __shared__ storage."""
        dims = self.verified.local_arrays.get(fn.decl.name, {})

        # MMA tiles: wmma needs 32-byte aligned rows (offsets are checked to be
        # multiples of 8 floats from the array's start)
        mma = {a.name for call in _calls(fn, MMA_FUNCS) for k, a in
               enumerate(call.args.exprs) if k in MMA_ARRAY_ARGS and isinstance(a, c_ast.ID)}

        def walk(n: c_ast.Node) -> None:
            if isinstance(n, c_ast.Decl) and n.name in dims and n.name.startswith("smem_"):
                # 16-byte aligned: tile copies then move float4/double2 vectors
                align = 32 if n.name in mma else 16
                n.storage = list(n.storage) + ["__shared__", f"__align__({align})"]
            for _, c in n.children():
                walk(c)

        walk(fn.body)
        return {k: list(v) for k, v in dims.items()}

    def function(self, fn: c_ast.FuncDef) -> tuple[str, KernelSig | None]:
        name = fn.decl.name
        arrays = self.local_arrays(fn)
        guards = ""
        if self.hoist:
            dims = {k: tuple(v) for k, v in arrays.items()}
            sig = self.verified.kernels.get(name)
            prove_subscripts(fn, dims, builtin_ranges("cuda", sig.block_dim if sig else None))
            table = hoist_function(fn, dims, self.waits, barriers=GPU_BARRIERS,
                                   warp_vote=GPU_WARP_VOTE, block_vote=GPU_BLOCK_VOTE)
            guards = "".join(self.outlined_guard(g) for g in table.guards)
        rw = _Rewriter(self, arrays)
        rw.visit(fn.body)
        if name in self.kernel_names:
            self.dynamic[name] = dynamic_shared(fn, arrays)
        if name in self.entry_polls:
            # a caller of helpers ticks at entry (hoist.entry_polls: why that bounds
            # the work between two reads of the record)
            poll = _call("RT_POLL", [c_ast.ID(PC_NAME)], fn.body.coord)
            fn.body.block_items = [poll] + list(fn.body.block_items or [])
        _map_types(fn)
        rename_user_names(fn, self.user_names)
        self.lowered[name] = fn
        body = self.gen.visit(fn.body)
        if rw.has_loop and not self.checked:
            # Raw mode never reads the counter (RT_POLL is empty there).
            body = "{\n  unsigned int __rt_pc = 0u; (void)__rt_pc;" + body.lstrip()[1:]
        fn.decl.storage = [s for s in fn.decl.storage if s != "static"]
        own_decl = self.gen.visit(fn.decl)
        if self.checked:
            own_decl = _with_counter(own_decl)
        if name not in self.kernel_names:
            return f"{guards}static __device__ __forceinline__ {own_decl}\n{body}\n", None
        # Kernel: device body + __global__ wrapper that sets up the block's fault flag.
        sig = self.verified.kernels[name]
        decl_txt = self.gen.visit(fn.decl)
        inner = own_decl.replace(mangle(name) + "(", f"__rtk_{name}(", 1)
        out = f"{guards}static __device__ __forceinline__ {inner}\n{body}\n"
        argnames = ", ".join(mangle(n) for n, _ in sig.params)
        prologue = ""
        if self.checked:  # raw builds have neither the hidden parameters nor the entry check
            decl_txt = _with_hidden_params(decl_txt)
            prologue = (f"  RT_PROLOGUE({SEQ_PARAM}, {LAUNCH_PARAM});\n"
                        f"  unsigned int {PC_NAME} = 0u;\n")
            argnames = ", ".join([PC_NAME] + [mangle(n) for n, _ in sig.params])
        # a block that returns leaves the group, so the other blocks' barriers complete
        leave = "  rt_group_leave();\n" if sig.group_sync else ""
        out += (f'extern "C" __global__ {decl_txt}\n{{\n{prologue}'
                f"  __rtk_{name}({argnames});\n{leave}}}\n")
        return out, sig

    def outlined_guard(self, fn: c_ast.FuncDef) -> str:
        """A cover guard hoist.py made a function of its own (hoist._outline): not
        inlined, so its bounds do not share registers with the loop it guards."""
        _Rewriter(self, {}).visit(fn.body)
        _map_types(fn)
        rename_user_names(fn, self.user_names)
        fn.decl.storage = []
        decl, body = self.gen.visit(fn.decl), self.gen.visit(fn.body)
        return f"static __device__ __noinline__ {decl}\n{body}\n"

    def run(self) -> CudaSource:
        parts = [("" if self.checked else "#define RT_RAW 1\n") + device_prelude()]
        kernels: dict[str, KernelSig] = {}
        # Forward declarations first so helpers may appear in any order.
        for ext in self.ast.ext:
            if not is_user_node(ext):
                continue
            if isinstance(ext, c_ast.FuncDef):
                txt, info = self.function(ext)
                parts.append(f'#line {ext.coord.line if ext.coord else 1} "kernel"\n' + txt)
                if info:
                    kernels[info.name] = info
            elif isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.FuncDecl):
                ext.storage = [s for s in ext.storage if s != "static"]
                if ext.name in self.kernel_names:
                    continue
                _map_types(ext)
                rename_user_names(ext, self.user_names)
                proto = self.gen.visit(ext)
                if self.checked:
                    proto = _with_counter(proto)
                parts.append(f"static __device__ __forceinline__ {proto};\n")
            else:
                raise AssertionError("the verifier admits only functions at file scope")
        return CudaSource(squeeze_line_directives("\n".join(parts)), kernels, self.arrays,
                          self.checked, {k: v for k, v in self.dynamic.items() if v})


def instrument(verified: VerifiedSource, *, checked: bool = True,
               hoist: bool = True) -> CudaSource:
    """Lower a source verified for target "cuda" to CUDA C.

    ``checked=False`` emits the same code with raw pointer accesses (baseline);
    ``hoist=False`` keeps every access checked inside loops (no versioning).
    """
    return _Instrumenter(verified, checked, hoist).run()
