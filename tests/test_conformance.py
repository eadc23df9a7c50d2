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
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.capabilities import abi
from capqr.runtime import cuda
from capqr.runtime.compiler.astutil import readable
from capqr.runtime.cuda.lower import device_prelude, inline_includes
from capqr.runtime.errors import CapabilityFault, KernelTimeout, VerifyError

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


def _on_both_lanes(tmp_path: Path, harness: str, inp: str) -> dict[str, list[str]]:
    """Output lines of a C harness fed ``inp``, built once over the host's cap.h and
    once over the device prelude (both lanes' copies of the ABI fragment)."""
    out = {}
    for name, prelude, include in (("host", '#include "cap.h"\n',
                                    [f"-I{capabilities.INCLUDE_DIR}"]),
                                   ("device", _device_predicate_source(), [])):
        src, exe = tmp_path / f"{name}.c", tmp_path / name
        src.write_text(prelude + harness)
        subprocess.run(["gcc", "-O1", "-std=gnu11", "-fwrapv", "-w", *include, "-o", str(exe),
                        str(src)], check=True)
        out[name] = subprocess.run([str(exe)], input=inp, capture_output=True, text=True,
                                   check=True).stdout.splitlines()
    return out


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

    got = _on_both_lanes(tmp_path, _GUARD_HARNESS, inp)
    host, dev = got["host"], got["device"]
    assert len(host) == len(rows)
    bad = [(r, h, d) for r, h, d in zip(rows, host, dev, strict=True) if h != d]
    assert bad == [], bad[:3]


_TILE_HARNESS = r"""
#include <stdio.h>
int main(void)
{
    long long off, ld, rows, cols, n, aoff, ald, cl, st;
    static char base[1 << 12];
    while (scanf("%lld %lld %lld %lld %lld %lld %lld %lld %lld", &off, &ld, &rows, &cols, &n,
                 &aoff, &ald, &cl, &st) == 9) {
        cap_t c;
        rt_i64 idx = -7;
        c.lo = base + 2048; c.p = c.lo + 8; c.rlen = (rt_u64)cl; c.wlen = (rt_u64)cl / 2;
        int ok = rt_tile_ok(c, off, ld, 4, (int)st, n, aoff, ald, rows, cols);
        int which = rt_tile_first_fault(c, off, ld, 4, (int)st, n, aoff, ald, rows, cols, &idx);
        printf("%d %d %lld\n", ok, which, which ? idx : 0);
    }
    return 0;
}
"""


def _tile_oracle(off, ld, rows, cols, n, aoff, ald, cl, st) -> str:
    """The equivalent element loop, exact integers: (tile ok, first fault side, index)."""
    clen = cl // 2 if st else cl
    for r in range(max(rows, 0)):
        for k in range(max(cols, 0)):
            ci, li = off + r * ld + k, aoff + r * ald + k
            cok = abs(ci) < _LIMIT and 0 <= 8 + 4 * ci and 8 + 4 * ci + 4 <= clen
            lok = 0 <= li < n
            first = [(lok, 2, li), (cok, 1, ci)] if st else [(cok, 1, ci), (lok, 2, li)]
            for good, side, idx in first:
                if not good:
                    sat = max(min(idx, 2**63 - 1), -(2**63))
                    return f"0 {side} {sat}"
    return "1 0 0"


_HULL_HARNESS = r"""
#include <stdio.h>
int main(void)
{
    long long lo, hi, d, span, dj, sj, cl, st;
    static char base[1 << 12];
    while (scanf("%lld %lld %lld %lld %lld %lld %lld %lld", &lo, &hi, &d, &span, &dj, &sj, &cl,
                 &st) == 8) {
        cap_t c;
        c.lo = base + 2048; c.p = c.lo + 8; c.rlen = (rt_u64)cl; c.wlen = (rt_u64)cl / 2;
        printf("%d %d %d %d\n", rt_range_hull_ok(c, lo, hi, d, span, 4, (int)st),
               rt_lrange_hull_ok(lo, hi, d, span, cl / 4),
               rt_range2_hull_ok(c, lo, hi, d, span, dj, sj, 4, (int)st),
               rt_lrange2_hull_ok(lo, hi, d, span, dj, sj, cl / 4));
    }
    return 0;
}
"""


def _hull_oracle(lo, hi, d, span, dj, sj, cl, st) -> str:
    """Every index e + d*s (+ dj*t) for e in [lo, hi], s in [0, span], t in [0, sj] in
    range, exact integers: what the hull checks must answer."""
    clen = cl // 2 if st else cl
    es = range(lo, hi + 1)

    def cap_ok(i: int) -> bool:
        return abs(i) < _LIMIT and 0 <= 8 + 4 * i and 8 + 4 * i + 4 <= clen

    one = [e + d * s for e in es for s in range(span + 1)]
    two = [i + dj * t for i in one for t in range(sj + 1)]
    return " ".join(str(int(all(map(f, xs)))) for f, xs in (
        (cap_ok, one), (lambda i: 0 <= i < cl // 4, one), (cap_ok, two),
        (lambda i: 0 <= i < cl // 4, two)))


def test_hull_checks_match_every_member_range(tmp_path: Path) -> None:
    """rt_*range*_hull_ok (one check for accesses that differ only in their first index)
    accept exactly when the range from every first index in [lo, hi] is in range, on
    both lanes' copies of the ABI fragment."""
    import random

    rnd = random.Random(13)
    rows = []
    for _ in range(3000):
        lo = rnd.randrange(-6, 40)
        rows.append([lo, lo + rnd.randrange(0, 8), rnd.randrange(-6, 7), rnd.randrange(0, 6),
                     rnd.randrange(-6, 7), rnd.randrange(0, 4), rnd.randrange(0, 200),
                     rnd.randrange(2)])
    inp = "".join(" ".join(map(str, r)) + "\n" for r in rows)
    want = [_hull_oracle(*r) for r in rows]

    for lane_name, got in _on_both_lanes(tmp_path, _HULL_HARNESS, inp).items():
        bad = [(r, g, w) for r, g, w in zip(rows, got, want, strict=True) if g != w]
        assert bad == [], (lane_name, bad[:3])


def test_tile_checks_match_the_element_loop(tmp_path: Path) -> None:
    """rt_tile_ok (the one check per tile) accepts exactly the tiles whose every element
    is in range, and rt_tile_first_fault names the element the equivalent loop would
    fault on first, on both lanes' copies of the ABI fragment."""
    import random

    rnd = random.Random(12)
    edge = [0, 1, -1, 2, 3, 5, 9, 10, 2**31, 2**62, -(2**62), 2**63 - 1, -(2**63)]
    rows = []
    for _ in range(3000):
        small = [rnd.randrange(-12, 40), rnd.randrange(-12, 12), rnd.randrange(-1, 6),
                 rnd.randrange(-1, 6), rnd.randrange(0, 40), rnd.randrange(-3, 30),
                 rnd.randrange(-8, 10), rnd.randrange(0, 200), rnd.randrange(2)]
        for j in (0, 1, 5, 6):
            if rnd.random() < 0.08:
                small[j] = rnd.choice(edge)
        rows.append(small)
    inp = "".join(" ".join(map(str, r)) + "\n" for r in rows)
    want = [_tile_oracle(*r) for r in rows]

    for lane_name, got in _on_both_lanes(tmp_path, _TILE_HARNESS, inp).items():
        bad = [(r, g, w) for r, g, w in zip(rows, got, want, strict=True) if g != w]
        assert bad == [], (lane_name, bad[:3])


def test_device_prelude_has_one_predicate_from_the_abi() -> None:
    text = device_prelude()
    assert inline_includes(abi.c_header()) in text
    assert text.count("#define RT_INB") == 1
    for t in abi.SCALAR_SUFFIXES:
        assert f"RT_DEFINE_ACCESS({t}," in text


#: The checks written once, in capabilities/checks.h, for both lanes.
SHARED_CHECKS = ("rt_len", "rt_offset", "rt_cap_from_int", "rt_local_idx", "rt_tile_fail",
                 "rt_idiv", "rt_udiv", "rt_fault_kind", "rt_wrong_type", "RT_DEFINE_ACCESS",
                 "RT_TILE_CHECK", "RT_DIV", "RT_IS_INT")


def test_checks_are_written_once_for_both_lanes() -> None:
    """cap.h (CPU) and the device prelude both take the checks from checks.h, and
    neither defines one of its own; the launcher classifies faults with its function."""
    checks = (capabilities.INCLUDE_DIR / "checks.h").read_text()
    assert checks in device_prelude()
    cap_h = (capabilities.INCLUDE_DIR / "cap.h").read_text()
    prelude = (REPO / "runtime/cuda/prelude.cuh").read_text()
    assert '#include "checks.h"' in cap_h and '#include "checks.h"' in prelude
    for name in SHARED_CHECKS:
        define = re.compile(rf"^(#define {name}\b|\S.*[\s*]{name}\()", re.M)
        assert define.search(checks), name
        for other in (cap_h, prelude):
            assert not define.search(other), name
    assert "rt_fault_kind(" in (REPO / "runtime/csrc/launch.c").read_text()


def test_generated_header_is_current() -> None:
    assert abi.HEADER_PATH.read_text() == abi.c_header(), \
        "run python -m capqr.capabilities.abi to regenerate cap_abi.h"


def test_layouts_are_written_once() -> None:
    """abi.STRUCTS is the one declaration of the shared layouts: the headers keep no
    copy of their own, and cffi knows every field (its complete declarations are
    checked against the compiled C when the core builds)."""
    ffi = runtime.core.ffi
    own = (REPO / "capabilities/cap.h").read_text() + (REPO / "gc/gc.h").read_text()
    for st in abi.STRUCTS:
        assert f"{st.kind} {st.tag} {{" not in own, st.tag
        for f in st.fields:
            ffi.offsetof(st.tag, f.name.split("[")[0])
    assert ffi.sizeof(ffi.typeof("rt_obj").fields[-1][1].type) == abi.NAME_MAX
    assert not (REPO / "gc/gc_cdef.h").exists()


def test_collector_api_is_declared_once() -> None:
    """The host calls exactly the prototypes of gc.h's host API part (core.py reads
    them from there), and nothing else in gc.h that the host would need is left out."""
    from capqr.runtime.core import host_api_cdef

    header = (REPO / "gc/gc.h").read_text()
    cdef = host_api_cdef(header)
    names = re.findall(r"\b(gc_\w+)\s*\(", cdef)
    assert len(names) == len(set(names)) > 30
    for name in names:
        assert hasattr(runtime.core.lib, name), name
    # outside the host part: only the mutator-thread entry points the workers call
    code = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    outside = set(re.findall(r"\b(gc_\w+)\s*\(", code)) - set(names)
    assert outside == {"gc_thread_register", "gc_thread_unregister", "gc_enter", "gc_exit",
                       "gc_handshake_poll", "gc_store_barrier"}


def test_worker_pool_api_is_declared_once() -> None:
    """core.py declares to cffi exactly the prototypes of runtime/csrc/core.h's host API
    part: every rt_* function the Python side calls is there and nowhere else."""
    from capqr.runtime.core import CDEF, host_api_cdef

    header = (REPO / "runtime/csrc/core.h").read_text()
    names = re.findall(r"\b(rt_\w+)\s*\(", host_api_cdef(header, "rt_", "core.h"))
    assert len(names) == len(set(names)) >= 10
    for name in names:
        assert hasattr(runtime.core.lib, name), name
    assert not re.search(r"\brt_\w+\s*\(", CDEF), "a prototype written in core.py again"
    used = set(re.findall(r"\blib\.(rt_\w+)", "".join(
        p.read_text() for p in REPO.rglob("*.py") if ".git" not in p.parts)))
    assert used and used <= set(names), used - set(names)


def test_python_constants_agree_with_the_abi() -> None:
    from types import SimpleNamespace

    from capqr.capabilities import handle
    from capqr.runtime import faults

    assert {np.dtype(d.numpy): d.code for d in abi.DTYPES if d.numpy} == {
        k: v for k, v in handle.DTYPE_CODES.items()}
    assert handle.CAP_CODE == abi.CAP_DT_CODE
    assert handle.CAP_SLOT_BYTES == abi.ELEM_SIZE["cap"]
    assert all(faults.reason(SimpleNamespace(kind=f.code)) == f.reason for f in abi.FAULTS)
    assert runtime.core.ffi.sizeof("cap_t") == abi.CAP_BYTES


def test_cuda_lowering_compiles_as_cpp(tmp_path: Path) -> None:
    """The generated CUDA text (both modes) is valid C++ for the host compiler, against
    the device header of the emulated GPU lane (tests/emulate_cuda.py): a CPU-side
    check of the GPU lowering for every table kernel."""
    import shutil

    from emulate_cuda import DEVICE, host_cpp

    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    from capqr.kernels import gpu as g

    # the GPU QR kernels as compiled: composed with their shared files (kernels/sources.py)
    gpu_qr = sorted({g._kernel_spec(kind)[0] for kind in ("panel", "panel_small", "steps",
                                                          "update_z", "update_mma_z",
                                                          "whole232", "preg256")})
    assert len(gpu_qr) == 7, "the GPU QR kernel sources are missing"
    sources = ([c.src for c in FAULT_CASES] + [HOIST_SRC, TILE_SRC, TILE_STORE_SRC, WARP_SRC,
                                                GRID_Y_SRC, MMA_LOWER_SRC] + gpu_qr)
    jobs = []
    for k, src in enumerate(sources):
        for checked in (True, False):
            path = tmp_path / f"k{k}{int(checked)}.cpp"
            path.write_text(host_cpp(cuda.translate(src, checked=checked).text))
            jobs.append((src, path))

    # Each file starts with the device header's C++ standard headers (<barrier>, <thread>,
    # ...), most of a check's time: they go into a precompiled header, built once with the
    # same flags and force-included first (each file's own #includes of them are then
    # no-ops).  g++ checks every file's whole text as before; were the .gch unusable, it
    # would read the plain header instead (slower, same verdict).
    std = "-std=c++20"
    pch = tmp_path / "device_std.h"
    pch.write_text("".join(f"{line}\n" for line in DEVICE.splitlines()
                           if line.startswith("#include <")))
    r = subprocess.run(["g++", std, "-w", "-x", "c++-header", str(pch), "-o", f"{pch}.gch"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:2000]

    def syntax(job: tuple[str, Path]) -> tuple[str, subprocess.CompletedProcess]:
        return job[0], subprocess.run(["g++", std, "-fsyntax-only", "-w", "-include", str(pch),
                                       str(job[1])], capture_output=True, text=True)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # one g++ per core
        for src, r in pool.map(syntax, jobs):
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
        from capqr.runtime.compiler.parse import parse
        from capqr.runtime.compiler.verifier import verify

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


# -- tiles and warp collectives: misuse is refused with the construct and a reason

_TILE_CALL = "cap_tile_load_f32(x, 0, 8, 8, 8, {arr}, 0, 8);"
#: a warp MMA with the accumulator argument, its declaration and a condition filled in
_MMA_SRC = ("KERNEL void k(cap_t x) {{ float smem_a[128]; float smem_b[128]; {decl}\n"
            "{cond}rt_warp_mma_tf32({c}, 0, 16, smem_a, 0, 8, smem_b, 0, 16); }}")
BUILTIN_REJECTS = [
    # (id, source, targets that refuse it, construct substring, reason substring)
    ("tile-dst-not-array", "KERNEL void k(cap_t x, int64_t n) { "
     + _TILE_CALL.format(arr="n") + " }", ("cpu", "cuda"), "argument 6 of 'cap_tile_load_f32'",
     "name of a local array"),
    ("tile-dst-element", "KERNEL void k(cap_t x) { float smem_a[64]; "
     + _TILE_CALL.format(arr="smem_a[0]") + " }", ("cpu", "cuda"),
     "argument 6 of 'cap_tile_load_f32'", "name of a local array"),
    ("tile-dst-type", "KERNEL void k(cap_t x) { double smem_a[64]; "
     + _TILE_CALL.format(arr="smem_a") + " }", ("cpu", "cuda"),
     "argument 6 of 'cap_tile_load_f32'", "holds double"),
    ("tile-dst-const", "KERNEL void k(cap_t x) { const float smem_a[2] = {1.0f, 2.0f}; "
     + _TILE_CALL.format(arr="smem_a") + " }", ("cpu",), "argument 6 of 'cap_tile_load_f32'",
     "const"),
    ("tile-cap-expression", "KERNEL void k(cap_t x) { float smem_a[64]; "
     "cap_tile_load_f32(cap_offset_f32(x, 1), 0, 8, 8, 8, smem_a, 0, 8); }", ("cpu", "cuda"),
     "argument 1 of 'cap_tile_load_f32'", "cap_t variable"),
    ("tile-per-thread-array-on-gpu", "KERNEL void k(cap_t x) { float a[64]; "
     + _TILE_CALL.format(arr="a") + " }", ("cuda",), "argument 6 of 'cap_tile_load_f32'",
     "smem_"),
    ("tile-under-thread-condition", "KERNEL void k(cap_t x) { float smem_a[64];\n"
     "if (rt_block_idx() == 0) " + _TILE_CALL.format(arr="smem_a") + "\n"
     "if (rt_thread_idx() < 32) " + _TILE_CALL.format(arr="smem_a") + " }", ("cuda",),
     "call to 'cap_tile_load_f32' under thread-dependent control flow", "block barrier"),
    ("shuffle-mask-not-literal", "KERNEL void k(cap_t x, int64_t m) { "
     "float v = rt_shfl_xor_f32(1.0f, m); }", ("cuda",), "argument 2 of 'rt_shfl_xor_f32'",
     "integer literal 1, 2, 4, 8 or 16"),
    ("shuffle-mask-not-power-of-two", "KERNEL void k(cap_t x) { "
     "double v = rt_shfl_xor_f64(1.0, 3); }", ("cuda",), "argument 2 of 'rt_shfl_xor_f64'",
     "integer literal 1, 2, 4, 8 or 16"),
    ("shuffle-mask-32", "KERNEL void k(cap_t x) { int64_t v = rt_shfl_xor_i64(1, 32); }",
     ("cuda",), "argument 2 of 'rt_shfl_xor_i64'", "integer literal 1, 2, 4, 8 or 16"),
    ("shuffle-under-thread-condition", "KERNEL void k(cap_t x) { float v = 1.0f;\n"
     "if (rt_lane_idx() < 16)\n    v = rt_shfl_xor_f32(v, 1); }", ("cuda",),
     "call to 'rt_shfl_xor_f32' under thread-dependent control flow", "every lane of the warp"),
    ("warp-sum-after-thread-return", "KERNEL void k(cap_t x, int64_t n) {\n"
     "if (rt_thread_idx() >= n) return;\nfloat v = rt_warp_sum_f32(1.0f); }", ("cuda",),
     "call to 'rt_warp_sum_f32' under thread-dependent control flow", "early return"),
    ("warp-sum-in-thread-strided-loop", "KERNEL void k(cap_t x, int64_t n) { float v = 0.0f;\n"
     "for (int64_t i = rt_thread_idx(); i < n; i += rt_block_dim())\n"
     "    v += rt_warp_sum_f32(cap_load_f32(x, i)); }", ("cuda",),
     "call to 'rt_warp_sum_f32' under thread-dependent control flow", "rt_thread_idx()"),
    ("warp-sum-in-helper-called-divergently", "static float h(float v) "
     "{ return rt_warp_sum_f32(v); }\nKERNEL void k(cap_t x) { float v = 1.0f;\n"
     "int64_t f = 0;\nif (rt_thread_idx() == 0) f = 1;\nif (f) v = h(v); }", ("cuda",),
     "call to 'rt_warp_sum_f32' under thread-dependent control flow", "rt_thread_idx()"),
    ("warp-sum-after-continue-in-switch", "KERNEL void k(cap_t x, int64_t n) {\n"
     "float v = 0.0f;\nfor (int64_t i = 0; i < n; i++) {\n"
     "switch (n) { case 0: if (rt_thread_idx() > 2) continue; break; default: break; }\n"
     "v = rt_warp_sum_f32(v); } }", ("cuda",),
     "call to 'rt_warp_sum_f32' under thread-dependent control flow", "early return/break"),
    ("warp-sum-after-break-in-case", "KERNEL void k(cap_t x, int64_t n) {\n"
     "float v = 0.0f;\nswitch (n) { case 0: if (rt_thread_idx() > 2) break;\n"
     "v = rt_warp_sum_f32(v); break; default: break; } }", ("cuda",),
     "call to 'rt_warp_sum_f32' under thread-dependent control flow", "early return/break"),
    ("barrier-under-thread-condition", "KERNEL void k(cap_t x) { float smem_a[64];\n"
     "int64_t t = rt_thread_idx();\nif (t < 5)\n    rt_sync_threads();\n"
     "smem_a[t % 64] = 1.0f; }", ("cuda",),
     "call to 'rt_sync_threads' under thread-dependent control flow",
     "every thread of the block"),
    ("barrier-after-thread-return", "KERNEL void k(cap_t x, int64_t n) {\n"
     "if (rt_thread_idx() >= n) return;\nrt_sync_threads(); }", ("cuda",),
     "call to 'rt_sync_threads' under thread-dependent control flow", "early return"),
    ("mma-on-cpu", _MMA_SRC.format(c="smem_c", decl="float smem_c[256];", cond=""), ("cpu",),
     "call to 'rt_warp_mma_tf32'", "exists only on the GPU"),
    ("mma-element-not-array", _MMA_SRC.format(c="smem_c[0]", decl="float smem_c[256];",
                                               cond=""), ("cuda",),
     "argument 1 of 'rt_warp_mma_tf32'", "shared smem_ array"),
    ("mma-per-thread-array", _MMA_SRC.format(c="c", decl="float c[256];", cond=""), ("cuda",),
     "argument 1 of 'rt_warp_mma_tf32'", "shared smem_ array"),
    ("mma-double-tile", _MMA_SRC.format(c="smem_c", decl="double smem_c[256];", cond=""),
     ("cuda",), "argument 1 of 'rt_warp_mma_tf32'", "holds double"),
    ("mma-f32-without-k", _MMA_SRC.format(c="smem_c", decl="float smem_c[256];", cond="")
     .replace("rt_warp_mma_tf32", "rt_warp_mma_f32"), ("cuda",),
     "call to 'rt_warp_mma_f32'", "takes 10 argument(s), 9 given"),
    ("mma-under-thread-condition", _MMA_SRC.format(c="smem_c", decl="float smem_c[256];",
                                                    cond="if (rt_thread_idx() < 32)\n"),
     ("cuda",), "call to 'rt_warp_mma_tf32' under thread-dependent control flow",
     "every lane of the warp"),
] + [(f"{name}-on-cpu", "KERNEL void k(cap_t x) { float v = " + call + "; }", ("cpu",),
      f"call to '{name}'", "exists only on the GPU")
     for name, call in (("rt_shfl_xor_f32", "rt_shfl_xor_f32(1.0f, 1)"),
                        ("rt_shfl_xor_f64", "(float)rt_shfl_xor_f64(1.0, 2)"),
                        ("rt_shfl_xor_i64", "(float)rt_shfl_xor_i64(1, 4)"),
                        ("rt_warp_sum_f32", "rt_warp_sum_f32(1.0f)"),
                        ("rt_warp_sum_f64", "(float)rt_warp_sum_f64(1.0)"),
                        ("rt_lane_idx", "(float)rt_lane_idx()"),
                        ("rt_block_idx_y", "(float)rt_block_idx_y()"),
                        ("rt_grid_dim_y", "(float)rt_grid_dim_y()"))]


@pytest.mark.parametrize("case,target", [(c, t) for c in BUILTIN_REJECTS for t in c[2]],
                         ids=[f"{c[0]}-{t}" for c in BUILTIN_REJECTS for t in c[2]])
def test_builtin_misuse_is_refused_with_a_reason(case, target) -> None:
    """No device needed: the verifier runs before any driver call."""
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    ident, src, _, construct, reason = case
    with pytest.raises(VerifyError) as ei:
        verify(parse(src), target=target)
    assert construct in ei.value.construct, ei.value
    assert reason in ei.value.reason, ei.value
    if ident == "tile-under-thread-condition":
        assert ei.value.line == 3, "the block-uniform call on line 2 is accepted"


def test_a_name_reused_under_a_thread_condition_keeps_other_loops_uniform() -> None:
    """The divergence analysis is flow-insensitive over names: a counter ``j`` of a
    loop under ``if (t < 32)`` made every ``j`` varying, so the collectives in the
    uniform ``j`` loop above it were refused (kernels/gpu/panel.c has this shape)."""
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    src = """
KERNEL void k(cap_t x, int64_t nb)
{
    float smem_a[64];
    int64_t t = rt_thread_idx();
    for (int64_t j = 0; j < nb; j++) {
        smem_a[t % 64] = rt_warp_sum_f32((float)j);
        rt_sync_threads();
    }
    if (t < 32) {
        for (int64_t j = 0; j < 32; j++)
            cap_store_f32(x, t * 32 + j, smem_a[j]);
    }
}
"""
    verify(parse(src), target="cuda")


def test_tile_into_a_per_thread_array_is_fine_on_the_cpu() -> None:
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    verify(parse("KERNEL void k(cap_t x) { float a[64]; " + _TILE_CALL.format(arr="a") + " }"))


def test_uniform_collectives_are_accepted_on_the_gpu() -> None:
    """The divergence rule refuses only what can diverge: uniform loops, branches on
    launch arguments or block index, and thread-dependent values (not branches) pass."""
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    verify(parse(WARP_SRC), target="cuda")
    # a switch's own breaks end at the switch: after it, the block is together again
    verify(parse("KERNEL void k(cap_t x, int64_t n) { float v = 0.0f; "
                 "switch (n) { case 0: if (rt_thread_idx() > 2) break; v = 1.0f; break; "
                 "default: break; } v = rt_warp_sum_f32(v); }"), target="cuda")
    verify(parse("KERNEL void k(cap_t x, int64_t n) { float v = 0.0f; "
                 "for (int64_t i = 0; i < n; i++) { switch (n) { case 0: break; "
                 "default: break; } v = rt_warp_sum_f32(v); } }"), target="cuda")
    verify(parse("""
static float wsum(float v) { return rt_warp_sum_f32(v); }
KERNEL void k(cap_t x, int64_t n)
{
    float smem_a[64];
    float acc = 0.0f;
    int64_t t = rt_thread_idx();
    for (int64_t k0 = 0; k0 < n; k0 += 8) {
        if (rt_block_idx() == 0 && n > 3)
            cap_tile_load_f32(x, k0, 8, 8, 8, smem_a, 0, 8);
        float mine = t < 64 ? smem_a[t % 64] : 0.0f;
        acc += wsum(mine) + rt_shfl_xor_f32(mine, 16);
    }
    cap_store_f32(x, t, acc);
}
"""), target="cuda")


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


# -- checked tiles: one check per tile, the fault of the equivalent element loop

TILE_SRC = """
KERNEL void tile(cap_t x, cap_t out, int64_t off, int64_t ld, int64_t rows, int64_t cols,
                 int64_t aoff, int64_t ald)
{
    float smem_t[8][9];
    for (int64_t i = 0; i < 72; i++)
        smem_t[i / 9][i % 9] = -1.0f;
    cap_tile_load_f32(x, off, ld, rows, cols, smem_t, aoff, ald);
    for (int64_t i = 0; i < 72; i++)
        cap_store_f32(out, i, smem_t[i / 9][i % 9]);
}
"""
TILE_LINE = 8  # the cap_tile_load_f32

TILE_STORE_SRC = """
KERNEL void tile_store(cap_t x, cap_t out, int64_t off, int64_t ld, int64_t rows, int64_t cols,
                       int64_t aoff, int64_t ald)
{
    double smem_t[72];
    for (int64_t i = 0; i < 72; i++)
        smem_t[i] = cap_load_f64(x, i);
    cap_tile_store_f64(out, off, ld, rows, cols, smem_t, aoff, ald);
}
"""


WARP_SRC = """
KERNEL void warp(cap_t x, cap_t out)
{
    int64_t t = rt_thread_idx();
    float v = cap_load_f32(x, t);
    float s = rt_warp_sum_f32(v);
    float p = rt_shfl_xor_f32(v, 1);
    double d = rt_warp_sum_f64((double)v) + rt_shfl_xor_f64((double)v, 16);
    int64_t q = rt_shfl_xor_i64(t, 8) + rt_lane_idx();
    cap_store_f32(out, 4 * t, s);
    cap_store_f32(out, 4 * t + 1, p);
    cap_store_f32(out, 4 * t + 2, (float)d);
    cap_store_f32(out, 4 * t + 3, (float)q);
}
"""


GRID_Y_SRC = """
KERNEL void grid_y(cap_t out)
{
    int64_t b = rt_block_idx_y() * rt_grid_dim() + rt_block_idx();
    if (rt_thread_idx() == 0)
        cap_store_i64(out, b, rt_grid_dim_y() * 1000 + rt_block_idx_y());
}
"""


def _tile_ref(src: np.ndarray, dst: np.ndarray, off: int, ld: int, rows: int, cols: int,
              aoff: int, ald: int) -> np.ndarray:
    """The element loop the tile copy stands for (numpy oracle)."""
    out = dst.copy()
    for r in range(rows):
        for k in range(cols):
            out[aoff + r * ald + k] = src[off + r * ld + k]
    return out


@pytest.mark.parametrize("args", [
    (0, 10, 8, 9, 0, 9), (3, 10, 4, 3, 1, 5), (91, -10, 8, 9, 0, 9), (0, 0, 8, 9, 0, 9),
    (99, 0, 1, 1, 71, 0), (5, 7, 0, 9, 0, 9), (-50, 10, 3, -1, 0, 9), (4, 4, 2, 8, 64, -8),
], ids=["full", "inner", "negative-ld", "broadcast-row", "last-element", "empty", "no-cols",
        "negative-dst-ld"])
def test_tile_load_equals_element_loop(lane: Lane, args) -> None:
    k = lane.compile(TILE_SRC, "tile")
    xs = np.arange(100, dtype=np.float32) * 0.5 + 1.0
    x = lane.buffer(xs, perms="r", name="x")
    out = lane.alloc(72, np.float32, name="out")
    lane.launch(k, [x, out], args=args)
    want = _tile_ref(xs, np.full(72, -1.0, np.float32), *args)
    assert np.array_equal(lane.read(out), want)


def test_tile_store_equals_element_loop(lane: Lane) -> None:
    k = lane.compile(TILE_STORE_SRC, "tile_store")
    xs = np.arange(72, dtype=np.float64) + 0.25
    x = lane.buffer(xs, perms="r", name="x")
    out = lane.alloc(100, np.float64, name="out")
    off, ld, rows, cols, aoff, ald = 2, 11, 8, 9, 0, 9
    lane.launch(k, [x, out], args=(off, ld, rows, cols, aoff, ald))
    # a store copies array -> cap: the oracle's source is the array
    want = _tile_ref(xs, np.zeros(100), aoff, ald, rows, cols, off, ld)
    assert np.array_equal(lane.read(out), want)


TILE_FAULTS = [
    # (id, args (off, ld, rows, cols, aoff, ald), reason, index, access, buffer)
    ("last-row", (0, 30, 4, 12, 0, 12), "out-of-bounds", 100, "load", "x"),
    ("one-past-end", (91, 0, 1, 10, 0, 9), "out-of-bounds", 100, "load", "x"),
    ("negative-ld", (50, -20, 4, 5, 0, 9), "out-of-bounds", -10, "load", "x"),
    ("negative-off", (-1, 10, 2, 2, 0, 9), "out-of-bounds", -1, "load", "x"),
    ("huge-ld", (5, 2**62, 3, 1, 0, 9), "out-of-bounds", 2**62 + 5, "load", "x"),
    ("dst-overflow", (0, 10, 8, 9, 1, 9), "local-array", 72, None, "smem_t"),
    ("dst-negative", (0, 10, 2, 2, -1, 9), "local-array", -1, None, "smem_t"),
    ("dst-ld-overflow", (0, 1, 3, 2, 0, 2**62), "local-array", 2**62, None, "smem_t"),
    ("src-before-dst", (95, 5, 2, 5, 63, 9), "out-of-bounds", 100, "load", "x"),
]


@pytest.mark.parametrize("case", TILE_FAULTS, ids=[c[0] for c in TILE_FAULTS])
def test_tile_load_fault_is_exact_and_copies_nothing(lane: Lane, case) -> None:
    _, args, reason, index, access, buffer = case
    k = lane.compile(TILE_SRC, "tile")
    x = lane.buffer(np.arange(100, dtype=np.float32), perms="r", name="x")
    out = lane.alloc(72, np.float32, name="out")
    with pytest.raises(CapabilityFault) as ei:
        lane.launch(k, [x, out], args=args, timeout=30)
    e = ei.value
    assert (e.reason, e.index, e.access, e.buffer, e.line, e.kernel) == (
        reason, index, access, buffer, TILE_LINE, "tile")
    assert np.all(lane.read(out) == 0.0), "nothing after the refused tile ran"


def test_tile_store_to_read_only_cap_is_refused(lane: Lane) -> None:
    k = lane.compile(TILE_STORE_SRC, "tile_store")
    x = lane.buffer(np.ones(72), perms="r", name="x")
    out = lane.buffer(np.zeros(100), perms="r", name="out")
    with pytest.raises(CapabilityFault) as ei:
        lane.launch(k, [x, out], args=(0, 9, 8, 9, 0, 9), timeout=30)
    assert (ei.value.reason, ei.value.index, ei.value.access, ei.value.buffer) == (
        "read-only", 0, "store", "out")
    assert np.all(lane.read(out) == 0.0)


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


def test_grid_zero_is_refused(lane: Lane) -> None:
    k = lane.compile(ARGS_SRC, "put")
    out = lane.alloc(3, np.float64, name="out")
    for grid in (0, -1):
        with pytest.raises(ValueError, match="grid must be at least 1"):
            lane.launch(k, [out], args=(1, 2.0, 3.0), grid=grid)
    assert np.all(lane.read(out) == 0.0)
    with pytest.raises(TypeError, match="grid"):
        lane.launch(k, [out], args=(1, 2.0, 3.0), grid=1.0)


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
    from capqr.capabilities.protocol import CapabilityProtocol

    cap = lane.alloc(4, np.float32, name="p")
    assert isinstance(cap, CapabilityProtocol)
    assert cap.device == lane.target and cap.perms == "rw" and cap.nbytes == 16


def test_device_capability_rules_hold_without_a_device() -> None:
    """DeviceCapability's host-side rules (perms, double free, protocol) need no GPU."""
    from capqr.capabilities.protocol import CapabilityProtocol
    from capqr.runtime.cuda import DeviceCapability

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

    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify
    from capqr.runtime.cuda import DeviceCapability
    from capqr.runtime.cuda import driver as drv
    from capqr.runtime.cuda.params import ParamBlock

    sig = verify(parse(ARGS_SRC), target="cuda").kernels["put"]
    k = SimpleNamespace(info=sig, name="put", checked=True)
    block = ParamBlock(k)
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
    bar.sync is .aligned: undefined, in practice a hang).  Such a loop keeps one copy,
    or gets two under a guard the whole block votes on (a cover guard,
    `rt_block_all`), so every thread takes the same one."""
    from capqr.runtime import cuda

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
    _one_copy_or_block_voted(body, "rt_sync_threads()")


def _one_copy_or_block_voted(body: str, barrier: str) -> None:
    """``barrier`` stands once, or twice with the two copies chosen by one block vote."""
    n = body.count(barrier)
    assert n == 1 or (n == 2 and body.count("if (rt_block_all(") == 1), body
    if n == 2:  # the vote comes before both copies
        assert body.index("if (rt_block_all(") < body.index(barrier), body


def test_loops_calling_a_barrier_helper_are_not_versioned() -> None:
    """The same rule when the barrier sits in a helper (here two calls deep): the loop
    that calls it keeps one copy."""
    from capqr.runtime import cuda

    src = """
static void wait_all(int64_t t)
{
    rt_sync_threads();
}
static void stage(int64_t t)
{
    wait_all(t);
}
KERNEL void k(cap_t x, int64_t n)
{
    float smem_a[256];
    int64_t t = rt_thread_idx();
    for (int64_t j = 0; j < n; j++) {
        smem_a[t] = cap_load_f32(x, j + t);
        stage(t);
    }
}
"""
    body = cuda.translate(src, checked=True).text.split("__rtk_k(", 1)[1]
    _one_copy_or_block_voted(body, "stage(")


MMA_LOWER_SRC = """
KERNEL void k(cap_t x, int64_t n)
{
    float smem_a[128];
    float smem_b[8][16];
    float smem_c[256];
    float smem_d[64];
    for (int64_t i = 0; i < n; i++) {
        smem_d[i] = cap_load_f32(x, i);
        rt_warp_mma_tf32(smem_c, 0, 16, smem_a, 0, 8, smem_b, 0, 16);
    }
    rt_warp_mma_f32(smem_c, 0, 16, smem_a, 0, 8, smem_b, 0, 16, n);
    rt_warp_mma_f32_at(smem_c, 0, 16, smem_a, 0, 8, smem_b, 0, 16, n);
}
"""


def test_warp_mma_lowers_to_one_checked_call_on_aligned_shared_tiles() -> None:
    """No device needed: the warp MMAs become rt_mma<split, A transposed> with k (8 for
    tf32), each array's flat length and fault id
    (the checks run on the device); their arrays are 32-byte aligned (wmma), other
    shared arrays keep 16; a loop around a call is versioned under a warp vote (the
    call is a warp collective: every lane must take the same copy), the call itself
    checked in both copies."""
    text = readable(cuda.translate(MMA_LOWER_SRC).text)
    body = text[text.index("__rtk_k"):]
    assert "__align__(32) float smem_a[128]" in body
    assert "__align__(32) float smem_b[8][16]" in body
    assert "__align__(32) float smem_c[256]" in body
    assert "__align__(16) float smem_d[64]" in body
    calls = [ln.rstrip() for ln in body.splitlines() if "rt_mma<" in ln]
    assert len(calls) == 4  # the loop's call in its fast and its checked copy
    # <split, A transposed>, the tiles, k, flat lengths 256, 128 and 8 * 16, each with
    # its fault id, then the source line
    tiles = r"\(float \*\) smem_c, 0, 16, \(float \*\) smem_a, 0, 8, \(float \*\) smem_b, 0, 16, "
    arrays = r"256, \d+, 128, \d+, 128, \d+, "
    for call in calls[:2]:
        assert re.search(r"rt_mma<0, 0>\(" + tiles + "8, " + arrays + r"10\);$", call), call
    assert re.search(r"rt_mma<1, 0>\(" + tiles + "n, " + arrays + r"12\);$", calls[2]), calls[2]
    assert re.search(r"rt_mma<1, 1>\(" + tiles + "n, " + arrays + r"13\);$", calls[3]), calls[3]
    assert "if (rt_warp_all(" in body
    assert "rt_uload_f32(x, i)" in body and "rt_load_f32(x, i, " in body
