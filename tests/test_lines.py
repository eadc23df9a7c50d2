"""Line hulls (runtime/compiler/lines.py): an unrolled loop's first indices enter the hull
guard by each line's two extremes, guarded by rt_line_ok on the line's step.

The oracle for soundness is the fully checked build (hoist=False): the same
kernel must give the same stores and the same fault.
"""

from __future__ import annotations

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime.compiler.astutil import readable
from capqr.runtime.compiler.lines import line_hull
from capqr.runtime.errors import CapabilityFault
from pycparser import c_ast, c_parser

UNROLLED = """
KERNEL void scale_rows(cap_t M, int64_t n, int64_t r1, int64_t nw, int64_t k)
{
    int64_t cnt = (n - r1 + nw - 1) / nw;
    int64_t c4 = cnt - cnt % 4;
    for (int64_t i = 0; i < c4; i += 4) {
        float x0 = cap_load_f32(M, (r1 + i * nw) * n + k);
        float x1 = cap_load_f32(M, (r1 + i * nw + nw) * n + k);
        float x2 = cap_load_f32(M, (r1 + i * nw + 2 * nw) * n + k);
        float x3 = cap_load_f32(M, (r1 + i * nw + 3 * nw) * n + k);
        cap_store_f32(M, (r1 + i * nw) * n + k + 1, 2.0f * x0);
        cap_store_f32(M, (r1 + i * nw + nw) * n + k + 1, 2.0f * x1);
        cap_store_f32(M, (r1 + i * nw + 2 * nw) * n + k + 1, 2.0f * x2);
        cap_store_f32(M, (r1 + i * nw + 3 * nw) * n + k + 1, 2.0f * x3);
    }
}
"""

#: Three reads a, a + q, a + 2q of one loop: with q = 2^63 + 1, 2q wraps to 2, so
#: the two ends are in the buffer and the middle one is not.
WRAPPING_LINE = """
KERNEL void three(cap_t x, cap_t y, int64_t q, int64_t m)
{
    for (int64_t i = 0; i < m; i++)
        cap_store_f32(y, i, cap_load_f32(x, i) + cap_load_f32(x, i + q)
                      + cap_load_f32(x, i + 2 * q));
}
"""


def _run(kernel, bufs: dict[str, np.ndarray], args: tuple) -> tuple:
    caps = [capabilities.wrap(a, name=name) for name, a in bufs.items()]
    try:
        runtime.launch(kernel, caps, args=args, timeout=20)
        return ("ok",) + tuple(a.tobytes() for a in bufs.values())
    except CapabilityFault as f:
        return (f.reason, f.buffer, f.index, f.access, f.line) + tuple(
            a.tobytes() for a in bufs.values())


def test_an_unrolled_loop_guards_two_firsts_per_line() -> None:
    k = runtime.compile(UNROLLED, "scale_rows")
    guards = [ln for ln in readable(k.c_source).splitlines() if "rt_range_hull_ok" in ln]
    assert guards and all("rt_line_ok" in ln for ln in guards), guards
    # the middle members (+ nw and + 2 * nw) are not in the hull any more
    assert all("2 * nw" not in ln for ln in guards), guards
    # and they are covered: the fast copy reads and writes them unchecked
    lines = readable(k.c_source).splitlines()
    assert any("x1 = rt_uload_f32" in ln for ln in lines)
    assert any("rt_ustore_f32" in ln and "2.0f * x2" in ln for ln in lines)


@pytest.mark.parametrize("n,r1,nw,k", [
    (16, 1, 3, 2),      # in range: the fast copy runs
    (16, 1, 3, 15),     # the stores' column k + 1 is past the row: the last one faults
    (16, 0, 4, 0),
    (16, -2, 3, 1),     # the first row is -2: faults on the first load
    (12, 2, 2, 5),
])
def test_unrolled_loop_matches_the_fully_checked_build(n, r1, nw, k) -> None:
    fast = runtime.compile(UNROLLED, "scale_rows")
    slow = runtime.compile(UNROLLED, "scale_rows", hoist=False)
    rng = np.random.default_rng(n * 100 + k)
    a = rng.standard_normal(n * n).astype(np.float32)
    got = _run(fast, {"M": a.copy()}, (n, r1, nw, k))
    want = _run(slow, {"M": a.copy()}, (n, r1, nw, k))
    assert got == want


def test_a_line_whose_step_wraps_still_faults_on_its_middle_member() -> None:
    """q = 2^63 + 1: i and i + 2q are in range, i + q is not.  The ends of the line
    pass the hull guard; rt_line_ok (|q| < 2^58) sends the loop to its checked
    copy, which faults on the middle read.  Seen failing (no fault, a read at
    index 2^63 + 1 let through) with rt_line_ok's condition left out of the guard."""
    q = (1 << 63) + 1 - (1 << 64)
    fast = runtime.compile(WRAPPING_LINE, "three")
    slow = runtime.compile(WRAPPING_LINE, "three", hoist=False)
    assert "rt_line_ok" in fast.c_source
    bufs = {"x": np.arange(8, dtype=np.float32), "y": np.zeros(4, np.float32)}
    got = _run(fast, {k: v.copy() for k, v in bufs.items()}, (q, 4))
    want = _run(slow, {k: v.copy() for k, v in bufs.items()}, (q, 4))
    assert got == want
    assert got[0] == "out-of-bounds" and got[1] == "x" and got[2] == q and got[3] == "load"


def _exprs(*texts: str) -> list[c_ast.Node]:
    parser = c_parser.CParser()
    out = []
    for t in texts:
        fn = parser.parse(f"void f(void) {{ x = {t}; }}")
        out.append(fn.ext[0].body.block_items[0].rvalue)
    return out


I64 = {"a": 64, "q": 64, "n": 64, "t": 32, "u": 32}


@pytest.mark.parametrize("texts,kept,conds", [
    (["a", "a + q", "a + 2 * q", "a + 3 * q"], [0, 3], 1),
    (["a + 3 * q", "a", "a + q"], [0, 1], 1),                    # ends in any order
    (["a", "a + q"], [0, 1], 0),                                 # two members: nothing to drop
    (["a", "a + 2 * q", "a + 4 * q", "a + 6 * q"], [0, 3], 1),   # the step is 2q
    (["a", "a + q", "a + n"], [0, 1, 2], 0),                     # not one line
    (["a", "a + q", "a + 17 * q"], [0, 1, 2], 0),                # longer than LINE_MAX_SPAN
    (["(a + q) * n", "a * n", "(a + 2 * q) * n"], [1, 2], 1),    # expanded products
    (["t * 2 + a", "t * 2 + a + q", "t * 2 + a + 2 * q"], [0, 2], 1),
    # an int subexpression is one opaque value, never expanded: t * 2 and t + t differ
    (["t * 2 + a", "t + t + a + q", "t * 2 + a + 2 * q"], [0, 1, 2], 0),
    (["u + 1", "u + 2", "u + 3"], [0, 1, 2], 0),                 # int arithmetic: may wrap
])
def test_line_hull_keeps_the_ends_of_each_line(texts, kept, conds) -> None:
    firsts = _exprs(*texts)
    got, got_conds = line_hull(firsts, I64)
    assert [firsts.index(e) for e in got] == kept
    assert len(got_conds) == conds
