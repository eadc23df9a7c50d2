"""The CUDA lowering of a kernel source, run on the CPU: a second implementation of
the GPU's execution model, for tests on machines without a GPU.

``build(source, checked)`` compiles what ``runtime.cuda.translate`` hands to
NVRTC - the device prelude and the instrumented kernels, unchanged except that
the PTX ``exit`` of a faulting thread becomes a C++ exit of that thread and each
``__shared__`` declaration gets one copy per block - with g++ against a small
header that plays the device: a thread per CUDA thread; ``__syncthreads`` a
``std::barrier`` over the block's threads and each warp's shuffles, votes and
matches a barrier over its live lanes (an exited thread drops out of both, as
PTX ``exit`` does); atomics are GCC atomics.  Blocks run one after another,
except for kernels that call the grid barrier (``rt_group_sync``), whose blocks
all run at once, as a cooperative launch does.  Tensor-core MMA runs the prelude's
own checks, then a model of the tensor cores' arithmetic (rt_mma_tiles below).
So this checks the GPU kernels' index arithmetic, shared-memory
layout, barrier placement and checks with the same generated code the device
runs, under a scheduler that interleaves threads in other orders than a GPU does.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capqr.capabilities import abi
from capqr.runtime.cuda.lower import entry_symbol

DEVICE = r"""
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using std::sqrt; using std::copysign; using std::fabs;
using std::isnan; using std::isinf; using std::isfinite;   /* CUDA has them unqualified */
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __align__(n) __attribute__((aligned(n)))
#define RT_EMU_MAX_BLOCKS 64   /* copies of each __shared__ array; concurrent blocks */
struct rt_dim3 { unsigned x, y, z; };
static thread_local rt_dim3 threadIdx, blockIdx;
static rt_dim3 gridDim, blockDim;
/* __rt_bfault, the block's "a thread faulted" flag: written at once, read as it
 * stood when the block's last barrier completed.  The prelude reads it only right
 * after a barrier, where a GPU warp reads it in one instruction for all its lanes;
 * threads here run apart, and one that faulted just after the barrier must not make
 * some lanes of another warp leave and not others.  So every thread released by
 * a barrier sees the same value: one of the orders a GPU can run them in. */
static volatile int rt_emu_bfault_live[RT_EMU_MAX_BLOCKS];
static int rt_emu_bfault_seen[RT_EMU_MAX_BLOCKS];
struct rt_emu_bfault_ref {
    unsigned b;
    operator int() const { return rt_emu_bfault_seen[b]; }
    rt_emu_bfault_ref &operator=(int v) { rt_emu_bfault_live[b] = v; return *this; }
};
struct rt_emu_latch {
    unsigned b;
    void operator()() noexcept { rt_emu_bfault_seen[b] = rt_emu_bfault_live[b]; }
};
struct rt_emu_warp { std::barrier<> *bar; unsigned long long slot[32]; };
struct rt_emu_block { std::barrier<rt_emu_latch> *bar; rt_emu_warp *warps; int vote_failed; };
static thread_local rt_emu_block *rt_emu_self;
struct rt_emu_exited {};
static inline rt_emu_warp &rt_emu_my_warp(void) { return rt_emu_self->warps[threadIdx.x / 32]; }
static inline void rt_emu_exit(void)
{
    rt_emu_my_warp().bar->arrive_and_drop();
    rt_emu_self->bar->arrive_and_drop();
    throw rt_emu_exited();
}
static inline void __syncthreads(void) { rt_emu_self->bar->arrive_and_wait(); }
/* A block vote: cleared, then every live thread's vote in, then read by all. */
static inline int __syncthreads_and(int p)
{
    if (threadIdx.x == 0) __atomic_store_n(&rt_emu_self->vote_failed, 0, 5);
    __syncthreads();
    if (!p) __atomic_store_n(&rt_emu_self->vote_failed, 1, 5);
    __syncthreads();
    int all = !__atomic_load_n(&rt_emu_self->vote_failed, 5);
    __syncthreads();
    return all;
}
static inline void __syncwarp(void) { rt_emu_my_warp().bar->arrive_and_wait(); }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __nanosleep(unsigned) { std::this_thread::yield(); }
/* The SM's cycle counter: nanoseconds here (the prelude's poll clock counts its own units). */
static inline long long clock64(void)
{ return (long long)std::chrono::steady_clock::now().time_since_epoch().count(); }
template <class T> static inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, 5); }
template <class T> static inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, 5); }
static inline int atomicCAS(int *p, int a, int b)
{ __atomic_compare_exchange_n(p, &a, b, false, 5, 5); return a; }
static inline long long __mul64hi(long long a, long long b)
{ return (long long)(((__int128)a * b) >> 64); }
/* A warp exchange: every live lane posts a word, all read, all leave. */
template <class T> static inline T rt_emu_read(const rt_emu_warp &w, unsigned lane)
{ T o; std::memcpy(&o, &w.slot[lane], sizeof(T)); return o; }
template <class T> static inline void rt_emu_post(rt_emu_warp &w, T v)
{
    std::memcpy(&w.slot[threadIdx.x & 31u], &v, sizeof(T));
    w.bar->arrive_and_wait();
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src)
{
    rt_emu_warp &w = rt_emu_my_warp();
    rt_emu_post(w, v);
    T o = rt_emu_read<T>(w, (unsigned)src & 31u);
    w.bar->arrive_and_wait();
    return o;
}
template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int x)
{ return __shfl_sync(m, v, (int)((threadIdx.x & 31u) ^ (unsigned)x)); }
static inline unsigned rt_emu_live(void)
{
    unsigned n = blockDim.x - (threadIdx.x & ~31u);
    return n >= 32u ? 0xffffffffu : ((1u << n) - 1u);
}
static inline int __all_sync(unsigned m, int p)
{
    rt_emu_warp &w = rt_emu_my_warp();
    rt_emu_post(w, (long long)(p != 0));
    int all = 1;
    for (unsigned l = 0; l < 32; l++)
        if ((m >> l) & 1u) all &= (int)rt_emu_read<long long>(w, l);
    w.bar->arrive_and_wait();
    return all;
}
static inline int __any_sync(unsigned m, int p)
{
    rt_emu_warp &w = rt_emu_my_warp();
    rt_emu_post(w, (long long)(p != 0));
    int any = 0;
    for (unsigned l = 0; l < 32; l++)
        if ((m >> l) & 1u) any |= (int)rt_emu_read<long long>(w, l);
    w.bar->arrive_and_wait();
    return any;
}
template <class T> static inline unsigned __match_all_sync(unsigned m, T v, int *pred)
{
    rt_emu_warp &w = rt_emu_my_warp();
    rt_emu_post(w, v);
    int same = 1;
    for (unsigned l = 0; l < 32; l++)
        if ((m >> l) & 1u) same &= rt_emu_read<T>(w, l) == v;
    w.bar->arrive_and_wait();
    *pred = same;
    return same ? m : 0u;
}
static inline unsigned __reduce_min_sync(unsigned m, unsigned v)
{
    rt_emu_warp &w = rt_emu_my_warp();
    rt_emu_post(w, v);
    unsigned lo = v;
    for (unsigned l = 0; l < 32; l++)
        if ((m >> l) & 1u && rt_emu_read<unsigned>(w, l) < lo) lo = rt_emu_read<unsigned>(w, l);
    w.bar->arrive_and_wait();
    return lo;
}
static inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
/* Tensor cores: the prelude's rt_mma checks its tiles as on the device, then calls
 * rt_mma_tiles, modelled here: one m16n16k8 step adds its eight products (exact:
 * tf32 x tf32 fits a float) to the fp32 accumulator with one rounding; tf32 is
 * cvt.rna (10 mantissa bits, to nearest, ties away).  The steps go in the
 * device's order (f32: lo x hi, hi x lo, then hi x hi).  Lane 0 computes the
 * tile, between two warp barriers, as the warp's collective result. */
#define RT_EMU_TENSOR_CORES 1
static inline float rt_emu_tf32(float x)
{
    unsigned u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    std::memcpy(&x, &u, 4);
    return x;
}
template <int SPLIT, int A_T>
static inline void rt_mma_tiles(float *pc, long long ldc, const float *pa, long long lda,
                                const float *pb, long long ldb, long long k)
{
    __syncwarp();
    if ((threadIdx.x & 31u) == 0u)
        for (long long r = 0; r < 16; r++)
            for (long long c = 0; c < 16; c++) {
                float d = pc[r * ldc + c];
                for (long long kk = 0; kk < k; kk += 8)
                    for (int part = SPLIT ? 0 : 2; part < 3; part++) {
                        double s = 0.0;
                        for (long long q = kk; q < kk + 8; q++) {
                            float x = A_T ? pa[q * lda + r] : pa[r * lda + q];
                            float y = pb[q * ldb + c];
                            float xh = rt_emu_tf32(x), yh = rt_emu_tf32(y);
                            float xa = part == 0 ? rt_emu_tf32(x - xh) : xh;
                            float yb = part == 1 ? rt_emu_tf32(y - yh) : yh;
                            s += (double)xa * (double)yb;
                        }
                        d = (float)((double)d + s);
                    }
                pc[r * ldc + c] = d;
            }
    __syncwarp();
}
"""

_EXIT = 'asm volatile("exit;")'


@dataclass
class Kernel:
    """One emulated kernel: its parameters (name, kind) and the library entry."""

    name: str
    params: list[tuple[str, str]]
    fn: Any
    local_arrays: list[str]  # the names behind a local-array fault's slot -(id + 1)
    lib: Any = None          # the compiled library (a test's own symbols: build's edit)

    def capability_fault(self, fault: dict[str, int]) -> Any:
        """The CapabilityFault the GPU lane raises for this fault record (its own
        decoder, runtime/faults.py: reason, buffer, index, line)."""
        from types import SimpleNamespace

        from capqr.runtime.faults import fault_from_record, slot_buffer

        rec = SimpleNamespace(**fault)
        caps = [name for name, kind in self.params if kind == "cap"]
        return fault_from_record(rec, self.name, slot_buffer(rec, caps, self.local_arrays))

    def launch(self, args: list[Any], grid: int, block: int,
               cancel_after: float | None = None) -> dict[str, int] | None:
        """Run ``grid`` blocks of ``block`` threads; args in the kernel's order (numpy
        arrays for caps, or (array, "r") for a read-only one, (array, "freed") for a
        freed one; numbers for scalars).
        Returns the fault record's fields (kind, access, line, block, thread, index,
        slot) or None.  ``cancel_after``: seconds after which the host raises the
        record's cancel flag while the kernel runs, as the GPU lane does at a
        launch's deadline (runtime/cuda/sequence.py, cancel)."""
        caps = [a for (_, k), a in zip(self.params, args, strict=True) if k == "cap"]
        ints = [int(a) for (_, k), a in zip(self.params, args, strict=True) if k == "int64"]
        dbls = [float(a) for (_, k), a in zip(self.params, args, strict=True)
                if k in ("double", "float")]
        # each cap as the GPU lane passes it: abi.CAP_WORDS, 64-bit words, the owner
        # word a tag (argument slot + 1); perms "freed": a buffer freed while the launch
        # was packed (runtime/cuda/memory.py DeviceCapability: no bounds, the tag's freed bit)
        nw = len(abi.CAP_WORDS)
        c = _ffi.new("uint64_t[]", max(1, len(caps)) * nw)
        keep = []
        for i, a in enumerate(caps):
            a, perms = a if isinstance(a, tuple) else (a, "rw")
            buf = _ffi.from_buffer(a, require_writable=True)
            keep.append(buf)
            ptr = int(_ffi.cast("uintptr_t", buf))
            words = {"p": ptr, "lo": ptr, "rlen": a.nbytes if "r" in perms else 0,
                     "wlen": a.nbytes if "w" in perms else 0, "owner": i + 1}
            if perms == "freed":
                words = {"p": 0, "lo": 0, "rlen": 0, "wlen": 0,
                         "owner": (i + 1) | abi.GPU_TAG_FREED}
            for w, word in enumerate(abi.CAP_WORDS):
                c[i * nw + w] = words[word]
        rec = _ffi.new("rt_gpu_fault *")
        timer = None
        if cancel_after is not None:  # the call releases the GIL: the timer runs meanwhile
            timer = threading.Timer(cancel_after, setattr, (rec, "cancel", 1))
            timer.start()
        try:
            self.fn(c, _ffi.new("long long[]", ints or [0]),
                    _ffi.new("double[]", dbls or [0.0]), rec, grid, block)
        finally:
            if timer is not None:
                timer.cancel()
        if not rec.flag:
            return None
        return {"kind": rec.kind, "access": rec.access, "line": rec.line, "block": rec.block,
                "thread": rec.thread, "index": rec.index, "slot": rec.slot}


_ffi: Any = None


def _launcher(name: str, params: list[tuple[str, str]], checked: bool, together: bool) -> str:
    """extern "C" emu_<symbol>(caps, ints, dbls, record, grid, block), ``symbol`` the
    kernel's entry symbol (runtime/cuda/lower.py entry_symbol): a thread per CUDA
    thread; blocks one after another, or all at once (``together``: the kernel calls
    the grid barrier).  A raw kernel has no fault record."""
    ic = ii = idd = 0
    args = []
    for _pname, kind in params:
        if kind == "cap":
            args.append(f"caps[{ic}]")
            ic += 1
        elif kind == "int64":
            args.append(f"ints[{ii}]")
            ii += 1
        else:
            args.append(f"({'float' if kind == 'float' else 'double'})dbls[{idd}]")
            idd += 1
    sym = entry_symbol(name)  # the kernel's extern "C" __global__ name
    call = f"{sym}({', '.join(args + (['rec', '0'] if checked else []))})"
    return f"""
extern "C" void emu_{sym}(const void *cap_words, const long long *ints, const double *dbls,
                          rt_gpu_fault *rec, int grid, int block)
{{
    const cap_t *caps = (const cap_t *)cap_words;
    gridDim = rt_dim3{{(unsigned)grid, 1u, 1u}};
    blockDim = rt_dim3{{(unsigned)block, 1u, 1u}};
    int wave = {"grid" if together else "1"};
    if (wave > RT_EMU_MAX_BLOCKS) std::abort();
    for (int b0 = 0; b0 < grid; b0 += wave) {{
        std::vector<std::barrier<> *> bars;
        std::vector<std::barrier<rt_emu_latch> *> block_bars;
        std::vector<rt_emu_block> blocks(wave);
        std::vector<std::vector<rt_emu_warp>> warps(wave);
        for (int i = 0; i < wave; i++) {{
            unsigned slot = (unsigned)((b0 + i) % RT_EMU_MAX_BLOCKS);
            rt_emu_bfault_seen[slot] = rt_emu_bfault_live[slot] = 0;
            blocks[i].bar = new std::barrier<rt_emu_latch>(block, rt_emu_latch{{slot}});
            block_bars.push_back(blocks[i].bar);
            for (int w = 0; w * 32 < block; w++) {{
                int lanes = block - w * 32 < 32 ? block - w * 32 : 32;
                warps[i].push_back(rt_emu_warp{{new std::barrier<>(lanes), {{}}}});
                bars.push_back(warps[i].back().bar);
            }}
            blocks[i].warps = warps[i].data();
        }}
        std::vector<std::thread> threads;
        for (int i = 0; i < wave; i++)
            for (int t = 0; t < block; t++)
                threads.emplace_back([&, i, t] {{
                    threadIdx = rt_dim3{{(unsigned)t, 0u, 0u}};
                    blockIdx = rt_dim3{{(unsigned)(b0 + i), 0u, 0u}};
                    rt_emu_self = &blocks[i];
                    try {{ {call}; }} catch (rt_emu_exited &) {{}}
                }});
        for (auto &th : threads) th.join();
        for (auto *br : bars) delete br;
        for (auto *br : block_bars) delete br;
    }}
}}
"""


_SHARED = re.compile(r"^(\s*)__shared__ (?:__align__\((\d+)\) )?([\w ]*?[\w*]) ?(\**)(\w+)"
                     r"((?:\[\d+\])*);(.*)$")


def _per_block_shared(text: str) -> str:
    """Each __shared__ declaration becomes RT_EMU_MAX_BLOCKS copies, one per block
    (by blockIdx.x): an array through a reference made at the declaration, a
    file-scope variable through a macro."""
    out = []
    for line in text.splitlines():
        m = _SHARED.match(line)
        if not m:
            out.append(line)
            continue
        ind, align, typ, stars, name, dims, rest = m.groups()
        if name == "__rt_bfault":  # read as of the last barrier (DEVICE above)
            out.append(f"#define {name} (rt_emu_bfault_ref{{blockIdx.x % RT_EMU_MAX_BLOCKS}})")
            continue
        store = f"rt_emu_sh_{name}"
        slot = f"{store}[blockIdx.x % RT_EMU_MAX_BLOCKS].v"
        out.append(f"{ind}static struct alignas({align or 16}) {{ {typ} {stars}v{dims}; }} "
                   f"{store}[RT_EMU_MAX_BLOCKS];{rest}")
        if ind:
            out.append(f"{ind}{typ} {stars}(&{name}){dims} = {slot};")
        else:
            out.append(f"#define {name} ({slot})")
    return "\n".join(out)


_DYNAMIC = re.compile(r"^(\s*)extern __shared__ __align__\((\d+)\) unsigned char (\w+)\[\];$")


def _per_block_dynamic(text: str, nbytes: int) -> str:
    """A kernel's dynamic shared buffer (its smem_ arrays past CUDA's 48 KB static
    limit, runtime/cuda/lower.py dynamic_shared) as ``nbytes`` bytes per
    block, the size the GPU lane passes at launch; the arrays point into it as there."""
    out = []
    for line in text.splitlines():
        m = _DYNAMIC.match(line)
        if m:
            ind, align, name = m.groups()
            line = f"{ind}__shared__ __align__({align}) unsigned char {name}[{max(1, nbytes)}];"
        out.append(line)
    return "\n".join(out)


def host_cpp(cuda_text: str, dynamic_bytes: int = 0) -> str:
    """The C++ g++ compiles for a CUDA translation: the device header, then the
    translation with PTX exit made a C++ one and __shared__ arrays per block (a
    dynamic buffer: ``dynamic_bytes``, the largest its kernels launch with)."""
    cuda_text = _per_block_dynamic(cuda_text, dynamic_bytes)
    return (DEVICE + _per_block_shared(cuda_text.replace(_EXIT, "rt_emu_exit()"))
            + f"\nstatic_assert(sizeof(cap_t) == {abi.CAP_BYTES}, "
            "\"caps are passed as abi.CAP_WORDS\");\n")


def build(source: str, checked: bool = True, workdir: Path | None = None, hoist: bool = True,
          edit: Callable[[str], str] | None = None) -> dict[str, Kernel]:
    """Compile ``source``'s CUDA lowering for the CPU; returns its kernels by name.
    ``hoist=False``: every access checked where it is made (the oracle of the
    versioning); ``edit``: a test's change to the generated CUDA (to count events
    through extern "C" functions of its own, read with ``Kernel.lib``)."""
    return build_many([source], checked, workdir, hoist, edit)[source]


def build_many(sources: Iterable[str], checked: bool = True, workdir: Path | None = None,
               hoist: bool = True, edit: Callable[[str], str] | None = None
               ) -> dict[str, dict[str, Kernel]]:
    """:func:`build` for each of ``sources`` alike, by source; g++ compiles them on a
    thread per core (the loading stays serial: one shared FFI)."""
    lowered = {src: _lower(src, checked, workdir, hoist, edit) for src in dict.fromkeys(sources)}
    todo = {out: text for _, text, out in lowered.values() if not out.exists()}
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        for _ in pool.map(_compile, todo.values(), todo.keys()):
            pass   # map re-raises a g++ failure here
    return {src: _load(cs, out) for src, (cs, _, out) in lowered.items()}


def _lower(source: str, checked: bool, workdir: Path | None, hoist: bool,
           edit: Callable[[str], str] | None) -> tuple[Any, str, Path]:
    """The translation of ``source``, the C++ g++ compiles for it, and its .so's path."""
    from capqr.runtime.cuda import translate

    cs = translate(source, checked=checked, hoist=hoist)
    cuda_text = cs.text if edit is None else edit(cs.text)
    text = host_cpp(cuda_text, max(cs.dynamic_smem.values(), default=0))
    text += "".join(_launcher(k, sig.params, checked, sig.group_sync)
                    for k, sig in cs.kernels.items())
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return cs, text, Path(workdir or tempfile.gettempdir()) / f"capqr_emu_{key}.so"


def _compile(text: str, out: Path) -> None:
    src = out.with_suffix(".cpp")
    src.write_text(text)
    tmp = out.with_suffix(".tmp.so")
    # no contraction into FMA: the checked and the raw build then round alike
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-shared",
                        "-fPIC", "-pthread", "-w", "-o", str(tmp), str(src)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"g++ failed on the emulated CUDA:\n{r.stderr[:3000]}")
    tmp.replace(out)


def _load(cs: Any, out: Path) -> dict[str, Kernel]:
    global _ffi
    import cffi

    if _ffi is None:
        _ffi = cffi.FFI()
        _ffi.cdef(abi.GPU_FAULT_DECL)
    lib = _ffi.dlopen(str(out))
    kernels = {}
    for k, sig in cs.kernels.items():
        sym = f"emu_{entry_symbol(k)}"
        _ffi.cdef(f"void {sym}(const void *, const long long *, const double *, "
                  "rt_gpu_fault *, int, int);", override=True)
        kernels[k] = Kernel(k, sig.params, getattr(lib, sym), list(cs.local_arrays), lib)
    return kernels
