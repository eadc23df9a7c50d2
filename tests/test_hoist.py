"""Loop versioning (runtime/compiler/hoist/) never changes what a kernel does.

The hoisted build and the build with every access checked must agree on
every input: same fault (reason, index, block) or none, and byte-identical
memory afterwards, including index sequences built to wrap around 2^64.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime.compiler.astutil import readable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SRC = """
KERNEL void fill_lt(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i < hi; i++)
        cap_store_f32(x, a * i + b, (float)i);
}

KERNEL void fill_le3(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i <= hi; i += 3)
        cap_store_f32(x, b + i * a, cap_load_f32(x, b + i * a) + 1.0f);
}

KERNEL void cond_store(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i < hi; i++) {
        if (i < b)
            cap_store_f32(x, a * i, 2.0f);
    }
}
"""

DIV_SRC = """
KERNEL void div_zero(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i < hi; i++)
        cap_store_f32(x, a * i + b / 0x0, (float)i);
}

KERNEL void div_lit(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i < hi; i++)
        cap_store_f32(x, a * i + b / 010 - b % 3, (float)i);
}

KERNEL void div_var(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i < hi; i++)
        cap_store_f32(x, i + b / a, (float)i);
}
"""
SRC += DIV_SRC + """
KERNEL void fill_stride(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    int64_t s = (a & 3) + 1;
    for (int64_t i = lo; i < hi; i += s)
        cap_store_f32(x, i + b, (float)i);
}
"""

SRC += """
KERNEL void hull(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    for (int64_t i = lo; i < hi; i++) {
        float v = cap_load_f32(x, a * i + b) + cap_load_f32(x, b + 3 + i * a);
        cap_store_f32(x, a * i + b - 2, v);
        cap_store_f32(x, a * i + 5, v + 1.0f);
    }
}
"""

NAMES = ["fill_lt", "fill_le3", "cond_store", "div_zero", "div_lit", "div_var", "fill_stride",
         "hull"]


@pytest.fixture(scope="module")
def builds() -> dict:
    return {n: (runtime.compile(SRC, n), runtime.compile(SRC, n, hoist=False)) for n in NAMES}


def _run(kernel, n: int, args: tuple) -> tuple:
    guard = np.random.default_rng(1).standard_normal(n + 32).astype(np.float32)
    snapshot = guard.copy()
    cap = capabilities.wrap(guard[16:16 + n], name="x")
    fault = None
    try:
        runtime.launch(kernel, [cap], args=args, timeout=20)
    except runtime.CapabilityFault as e:
        fault = (e.reason, e.index, e.access, e.line)
    # neighbours of the buffer are never touched, hoisted or not
    assert np.array_equal(guard[:16], snapshot[:16])
    assert np.array_equal(guard[16 + n:], snapshot[16 + n:])
    return fault, guard[16:16 + n].copy()



def _assert_same(hoisted, plain, n: int, args: tuple) -> None:
    """The hoisted and the unhoisted build fault alike and leave the same bits."""
    f1, m1 = _run(hoisted, n, args)
    f2, m2 = _run(plain, n, args)
    assert f1 == f2
    assert np.array_equal(m1.view(np.uint32), m2.view(np.uint32))

def test_hoisting_applies_to_canonical_loops(builds) -> None:
    hoisted, plain = builds["fill_lt"]
    assert "rt_ustore_f32" in hoisted.c_source and "rt_range_ok" in hoisted.c_source
    assert "rt_ustore_f32" not in plain.c_source


def test_accesses_differing_in_offset_share_one_hull_check(builds) -> None:
    """Two loads and two stores, each pair with one stride: one check per pair."""
    src = readable(builds["hull"][0].c_source)
    body = src[src.index(" hull(rt_block"):]
    body = body[:body.index("\n}\n")]
    assert body.count("rt_range_hull_ok(") == 2
    assert not re.search(r"rt_range_ok\(x, [^,]*__h\d+_a", body)  # no per-access loop guard


def test_zero_trip_loop_never_evaluates_a_division_by_zero(builds) -> None:
    """The guard must never fault: `b / 0x0` is not a safe literal division."""
    for k in builds["div_zero"]:
        assert _run(k, 8, (0, 0, 1, 5))[0] is None
    for k in builds["div_zero"]:
        assert _run(k, 8, (0, 1, 1, 5))[0][0] == "division-by-zero"


def test_literal_divisions_are_hoisted(builds) -> None:
    assert "rt_ustore_f32" in builds["div_lit"][0].c_source


def test_invariant_variable_steps_are_hoisted(builds) -> None:
    assert "rt_ustore_f32" in builds["fill_stride"][0].c_source


def test_loop_that_writes_its_counter_is_not_hoisted() -> None:
    src = """
KERNEL void k(cap_t x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        cap_store_f32(x, i, 1.0f);
        i = i + 1;
    }
}"""
    assert "rt_ustore" not in runtime.compile(src, "k").c_source


big = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small = st.integers(min_value=-40, max_value=80)
coef = st.one_of(st.integers(-4, 4), st.sampled_from([2**61, 2**62, -(2**62), 2**63 - 1]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), n=st.integers(0, 48), lo=st.one_of(small, big),
       hi=st.one_of(small, big), a=coef, b=st.one_of(small, big))
def test_hoisted_equals_checked(builds, name, n, lo, hi, a, b) -> None:
    hoisted, plain = builds[name]
    if hi - lo > 4096:
        # Keep every loop finite in practice: a store-free or a=0 in-bounds
        # loop over 2^63 iterations would be correct but never end.
        if name == "cond_store":
            hi = lo + 4096
        elif a == 0:
            a = 1
    _assert_same(hoisted, plain, n, (lo, hi, a, b))


LOCAL_SRC = """
KERNEL void local_fill(cap_t x, int64_t lo, int64_t hi, int64_t a, int64_t b)
{
    float w[4][8];
    for (int r = 0; r < 4; r++)
        for (int l = 0; l < 8; l++)
            w[r][l] = 0.0f;
    for (int i = lo; i < hi; i++)
        w[b & 3][a * i + b] = w[b & 3][a * i + b] + 1.0f;
    for (int r = 0; r < 4; r++)
        for (int l = 0; l < 8; l++)
            cap_store_f32(x, r * 8 + l, w[r][l]);
}
"""


@pytest.fixture(scope="module")
def local_builds() -> tuple:
    return (runtime.compile(LOCAL_SRC, "local_fill"),
            runtime.compile(LOCAL_SRC, "local_fill", hoist=False))


def test_local_array_subscripts_are_hoisted(local_builds) -> None:
    hoisted, plain = local_builds
    assert "rt_lrange_ok" in hoisted.c_source and "rt_loop_span32" in hoisted.c_source
    assert "rt_lrange_ok" not in plain.c_source


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lo=st.integers(-20, 20), hi=st.integers(-20, 40), a=st.integers(-3, 3),
       b=st.integers(-10, 12))
def test_hoisted_local_arrays_equal_checked(local_builds, lo, hi, a, b) -> None:
    hoisted, plain = local_builds
    if a == 0 and hi - lo > 64:
        hi = lo + 64
    _assert_same(hoisted, plain, 32, (lo, hi, a, b))


NEST_SRC = """
KERNEL void nest(cap_t x, int64_t rows, int64_t ld, int64_t off)
{
    float acc[16];
    for (int64_t r = 0; r < rows; r++) {
        float s = cap_load_f32(x, r * ld + off);
        for (int l = 0; l < 16; l++)
            acc[l] = s * 2.0f + (float)l;
        for (int l = 0; l < 16; l++)
            cap_store_f32(x, r * ld + off + l, acc[l]);
    }
}
"""


@pytest.fixture(scope="module")
def nest_builds() -> tuple:
    return runtime.compile(NEST_SRC, "nest"), runtime.compile(NEST_SRC, "nest", hoist=False)


def test_short_nests_poll_once_after_the_nest(nest_builds) -> None:
    hoisted, _ = nest_builds
    # outer loop versioned (its own load hoisted) with a quiet copy for short nests
    assert "rt_uload_f32" in hoisted.c_source and "rt_ustore_f32" in hoisted.c_source
    # the side table of the pass says which loops poll once after themselves
    import copy

    from capqr.runtime.compiler.hoist import hoist_function
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    v = verify(parse(NEST_SRC))
    fn = copy.deepcopy(v.parsed.funcs["nest"])
    table = hoist_function(fn, v.local_arrays["nest"])
    assert any(plan.quiet for plan in table.loops)
    assert all(plan.guards and plan.covered for plan in table.loops if not plan.quiet)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(-2, 6), ld=st.integers(-20, 20), off=st.integers(-20, 60))
def test_hoisted_nest_equals_checked(nest_builds, rows, ld, off) -> None:
    hoisted, plain = nest_builds
    _assert_same(hoisted, plain, 48, (rows, ld, off))



ROWS_SRC = """
KERNEL void fill_rows(cap_t x, int64_t rows, int64_t cw, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++) {
        float s = cap_load_f32(x, r * ld);
        for (int64_t l = 1; l < cw; l++)
            cap_store_f32(x, r * ld + l, s + (float)l);
    }
}
"""


@pytest.fixture(scope="module")
def rows_builds() -> tuple:
    return (runtime.compile(ROWS_SRC, "fill_rows"),
            runtime.compile(ROWS_SRC, "fill_rows", hoist=False))


def test_nest_over_a_short_runtime_width_polls_once_after_itself(rows_builds) -> None:
    """An inner loop whose bound is a run-time value, invariant in the nest, is as
    short as a constant one when its span (computed before the nest) says so: the
    nest gets a copy without per-iteration pollchecks, taken only when the outer
    span is short and the inner one at most INNER_CONST_TRIP iterations."""
    import copy

    from capqr.runtime.compiler.hoist import INNER_CONST_TRIP, hoist_function
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    v = verify(parse(ROWS_SRC))
    fn = copy.deepcopy(v.parsed.funcs["fill_rows"])
    table = hoist_function(fn, v.local_arrays["fill_rows"])
    outer = [plan for plan in table.loops if plan.line == 4]
    assert outer and outer[0].quiet, table.loops
    text = readable(rows_builds[0].c_source)
    limit = rf"\(RT_DIV\(__rt, __h\d+_span, 1, 0\) < {INNER_CONST_TRIP}\)"
    assert re.search(limit, text), text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(-2, 6), cw=st.integers(-3, 300), ld=st.integers(-20, 400))
def test_nest_over_a_runtime_width_equals_checked(rows_builds, rows, cw, ld) -> None:
    hoisted, plain = rows_builds
    _assert_same(hoisted, plain, 640, (rows, cw, ld))

# Two-level nests: an inner loop whose bounds do not change in the outer loop
# is folded into the outer loop's guard (one box check per access, corners of
# the iteration box).  Indices are affine in both counters, with coefficients
# that make the sequences wrap around 2^64, negative ones, conditional
# accesses, int counters and local arrays; the fully checked build is the oracle.
BOX_SRC = """
KERNEL void box(cap_t x, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t a, int64_t b,
                int64_t c)
{
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0; j < j1; j++)
            cap_store_f32(x, a * i + b * j + c, (float)(i - j));
}

KERNEL void box_le(cap_t x, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t a, int64_t b,
                   int64_t c)
{
    for (int64_t i = i0; i <= i1; i += 2)
        for (int j = j0; j <= j1; j += 3)
            cap_store_f32(x, c + i * a - j * b, cap_load_f32(x, c + i * a - j * b) + 1.0f);
}

KERNEL void box_cond(cap_t x, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t a,
                     int64_t b, int64_t c)
{
    for (int64_t i = i0; i < i1; i++) {
        float s = cap_load_f32(x, i - i0);
        for (int64_t j = j0; j < j1; j++) {
            if (j < c)
                cap_store_f32(x, b * j + a * (i - i0), s + 1.0f);
        }
    }
}

KERNEL void box_local(cap_t x, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t a,
                      int64_t b, int64_t c)
{
    float w[6][8];
    for (int r = 0; r < 6; r++)
        for (int l = 0; l < 8; l++)
            w[r][l] = 0.0f;
    for (int i = i0; i < i1; i++)
        for (int j = j0; j < j1; j++)
            w[i + c][a * i + b * j + c] = w[i + c][a * i + b * j + c] + 1.0f;
    for (int r = 0; r < 6; r++)
        for (int l = 0; l < 8; l++)
            cap_store_f32(x, r * 8 + l, w[r][l]);
}

KERNEL void tri(cap_t x, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t a, int64_t b,
                int64_t c)
{
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0 + i; j < j1; j++)
            cap_store_f32(x, a * i + b * j + c, 3.0f);
}
"""
BOX_NAMES = ["box", "box_le", "box_cond", "box_local", "tri"]
I64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def box_builds() -> dict:
    return {n: (runtime.compile(BOX_SRC, n), runtime.compile(BOX_SRC, n, hoist=False))
            for n in BOX_NAMES}


def test_rectangular_nests_fold_into_one_box_check(box_builds) -> None:
    for name in ("box", "box_le", "box_cond"):
        src = readable(box_builds[name][0].c_source)
        assert "rt_range2_ok" in src and "rt_ustore_f32" in src, name
    assert "rt_lrange2_ok" in box_builds["box_local"][0].c_source
    # the fast copy of the nest runs no per-inner-loop guard: one interval guard at
    # function entry (the whole body), then in its checked copy the box guard
    # before the nest and the inner loop's own guard
    src = readable(box_builds["box"][0].c_source)
    box = src[src.index(" box(rt_block"):src.index(" box_le(rt_block")]
    assert box.count("rt_range2_ok(") == 1 and box.count("rt_range_ok(") == 2
    # the inner bound moves with i: no box, each inner loop keeps its own guard
    src = readable(box_builds["tri"][0].c_source)
    tri = src[src.index(" tri(rt_block"):src.index("capqr_entry")]
    assert "rt_range2_ok" not in tri and "rt_range_ok" in tri


def test_products_of_counters_are_not_folded() -> None:
    src = """
KERNEL void k(cap_t x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++)
            cap_store_f32(x, i * j, 1.0f);
}"""
    assert "rt_range2_ok" not in runtime.compile(src, "k").c_source
    assert "rt_range_ok" in runtime.compile(src, "k").c_source


def _bounds(lo: int, count: int, hi_cap: int = I64_MAX) -> int:
    return max(-(2**63), min(hi_cap, lo + count))


start = st.one_of(small, big)
count = st.integers(-2, 12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(BOX_NAMES), n=st.integers(0, 48), i0=start, ci=count, j0=start,
       cj=count, a=coef, b=coef, c=st.one_of(small, big))
def test_hoisted_nest_box_equals_checked(box_builds, name, n, i0, ci, j0, cj, a, b, c) -> None:
    hoisted, plain = box_builds[name]
    i1 = _bounds(i0, ci, I64_MAX - 8)      # `<=` loops: no counter wrap past INT64_MAX
    if name == "box_le":
        j0 = max(-(2**31), min(j0, 2**31 - 16))
        j1 = _bounds(j0, cj, 2**31 - 8)     # int counter: the same for INT32_MAX
    else:
        j1 = _bounds(j0, cj)
    if name == "box_local":
        # int counters initialised from int64 bounds: keep them in int range
        # (a truncated start could make a loop of 2^32 iterations in both builds)
        n = 48
        i0, i1 = max(-50, min(i0, 50)), max(-50, min(i1, 50))
    if name in ("box_local", "tri"):
        # tri: j starts at j0 + i; keep that sum small, or both builds run a loop of
        # |i0| iterations (a fresh clone's hypothesis found i0 = -3.6e10, a = -1,
        # b = 0, c = i0: index 0 every time, a 20 s timeout in both builds)
        j0, j1 = max(-50, min(j0, 50)), max(-50, min(j1, 50))
        i0, i1 = max(-50, min(i0, 50)), max(-50, min(i1, 50))
    args = (i0, i1, j0, j1, a, b, c)
    _assert_same(hoisted, plain, n, args)


# Offsets a loop body computes from its counter (int64_t a0 = (r + 4*q) * ld;
# a1 = a0 + ld) are expanded into the indices that use them: the loads of the
# outer body and the inner loop's accesses become affine in (q, j) and fold
# into one guard before the nest (the row-quad shape of larf_left).  A name
# the body assigns again, an int (32-bit) definition and a definition reading
# a variable the body changes are not expanded.
DEF_SRC = """
KERNEL void quad(cap_t x, int64_t nq, int64_t r, int64_t ld, int64_t j0, int64_t j1, int64_t c)
{
    for (int64_t q = 0; q < nq; q++) {
        int64_t a0 = (r + 2 * q) * ld;
        int64_t a1 = a0 + ld;
        float v0 = cap_load_f32(x, a0 + c);
        float v1 = cap_load_f32(x, a1 + c);
        for (int64_t j = j0; j < j1; j++) {
            cap_store_f32(x, a0 + j, cap_load_f32(x, a0 + j) + v1);
            cap_store_f32(x, a1 + j, cap_load_f32(x, a1 + j) - v0);
        }
    }
}

KERNEL void redef(cap_t x, int64_t nq, int64_t r, int64_t ld, int64_t j0, int64_t j1, int64_t c)
{
    for (int64_t q = 0; q < nq; q++) {
        int64_t a0 = (r + q) * ld;
        if (q == c)
            a0 = a0 + ld;
        for (int64_t j = j0; j < j1; j++)
            cap_store_f32(x, a0 + j, 1.0f);
    }
}

KERNEL void narrow(cap_t x, int64_t nq, int64_t r, int64_t ld, int64_t j0, int64_t j1, int64_t c)
{
    int s = (int)ld;
    for (int q = 0; q < nq; q++) {
        int a0 = q * s + (int)r;
        int64_t a1 = (int64_t)(q * s) + c;
        for (int64_t j = j0; j < j1; j++) {
            cap_store_f32(x, a0 + j, 1.0f);
            cap_store_f32(x, a1 + j, 2.0f);
        }
    }
}

KERNEL void moving(cap_t x, int64_t nq, int64_t r, int64_t ld, int64_t j0, int64_t j1, int64_t c)
{
    int64_t base = r;
    for (int64_t q = 0; q < nq; q++) {
        int64_t a0 = base + q * ld;
        for (int64_t j = j0; j < j1; j++)
            cap_store_f32(x, a0 + j, 1.0f);
        base = base + c;
    }
}
"""
DEF_NAMES = ["quad", "redef", "narrow", "moving"]


def _per_loop(src: str) -> str:
    """src with a while loop at the top of every kernel: the whole-body guard
    cannot bound it, so these builds exercise the per-loop rules on their own."""
    return re.sub(r"(KERNEL void \w+\([^)]*\)\s*\{)", r"\1\n    while (0) {}", src)


@pytest.fixture(scope="module")
def def_builds() -> dict:
    src = _per_loop(DEF_SRC)
    return {n: (runtime.compile(src, n), runtime.compile(src, n, hoist=False)) for n in DEF_NAMES}


def _section(src: str, name: str, nxt: str) -> str:
    return src[src.index(f" {name}(rt_block"):src.index(nxt)]


def test_body_offsets_fold_the_nest_into_one_guard(def_builds) -> None:
    src = readable(def_builds["quad"][0].c_source)
    quad = _section(src, "quad", "capqr_entry")
    # the outer loads and the inner nest are covered before the q loop ...
    assert "rt_uload_f32(x, a0 + c)" in quad and "rt_uload_f32(x, a1 + c)" in quad
    assert "rt_range2_hull_ok" in quad  # a0 + j and a1 + j: one stride pair, one check
    # ... so the fast copy of the nest evaluates no guard per q iteration: every
    # range guard of the function is in the one condition before the loop, or
    # in the checked copy (the inner loop's own versioning, kept there)
    fast_cond = quad[quad.index("if ("):quad.index("{", quad.index("if ("))]
    assert fast_cond.count("rt_range2_hull_ok(") == 2 and fast_cond.count("rt_range_hull_ok(") == 1
    for name in ("redef", "moving"):
        body = _section(readable(def_builds[name][0].c_source), name, "capqr_entry")
        assert "rt_range2_" not in body, name  # a0 changes in the body: no expansion
    narrow = _section(readable(def_builds["narrow"][0].c_source), "narrow", "capqr_entry")
    assert "rt_range2_" not in narrow  # int arithmetic wraps mod 2^32: not expanded


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(DEF_NAMES), n=st.integers(0, 48), nq=st.integers(-1, 6),
       r=st.one_of(small, big), ld=st.one_of(st.integers(-12, 12), st.sampled_from(
           [2**61, 2**62, -(2**62), 2**63 - 1, 2**31, 2**32 + 1])),
       j0=st.one_of(small, big), cj=count, c=st.one_of(small, big))
def test_body_offsets_equal_checked(def_builds, name, n, nq, r, ld, j0, cj, c) -> None:
    hoisted, plain = def_builds[name]
    args = (nq, r, ld, j0, _bounds(j0, cj), c)
    _assert_same(hoisted, plain, n, args)


def test_planted_write_past_the_end_through_a_body_offset(def_builds) -> None:
    """Row quads over a 6 x 8 buffer, the last row one past the end: the fast
    copy must not run (it would write the 16 floats after the buffer, which
    _run's canaries check); the checked copy faults at the first index past it."""
    for k in def_builds["quad"]:
        fault, _ = _run(k, 48, (3, 1, 8, 0, 8, 0))  # rows 1..6 of 8 floats: 48 is past
        assert fault is not None and fault[0] == "out-of-bounds" and fault[1] == 48


# Nest guards: one interval check before a nest of depth >= 2 (triangular
# bounds, bounds computed in the body with min/max ternaries, accesses under
# a condition that narrows a counter, downward loops, ragged last chunks,
# int arithmetic that must not wrap).  The fully checked build is the oracle.
NEST_GUARD_SRC = """
KERNEL void tri_min(cap_t x, int64_t rows, int64_t jb, int64_t ld, int64_t off, int64_t c)
{
    float w[8][8];
    for (int r = 0; r < 8; r++)
        for (int l = 0; l < 8; l++)
            w[r][l] = 0.0f;
    for (int64_t t = 0; t < rows; t++) {
        int64_t pe = t < jb ? t : jb;
        int64_t rc = t * ld + off;
        for (int64_t p = 0; p < pe; p++) {
            float v = cap_load_f32(x, rc + p);
            for (int l = 0; l < 8; l++)
                w[p][l] = w[p][l] + v;
        }
        if (t < jb) {
            for (int l = 0; l < 8; l++)
                w[t][l] = w[t][l] + 1.0f;
        }
    }
    for (int r = 0; r < 6; r++)
        for (int l = 0; l < 8; l++)
            cap_store_f32(x, r * 8 + l + c, w[r][l]);
}

KERNEL void down(cap_t x, int64_t n, int64_t s, int64_t ld, int64_t off, int64_t c)
{
    for (int64_t p = n - 1; p >= s; p--) {
        for (int64_t q = 0; q < p; q++) {
            for (int l = 0; l < 4; l++)
                cap_store_f32(x, p * ld + q * 4 + l + off, cap_load_f32(x, q + c) + 1.0f);
        }
    }
}

KERNEL void ragged(cap_t x, int64_t nc, int64_t mr, int64_t ld, int64_t off, int64_t c)
{
    float buf[16];
    for (int64_t c0 = 0; c0 < nc; c0 += 16) {
        int64_t cw = nc - c0 < 16 ? nc - c0 : 16;
        for (int64_t t = 0; t < mr; t++) {
            int64_t rc = t * ld + c0 + off;
            for (int l = 0; l < 16; l++)
                buf[l] = l < cw ? cap_load_f32(x, rc + l) : 0.0f;
            for (int l = 0; l < cw; l++)
                cap_store_f32(x, rc + l, buf[l] * 2.0f + (float)c);
        }
    }
}

KERNEL void wrap32(cap_t x, int64_t n, int64_t a, int64_t b, int64_t off, int64_t c)
{
    int ia = (int)a;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++)
                cap_store_f32(x, (int64_t)(i * ia + j * k) + off, 1.0f);
}

KERNEL void tri_store(cap_t x, int64_t rows, int64_t jb, int64_t ld, int64_t off, int64_t c)
{
    for (int64_t t = 0; t < rows; t++) {
        int64_t pe = t < jb ? t : jb;
        for (int64_t p = 0; p < pe; p++)
            for (int l = 0; l < 4; l++)
                cap_store_f32(x, t * ld + p * 4 + l + off, 1.0f);
    }
}
"""
NEST_GUARD_SRC += """
KERNEL void groups(cap_t x, int64_t nn, int64_t p, int64_t ld, int64_t off, int64_t c)
{
    for (int64_t j = 0; j < nn; j++) {
        int64_t na = nn - j;
        int64_t pa = p / na;
        int64_t ga = pa < 1 ? 1 : (pa < 4 ? pa : 4);
        for (int64_t r = j + p % na; r < nn; r += ga)
            for (int l = 0; l < 2; l++)
                cap_store_f32(x, r * ld + p % na + l + off, 1.0f);
    }
}
"""
# (groups: a divisor and a step that change with j, bounded over all columns)
NEST_GUARD_NAMES = ["tri_min", "down", "ragged", "wrap32", "tri_store", "groups"]


@pytest.fixture(scope="module")
def nest_guard_builds() -> dict:
    src = _per_loop(NEST_GUARD_SRC)
    return {n: (runtime.compile(src, n), runtime.compile(src, n, hoist=False))
            for n in NEST_GUARD_NAMES}


def test_nests_get_one_interval_guard(nest_guard_builds) -> None:
    for name in NEST_GUARD_NAMES:
        src = readable(nest_guard_builds[name][0].c_source)
        body = src[src.index(f" {name}(rt_block"):]
        body = body[:body.index("\n}\n")]
        # a nest guard before the nest, and a fast copy without checked accesses
        assert "_ok = 1;" in body and "rt_ustore_f32" in body, name
    # the side table lists the nest with its guard terms and covered accesses
    import copy

    from capqr.runtime.compiler.hoist import hoist_function
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    v = verify(parse(_per_loop(NEST_GUARD_SRC)))
    fn = copy.deepcopy(v.parsed.funcs["tri_min"])
    table = hoist_function(fn, v.local_arrays["tri_min"])
    assert any(len(plan.covered) >= 5 and plan.guards for plan in table.loops)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NEST_GUARD_NAMES), n=st.integers(0, 64), p0=st.integers(-2, 10),
       p1=st.integers(-3, 12), ld=st.one_of(st.integers(-12, 12), st.sampled_from(
           [2**61, -(2**62), 2**63 - 1, 2**30, 2**31 - 1, 2**32 + 1])),
       off=st.one_of(small, big), c=st.one_of(small, st.integers(-(2**40), 2**40)))
def test_nest_guards_equal_checked(nest_guard_builds, name, n, p0, p1, ld, off, c) -> None:
    hoisted, plain = nest_guard_builds[name]
    if name == "ragged":
        p0 = max(p0, 0) * 5  # columns: up to three chunks, the last one ragged
    args = (p0, p1, ld, off, c)
    _assert_same(hoisted, plain, n, args)


def test_planted_write_past_the_end_in_a_triangular_nest(nest_guard_builds) -> None:
    """Rows t < 6 store p < min(t, 3) quads of 4 floats at 7*t + 4*p + 2: the last
    store lands at 48, one past a 48-float buffer.  pe = min(t, jb) reaches jb
    on the last rows; an interval that missed it would let the fast copy write
    the canary after the buffer."""
    for k in nest_guard_builds["tri_store"]:
        fault, _ = _run(k, 48, (6, 3, 7, 2, 0))
        assert fault is not None and fault[0] == "out-of-bounds" and fault[1] == 48
        assert fault[2] == "store"
    for k in nest_guard_builds["tri_store"]:  # one row less: in bounds, no fault
        assert _run(k, 48, (5, 3, 7, 2, 0))[0] is None


# Whole-body guards: a function whose every access interval bounds cover gets
# one guard at entry (the same kernels as above, without the while loop).
@pytest.fixture(scope="module")
def whole_builds() -> dict:
    out = {}
    for src, names in ((DEF_SRC, DEF_NAMES), (NEST_GUARD_SRC, NEST_GUARD_NAMES)):
        for n in names:
            out[n] = (runtime.compile(src, n), runtime.compile(src, n, hoist=False))
    return out


def test_whole_body_guard_at_entry(whole_builds) -> None:
    for name in ("quad", "tri_min", "down", "ragged", "tri_store"):
        src = readable(whole_builds[name][0].c_source)
        body = src[src.index(f" {name}(rt_block"):]
        body = body[body.index("{") + 1:]
        # the guard comes first (after the local arrays, which both copies share)
        before = body[:body.index("int __n1_ok = 1;")]
        assert all(re.fullmatch(r"float \w+(\[\d+\])+;", d.strip())
                   for d in before.strip().splitlines()), name
        assert "while (0)" not in body
    for name in ("redef", "moving"):  # a0 / base change in the body: no bound at entry
        src = readable(whole_builds[name][0].c_source)
        body = src[src.index(f" {name}(rt_block"):]
        assert "int __n1_ok = 1;" not in body[:200], name


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(DEF_NAMES + NEST_GUARD_NAMES), n=st.integers(0, 64),
       p0=st.integers(-2, 10), p1=st.integers(-3, 12),
       ld=st.one_of(st.integers(-12, 12), st.sampled_from(
           [2**61, -(2**62), 2**63 - 1, 2**30, 2**31 - 1, 2**32 + 1])),
       off=st.one_of(small, big), c=st.one_of(small, st.integers(-(2**40), 2**40)))
def test_whole_body_guards_equal_checked(whole_builds, name, n, p0, p1, ld, off, c) -> None:
    hoisted, plain = whole_builds[name]
    if name == "ragged":
        p0 = max(p0, 0) * 5
    args = (p0, p1, ld, off, c) if name in NEST_GUARD_NAMES else (
        p0, p1, ld, off, _bounds(off, p1), c)
    _assert_same(hoisted, plain, n, args)


def test_planted_write_past_the_end_behind_a_whole_body_guard(whole_builds) -> None:
    for name, args in (("tri_store", (6, 3, 7, 2, 0)), ("quad", (3, 1, 8, 0, 8, 0))):
        for k in whole_builds[name]:
            fault, _ = _run(k, 48, args)
            assert fault is not None and fault[0] == "out-of-bounds" and fault[1] == 48, name
    for k in whole_builds["tri_store"]:
        assert _run(k, 48, (5, 3, 7, 2, 0))[0] is None


# int (32-bit) counters: the guard substitutes a 64-bit value for the counter,
# so it computes `i * ld` in 64 bits where the loop wraps it at 32.  Each int
# part of an index must stay in int range (rt_irange_ok) or the two disagree:
# with i * ld = 2^31 and off = 1 - 2^31 the guard sees index 1, the loop
# -2^32 + 1.  The three kernels cover a single loop, a folded box and a local
# array subscript.
WRAP32_SRC = """
KERNEL void wrap_loop(cap_t x, int64_t lo64, int64_t hi64, int64_t ld64, int64_t off)
{
    int lo = (int)lo64;
    int hi = (int)hi64;
    int ld = (int)ld64;
    for (int i = lo; i < hi; i++)
        cap_store_f32(x, i * ld + off, 1.0f);
}

KERNEL void wrap_box(cap_t x, int64_t lo64, int64_t hi64, int64_t ld64, int64_t off)
{
    int lo = (int)lo64;
    int hi = (int)hi64;
    int ld = (int)ld64;
    for (int i = lo; i < hi; i++)
        for (int j = 0; j < 2; j++)
            cap_store_f32(x, (i * ld + j * 3) + off, 2.0f);
}

KERNEL void wrap_local(cap_t x, int64_t lo64, int64_t hi64, int64_t ld64, int64_t off)
{
    float w[16];
    int lo = (int)lo64;
    int hi = (int)hi64;
    int ld = (int)ld64;
    for (int k = 0; k < 16; k++)
        w[k] = 0.0f;
    for (int i = lo; i < hi; i++)
        w[i * ld + off] = 3.0f;
    for (int k = 0; k < 16; k++)
        cap_store_f32(x, k, w[k]);
}

KERNEL void wrap_unsigned(cap_t x, int64_t lo64, int64_t hi64, int64_t ld64, int64_t off)
{
    int lo = (int)lo64;
    int hi = (int)hi64;
    unsigned ld = (unsigned)ld64;
    for (int i = lo; i < hi; i++)
        cap_store_f32(x, i * ld + off, 4.0f);
}
"""
WRAP32_NAMES = ["wrap_loop", "wrap_box", "wrap_local", "wrap_unsigned"]
WRAP32_CHILD = """
import sys
import numpy as np
from capqr import capabilities, runtime
from tests.test_hoist import WRAP32_SRC
k = runtime.compile(WRAP32_SRC, sys.argv[1])
buf = np.zeros(16, np.float32)
try:
    runtime.launch(k, [capabilities.wrap(buf, name="x")],
                   args=(2**30, 2**30 + 2, 2, 1 - 2**31), timeout=20)
    print("no fault")
except runtime.CapabilityFault as e:
    print(e.reason, e.index)
"""


@pytest.fixture(scope="module")
def wrap32_builds() -> dict:
    return {n: (runtime.compile(WRAP32_SRC, n), runtime.compile(WRAP32_SRC, n, hoist=False))
            for n in WRAP32_NAMES}


def test_int_parts_of_indices_are_range_checked(wrap32_builds) -> None:
    assert "rt_irange_ok" in wrap32_builds["wrap_loop"][0].c_source
    assert "rt_irange2_ok" in wrap32_builds["wrap_box"][0].c_source
    assert "rt_irange_ok" in wrap32_builds["wrap_local"][0].c_source
    # an unsigned part wraps mod 2^32 whatever its int range: the store stays checked
    src = readable(wrap32_builds["wrap_unsigned"][0].c_source)
    src = src[src.index(" wrap_unsigned(rt_block"):]
    assert "rt_ustore_f32(x, (i * ld)" not in src and "rt_store_f32(__rt, x, (i * ld)" in src


@pytest.mark.parametrize("name", WRAP32_NAMES[:3])
def test_planted_int_wrap_faults_instead_of_landing(name) -> None:
    """In a child process: before rt_irange_ok the fast copy ran and the store
    landed 16 GiB before the buffer (SIGSEGV, exit -11) for the first three."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", WRAP32_CHILD, name], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = "local-array" if name == "wrap_local" else "out-of-bounds"
    assert proc.stdout.split()[-2:] == [want, str(1 - 2**31 - 2**31)], proc.stdout


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(WRAP32_NAMES),
       lo=st.one_of(st.integers(-6, 6), st.integers(2**30 - 4, 2**30 + 4),
                    st.integers(2**31 - 6, 2**31 - 1), st.integers(-(2**31), -(2**31) + 4)),
       count=st.integers(0, 5), ld=st.sampled_from([0, 1, 2, 3, -1, -2, 2**16, 2**31 - 1]),
       off=st.one_of(st.integers(-4, 20), st.integers(-(2**31) - 8, -(2**31) + 20),
                     st.integers(2**31 - 20, 2**31 + 8), st.integers(2**32 - 8, 2**32 + 8)))
def test_int_counter_indices_equal_checked(wrap32_builds, name, lo, count, ld, off) -> None:
    hoisted, plain = wrap32_builds[name]
    args = (lo, min(lo + count, 2**31 - 1), ld, off)
    _assert_same(hoisted, plain, 16, args)


# Whole-body guards over values fixed at entry: a block index, caps derived from
# a parameter by one offset (and their aliases), divisions and remainders by a
# symbolic divisor, a step the body computes.
DERIVED_SRC = """
KERNEL void derived(cap_t x, int64_t nr, int64_t ld, int64_t off, int64_t cnt)
{
    int64_t b = rt_block_idx();
    cap_t M = cap_offset_f32(x, b * ld + off);
    cap_t P = M;
    int64_t q = (cnt + nr - 1) / nr;
    int64_t st = (nr % 3 + 3) % 3 + 1;
    for (int64_t i = 0; i < q; i += st)
        for (int64_t j = 0; j < 2; j++)
            cap_store_f32(P, i * 2 + j + cnt % nr, cap_load_f32(x, j) + 1.0f);
}
"""


@pytest.fixture(scope="module")
def derived_builds() -> tuple:
    return (runtime.compile(DERIVED_SRC, "derived"),
            runtime.compile(DERIVED_SRC, "derived", hoist=False))


def test_whole_body_guard_over_derived_caps(derived_builds) -> None:
    src = readable(derived_builds[0].c_source)
    body = src[src.index(" derived(rt_block"):]
    assert "int __n1_ok = 1;" in body[:300]
    assert "rt_range_ok(rt_offset(x," in body  # the guard checks P through M's offset


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 48), nr=st.integers(-3, 9), ld=st.integers(-4, 4),
       off=st.one_of(small, st.sampled_from([2**62, -(2**62), 2**63 - 1])),
       cnt=st.one_of(st.integers(-5, 40), st.sampled_from([2**62, -(2**63)])))
def test_derived_whole_body_equals_checked(derived_builds, n, nr, ld, off, cnt) -> None:
    hoisted, plain = derived_builds
    _assert_same(hoisted, plain, n, (nr, ld, off, cnt))


def test_planted_write_past_the_end_through_a_derived_cap(derived_builds) -> None:
    """q = ceil(20/4) = 5 rows of 2 at offset 4 + 20 % 4 = 4: the last store is at
    4 + 2*4 + 1 = 13 of a 13-float buffer, one past the end."""
    for k in derived_builds:
        fault, _ = _run(k, 13, (4, 0, 4, 20))
        assert fault is not None and fault[0] == "out-of-bounds" and fault[1] == 9
        assert _run(k, 14, (4, 0, 4, 20))[0] is None


def test_nested_quiet_loops_need_no_poll_after_themselves() -> None:
    """A short leaf loop's quiet copy polls once after itself only at the top of a
    function; inside another loop, that loop's per-iteration pollcheck bounds the
    time between two polls already."""
    src = """
KERNEL void k(cap_t x, int64_t n, int64_t m)
{
    for (int64_t i = 0; i < m; i++)
        cap_store_f32(x, i, 0.0f);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < m; i++)
            cap_store_f32(x, r * m + i, 1.0f);
        if (r == 7)
            m = m - 1;
    }
}
"""
    text = readable(runtime.compile(src, "k").c_source)
    body = text[text.index(" k(rt_block"):]
    quiet = re.findall(r"for \(int64_t i = 0; i < m; i\+\+\)\s*\{\s*rt_ustore_f32\([^;]*;\s*\}\s*"
                       r"(rt_pollcheck\(__rt\);)?", body)
    assert len(quiet) >= 2, body
    assert quiet[0] == "rt_pollcheck(__rt);"  # top level: polls after itself
    assert all(q == "" for q in quiet[1:]), body  # nested: the r loop polls
    assert "rt_pollcheck(__rt);" in body[body.index("for (int64_t r = 0"):][:200]


CONSTANT_SHORT = """
KERNEL void cs(cap_t out, int64_t n, int64_t kt)
{
    float w[64];
    for (int64_t i = 0; i < 64; i++)
        w[i] = (float)i;
    float s = 0.0f;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t k = 0; k < 64; k++) {
            if (k >= kt)
                break;
            s = fmaf(w[k], 0.5f, s);
        }
    }
    cap_store_f32(out, 0, s);
}
"""


def test_constant_short_loops_with_nothing_to_guard_compile_once() -> None:
    """An innermost loop with literal bounds whose subscripts are all proved in range
    has no polling or checked copy to fall back to: both tests that would pick one
    hold at compile time.  Its quiet copy is the only one; it polls after itself at
    the top of a function, and inside a loop that loop polls each iteration."""
    text = readable(runtime.compile(CONSTANT_SHORT, "cs").c_source)
    body = text[text.index(" cs(rt_block"):]
    # once per copy of the whole body (its entry guard keeps a checked one)
    bodies = body.count("float s = 0.0f;")
    assert bodies in (1, 2), body
    assert body.count("w[k]") == bodies, body
    assert body.count("w[i] = (float) i") == bodies, body
    top = body.index("for (int64_t i = 0; i < 64; i++)")
    assert "rt_pollcheck(__rt);" in body[top:top + 200], body   # polls after itself
    outer = body.index("for (int64_t r = 0; r < n; r++)")
    inner = body.index("for (int64_t k = 0; k < 64; k++)")
    assert "rt_pollcheck(__rt);" in body[outer:inner], body     # the r loop polls
    x = capabilities.alloc(1, np.float32, name="out")
    runtime.launch(runtime.compile(CONSTANT_SHORT, "cs"), [x], args=(3, 10))
    assert x.numpy()[0] == 3 * sum(0.5 * k for k in range(10))


def test_a_nest_of_constant_short_loops_still_answers_a_timeout() -> None:
    """The outer loop's pollcheck is what ends a long run of constant short loops."""
    k = runtime.compile(CONSTANT_SHORT, "cs")
    x = capabilities.alloc(1, np.float32, name="out")
    with pytest.raises(runtime.KernelTimeout):
        runtime.launch(k, [x], args=(1 << 40, 64), timeout=0.3)


WARP_LOOP = """
KERNEL void rot(cap_t x, cap_t out, int64_t n, int64_t far)
{
    int64_t t = rt_thread_idx();
    int64_t f = t == 7 ? far : 0;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = cap_load_f32(x, i * 32 + t);
        if (v > 1e30f)
            v = cap_load_f32(x, i * 32 + t + f);
        s += rt_shfl_idx_f32(v, (t + 1) % 32);
    }
    cap_store_f32(out, t, s);
}
"""


def test_gpu_loops_with_warp_collectives_are_versioned_under_a_warp_vote() -> None:
    """A shuffle in a loop no longer keeps every access checked: the loop is versioned,
    and the copy is chosen by a vote of the whole warp (rt_warp_all), so lanes whose
    guards differ still run the same copy and meet at the same shuffle
    (tests/test_gpu_builtins.py runs it).  A loop with a block barrier is duplicated
    only under a vote of the whole block on one cover guard taken before it."""
    from capqr.runtime.cuda import translate

    body = readable(translate(WARP_LOOP, checked=True).text).split("void __rtk_rot(", 1)[1]
    assert re.search(r"if \(rt_warp_all\(\(*__h1_ok", body), body
    assert "rt_uload_f32(x, " in body and "rt_load_f32(x, " in body  # fast and checked copies
    with_barrier = WARP_LOOP.replace("s += rt_shfl", "rt_sync_threads();\n        s += rt_shfl")
    body = readable(translate(with_barrier, checked=True).text).split("void __rtk_rot(", 1)[1]
    assert "rt_warp_all(" not in body and "if (rt_block_all(__rtg1_rot(" in body, body
    assert "rt_uload_f32(x, " in body and "rt_load_f32(x, " in body  # fast and checked copies


# Cover guards (GPU): a loop that waits at a barrier gets one interval guard before it
# for every access of all its iterations, computed by a function of its own, and the
# whole block votes on it: every thread runs the unchecked copy of the loop, or every
# thread the checked one, so barriers stay matched.  The loop below has the panel
# kernels' shapes: rows unrolled by two up to rows - P and a tail from a computed
# start (both bounded by rows itself), a declaration whose initialiser loads, an
# access narrowed by j + 2 < nc, a store only threads t < j make, a shared array.
COVER_SRC = """
KERNEL void cover(cap_t x, cap_t y, int64_t nc, int64_t rows, int64_t ld, int64_t off)
{
    float smem_s[64];
    int64_t t = rt_thread_idx();
    int64_t P = rt_block_dim();
    for (int64_t j = 0; j < nc; j++) {
        float a = cap_load_f32(x, j * ld + off);
        int64_t r1 = j + 1 + t;
        int64_t cnt = r1 < rows ? (rows - r1 + P - 1) / P : 0;
        int64_t rtail = r1 + cnt / 2 * 2 * P;
        float q = 0.0f;
        for (int64_t r = r1; r < rows - P; r += 2 * P)
            q += cap_load_f32(x, r * ld + j + off) + cap_load_f32(x, (r + P) * ld + j + off);
        for (int64_t r = rtail; r < rows; r += P)
            q += cap_load_f32(x, r * ld + j + off);
        if (j + 2 < nc)
            q += cap_load_f32(x, (j + 2) * ld + off);
        smem_s[t] = q + a;
        rt_sync_threads();
        if (t < j)
            cap_store_f32(y, j * 8 + t, smem_s[(t + j) % 64]);
        rt_sync_threads();
    }
}
"""


@pytest.fixture(scope="module")
def cover_builds(tmp_path_factory) -> dict:
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    from emulate_cuda import build
    from test_gpu_checks import _count_covers

    d = tmp_path_factory.mktemp("emu_cover")
    return {"cover": build(COVER_SRC, workdir=d, edit=_count_covers)["cover"],
            "checked": build(COVER_SRC, workdir=d, hoist=False)["cover"]}


def _cover_run(k, block: int, args: tuple) -> tuple:
    x = np.arange(200, dtype=np.float32) / 7
    y = np.zeros(64, np.float32)
    fault = k.launch([x, y, *args], 1, block)
    if fault is not None:
        fault = {f: fault[f] for f in ("kind", "access", "line", "index", "slot")}
    return fault, x.tobytes(), y.tobytes()


def test_loops_with_barriers_get_one_cover_guard(cover_builds) -> None:
    """A fast and a checked copy of the loop, chosen by the block's vote on one cover
    guard, which holds on the emulated lane for in-range arguments (8 threads, so
    threads differ in rows and in the t < j store) and leaves the bits of the fully
    checked build."""
    from capqr.runtime.cuda import translate

    text = readable(translate(COVER_SRC).text)
    assert "__noinline__ int __rtg1_cover(" in text
    body = text.split("void __rtk_cover(", 1)[1]
    assert body.count("for (long long j = 0;") == 2
    assert "if (rt_block_all(__rtg1_cover(" in body and "float a = rt_uload_f32(x, " in body
    k = cover_builds["cover"]
    import emulate_cuda

    emulate_cuda._ffi.cdef("long long capqr_emu_covers(int failed);", override=True)
    before = k.lib.capqr_emu_covers(0), k.lib.capqr_emu_covers(1)
    # (8, 8, 25, 0): (j + 2) * ld lies in x only because j + 2 < nc narrows j;
    # (6, 5, 30, 3): threads t >= 4 have no rows, their row intervals come out empty
    for args in ((6, 20, 9, 3), (8, 17, 10, 0), (8, 8, 25, 0), (6, 5, 30, 3), (0, 5, 9, 0),
                 (4, 0, 9, 0)):
        assert _cover_run(k, 8, args) == _cover_run(cover_builds["checked"], 8, args)
        assert _cover_run(k, 8, args)[0] is None
    assert k.lib.capqr_emu_covers(0) > before[0] and k.lib.capqr_emu_covers(1) == before[1]


def test_cover_guards_run_short_loops_quiet(cover_builds) -> None:
    """In the covered copy the row loops are their quiet copies alone: no span, no
    short-trip test and no poll of their own on each entry (the loop around them polls
    every column).  The cover guard requires that they are short, from their counters'
    intervals: rows that give a thread more iterations than a quiet loop may run make
    it fail, and the checked copy (which decides per loop, polling) runs instead, with
    the same bits."""
    from capqr.runtime.cuda import translate

    body = readable(translate(COVER_SRC).text).split("void __rtk_cover(", 1)[1]
    fast = body.split("if (rt_block_all(__rtg1_cover(", 1)[1].split("\n    else\n", 1)[0]
    assert fast.count("for (long long r = ") == 2, fast
    assert "rt_loop_span" not in fast and fast.count("RT_POLL") == 1, fast
    k = cover_builds["cover"]
    import emulate_cuda

    emulate_cuda._ffi.cdef("long long capqr_emu_covers(int failed);", override=True)
    # one thread: the unrolled loop runs rows / 2 iterations, its tail's interval spans
    # rows; a quiet loop may run 65536 (polls.SHORT_TRIP)
    for rows, holds in ((50_000, True), (300_000, False)):
        before = k.lib.capqr_emu_covers(0), k.lib.capqr_emu_covers(1)
        args = (2, rows, 0, 0)
        assert _cover_run(k, 1, args) == _cover_run(cover_builds["checked"], 1, args)
        after = k.lib.capqr_emu_covers(0), k.lib.capqr_emu_covers(1)
        # (evaluated, failed)
        assert (after[0] - before[0], after[1] - before[1]) == (1, 0 if holds else 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nc=st.integers(-1, 10), rows=st.integers(-3, 30),
       ld=st.one_of(st.integers(-12, 12), st.sampled_from([2**61, -(2**62), 2**63 - 1, 2**31])),
       off=st.one_of(st.integers(-40, 200), st.sampled_from([2**62, -(2**63), 2**63 - 1])))
def test_cover_guards_equal_checked(cover_builds, nc, rows, ld, off) -> None:
    """One thread (its fault is the launch's first): the covered build faults where the
    fully checked one does, at the same access and index, and leaves the same bits."""
    args = (nc, rows, ld, off)
    assert _cover_run(cover_builds["cover"], 1, args) == _cover_run(cover_builds["checked"], 1,
                                                                     args)


def test_guard_bounds_print_the_int64_extremes() -> None:
    """The guards compare with -2^63 (a downward loop's last step must not pass it),
    which C can only write as an expression: it must print as that value."""
    from capqr.runtime.compiler.hoist.nest_guard import _I64_MAX, _I64_MIN, NestGuard
    from pycparser import c_generator

    gen = c_generator.CGenerator()
    for v in (_I64_MIN, _I64_MAX, -5, 0, 7):
        assert eval(gen.visit(NestGuard._node(v))) == v
