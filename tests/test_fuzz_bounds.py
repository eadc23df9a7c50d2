"""Hypothesis: a checked store/load lands iff its index is in bounds; otherwise it faults
with the right index and no byte of the victim or its neighbours changes.  Plus a
crash-safety run of a hostile workload in a subprocess."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import CapabilityFault
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GUARD = 8
DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i32": np.int32,
          "i64": np.int64}
SENTINEL = {"f16": 42.5, "f32": 42.5, "f64": 42.5, "i32": 0x5A5A5A5A, "i64": 0x5A5A5A5A5A5A5A5A}

# The index is computed in the kernel as i*stride + off (wrapping int64 arithmetic,
# -fwrapv), relative to an origin moved by `org` elements with cap_offset.
STORE_SRC = """
KERNEL void fz_store_{t}(cap_t x, int64_t org, int64_t i, int64_t stride, int64_t off)
{{
    cap_t y = cap_offset_{t}(x, org);
    cap_store_{t}(y, i * stride + off, {v});
}}
"""

LOAD_SRC = """
KERNEL void fz_load_{t}(cap_t x, cap_t out, int64_t org, int64_t i, int64_t stride,
                        int64_t off)
{{
    cap_t y = cap_offset_{t}(x, org);
    cap_store_{t}(out, 0, cap_load_{t}(y, i * stride + off));
}}
"""


@functools.cache
def kernels(t: str):
    """One compiled store and load kernel per dtype for the whole module."""
    v = repr(SENTINEL[t]) + ("LL" if t == "i64" else "")
    return (runtime.compile(STORE_SRC.format(t=t, v=v), f"fz_store_{t}"),
            runtime.compile(LOAD_SRC.format(t=t), f"fz_load_{t}"))


def wrap64(v: int) -> int:
    v %= 2**64
    return v - 2**64 if v >= 2**63 else v


I64 = st.integers(-(2**63), 2**63 - 1)
EDGES = st.sampled_from([0, 1, -1, 2, 7, 8, 63, 64, 65, 2**31, -(2**31), 2**32, 2**58,
                         2**58 - 1, -(2**58), 2**61, 2**62, 2**62 + 1, 2**63 - 1, -(2**63),
                         -(2**63) + 1, 2**64 // 2 // 3, 2**64 // 8 + 1])
SMALL = st.integers(-80, 80)
ANY_INT = st.one_of(SMALL, EDGES, I64)


@st.composite
def cases(draw):
    t = draw(st.sampled_from(sorted(DTYPES)))
    n = draw(st.integers(0, 64))
    org = draw(st.one_of(st.just(0), st.integers(-70, 70)))
    shape = draw(st.sampled_from(["plain", "product", "small"]))
    if shape == "plain":
        i, stride, off = draw(ANY_INT), 1, 0
    elif shape == "product":
        i, stride, off = draw(ANY_INT), draw(ANY_INT), draw(ANY_INT)
    else:
        i, stride, off = draw(SMALL), draw(st.integers(-9, 9)), draw(SMALL)
    seed = draw(st.integers(0, 2**32 - 1))
    return t, n, org, i, stride, off, seed


def canary(t: str, n: int, seed: int):
    dtype = DTYPES[t]
    rng = np.random.default_rng(seed)
    big = rng.integers(0, 256, (n + 2 * GUARD) * np.dtype(dtype).itemsize,
                       dtype=np.uint8).view(dtype)
    if np.dtype(dtype).kind == "f":  # finite victim values so loads compare exactly
        big[GUARD:GUARD + n] = rng.uniform(-1000, 1000, n).astype(dtype)
    return big


SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cases())
def test_store_lands_iff_in_bounds(case):
    t, n, org, i, stride, off, seed = case
    big = canary(t, n, seed)
    orig = big.copy()
    x = capabilities.wrap(big[GUARD:GUARD + n], name="fz")
    idx = wrap64(i * stride + off)  # relative to the moved origin
    pos = org + idx                 # element of the object actually addressed
    store, _ = kernels(t)
    if 0 <= pos < n:
        runtime.launch(store, [x], args=(org, i, stride, off))
        want = orig.copy()
        want[GUARD + pos] = SENTINEL[t]
        assert big.tobytes() == want.tobytes()
    else:
        with pytest.raises(CapabilityFault) as ei:
            runtime.launch(store, [x], args=(org, i, stride, off))
        f = ei.value
        assert (f.reason, f.access, f.index, f.buffer) == ("out-of-bounds", "store", idx, "fz")
        assert big.tobytes() == orig.tobytes()  # neither victim nor guards changed


@SETTINGS
@given(cases())
def test_load_succeeds_iff_in_bounds(case):
    t, n, org, i, stride, off, seed = case
    big = canary(t, n, seed)
    orig = big.copy()
    x = capabilities.wrap(big[GUARD:GUARD + n], perms="r", name="fz")
    out_arr = np.zeros(1, dtype=DTYPES[t])
    out = capabilities.wrap(out_arr)
    idx = wrap64(i * stride + off)
    pos = org + idx
    _, load = kernels(t)
    if 0 <= pos < n:
        runtime.launch(load, [x, out], args=(org, i, stride, off))
        assert out_arr.tobytes() == big[GUARD + pos:GUARD + pos + 1].tobytes()
    else:
        with pytest.raises(CapabilityFault) as ei:
            runtime.launch(load, [x, out], args=(org, i, stride, off))
        f = ei.value
        assert (f.reason, f.access, f.index, f.buffer) == ("out-of-bounds", "load", idx, "fz")
        assert not out_arr.any()  # the load's value was never stored
    assert big.tobytes() == orig.tobytes()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 64), lo=ANY_INT, hi=ANY_INT, grid=st.integers(1, 8))
def test_loop_store_range(n, lo, hi, grid):
    """A counted loop stores indices lo..hi-1 (the hoistable shape): all of them land when
    the whole range is in bounds, otherwise a fault names an out-of-bounds index and no
    byte outside the buffer changed."""
    k = loop_kernel()
    big = canary("f64", n, n)
    orig = big.copy()
    x = capabilities.wrap(big[GUARD:GUARD + n], name="loop")
    span_ok = hi <= lo or (0 <= lo and hi <= n)
    if span_ok:
        runtime.launch(k, [x], args=(lo, hi), grid=grid)
        want = orig.copy()
        if hi > lo:
            want[GUARD + lo:GUARD + hi] = 1.5
        assert big.tobytes() == want.tobytes()
    else:
        with pytest.raises(CapabilityFault) as ei:
            runtime.launch(k, [x], args=(lo, hi), grid=grid)
        assert not 0 <= ei.value.index < n
        assert big[:GUARD].tobytes() == orig[:GUARD].tobytes()
        assert big[GUARD + n:].tobytes() == orig[GUARD + n:].tobytes()
        victim, old = big[GUARD:GUARD + n], orig[GUARD:GUARD + n]
        assert ((victim == old) | (victim == 1.5)).all()


@functools.cache
def loop_kernel():
    return runtime.compile("""
KERNEL void fz_loop(cap_t x, int64_t lo, int64_t hi)
{
    for (int64_t i = lo; i < hi; i++) cap_store_f64(x, i, 1.5);
}""", "fz_loop")


# ---------------------------------------------------------------------------
# crash safety: a hostile, buggy workload in a subprocess exits normally

HOSTILE = textwrap.dedent("""
    import numpy as np
    from capqr import capabilities, runtime
    rng = np.random.default_rng(0)
    src = '''
    static void poke(cap_t x, int64_t i) { cap_store_f64(x, i, 1.0); }
    KERNEL void hostile(cap_t x, cap_t t, int64_t mode, int64_t i)
    {
        double loc[4];
        if (mode == 0) poke(x, i);
        if (mode == 1) cap_store_f64(cap_from_int(cap_to_int(x) + i), 0, 2.0);
        if (mode == 2) loc[i & 7] = 1.0;
        if (mode == 3) cap_store_f64(cap_offset_f64(x, i), -i, 3.0);
        if (mode == 4) cap_store_f64(cap_load_cap(t, 0), i, 4.0);
        if (mode == 5) cap_store_cap(t, i, x);
        if (mode == 6) { for (;;) { } }
        if (mode == 7) cap_store_f64(x, i * rt_block_idx(), (double)rt_block_idx());
    }'''
    k = runtime.compile(src, 'hostile')
    faults = 0
    for it in range(400):
        x = capabilities.alloc(int(rng.integers(0, 32)), np.float64)
        t = capabilities.alloc(1, 'cap')
        mode = int(rng.integers(0, 8))
        i = int(rng.choice([rng.integers(-2**63, 2**63 - 1, dtype=np.int64),
                            rng.integers(-40, 40)]))
        if mode == 4 and rng.integers(0, 2):
            runtime.launch(k, [x, t], args=(5, 0))  # t[0] = x, then free x
            x.free()
            x = capabilities.alloc(3, np.float64)
        try:
            runtime.launch(k, [x, t], args=(mode, i), grid=int(rng.integers(1, 9)),
                           timeout=0.05 if mode == 6 else 10.0)
        except (runtime.CapabilityFault, runtime.KernelTimeout):
            faults += 1
        if it % 50 == 0:
            runtime.gc_collect()
    print('DONE', faults)
""")


def test_hostile_workload_never_crashes_the_process():
    r = subprocess.run([sys.executable, "-c", HOSTILE], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
    words = r.stdout.split()
    assert words[0] == "DONE" and int(words[1]) > 100, r.stdout
