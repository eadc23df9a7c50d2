"""Planted bugs are caught, and the refused access did not happen.

Every victim buffer is the middle of a bigger numpy array filled with a random
byte pattern (``capabilities.wrap(big[G:-G])`` is zero-copy), so the guard
regions are the real bytes next to the victim.  After each fault: the guards
are byte-identical, and every victim element is either unchanged or holds a
value that an *in-bounds* store of the kernel may legitimately have written
before the fault.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import CapabilityFault

GUARD = 16  # elements of canary on each side of the victim

DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i32": np.int32,
          "i64": np.int64}
SIZES = {"f16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8}


class Canary:
    """A victim buffer flanked by random guard bytes that nothing may touch."""

    def __init__(self, n: int, dtype, *, perms: str = "rw", name: str = "victim", seed: int = 0):
        itemsize = np.dtype(dtype).itemsize
        rng = np.random.default_rng(seed)
        raw = rng.integers(0, 256, (n + 2 * GUARD) * itemsize, dtype=np.uint8)
        self.big = raw.view(dtype)
        if np.dtype(dtype).kind == "f":  # finite values in the victim, random bytes around
            self.big[GUARD:GUARD + n] = rng.uniform(-100, 100, n).astype(dtype)
        self.orig = self.big.copy()
        self.n = n
        self.cap = capabilities.wrap(self.big[GUARD:GUARD + n], perms=perms, name=name)

    @property
    def victim(self) -> np.ndarray:
        return self.big[GUARD:GUARD + self.n]

    def assert_guards_intact(self) -> None:
        b, o = self.big.view(np.uint8), self.orig.view(np.uint8)
        g = GUARD * self.big.itemsize
        assert b[:g].tobytes() == o[:g].tobytes(), "guard before the victim changed"
        assert b[-g:].tobytes() == o[-g:].tobytes(), "guard after the victim changed"

    def assert_victim_unchanged(self) -> None:
        assert self.victim.tobytes() == self.orig[GUARD:GUARD + self.n].tobytes()

    def assert_victim_each(self, allowed) -> None:
        """Each victim element is unchanged or equal to allowed[i]."""
        old = self.orig[GUARD:GUARD + self.n]
        cur = self.victim
        ok = (cur.view(np.uint8).reshape(self.n, -1) == old.view(np.uint8).reshape(self.n, -1))
        ok = ok.all(axis=1) | (cur == np.asarray(allowed, dtype=cur.dtype))
        assert ok.all(), f"victim elements changed unexpectedly at {np.nonzero(~ok)[0]}"


def fault_of(kernel, caps, **kw) -> CapabilityFault:
    with pytest.raises(CapabilityFault) as ei:
        runtime.launch(kernel, caps, **kw)
    return ei.value


# ---------------------------------------------------------------------------
# off-by-one, negative and huge indices

OFF_BY_ONE = """
KERNEL void obo_{t}(cap_t x, int64_t n)
{{
    for (int64_t i = 0; i <= n; i++) cap_store_{t}(x, i, 3);
}}
"""

OFF_BY_ONE_LOAD = """
KERNEL void obol_{t}(cap_t x, cap_t out, int64_t n)
{{
    double s = 0;
    for (int64_t i = 0; i <= n; i++) s += cap_load_{t}(x, i);
    cap_store_f64(out, 0, s);
}}
"""

STORE_AT = """
KERNEL void st_{t}(cap_t x, int64_t i)
{{
    cap_store_{t}(x, i, 7);
}}
"""

LOAD_AT = """
KERNEL void ld_{t}(cap_t x, cap_t out, int64_t i)
{{
    cap_store_f64(out, 0, (double)cap_load_{t}(x, i));
}}
"""


def _k(template: str, t: str, prefix: str):
    return runtime.compile(template.format(t=t), f"{prefix}_{t}")


@pytest.mark.parametrize("t", sorted(DTYPES))
def test_off_by_one_store_loop(t):
    """`i <= n`: the store at n is refused; elements 0..n-1 may hold 3 (stores before it)."""
    c = Canary(10, DTYPES[t], seed=1)
    f = fault_of(_k(OFF_BY_ONE, t, "obo"), [c.cap], args=(10,), grid=3)
    assert (f.reason, f.access, f.index, f.buffer, f.kernel) == (
        "out-of-bounds", "store", 10, "victim", f"obo_{t}")
    assert f.line == 4 and 0 <= f.block < 3
    c.assert_guards_intact()
    c.assert_victim_each(np.full(10, 3))


@pytest.mark.parametrize("t", ["f32", "i64"])
def test_off_by_one_load_loop(t):
    """The sum reads one element past the end: the load faults and nothing is stored."""
    c = Canary(9, DTYPES[t], seed=2)
    out = capabilities.wrap(np.full(1, -5.0))
    f = fault_of(_k(OFF_BY_ONE_LOAD, t, "obol"), [c.cap, out], args=(9,))
    assert (f.reason, f.access, f.index) == ("out-of-bounds", "load", 9)
    assert out.numpy()[0] == -5.0
    c.assert_guards_intact()
    c.assert_victim_unchanged()


@pytest.mark.parametrize("t", sorted(DTYPES))
@pytest.mark.parametrize("idx", [-1, -2, -GUARD, -(2**31), -(2**58) - 1, -(2**63)])
def test_negative_index_store(t, idx):
    c = Canary(8, DTYPES[t], seed=3)
    f = fault_of(_k(STORE_AT, t, "st"), [c.cap], args=(idx,))
    assert (f.reason, f.access, f.index) == ("out-of-bounds", "store", idx)
    c.assert_guards_intact()
    c.assert_victim_unchanged()


def _wrapping_indices(size: int) -> list[int]:
    """Indices whose byte offset i*size wraps mod 2**64 back into [0, 8 elements)."""
    per_wrap = 2**64 // size
    out = [2**61, 2**62 + 1, 2**63 - 1, 2**58, 2**58 + 3, -(2**63)]
    for k in (1, 2, 3):
        for j in (0, 1, 5):
            if k * per_wrap + j < 2**63:
                out.append(k * per_wrap + j)
            if -k * per_wrap + j >= -(2**63):
                out.append(-k * per_wrap + j)
    return sorted(set(out))


@pytest.mark.parametrize("t", sorted(DTYPES))
def test_huge_index_that_wraps_into_the_buffer_faults(t):
    """i * sizeof(T) overflows to a small in-bounds offset: must still be refused."""
    c = Canary(8, DTYPES[t], seed=4)
    k = _k(STORE_AT, t, "st")
    for idx in _wrapping_indices(SIZES[t]):
        f = fault_of(k, [c.cap], args=(idx,))
        assert (f.reason, f.access, f.index) == ("out-of-bounds", "store", idx), idx
        c.assert_guards_intact()
        c.assert_victim_unchanged()


@pytest.mark.parametrize("t", ["f16", "f64", "i32"])
def test_huge_index_load_faults(t):
    c = Canary(8, DTYPES[t], seed=5)
    out = capabilities.wrap(np.full(1, -5.0))
    k = _k(LOAD_AT, t, "ld")
    for idx in _wrapping_indices(SIZES[t]) + [8, -1]:
        f = fault_of(k, [c.cap, out], args=(idx,))
        assert (f.reason, f.access, f.index) == ("out-of-bounds", "load", idx)
        assert out.numpy()[0] == -5.0
    c.assert_guards_intact()


def test_wrapping_stride_in_a_counted_loop_faults():
    """Hoistable loop x[i*k], i < 4, k = 2/3 mod 2**64: both ends (0 and 2) are in bounds
    but i = 1 is not; the checks must not be fooled by the wrap."""
    k_stride = (2 * pow(3, -1, 2**64)) % 2**64
    k_stride -= 2**64 if k_stride >= 2**63 else 0
    assert (3 * k_stride) % 2**64 == 2
    src = """
KERNEL void stride(cap_t x, int64_t n, int64_t k)
{
    for (int64_t i = 0; i < n; i++) cap_store_f64(x, i * k, 1.0);
}"""
    c = Canary(8, np.float64, seed=6)
    f = fault_of(runtime.compile(src, "stride"), [c.cap], args=(4, k_stride))
    assert (f.reason, f.index) == ("out-of-bounds", k_stride)
    c.assert_guards_intact()
    c.assert_victim_each([1.0] + [np.nan] * 7)  # only x[0] (i = 0) may have been written


# ---------------------------------------------------------------------------
# read-only capabilities

STORE_FIRST = """
KERNEL void store_first(cap_t x, int64_t i)
{
    cap_store_f64(x, i, 99.0);
}
"""


@pytest.mark.parametrize("idx", [0, 5, 7])
def test_store_through_readonly_wrap(idx):
    c = Canary(8, np.float64, perms="r", name="ro", seed=7)
    f = fault_of(runtime.compile(STORE_FIRST, "store_first"), [c.cap], args=(idx,))
    assert (f.reason, f.access, f.index, f.buffer) == ("read-only", "store", idx, "ro")
    c.assert_guards_intact()
    c.assert_victim_unchanged()


def test_store_through_readonly_alloc():
    c = capabilities.alloc(8, np.float64, perms="r", name="ro_alloc")
    f = fault_of(runtime.compile(STORE_FIRST, "store_first"), [c], args=(3,))
    assert (f.reason, f.buffer) == ("read-only", "ro_alloc")
    assert not c.numpy().any()


def test_readonly_cap_moved_by_offset_stays_readonly():
    src = """
KERNEL void ro_off(cap_t x)
{
    cap_t y = cap_offset_f64(x, 3);
    cap_store_f64(y, 1, 5.0);
}"""
    c = Canary(8, np.float64, perms="r", seed=8)
    f = fault_of(runtime.compile(src, "ro_off"), [c.cap])
    assert f.reason == "read-only" and f.index == 1
    c.assert_guards_intact()
    c.assert_victim_unchanged()


# ---------------------------------------------------------------------------
# use after free

PUT_SRC = """
KERNEL void put(cap_t table, cap_t x)
{
    cap_store_cap(table, 0, x);
}
"""

GET_STORE_SRC = """
KERNEL void get_store(cap_t table)
{
    cap_t c = cap_load_cap(table, 0);
    cap_store_f64(c, 2, 11.0);
}
"""

GET_LOAD_SRC = """
KERNEL void get_load(cap_t table, cap_t out)
{
    cap_t c = cap_load_cap(table, 0);
    cap_store_f64(out, 0, cap_load_f64(c, 2));
}
"""


def test_use_after_free_from_python_launch():
    """free() then launch with it: refused before any block runs."""
    c = Canary(8, np.float64, name="freed_victim", seed=9)
    other = capabilities.wrap(np.zeros(1))
    c.cap.free()
    k = runtime.compile("""
KERNEL void two_uaf(cap_t a, cap_t b)
{
    cap_store_f64(a, 0, 1.0);
    cap_store_f64(b, 0, 1.0);
}""", "two_uaf")
    f = fault_of(k, [other, c.cap])
    assert (f.reason, f.buffer) == ("freed", "freed_victim")
    assert other.numpy()[0] == 0.0
    c.assert_guards_intact()
    c.assert_victim_unchanged()


def test_use_after_free_through_cap_table_store():
    """A cap kept in a cap table outlives free(); a later launch loading it faults "freed"."""
    c = Canary(8, np.float64, name="tabled", seed=10)
    table = capabilities.alloc(1, "cap", name="table")
    runtime.launch(runtime.compile(PUT_SRC, "put"), [table, c.cap])
    get = runtime.compile(GET_STORE_SRC, "get_store")
    runtime.launch(get, [table])  # positive control: live target is writable
    assert c.victim[2] == 11.0
    c.orig[GUARD + 2] = 11.0
    c.cap.free()
    f = fault_of(get, [table])
    assert (f.reason, f.access, f.buffer, f.kernel, f.index) == (
        "freed", "store", "tabled", "get_store", 2)
    c.assert_guards_intact()
    c.assert_victim_unchanged()


def test_use_after_free_through_cap_table_load():
    table = capabilities.alloc(1, "cap")
    x = capabilities.wrap(np.arange(8.0), name="loaded")
    runtime.launch(runtime.compile(PUT_SRC, "put"), [table, x])
    get = runtime.compile(GET_LOAD_SRC, "get_load")
    out = capabilities.wrap(np.zeros(1))
    runtime.launch(get, [table, out])
    assert out.numpy()[0] == 2.0
    x.free()
    out.numpy()[0] = -1.0
    f = fault_of(get, [table, out])
    assert (f.reason, f.access, f.buffer) == ("freed", "load", "loaded")
    assert out.numpy()[0] == -1.0


def test_use_after_free_of_collector_allocated_buffer_via_table():
    """Same as above with an alloc()ed (collector-owned payload) target."""
    table = capabilities.alloc(1, "cap")
    x = capabilities.alloc(8, np.float64, name="owned")
    runtime.launch(runtime.compile(PUT_SRC, "put"), [table, x])
    x.free()
    runtime.gc_collect()  # the payload may go now; the header must still say "freed"
    f = fault_of(runtime.compile(GET_STORE_SRC, "get_store"), [table])
    assert (f.reason, f.buffer) == ("freed", "owned")


# ---------------------------------------------------------------------------
# int -> cap round trips

ROUNDTRIP_STORE = """
KERNEL void roundtrip_store(cap_t x)
{
    cap_t y = cap_from_int(cap_to_int(x));
    cap_store_f64(y, 0, 13.0);
}
"""

ROUNDTRIP_LOAD = """
KERNEL void roundtrip_load(cap_t x, cap_t out)
{
    cap_t y = cap_from_int(cap_to_int(x) + 8);
    cap_store_f64(out, 0, cap_load_f64(y, 0));
}
"""


def test_int_to_cap_round_trip_in_kernel_store():
    c = Canary(4, np.float64, seed=11)
    f = fault_of(runtime.compile(ROUNDTRIP_STORE, "roundtrip_store"), [c.cap])
    assert (f.reason, f.access, f.index, f.kernel) == ("no-bounds", "store", 0, "roundtrip_store")
    c.assert_guards_intact()
    c.assert_victim_unchanged()


def test_int_to_cap_round_trip_in_kernel_load():
    c = Canary(4, np.float64, seed=12)
    out = capabilities.wrap(np.full(1, -3.0))
    f = fault_of(runtime.compile(ROUNDTRIP_LOAD, "roundtrip_load"), [c.cap, out])
    assert (f.reason, f.access) == ("no-bounds", "load")
    assert out.numpy()[0] == -3.0


def test_from_int_on_host_then_launch():
    c = Canary(4, np.float64, seed=13)
    forged = capabilities.from_int(int(c.cap))
    f = fault_of(runtime.compile(STORE_FIRST, "store_first"), [forged], args=(0,))
    assert (f.reason, f.access) == ("no-bounds", "store")
    c.assert_guards_intact()
    c.assert_victim_unchanged()


def test_no_bounds_cap_stays_no_bounds_after_offset():
    src = """
KERNEL void nb_off(cap_t x)
{
    cap_t y = cap_offset_f64(cap_from_int(cap_to_int(x) - 64), 8);
    cap_store_f64(y, 0, 1.0);
}"""
    c = Canary(4, np.float64, seed=14)
    f = fault_of(runtime.compile(src, "nb_off"), [c.cap])
    assert f.reason == "no-bounds"
    c.assert_guards_intact()
    c.assert_victim_unchanged()


# ---------------------------------------------------------------------------
# local arrays

LOCAL_1D = """
KERNEL void local1(cap_t out, int64_t i)
{
    double a[4];
    for (int k = 0; k < 4; k++) a[k] = 1.0;
    a[i] = 2.0;
    cap_store_f64(out, 0, a[0] + a[1] + a[2] + a[3]);
}
"""

LOCAL_2D = """
KERNEL void local2(cap_t out, int64_t i, int64_t j)
{
    float m[2][3];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++) m[r][c] = 0.0f;
    m[i][j] = 1.0f;
    cap_store_f32(out, 0, m[0][0] + m[1][2]);
}
"""

LOCAL_HELPER = """
static double sum_first(int64_t n)
{
    int64_t t[8];
    double s = 0;
    for (int64_t k = 0; k < n; k++) { t[k] = k; s += (double)t[k]; }
    return s;
}
KERNEL void local_helper(cap_t out, int64_t n)
{
    cap_store_f64(out, 0, sum_first(n));
}
"""


@pytest.mark.parametrize("idx", [4, 5, -1, 2**31, 2**62 + 1, -(2**63)])
def test_local_array_overflow(idx):
    out = Canary(1, np.float64, seed=15)
    f = fault_of(runtime.compile(LOCAL_1D, "local1"), [out.cap], args=(idx,))
    assert (f.reason, f.buffer, f.index, f.kernel, f.line) == (
        "local-array", "a", idx, "local1", 6)
    out.assert_guards_intact()
    out.assert_victim_unchanged()


def test_local_array_in_bounds_control():
    out = capabilities.alloc(1, np.float64)
    runtime.launch(runtime.compile(LOCAL_1D, "local1"), [out], args=(3,))
    assert out.numpy()[0] == 5.0


@pytest.mark.parametrize("i,j,bad", [(0, 3, 3), (1, 3, 3), (2, 0, 2), (-1, 0, -1), (0, -1, -1)])
def test_local_2d_array_each_dimension_checked(i, j, bad):
    """m[0][3] is inside the 6-element storage but outside dimension 2: refused."""
    out = capabilities.wrap(np.full(1, -1.0, dtype=np.float32))
    f = fault_of(runtime.compile(LOCAL_2D, "local2"), [out], args=(i, j))
    assert (f.reason, f.buffer, f.index) == ("local-array", "m", bad)
    assert out.numpy()[0] == -1.0


def test_local_array_overflow_in_static_helper():
    out = capabilities.wrap(np.full(1, -1.0))
    k = runtime.compile(LOCAL_HELPER, "local_helper")
    runtime.launch(k, [out], args=(8,))
    assert out.numpy()[0] == 28.0
    out.numpy()[0] = -1.0
    f = fault_of(k, [out], args=(9,))
    assert (f.reason, f.buffer, f.index) == ("local-array", "t", 8)
    assert out.numpy()[0] == -1.0


# ---------------------------------------------------------------------------
# cap_offset beyond the object

OFFSET_SRC = """
KERNEL void off_{t}(cap_t x, int64_t k, int64_t i)
{{
    cap_t y = cap_offset_{t}(x, k);
    cap_store_{t}(y, i, 9);
}}
"""


@pytest.mark.parametrize("t", ["f16", "f64", "i32"])
@pytest.mark.parametrize("k,i", [(8, 0), (100, 0), (-1, 0), (3, 5), (-4, 3), (2**57, 0),
                                 (2**61, 0), (-(2**61), 0)])
def test_offset_beyond_object_then_access(t, k, i):
    """The origin may move anywhere; accesses are still checked against the object."""
    c = Canary(8, DTYPES[t], seed=16)
    f = fault_of(_k(OFFSET_SRC, t, "off"), [c.cap], args=(k, i))
    assert (f.reason, f.access, f.index) == ("out-of-bounds", "store", i)
    c.assert_guards_intact()
    c.assert_victim_unchanged()


@pytest.mark.parametrize("k,i", [(100, -97), (-1, 1), (8, -8), (4, 3)])
def test_offset_back_into_object_is_allowed(k, i):
    """Control: an origin outside the object is fine if the access lands inside it."""
    c = Canary(8, np.float64, seed=17)
    runtime.launch(_k(OFFSET_SRC, "f64", "off"), [c.cap], args=(k, i))
    want = c.orig[GUARD:GUARD + 8].copy()
    want[k + i] = 9
    assert c.victim.tobytes() == want.tobytes()
    c.assert_guards_intact()


@pytest.mark.parametrize("small,big,k", [("f16", "f64", -1), ("f16", "f32", -1),
                                         ("i32", "f64", -1), ("f16", "i64", -3),
                                         ("f32", "f64", 15), ("f16", "f64", 29)])
def test_misaligned_origin_partial_overlap_faults(small, big, k):
    """Origin moved by a smaller element, then a wider access straddles an end of the object."""
    src = f"""
KERNEL void straddle_{small}_{big}(cap_t x, int64_t k)
{{
    cap_t y = cap_offset_{small}(x, k);
    cap_store_{big}(y, 0, 5);
}}"""
    c = Canary(8, np.float64, seed=18)
    f = fault_of(runtime.compile(src, f"straddle_{small}_{big}"), [c.cap], args=(k,))
    assert (f.reason, f.index) == ("out-of-bounds", 0)
    c.assert_guards_intact()
    c.assert_victim_unchanged()


def test_cap_len_of_moved_origin():
    src = """
KERNEL void lens(cap_t x, cap_t out)
{
    cap_store_i64(out, 0, cap_len_f64(x));
    cap_store_i64(out, 1, cap_len_f64(cap_offset_f64(x, 3)));
    cap_store_i64(out, 2, cap_len_f64(cap_offset_f64(x, 20)));
    cap_store_i64(out, 3, cap_len_f64(cap_offset_f64(x, -2)));
    cap_store_i64(out, 4, cap_len_f32(x));
}"""
    out = capabilities.alloc(5, np.int64)
    runtime.launch(runtime.compile(src, "lens"), [capabilities.alloc(8, np.float64), out])
    got = out.numpy().tolist()
    assert got[0] == 8 and got[1] == 5 and got[2] == 0 and got[4] == 16
    assert got[3] in (0, 10)  # a length before the object start is never usable anyway


# ---------------------------------------------------------------------------
# one bad block among many

ONE_BLOCK_SRC = """
KERNEL void one_bad(cap_t x, int64_t n)
{
    int64_t b = rt_block_idx();
    int64_t i = b == 37 ? n + 3 : b;
    cap_store_f64(x, i, (double)b + 1.0);
}
"""

ONE_BLOCK_SPIN_SRC = """
KERNEL void one_bad_spin(cap_t x, int64_t n)
{
    int64_t b = rt_block_idx();
    if (b == 37) cap_store_f64(x, -1, 1.0);
    if (b > 37) {
        for (;;) { }
    }
}
"""


@pytest.mark.parametrize("rep", range(5))
def test_write_out_of_bounds_in_one_block_of_64(rep):
    c = Canary(64, np.float64, seed=20 + rep)
    f = fault_of(runtime.compile(ONE_BLOCK_SRC, "one_bad"), [c.cap], args=(64,), grid=64)
    assert (f.reason, f.block, f.index, f.access) == ("out-of-bounds", 37, 67, "store")
    c.assert_guards_intact()
    allowed = np.arange(64) + 1.0
    allowed[37] = np.nan  # block 37 wrote nothing in bounds
    c.assert_victim_each(allowed)


def test_fault_in_one_block_stops_blocks_in_infinite_loops():
    """Blocks after 37 loop forever; the fault in block 37 stops them (no timeout needed)."""
    c = Canary(8, np.float64, seed=30)
    with pytest.raises(CapabilityFault) as ei:
        runtime.launch(runtime.compile(ONE_BLOCK_SPIN_SRC, "one_bad_spin"), [c.cap],
                       args=(8,), grid=64, timeout=30.0)
    assert ei.value.block == 37 and ei.value.index == -1
    c.assert_guards_intact()
    c.assert_victim_unchanged()


# ---------------------------------------------------------------------------
# forging a capability out of a cap table's bytes (run in a subprocess: if the
# forge works, it writes through a fake object header)

FORGE_SCRIPT = textwrap.dedent("""
    import numpy as np
    from capqr import capabilities, runtime
    GUARD = 8
    big = np.arange(32, dtype=np.float64)
    orig = big.copy()
    v = capabilities.wrap(big[GUARD:-GUARD], name="v")
    fake = capabilities.alloc(16, np.int64, name="fake")
    tab = capabilities.alloc(2, "cap", name="tab")
    k = runtime.compile(SRC, "forge")
    try:
        runtime.launch(k, [tab, fake, v])
        print("NOFAULT")
    except runtime.CapabilityFault as e:
        print("FAULT", e.reason)
    print("INTACT" if (big == orig).all() else "CHANGED")
""")

FORGE_NUMERIC = """
KERNEL void forge(cap_t t, cap_t fake, cap_t v)
{
    int64_t target = cap_to_int(v) - 64;
    cap_store_i64(fake, 0, target);
    cap_store_i64(fake, 1, 4096);
    cap_store_i64(fake, 2, 4096);
    cap_store_i64(fake, 3, 4096);
    cap_store_i64(fake, 4, 5 + (3LL << 32));
    cap_store_i64(t, 0, target);
    cap_store_i64(t, 1, cap_to_int(fake));
    cap_t c = cap_load_cap(t, 0);
    cap_store_f64(c, 0, 666.0);
}"""

FORGE_MISALIGNED = """
KERNEL void forge(cap_t t, cap_t fake, cap_t v)
{
    int64_t target = cap_to_int(v) - 56;
    cap_store_i64(fake, 0, 0);
    cap_store_i64(fake, 1, 1LL << 62);
    cap_store_i64(fake, 2, 1LL << 62);
    cap_store_i64(fake, 3, 1LL << 62);
    cap_store_i64(fake, 4, 5 + (3LL << 32));
    cap_store_cap(t, 0, v);
    cap_store_cap(t, 1, cap_from_int(cap_to_int(fake)));
    cap_t c = cap_load_cap(cap_offset_i64(t, 1), 0);
    cap_store_f64(c, (target - cap_to_int(c)) / 8, 777.0);
}"""


@pytest.mark.parametrize("src", [FORGE_NUMERIC, FORGE_MISALIGNED],
                         ids=["numeric-store-into-cap-table", "misaligned-cap-table-load"])
def test_cap_table_bytes_cannot_forge_a_capability(src):
    """Planted: overwrite a cap table slot's object pointer (with cap_store_i64 on the table,
    or by loading a slot through an origin moved by 8 bytes) so it points at a fake header
    the kernel built in a numeric buffer, then write through the forged cap into the guard
    before `v`.  Must fault; memory outside every buffer must be intact."""
    script = f"SRC = {src!r}\n" + FORGE_SCRIPT
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.split()
    assert "INTACT" in lines, f"memory outside every buffer was written: {r.stdout!r}"
    assert "FAULT" in lines, r.stdout


def test_demo_catches_its_off_by_one_store(capsys: pytest.CaptureFixture) -> None:
    """`python -m capqr.demo` tells of an off-by-one store: the fault it shows is that store."""
    from capqr import demo

    assert demo.main(["--m", "24", "--n", "16", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "store of 'rows'[128]" in out and "access=store" in out
    assert "canaries around the buffer intact: True" in out and "demo OK" in out
