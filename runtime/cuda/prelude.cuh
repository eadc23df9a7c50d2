/*
 * capqr device runtime: what the CUDA lowering (runtime/cuda/lower.py) puts in
 * front of every kernel it emits.  device_prelude() there inlines the
 * #include "..." lines below (cap_abi.h and checks.h from capabilities/), so
 * NVRTC, the nvcc fallback and tests/emulate_cuda.py all compile one text, and
 * the compile cache keys on all of it.  The checks themselves are
 * capabilities/checks.h, the CPU lane's too; this file holds what only the
 * device has: the fault record protocol, polls, barriers, tile copies spread
 * over a block, warp collectives and tensor-core MMA.
 */
#pragma nv_diag_suppress 177   /* unused helpers of the runtime are expected */
#pragma nv_diag_suppress 550   /* the poll clock is unused in raw mode */
#define RT_DEVICE_LANE 1
#include "cap_abi.h"   /* cap_t, fault/dtype codes, RT_INB, rt_gpu_fault (capabilities/abi.py) */

__shared__ volatile int __rt_bfault;         /* this block: a thread faulted / cancelled */
__shared__ rt_gpu_fault *__rt_bseq;          /* the sequence record (hidden kernel parameter) */
__shared__ int __rt_blaunch;                 /* this launch's index in its sequence */

static __device__ __forceinline__ float rt_half_to_float(unsigned short h)
{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static __device__ __forceinline__ unsigned short rt_float_to_half(float f)
{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

static __device__ __forceinline__ long long rt_block_idx(void) { return (long long)blockIdx.x; }
static __device__ __forceinline__ long long rt_grid_dim(void) { return (long long)gridDim.x; }
static __device__ __forceinline__ long long rt_thread_idx(void) { return (long long)threadIdx.x; }
/* The launch refuses any other block size (launches.check_block): nothing left to do here. */
#define rt_require_block_dim(n) ((void)0)
static __device__ __forceinline__ long long rt_block_dim(void) { return (long long)blockDim.x; }
/* The thread's poll clock, the hidden first parameter of every device function in
 * checked mode: the clock (low 32 bits) at the thread's last read of the sequence
 * record, one value across calls (after inlining, a register). */
typedef unsigned int &rt_pc_t;
static __device__ __forceinline__ unsigned int rt_poll_clock(void)
{ return (unsigned int)clock64(); }

/* ---- fault paths ----
 * The fault paths are inlined, not calls: a call's argument set-up and ABI kept
 * the caller's values in registers around every check site (NVRTC 13, sm_90:
 * the former gpu_qr_steps_column, 218 registers checked vs 56 raw as calls, 64
 * inlined).  Raw builds never reach them. */
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
/* A refused cap access (defined after checks.h: it classifies with rt_fault_kind). */
static __device__ __forceinline__ void rt_fault_cap(cap_t c, long long i, int S, int acc, int line);
static __device__ __forceinline__ void rt_fault_local(long long i, int id, int line)
{
    rt_record(RT_FAULT_LOCAL, 0, line, i, 0, 0, -(id + 1));
    rt_exit_block(1);
}
static __device__ __forceinline__ void rt_fault_div(int line)
{
    rt_record(RT_FAULT_DIVZERO, 0, line, 0, 0, 0, -1);
    rt_exit_block(1);
}

/* ---- the device's side of checks.h (capabilities/checks.h says what each is) */
#define RT_CTX
#define RT_CTX_ARG
typedef int rt_array_ref;   /* a local array, by its index in CudaSource.local_arrays */
#define RT_COLD_FN static __device__ __forceinline__
#define RT_FAULT_CAP(c, i, S, acc, line)                                              \
    do { rt_fault_cap(c, i, S, acc, line); __builtin_unreachable(); } while (0)
#define RT_FAULT_LOCAL(a, i, line)                                                    \
    do { rt_fault_local(i, a, line); __builtin_unreachable(); } while (0)
#define RT_FAULT_DIV(line) do { rt_fault_div(line); __builtin_unreachable(); } while (0)
#ifdef RT_RAW
#define RT_UNCHECKED 1
#endif
/* the checked form's wrapping arithmetic: with pointer arithmetic the raw
 * gpu_qr_panel took 72 registers instead of 48 (nvcc 13, sm_90) */
#define RT_RAW_OFFSET(p, k, S) ((char *)((rt_u64)(p) + (rt_u64)(k) * (rt_u64)(S)))
#include "checks.h"   /* accessors, rt_len/rt_offset, local-array, tile and division checks */

/* A refused cap access: the owner word is a tag (argument slot + 1, 0 for
 * cap_from_int, RT_TAG_FREED once freed), the cap's read bounds are its
 * object.  Device buffers are never cap tables (no device dtype is RT_DT_CAP
 * and the verifier refuses cap tables for target cuda: tests/test_gpu_faults.py). */
static __device__ __forceinline__ void rt_fault_cap(cap_t c, long long i, int S, int acc, int line)
{
    unsigned long long tag = c.tag;
    int slot = (int)(tag & RT_TAG_SLOT_MASK);
    long long off = (long long)(c.p - c.lo);
    int kind = rt_fault_kind(slot != 0, (tag & RT_TAG_FREED) != 0,
                             rt_wrong_type(0, S, (rt_u64)off), acc == RT_ACC_STORE,
                             RT_INB(c, i, (rt_u64)S, c.rlen), RT_INB(c, i, (rt_u64)S, c.wlen));
    rt_record(kind, acc, line, i, S, off, slot - 1);
    rt_exit_block(1);
}

#ifndef RT_RAW
/* ============================ checked mode ============================ */
static __device__ __forceinline__ void rt_poll_slow(void)
{
    rt_gpu_fault *r = __rt_bseq;
    if (*(volatile int *)&r->cancel) {      /* deadline: record which launch was running */
        rt_record(RT_FAULT_TIMEOUT, 0, 0, 0, 0, 0, -1);
        rt_exit_block(2);
    }
    if (*(volatile int *)&r->flag) rt_exit_block(2);   /* another block faulted */
}
/* A pollcheck reads the record once RT_POLL_CYCLES (~20 us) have passed since the
 * thread's last read: the time between two reads is bounded by the clock, not by how
 * many polls a loop makes or what its iterations cost (hoist/polls.py bounds the work
 * between two polls).  Unsigned difference: a clock that went back (a block resumed on
 * another SM) reads at once. */
#define RT_POLL_CYCLES 32768u
static __device__ __forceinline__ void rt_poll(unsigned int &pc)
{
    unsigned int now = rt_poll_clock();
    if (now - pc >= RT_POLL_CYCLES) {
        pc = now;
        rt_poll_slow();
    }
}
#define RT_POLL(pc) rt_poll(pc)
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
/* Outlined cover guards (runtime/compiler/hoist/versioning.py GUARD_PINS): each bound
 * stays where it is computed, so the guard needs few registers at a time. */
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
/* Loop versioning's block vote (runtime/compiler/hoist/loops.py GPU_BLOCK_VOTE): a
 * loop that waits at a barrier runs its unchecked copy only if every thread's cover
 * guard holds, so the whole block takes one copy; a barrier like rt_sync_threads. */
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
#else
/* ============================ raw mode (baseline) ============================ */
#define RT_POLL(pc) ((void)0)
#define RT_POLL_NOW() ((void)0)
static __device__ __forceinline__ void rt_sync_threads(void) { __syncthreads(); }
/* Raw kernels have no sequence record: the grid barrier's words are module globals
 * (zero at load; the last block of each cooperative launch zeroes them again). */
__device__ unsigned long long __rt_group_words;
__device__ unsigned int __rt_group_gen;
#define RT_GROUP_WORDS() (&__rt_group_words)
#define RT_GROUP_GEN() (&__rt_group_gen)
#define RT_GROUP_POLL() ((void)0)
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
/* ---- cooperative tile copies (cap_tile_load_T / cap_tile_store_T) ----
 * RT_TILE_CHECK (capabilities/checks.h) by every thread on its own arguments:
 * a refused tile faults, before anything is copied, at the element the
 * equivalent loop would fault on.  Then a barrier
 * (earlier uses of the array are done), the copy spread over the block
 * (consecutive threads take consecutive columns; 16-byte vectors when both
 * addresses, both strides and cols allow), and a barrier (the tile is there
 * for every thread).  Both barriers are rt_sync_threads: survivors of a fault
 * elsewhere in the block leave there.  The copy does not poll: RT_TILE_CHECK put the
 * tile inside a local array, so a thread moves at most that array's elements (shared
 * memory: under 64K floats), a bounded stretch like a quiet loop's
 * (runtime/compiler/hoist/polls.py).  A poll per element cost a clock read per
 * element and, its clock starting at 0, a read of the sequence record per copy. */
/* dst[r*dld + k] = src[r*sld + k] for the rows x cols tile, spread over the block. */
template <class T, class V>
static __device__ __forceinline__ void rt_tile_copy(const T *src, long long sld, T *dst,
                                                    long long dld, long long rows,
                                                    long long cols)
{
    const long long W = (long long)(sizeof(V) / sizeof(T));
    if (rows <= 0 || cols <= 0) return;
    if ((((unsigned long long)src | (unsigned long long)dst) % sizeof(V)) == 0
            && sld % W == 0 && dld % W == 0 && cols % W == 0) {
        unsigned long long cw = (unsigned long long)(cols / W), nt = blockDim.x;
        unsigned long long r = threadIdx.x / cw, k = threadIdx.x % cw;
        unsigned long long dr = nt / cw, dk = nt % cw;
        while (r < (unsigned long long)rows) {
            *(V *)(dst + (long long)r * dld + (long long)k * W) =
                *(const V *)(src + (long long)r * sld + (long long)k * W);
            k += dk; r += dr;
            if (k >= cw) { k -= cw; r += 1; }
        }
    } else {
        unsigned long long cw = (unsigned long long)cols, nt = blockDim.x;
        unsigned long long r = threadIdx.x / cw, k = threadIdx.x % cw;
        unsigned long long dr = nt / cw, dk = nt % cw;
        while (r < (unsigned long long)rows) {
            dst[(long long)r * dld + (long long)k] = src[(long long)r * sld + (long long)k];
            k += dk; r += dr;
            if (k >= cw) { k -= cw; r += 1; }
        }
    }
}
#define RT_DEFINE_TILE(T, CT, V)                                                      \
    static __device__ __forceinline__ void rt_tile_load_##T(                          \
        cap_t c, long long off, long long ld, long long rows, long long cols, void *arr, \
        long long n, int a, long long aoff, long long ald, int line)                  \
    {                                                                                 \
        RT_TILE_CHECK((int)sizeof(CT), 0);                                            \
        rt_sync_threads();                                                            \
        if (rows > 0 && cols > 0)                                                     \
            rt_tile_copy<CT, V>((const CT *)c.p + off, ld, (CT *)arr + aoff, ald,     \
                                rows, cols);                                          \
        rt_sync_threads();                                                            \
    }                                                                                 \
    static __device__ __forceinline__ void rt_tile_store_##T(                         \
        cap_t c, long long off, long long ld, long long rows, long long cols, void *arr, \
        long long n, int a, long long aoff, long long ald, int line)                  \
    {                                                                                 \
        RT_TILE_CHECK((int)sizeof(CT), 1);                                            \
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
/* Loop versioning's warp vote (runtime/compiler/hoist/ GPU_WARP_VOTE): the fast copy of a
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
