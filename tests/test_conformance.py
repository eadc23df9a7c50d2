"""One behaviour on both lanes.

Part 1 (no GPU needed): the ABI facts come from one source.  The bounds
predicate that the CUDA prelude really contains is compiled with the host C
compiler (CUDA keywords stubbed out) and evaluated, next to cap.h's, against
an exact big-integer oracle on negative, huge and edge indices.

Part 2: one table of cases run through ``runtime.compile``/``runtime.launch``
on every lane with identical expectations.  The CPU lane runs everywhere; the
cuda lane carries the ``gpu`` mark (``pytest -m gpu tests/test_conformance.py``)
and skips cleanly where ``runtime.cuda.available()`` is false.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import numpy as np
import pytest

import capabilities
import runtime
from capabilities import abi
from runtime import cuda
from runtime.cuda.instrument_cuda import device_prelude
from runtime.errors import CapabilityFault, KernelTimeout, VerifyError

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------
# Part 1: the bounds predicate, both lanes, against an exact oracle

_LIMIT = 1 << abi.IDX_LIMIT_LOG2
_IDX = sorted({0, 1, -1, -2, 2, 9, 10, 11, 99, 100, _LIMIT - 1, _LIMIT, -_LIMIT, -_LIMIT + 1,
               (1 << 62), -(1 << 62), (1 << 63) - 1, -(1 << 63), (1 << 62) // 4 + 1,
               -((1 << 64) // 16), (1 << 64) // 16 - 1})
_CASES = [(off, ln, s, i) for off, ln, s, i in itertools.product(
    (0, 4, 8, 40, -4, -8, -40), (0, 4, 16, 40, 400), (1, 2, 4, 8, 16), _IDX)]


def _oracle(off: int, ln: int, s: int, i: int) -> int:
    """In bounds, computed exactly: origin offset plus i*S is inside [0, len)."""
    byte = off + i * s
    return int(abs(i) < _LIMIT and 0 <= byte and byte + s <= ln)


_HARNESS = r"""
#include <stdio.h>
#include <stdint.h>
int main(void)
{
    long long off, i; unsigned long long len, S;
    static char base[1 << 12];
    while (scanf("%lld %llu %llu %lld", &off, &len, &S, &i) == 4) {
        cap_t c;
        c.lo = base + 2048;
        c.p = (char *)((uintptr_t)c.lo + (uintptr_t)off);
        c.rlen = len; c.wlen = len;
        putchar(RT_INB(c, i, S, c.rlen) ? '1' : '0');
    }
    return 0;
}
"""

# The device prelude up to its first helper function, compiled as C: CUDA
# keywords become nothing.  This is exactly the predicate text NVRTC compiles.
_DEVICE_STUBS = ("#define __device__\n#define __shared__\n#define __forceinline__ inline\n"
                 "#define __noinline__\n"
                 "static inline long long __mul64hi(long long a, long long b)\n"
                 "{ return (long long)(((__int128)a * b) >> 64); }\n")


def _device_predicate_source() -> str:
    """The device prelude's ABI part (predicate, cap_t, guard helpers), as C."""
    text = device_prelude()
    cut = text.index("#endif /* CAPQR_CAP_ABI_H */")
    return "#include <stdint.h>\n" + _DEVICE_STUBS + text[:cut] + "#endif\n"


def _run_predicate(tmp_path: Path, name: str, prelude: str, include: list[str]) -> str:
    src = tmp_path / f"{name}.c"
    exe = tmp_path / name
    src.write_text(prelude + _HARNESS)
    subprocess.run(["gcc", "-O2", "-std=gnu11", "-fwrapv", "-w", *include, "-o", str(exe),
                    str(src)], check=True)
    inp = "".join(f"{off} {ln} {s} {i}\n" for off, ln, s, i in _CASES)
    return subprocess.run([str(exe)], input=inp, capture_output=True, text=True,
                          check=True).stdout


def _mismatches(got: str) -> list[tuple[int, int, int, int]]:
    want = "".join(str(_oracle(*c)) for c in _CASES)
    assert len(got) == len(want)
    return [c for c, g, w in zip(_CASES, got, want, strict=True) if g != w]


def test_cpu_bounds_predicate_matches_exact_oracle(tmp_path: Path) -> None:
    got = _run_predicate(tmp_path, "cpu", '#include "cap.h"\n',
                         [f"-I{capabilities.INCLUDE_DIR}"])
    assert _mismatches(got) == []


def test_device_bounds_predicate_matches_exact_oracle(tmp_path: Path) -> None:
    """The GPU escape: x[-1] (and an origin moved back past lo) passed the device check."""
    got = _run_predicate(tmp_path, "dev", _device_predicate_source(), [])
    bad = _mismatches(got)
    assert bad == [], f"{len(bad)} wrong verdicts, e.g. (off, len, S, i) = {bad[:5]}"


_GUARD_HARNESS = r"""
#include <stdio.h>
int main(void)
{
    long long a, b, c, d, e;
    static char base[1 << 12];
    while (scanf("%lld %lld %lld %lld %lld", &a, &b, &c, &d, &e) == 5) {
        rt_i64 span = -7, end = -7;
        int s1 = rt_loop_span(a, b, c > 0 ? c : 1, (int)(e & 1), &span);
        rt_i64 span32 = -7;
        int s2 = rt_loop_span32(a, b, c > 0 ? c : 1, (int)(e & 1), &span32);
        int s3 = rt_affine_end(a, b, c, &end);
        cap_t cp;
        cp.lo = base + 2048; cp.p = cp.lo + (d & 63); cp.rlen = (rt_u64)(e & 1023);
        cp.wlen = cp.rlen / 2;
        int s4 = rt_range_ok(cp, a, b, c, 4, (int)(e & 1));
        int s5 = rt_lrange_ok(a, b, c, d & 1023);
        rt_i64 lo = -7, hi = -7;
        int s6 = rt_affine_box(a, b, c, d, e, &lo, &hi);
        int s7 = rt_range2_ok(cp, a & 255, b & 7, c & 63, d & 15, e & 63, 4, (int)(e & 1));
        int s8 = rt_lrange2_ok(a, b, c & 63, d, e & 63, 1000);
        printf("%d %lld %d %lld %d %lld %d %d %d %lld %lld %d %d\n", s1, s1 ? span : 0, s2,
               s2 ? span32 : 0, s3, s3 ? end : 0, s4, s5, s6, s6 ? lo : 0, s6 ? hi : 0, s7, s8);
    }
    return 0;
}
"""


def test_device_guard_helpers_match_the_host_ones(tmp_path: Path) -> None:
    """Loop-versioning guards, 1-D and 2-D (box) forms: the device's overflow arithmetic
    (no gcc builtins there) gives the host's answers on edge and random inputs."""
    import random

    rnd = random.Random(7)
    edge = [0, 1, -1, 2, 3, 7, 64, 2**31 - 1, -(2**31), 2**32, 2**62, -(2**62), 2**63 - 1,
            -(2**63), 3037000499, 3037000500, -3037000500]
    rows = [[rnd.choice(edge) if rnd.random() < 0.6 else rnd.randrange(-(2**63), 2**63)
             for _ in range(5)] for _ in range(4000)]
    rows += [[rnd.randrange(-50, 50) for _ in range(5)] for _ in range(2000)]
    inp = "".join(" ".join(map(str, r)) + "\n" for r in rows)

    def run(name: str, prelude: str, include: list[str]) -> str:
        src, exe = tmp_path / f"{name}.c", tmp_path / name
        src.write_text(prelude + _GUARD_HARNESS)
        subprocess.run(["gcc", "-O1", "-std=gnu11", "-fwrapv", "-w", *include, "-o", str(exe),
                        str(src)], check=True)
        return subprocess.run([str(exe)], input=inp, capture_output=True, text=True,
                              check=True).stdout

    host = run("host", '#include "cap.h"\n', [f"-I{capabilities.INCLUDE_DIR}"])
    dev = run("dev", _device_predicate_source(), [])
    assert host.count("\n") == len(rows)
    bad = [(r, h, d) for r, h, d in zip(rows, host.splitlines(), dev.splitlines(), strict=True)
           if h != d]
    assert bad == [], bad[:3]


def test_device_prelude_has_one_predicate_from_the_abi() -> None:
    text = device_prelude()
    assert abi.c_header() in text
    assert text.count("#define RT_INB") == 1
    for t in abi.SCALAR_SUFFIXES:
        assert f"RT_DEFINE_ACCESS({t}," in text


def test_generated_header_is_current() -> None:
    assert abi.HEADER_PATH.read_text() == abi.c_header(), \
        "run python -m capabilities.abi to regenerate cap_abi.h"


def test_python_constants_agree_with_the_abi() -> None:
    import sys

    from capabilities import handle

    launch_mod = sys.modules["runtime.launch"]

    assert {np.dtype(d.numpy): d.code for d in abi.DTYPES if d.numpy} == {
        k: v for k, v in handle.DTYPE_CODES.items()}
    assert handle.CAP_CODE == abi.CAP_DT_CODE
    assert handle.CAP_SLOT_BYTES == abi.ELEM_SIZE["cap"]
    assert launch_mod.FAULT_REASONS is abi.FAULT_REASON
    assert runtime.core.ffi.sizeof("cap_t") == abi.CAP_BYTES


def test_cuda_lowering_compiles_as_cpp(tmp_path: Path) -> None:
    """The generated CUDA text (both modes) is valid C++ for the host compiler, CUDA
    builtins stubbed: a CPU-side check of the GPU lowering for every table kernel."""
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    stubs = ("#define __device__\n#define __global__\n#define __shared__\n"
             "#define __forceinline__ inline\n#define __noinline__\n"
             "struct rt_dim3 { unsigned x, y, z; };\n"
             "static rt_dim3 blockIdx, gridDim, threadIdx, blockDim;\n"
             "static inline int atomicCAS(int *p, int a, int b)"
             " { int o = *p; if (o == a) *p = b; return o; }\n"
             "static inline void __threadfence(void) {}\n"
             "static inline void __threadfence_block(void) {}\n"
             "static inline void __syncthreads(void) {}\n"
             "static inline long long __mul64hi(long long a, long long b)"
             " { return (long long)(((__int128)a * b) >> 64); }\n"
             "#include <cmath>\nusing std::sqrt; using std::copysign; using std::fabs;\n")
    gpu_qr = [p.read_text() for p in sorted((REPO / "kernels/gpu").glob("*.c"))]
    assert gpu_qr, "the GPU QR kernel sources are missing"
    sources = [c.src for c in FAULT_CASES] + [HOIST_SRC] + gpu_qr
    for k, src in enumerate(sources):
        for checked in (True, False):
            text = cuda.translate(src, checked=checked).text
            path = tmp_path / f"k{k}{int(checked)}.cpp"
            path.write_text(stubs + text)
            r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-w", str(path)],
                               capture_output=True, text=True)
            assert r.returncode == 0, (src, r.stderr[:2000])


# ---------------------------------------------------------------------------
# Part 2: one table of cases, every lane


def _cuda_ok() -> tuple[bool, str]:
    try:
        return cuda.available()
    except Exception as e:  # noqa: BLE001 - no cffi/libcuda/device: all mean "not here"
        return False, str(e)


_CUDA_OK, _CUDA_WHY = _cuda_ok()
LANES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not _CUDA_OK, reason=f"no usable GPU: {_CUDA_WHY}")]),
]


class Lane:
    """Buffers, compile and launch through the public API of one target."""

    def __init__(self, target: str):
        self.target = target

    def buffer(self, data: np.ndarray, perms: str = "rw", name: str | None = None):
        if self.target == "cpu":
            return capabilities.wrap(np.array(data), perms=perms, name=name)
        return cuda.to_device(data, perms=perms, name=name)

    def alloc(self, n: int, dtype, perms: str = "rw", name: str | None = None):
        return capabilities.alloc(n, dtype, perms=perms, name=name, device=self.target)

    @staticmethod
    def read(cap) -> np.ndarray:
        return np.array(cap.numpy())

    def compile(self, src: str, name: str | None = None, **kw):
        return runtime.compile(src, name, target=self.target, **kw)

    def launch(self, k, caps, args=(), grid: int = 1, timeout: float | None = None) -> None:
        kw = {"block": 1} if self.target == "cuda" else {}
        runtime.launch(k, caps, args=args, grid=grid, timeout=timeout, **kw)


@pytest.fixture(params=LANES)
def lane(request) -> Lane:
    return Lane(request.param)


# -- hostile kernels: the verifier refuses them (no device needed on either target)

REJECT_CASES = [
    # (id, source, construct substring, targets that refuse it)
    ("pointer", "KERNEL void k(cap_t x) { int64_t *p; }", "pointer declarator",
     ("cpu", "cuda")),
    ("cap-arith", "KERNEL void k(cap_t x) { cap_t y = x + 1; }", "cap_t operand of '+'",
     ("cpu", "cuda")),
    ("goto", "KERNEL void k(cap_t x) { goto l; l: ; }", "goto", ("cpu", "cuda")),
    ("asm", "KERNEL void k(cap_t x) { asm(\"nop\"); }", "asm", ("cpu", "cuda")),
    ("global", "int64_t g;\nKERNEL void k(cap_t x) { }", "global variable", ("cpu", "cuda")),
    ("extern", "extern int64_t f(int64_t a);\nKERNEL void k(cap_t x) { }", "extern",
     ("cpu", "cuda")),
    ("cast-to-cap", "KERNEL void k(cap_t x, int64_t n) { cap_t y = (cap_t)n; }", "cast to cap_t",
     ("cpu", "cuda")),
    ("recursion", "int64_t f(int64_t a) { return f(a); }\nKERNEL void k(cap_t x) { f(1); }",
     "recursion", ("cpu", "cuda")),
    ("compound-div", "KERNEL void k(cap_t x) { float w[4]; int64_t i = 0; w[i++] /= 2.0f; }",
     "compound '/=' on a complex lvalue", ("cpu", "cuda")),
    ("partial-subscript", "KERNEL void k(cap_t x) { float w[2][2]; w[0] = 1.0f; }",
     "partial array subscript", ("cpu", "cuda")),
    ("vla", "KERNEL void k(cap_t x, int64_t n) { float w[n]; }", "non-constant array size",
     ("cpu", "cuda")),
    ("gpu-alloc", "KERNEL void k(cap_t x) { cap_t y = cap_alloc_f32(4); }",
     "call to 'cap_alloc_f32'", ("cuda",)),
    ("gpu-cap-table", "KERNEL void k(cap_t t) { cap_t y = cap_load_cap(t, 0); }",
     "call to 'cap_load_cap'", ("cuda",)),
    ("thread-idx-on-cpu", "KERNEL void k(cap_t x) { cap_store_f32(x, rt_thread_idx(), 1.0f); }",
     "call to 'rt_thread_idx'", ("cpu",)),
    ("kernel-param", "KERNEL void k(cap_t x, int n) { }", "KERNEL parameter type 'int'",
     ("cpu", "cuda")),
]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("case", REJECT_CASES, ids=[c[0] for c in REJECT_CASES])
def test_verifier_refuses_hostile_kernels(case, target) -> None:
    _, src, construct, refused_on = case
    if target not in refused_on:
        from runtime.parse import parse
        from runtime.verifier import verify

        verify(parse(src), target=target)  # accepted on this target
        return
    # cuda: the verifier runs before any driver call, so no GPU is needed
    with pytest.raises(VerifyError) as ei:
        if target == "cuda":
            cuda.translate(src)
        else:
            runtime.compile(src, target=target)
    assert construct in ei.value.construct, ei.value
    assert ei.value.reason


def test_unknown_kernel_name_is_a_verify_error() -> None:
    for target in ("cpu", "cuda"):
        with pytest.raises(VerifyError, match="nope"):
            runtime.compile("KERNEL void k(cap_t x) { }", "nope", target=target)


# -- faults: reason, index, access, line and buffer are the same on every lane


class FaultCase:
    def __init__(self, ident: str, src: str, reason: str, index: int | None, access: str | None,
                 line: int, buffer: str | None, perms: str = "rw", n: int = 8):
        self.ident, self.src, self.reason, self.index = ident, src, reason, index
        self.access, self.line, self.buffer, self.perms, self.n = access, line, buffer, perms, n


def _k(body: str) -> str:
    return "KERNEL void k(cap_t x, int64_t n)\n{\n" + body + "\n}\n"


FAULT_CASES = [
    FaultCase("index-minus-one", _k("    cap_store_f32(x, n - n - 1, 7.0f);"),
              "out-of-bounds", -1, "store", 3, "x"),
    FaultCase("origin-moved-back", _k("    cap_t y = cap_offset_f32(x, n);\n"
                                      "    cap_store_f32(y, -n - 1, 7.0f);"),
              "out-of-bounds", -9, "store", 4, "x"),
    FaultCase("one-past-end", _k("    cap_store_f32(x, 0, cap_load_f32(x, n));"),
              "out-of-bounds", 8, "load", 3, "x"),
    FaultCase("huge", _k("    cap_store_f32(x, n * 576460752303423488, 1.0f);"),
              "out-of-bounds", 8 * 576460752303423488, "store", 3, "x"),
    FaultCase("int64-min", _k("    cap_store_f32(x, -9223372036854775807 - n + 7, 1.0f);"),
              "out-of-bounds", -(2**63), "store", 3, "x"),
    FaultCase("offset-wraps-back", _k("    cap_t y = cap_offset_f32(x, 4611686018427387904);\n"
                                      "    cap_store_f32(y, -4611686018427387904, 1.0f);"),
              "out-of-bounds", -4611686018427387904, "store", 4, "x"),
    FaultCase("f64-view-of-f32", _k("    cap_store_f64(x, n / 2, 1.0);"),
              "out-of-bounds", 4, "store", 3, "x"),
    FaultCase("read-only", _k("    cap_store_f32(x, n - 1, 1.0f);"),
              "read-only", 7, "store", 3, "x", perms="r"),
    FaultCase("local-array", _k("    float w[4];\n    w[n - 4] = 1.0f;\n"
                                "    cap_store_f32(x, 0, w[0]);"),
              "local-array", 4, None, 4, "w"),
    FaultCase("division-by-zero", _k("    int64_t q = n / (n - 8);\n"
                                     "    cap_store_f32(x, 0, (float)q);"),
              "division-by-zero", None, None, 3, None),
    FaultCase("remainder-by-zero", _k("    int64_t q = n % (n - 8);\n"
                                      "    cap_store_f32(x, 0, (float)q);"),
              "division-by-zero", None, None, 3, None),
    FaultCase("no-bounds", _k("    cap_t y = cap_from_int(cap_to_int(x));\n"
                              "    cap_store_f32(y, 0, 1.0f);"),
              "no-bounds", 0, "store", 4, "<int-derived>"),
    FaultCase("hoisted-loop-exact-element", _k(
        "    for (int64_t i = 0; i <= n; i++)\n        cap_store_f32(x, i, 2.0f);"),
        "out-of-bounds", 8, "store", 4, "x"),
    FaultCase("hoisted-loop-negative", _k(
        "    for (int64_t i = n - 1; i >= -1; i--)\n        cap_store_f32(x, i, 2.0f);"),
        "out-of-bounds", -1, "store", 4, "x"),
]


@pytest.mark.parametrize("case", FAULT_CASES, ids=[c.ident for c in FAULT_CASES])
def test_fault_is_reported_identically(lane: Lane, case: FaultCase) -> None:
    k = lane.compile(case.src, "k")
    before = lane.buffer(np.full(64, 3.0, np.float32), name="before")
    x = lane.buffer(np.zeros(case.n, np.float32), perms=case.perms, name="x")
    after = lane.buffer(np.full(64, 5.0, np.float32), name="after")
    with pytest.raises(CapabilityFault) as ei:
        lane.launch(k, [x], args=(case.n,), timeout=30)
    e = ei.value
    got = (e.reason, e.access, e.line, e.buffer, e.kernel, e.block)
    assert got == (case.reason, case.access, case.line, case.buffer, "k", 0)
    if case.index is not None:
        assert e.index == case.index
    # the refused access did not happen, and the neighbours are intact
    assert np.all(lane.read(before) == 3.0) and np.all(lane.read(after) == 5.0)
    if case.ident.startswith("hoisted"):
        return  # the elements before the faulting one were written, as in the source
    assert np.all(lane.read(x) == 0.0)


# -- arguments, perms, grids, free, timeouts

ARGS_SRC = """
KERNEL void put(cap_t out, int64_t n, double d, float f)
{
    cap_store_f64(out, 0, (double)n);
    cap_store_f64(out, 1, d);
    cap_store_f64(out, 2, (double)f);
}
"""


@pytest.mark.parametrize("bad,exc", [
    ((2.5, 1.0, 1.0), TypeError), ((True, 1.0, 1.0), TypeError), (("3", 1.0, 1.0), TypeError),
    ((2**63, 1.0, 1.0), OverflowError), ((-(2**63) - 1, 1.0, 1.0), OverflowError),
    ((1, "x", 1.0), TypeError), ((1, 1.0, None), TypeError), ((1, 1.0), TypeError),
    ((1, 1.0, 1.0, 1), TypeError),
], ids=["float-for-int", "bool", "str", "too-big", "too-small", "str-double", "none-float",
        "too-few", "too-many"])
def test_scalar_args_checked_alike(lane: Lane, bad, exc) -> None:
    k = lane.compile(ARGS_SRC, "put")
    out = lane.alloc(3, np.float64, name="out")
    with pytest.raises(exc):
        lane.launch(k, [out], args=bad)
    assert np.all(lane.read(out) == 0.0), "nothing ran"


def test_scalar_args_exact(lane: Lane) -> None:
    k = lane.compile(ARGS_SRC, "put")
    out = lane.alloc(3, np.float64, name="out")
    lane.launch(k, [out], args=(np.int64(-(2**53) - 1), 0.1, 0.1))
    got = lane.read(out)
    assert got[0] == float(-(2**53) - 1) and got[1] == 0.1 and got[2] == float(np.float32(0.1))


@pytest.mark.parametrize("perms", ["w", "", "rwx", 3, None])
def test_only_r_and_rw_perms(lane: Lane, perms) -> None:
    with pytest.raises(ValueError, match="perms"):
        lane.alloc(4, np.float32, perms=perms)


def test_grid_zero_runs_nothing(lane: Lane) -> None:
    k = lane.compile(ARGS_SRC, "put")
    out = lane.alloc(3, np.float64, name="out")
    lane.launch(k, [out], args=(1, 2.0, 3.0), grid=0)
    assert np.all(lane.read(out) == 0.0)
    with pytest.raises(TypeError):
        lane.launch(k, [out], args=(1, 2.0, 3.0), grid=-1)


def test_freed_buffer_refused_and_double_free(lane: Lane) -> None:
    k = lane.compile(ARGS_SRC, "put")
    out = lane.alloc(3, np.float64, name="gone")
    out.free()
    assert out.freed
    with pytest.raises(CapabilityFault) as ei:
        lane.launch(k, [out], args=(1, 2.0, 3.0))
    assert (ei.value.reason, ei.value.buffer, ei.value.access) == ("freed", "gone", "launch")
    with pytest.raises(CapabilityFault) as ei:
        out.free()
    assert ei.value.reason == "freed"


def test_handles_satisfy_the_capability_protocol(lane: Lane) -> None:
    from capabilities.protocol import CapabilityProtocol

    cap = lane.alloc(4, np.float32, name="p")
    assert isinstance(cap, CapabilityProtocol)
    assert cap.device == lane.target and cap.perms == "rw" and cap.nbytes == 16


def test_device_capability_rules_hold_without_a_device() -> None:
    """DeviceCapability's host-side rules (perms, double free, protocol) need no GPU."""
    from capabilities.protocol import CapabilityProtocol
    from runtime.cuda import DeviceCapability

    for bad in ("w", 3, ""):
        with pytest.raises(ValueError):
            DeviceCapability(0, (4,), np.float32, bad, owned=False)
    cap = DeviceCapability(0, (4,), np.float32, "r", name="d", owned=False)
    assert isinstance(cap, CapabilityProtocol)
    cap.free()
    with pytest.raises(CapabilityFault) as ei:
        cap.free()
    assert ei.value.reason == "freed" and ei.value.buffer == "d"


def test_gpu_scalar_args_checked_without_a_device() -> None:
    """The GPU launcher's argument packing rejects what the CPU rejects (no GPU needed),
    and each parameter pointer handed to the driver reads back the packed value."""
    from types import SimpleNamespace

    from runtime.cuda import DeviceCapability
    from runtime.cuda import driver as drv
    from runtime.cuda.lane import _ParamBlock
    from runtime.parse import parse
    from runtime.verifier import verify

    sig = verify(parse(ARGS_SRC), target="cuda").kernels["put"]
    k = SimpleNamespace(info=sig, name="put", checked=True)
    block = _ParamBlock(k)
    out = DeviceCapability(0x1000, (3,), np.float64, "rw", owned=False)
    for bad, exc in (((2.5, 1.0, 1.0), TypeError), ((True, 1.0, 1.0), TypeError),
                     ((2**63, 1.0, 1.0), OverflowError), ((1, 1.0), TypeError)):
        with pytest.raises(exc):
            block.pack([out], bad)
    assert block.pack([out], (np.int64(7), 2.5, 1.5), record=0xABC0, index=41) == [out.name]
    f = drv.ffi()

    def at(i: int, ctype: str):
        return f.cast(ctype + " *", block.params[i])[0]

    assert [at(0, "unsigned long long"), at(1, "long long"), at(2, "double"), at(3, "float"),
            at(4, "unsigned long long"), at(5, "int")] == [0x1000, 7, 2.5, 1.5, 0xABC0, 41]
    assert f.sizeof(block.params) == 6 * f.sizeof("void *")  # 4 parameters + 2 hidden
    cap = f.cast("unsigned long long *", block.params[0])
    assert [cap[w] for w in range(5)] == [0x1000, 0x1000, 24, 24, 1]  # p lo rlen wlen tag


SPIN_SRC = """
KERNEL void spin(cap_t flag)
{
    int64_t k = 0;
    while (cap_load_i64(flag, 0) == 0) {
        k = k + 1;
    }
    cap_store_i64(flag, 1, k);
}
"""


def test_timeout(lane: Lane) -> None:
    k = lane.compile(SPIN_SRC, "spin")
    flag = lane.alloc(2, np.int64, name="flag")
    with pytest.raises(KernelTimeout):
        lane.launch(k, [flag], timeout=0.5)
    with pytest.raises(ValueError):
        lane.launch(k, [flag], timeout=0)


def test_options_honoured_or_refused(lane: Lane) -> None:
    src = _k("    for (int64_t i = 0; i < n; i++)\n        cap_store_f32(x, i, 1.0f);")
    for mode in ("checked", "raw"):
        for hoist in (True, False):
            k = lane.compile(src, "k", mode=mode, hoist=hoist)
            assert k.checked == (mode == "checked")
    text_on = cuda.translate(src, hoist=True).text
    text_off = cuda.translate(src, hoist=False).text
    body_off = text_off.split("end of the device runtime")[-1]
    assert "rt_range_ok" in text_on and "rt_range_ok(" not in body_off
    if lane.target == "cuda":
        with pytest.raises(ValueError, match="raw_poll"):
            lane.compile(src, "k", mode="raw_poll")
    with pytest.raises(ValueError, match="mode"):
        lane.compile(src, "k", mode="fast")


# -- loop versioning never changes what a kernel does (hoisted vs all-checked)

HOIST_SRC = """
KERNEL void fill(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i < hi; i++)
        cap_store_f32(x, a * i + b, (float)i);
}
KERNEL void fill_stride(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    int64_t s = (a & 3) + 1;
    for (int64_t i = lo; i < hi; i += s)
        cap_store_f32(x, a * i + b, cap_load_f32(x, i - lo) + 1.0f);
}
KERNEL void fill_div(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i <= hi; i += 2)
        cap_store_f32(x, a * i + b / 3 - b % 0x2, cap_load_f32(x, a * i + b / 3 - b % 2) + 1.0f);
}
"""


def test_loop_versioning_equivalence(lane: Lane) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    builds = {n: (lane.compile(HOIST_SRC, n), lane.compile(HOIST_SRC, n, hoist=False))
              for n in ("fill", "fill_div", "fill_stride")}

    def run(k, n, args):
        x = lane.buffer(np.arange(n, dtype=np.float32), name="x")
        fault = None
        try:
            lane.launch(k, [x], args=args, timeout=20)
        except CapabilityFault as e:
            fault = (e.reason, e.index, e.access, e.line)
        return fault, lane.read(x)

    big = st.integers(-(2**63), 2**63 - 1)
    small = st.integers(-40, 80)

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(sorted(builds)), n=st.integers(0, 40),
           lo=st.one_of(small, big), hi=small, a=st.sampled_from([-3, -1, 0, 1, 2, 2**62]),
           b=st.one_of(small, big))
    def check(name, n, lo, hi, a, b):
        if hi - lo > 4096:
            lo = hi - 4096
        f1, m1 = run(builds[name][0], n, (lo, hi, a, b))
        f2, m2 = run(builds[name][1], n, (lo, hi, a, b))
        assert f1 == f2
        assert np.array_equal(m1.view(np.uint32), m2.view(np.uint32))

    check()


def test_loops_with_a_barrier_are_not_versioned() -> None:
    """A versioned loop runs one of two copies per thread; when the guard depends on
    the thread, a warp would split over two different bar.sync instructions (PTX
    bar.sync is .aligned: undefined, in practice a hang).  Such loops keep one copy."""
    from runtime import cuda

    src = """
KERNEL void k(cap_t x, int64_t n)
{
    float smem_a[256];
    int64_t t = rt_thread_idx();
    for (int64_t j = 0; j < n; j++) {
        smem_a[t] = cap_load_f32(x, j + t);
        rt_sync_threads();
        for (int64_t i = 0; i < 8; i++)
            smem_a[t] += cap_load_f32(x, i * n + t);
    }
}
"""
    body = cuda.translate(src, checked=True).text.split("__rtk_k(", 1)[1]
    assert body.count("rt_sync_threads()") == 1, body
