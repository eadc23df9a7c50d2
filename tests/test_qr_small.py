"""The small path of the parallel QR variant (kernels/src/qr_small.c: a whole matrix of
at most 64 x 32 in one block's local array, the input copied and scanned for NaN/Inf
by the kernel itself).

It must pass the checker on every shape it takes (m < n, one row, one column, both
limits), at the ends of the float range (its norms sum in double instead of
xNRM2's scaling), give checked and raw bitwise the same result, be what kernels.qr
runs on a small float32 batch (contiguous or not, float16 input too), refuse NaN/Inf
input unless asked, leave padding columns alone, and stop with a CapabilityFault
when a buffer is too short.
"""

from __future__ import annotations

import numpy as np
import pytest
from capqr import runtime
from capqr.kernels import check, mutate, parallel, qr, sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_qr_fuzz import VALUE_CLASSES, canaries_intact, guarded, make_matrix

#: (batch, m, n): the contest batch, both limits, m < n, one row, one column, odd sizes.
SHAPES = ((20, 32, 32), (3, 64, 32), (5, 13, 7), (3, 5, 20), (4, 1, 1), (4, 64, 1),
          (2, 1, 32), (6, 33, 31))


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _small(a3: np.ndarray, checked: bool = True, ld: int | None = None, fill: float = 0.0
           ) -> tuple[np.ndarray, np.ndarray, int]:
    """run_small on a3 (copied into rows of ld filled with ``fill`` past n)."""
    batch, m, n = a3.shape
    h = np.full((batch, m, ld or n), fill, np.float32)
    tau = np.full((batch, min(m, n)), -7.0, np.float32)
    bad = parallel.run_small(h, tau, checked, None, None, n, src=np.ascontiguousarray(a3))
    return h, tau, bad


@pytest.mark.parametrize("shape", SHAPES)
def test_small_passes_the_checker(shape):
    a3 = _rand(shape, seed=sum(shape))
    assert parallel.use_small(shape[1], shape[2], "float32")
    h, tau, bad = _small(a3)
    assert bad == 0
    rep = check(a3, h, tau)
    assert rep.ok, (shape, str(rep))


def test_checked_and_raw_agree_bitwise():
    a3 = _rand((9, 40, 29), seed=3)
    hc, tc, _ = _small(a3, checked=True)
    hr, tr, _ = _small(a3, checked=False)
    assert hc.tobytes() == hr.tobytes() and tc.tobytes() == tr.tobytes()


@pytest.mark.parametrize("scale", [1e-30, 1e-19, 1.0, 1e18, 1e30])
def test_small_at_the_ends_of_the_range(scale):
    """Squares of 1e-30 underflow float32 and of 1e30 overflow it: the norms, summed
    in double, must still give accurate reflectors (xLARFG's job)."""
    a3 = (_rand((4, 32, 32), seed=11).astype(np.float64) * scale).astype(np.float32)
    h, tau, _ = _small(a3)
    assert np.isfinite(h).all() and np.isfinite(tau).all()
    rep = check(a3, h, tau)
    assert rep.ok, (scale, str(rep))


def test_zero_columns_give_identity_reflectors():
    a3 = _rand((2, 16, 8), seed=5)
    a3[0] = 0.0
    a3[1, 1:, 2] = 0.0          # column 2 is zero below row 1 ...
    a3[1, :, 2] = 0.0           # ... and above: after two reflectors it stays zero
    h, tau, _ = _small(a3)
    assert (tau[0] == 0).all() and (h[0] == 0).all()
    assert tau[1, 2] == 0.0
    assert check(a3, h, tau).ok


def test_padding_columns_are_left_alone():
    a3 = _rand((3, 20, 12), seed=8)
    h, tau, _ = _small(a3, ld=16, fill=123.0)
    assert (h[:, :, 12:] == 123.0).all()
    assert check(a3, np.ascontiguousarray(h[:, :, :12]), tau).ok


def test_kernels_qr_runs_the_small_kernel():
    """kernels.qr on a small float32 batch gives bitwise run_small's result, for a
    contiguous input, a strided view and float16 input (both copied by the host)."""
    a3 = _rand((6, 32, 32), seed=2)
    h, tau, _ = _small(a3)
    H, T = qr(a3)
    assert H.tobytes() == h.tobytes() and T.tobytes() == tau.tobytes()
    wide = _rand((6, 32, 64), seed=2)
    view = wide[:, :, ::2]
    hv, tv, _ = _small(np.ascontiguousarray(view))
    Hv, Tv = qr(view)
    assert Hv.tobytes() == hv.tobytes() and Tv.tobytes() == tv.tobytes()
    a16 = a3.astype(np.float16)
    h16, t16, _ = _small(a16.astype(np.float32))
    H16, T16 = qr(a16)
    assert H16.dtype == np.float32 and H16.tobytes() == h16.tobytes()
    assert T16.tobytes() == t16.tobytes()
    H2, T2 = qr(a3[0])         # one matrix, unbatched
    assert H2.shape == (32, 32) and H2.tobytes() == h[0].tobytes()


def test_nonfinite_input():
    a3 = _rand((5, 32, 32), seed=4)
    a3[3, 7, 9] = np.nan
    a3[1, 0, 0] = np.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        qr(a3)
    H, T = qr(a3, allow_nonfinite=True)
    assert not np.isfinite(H[3]).all() and not np.isfinite(H[1]).all()
    assert check(a3[[0, 2, 4]], H[[0, 2, 4]], T[[0, 2, 4]]).ok
    _, _, bad = _small(a3)
    assert bad == 2


def test_short_buffers_fault():
    """A tau or an input one matrix short: the kernel's access there is refused."""
    a3 = _rand((2, 32, 32), seed=6)
    h = np.zeros((2, 32, 32), np.float32)
    with pytest.raises(runtime.CapabilityFault) as e:
        parallel.run_small(h, np.zeros((1, 32), np.float32), True, None, None, 32, src=a3)
    assert e.value.buffer == "qr.tau" and e.value.access == "store"
    with pytest.raises(runtime.CapabilityFault) as e:
        parallel.run_small(h, np.zeros((2, 32), np.float32), True, None, None, 32,
                           src=a3[:1])
    assert e.value.buffer == "qr.input" and e.value.access == "load"


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 64), st.integers(1, 32)),
       kind=st.sampled_from(VALUE_CLASSES), seed=st.integers(0, 2**16))
def test_fuzz_small_numerics(shape, kind, seed):
    """kernels.qr on small float32 batches (the small path) over the fuzz value classes:
    graded rows 1e-8..1e8, columns down to 1e-11, near rank deficiency, 1e+-30;
    NaN/Inf refused."""
    batch, m, n = shape
    A = make_matrix(kind, batch, m, n, seed).astype(np.float32)
    if kind == "nonfinite":
        with pytest.raises(ValueError):
            qr(A)
        return
    H, tau = qr(A)
    rep = check(A, H, tau)
    assert rep.ok, f"{kind} {A.shape}\n{rep}"


def test_mutants_checked_are_safe():
    """Mutants of qr_small (off-by-one bounds, swapped indices, dropped clamps:
    kernels.mutate) on canary-guarded buffers, checked: every one that compiles either
    runs or faults, and no canary beside any buffer changes."""
    outcomes = {}
    for mu in mutate.sample(sources.source("qr_small"), 12, seed=7):
        try:
            kern = runtime.compile(mu.source, "qr_small_f32")
        except (runtime.VerifyError, runtime.CompileError):
            continue
        a3 = _rand((3, 33, 29), seed=1)
        src, sback = guarded(a3)
        dst, dback = guarded(np.zeros_like(a3))
        tau, tback = guarded(np.zeros((3, 29), np.float32))
        bad, bback = guarded(np.zeros(3, np.int64))
        try:
            runtime.launch(kern, [src, dst, tau, bad], args=(3, 33, 29, 29, 29), grid=3,
                           timeout=20)
            outcome = "ran"
        except runtime.CapabilityFault:
            outcome = "fault"
        except runtime.KernelTimeout:
            outcome = "timeout"
        assert all(canaries_intact(b) for b in (sback, dback, tback, bback)), mu.description
        outcomes[mu.description] = outcome
    assert outcomes, "no mutant compiled"
    assert "fault" in outcomes.values(), outcomes
