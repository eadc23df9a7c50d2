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

import capabilities
import runtime
from capabilities import abi
from runtime.cuda.instrument_cuda import device_prelude

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
_DEVICE_STUBS = ("#define __device__\n#define __shared__\n#define __forceinline__\n"
                 "#define __noinline__\n")


def _device_predicate_source() -> str:
    text = device_prelude()
    cut = text.index("static __device__")
    return "#include <stdint.h>\n" + _DEVICE_STUBS + text[:cut]


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
