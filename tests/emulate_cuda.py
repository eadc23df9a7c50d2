"""The CUDA lowering of a kernel source, run on the CPU: a second implementation of
the GPU's execution model, for tests on machines without a GPU.

``build(source, checked)`` compiles what ``runtime.cuda.translate`` hands to
NVRTC - the device prelude and the instrumented kernels, unchanged except that
the PTX ``exit`` of a faulting thread becomes a C++ exit of that thread - with
g++ against a small header that plays the device: every block runs on its own
threads, one per CUDA thread, ``__syncthreads`` is a ``std::barrier`` over them
(an exited thread drops out of it, as PTX ``exit`` does), ``__shared__`` arrays
are function statics (blocks run one after another), atomics are GCC atomics.
Warp collectives, warp votes, tensor-core MMA and grid barriers are not
modelled: a kernel that reaches one aborts.  So this checks the GPU kernels'
index arithmetic, shared-memory layout, barrier placement and checks with the
same generated code the device runs, under a scheduler that interleaves threads
in other orders than a GPU does.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capabilities import abi

DEVICE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>
using std::sqrt; using std::copysign; using std::fabs;
#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
struct rt_dim3 { unsigned x, y, z; };
static thread_local rt_dim3 threadIdx;
static rt_dim3 blockIdx, gridDim, blockDim;
static std::barrier<> *rt_emu_barrier;
struct rt_emu_exited {};
static inline void rt_emu_exit(void) { rt_emu_barrier->arrive_and_drop(); throw rt_emu_exited(); }
static inline void __syncthreads(void) { rt_emu_barrier->arrive_and_wait(); }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __nanosleep(unsigned) {}
static inline void __syncwarp(void) { std::abort(); }
template <class T> static inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, 5); }
template <class T> static inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, 5); }
static inline int atomicCAS(int *p, int a, int b)
{ __atomic_compare_exchange_n(p, &a, b, false, 5, 5); return a; }
static inline long long __mul64hi(long long a, long long b)
{ return (long long)(((__int128)a * b) >> 64); }
template <class T> static inline T __shfl_xor_sync(unsigned, T, int) { std::abort(); }
template <class T> static inline T __shfl_sync(unsigned, T, int) { std::abort(); }
template <class T> static inline unsigned __match_all_sync(unsigned, T, int *) { std::abort(); }
static inline int __all_sync(unsigned, int) { std::abort(); }
static inline int __any_sync(unsigned, int) { std::abort(); }
static inline unsigned __reduce_min_sync(unsigned, unsigned) { std::abort(); }
static inline float __uint_as_float(unsigned x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
"""

_EXIT = 'asm volatile("exit;")'


@dataclass
class Kernel:
    """One emulated kernel: its parameters (name, kind) and the library entry."""

    name: str
    params: list[tuple[str, str]]
    fn: Any

    def launch(self, args: list[Any], grid: int, block: int) -> dict[str, int] | None:
        """Run ``grid`` blocks of ``block`` threads; args in the kernel's order (numpy
        arrays for caps, numbers for scalars).  Returns the fault record's fields
        (kind, line, block, thread, index) or None."""
        caps = [a for (_, k), a in zip(self.params, args, strict=True) if k == "cap"]
        ints = [int(a) for (_, k), a in zip(self.params, args, strict=True) if k == "int64"]
        dbls = [float(a) for (_, k), a in zip(self.params, args, strict=True)
                if k in ("double", "float")]
        c = _ffi.new("cap_t[]", max(1, len(caps)))
        for i, a in enumerate(caps):
            buf = _ffi.from_buffer(a, require_writable=True)
            ptr = _ffi.cast("char *", buf)
            c[i].p = c[i].lo = ptr
            c[i].rlen = c[i].wlen = a.nbytes
            c[i].tag = i + 1
        rec = _ffi.new("rt_gpu_fault *")
        self.fn(c, _ffi.new("long long[]", ints or [0]), _ffi.new("double[]", dbls or [0.0]),
                rec, grid, block)
        if not rec.flag:
            return None
        return {"kind": rec.kind, "line": rec.line, "block": rec.block, "thread": rec.thread,
                "index": rec.index, "slot": rec.slot}


_ffi: Any = None


def _launcher(name: str, params: list[tuple[str, str]], checked: bool) -> str:
    """extern "C" emu_<name>(caps, ints, dbls, record, grid, block): every block on
    its own threads, one after another (a raw kernel has no fault record)."""
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
    call = f"{name}({', '.join(args + (['rec', '0'] if checked else []))})"
    return f"""
extern "C" void emu_{name}(const cap_t *caps, const long long *ints, const double *dbls,
                           rt_gpu_fault *rec, int grid, int block)
{{
    gridDim = rt_dim3{{(unsigned)grid, 1u, 1u}};
    blockDim = rt_dim3{{(unsigned)block, 1u, 1u}};
    for (int b = 0; b < grid; b++) {{
        blockIdx = rt_dim3{{(unsigned)b, 0u, 0u}};
        std::barrier<> bar(block);
        rt_emu_barrier = &bar;
        std::vector<std::thread> threads;
        for (int t = 0; t < block; t++)
            threads.emplace_back([&, t] {{
                threadIdx = rt_dim3{{(unsigned)t, 0u, 0u}};
                try {{ {call}; }} catch (rt_emu_exited &) {{}}
            }});
        for (auto &th : threads) th.join();
    }}
}}
"""


def build(source: str, checked: bool = True, workdir: Path | None = None) -> dict[str, Kernel]:
    """Compile ``source``'s CUDA lowering for the CPU; returns its kernels by name."""
    global _ffi
    import cffi

    from runtime.cuda import translate

    cs = translate(source, checked=checked)
    text = DEVICE + cs.text.replace(_EXIT, "rt_emu_exit()")
    text += "".join(_launcher(k, sig.params, checked) for k, sig in cs.kernels.items())
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    out = Path(workdir or tempfile.gettempdir()) / f"capqr_emu_{key}.so"
    if not out.exists():
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
    if _ffi is None:
        _ffi = cffi.FFI()
        _ffi.cdef("typedef struct cap_t { char *p; char *lo; uint64_t rlen; uint64_t wlen; "
                  "uint64_t tag; } cap_t;\n" + abi.GPU_FAULT_DECL)
    lib = _ffi.dlopen(str(out))
    kernels = {}
    for k, sig in cs.kernels.items():
        _ffi.cdef(f"void emu_{k}(const cap_t *, const long long *, const double *, "
                  "rt_gpu_fault *, int, int);", override=True)
        kernels[k] = Kernel(k, sig.params, getattr(lib, f"emu_{k}"))
    return kernels


def zeros(n: int, dtype: Any = np.float32) -> np.ndarray:
    return np.zeros(max(1, n), dtype)
