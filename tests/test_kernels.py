"""QR kernel family: every variant on contest-like shapes, rectangles, batches;
checked == raw bitwise; input validation; the checker itself."""

from __future__ import annotations

import numpy as np
import pytest
from capqr import kernels, runtime
from capqr.bench.peers import BATCHED
from capqr.kernels import check, qr

F32_VARIANTS = [("unblocked", {}), ("blocked", {"nb": 32}), ("blocked", {"nb": 7})]

# Contest (batch, n) shapes, the batch scaled down so each stays ~<1.5 GFlop in CI.
CONTEST = BATCHED["full"]


def _ci_shape(batch: int, n: int, budget: float = 1.5e9) -> tuple[int, int]:
    while n > 1024:
        n //= 2
    flops = 4 / 3 * n ** 3
    return max(1, min(batch, int(budget // flops))), n


def _rand(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("batch,n", CONTEST)
def test_contest_shapes_blocked(batch, n):
    b, nn = _ci_shape(batch, n)
    A = _rand((b, nn, nn), seed=n)
    H, tau = qr(A, "blocked")
    assert H.shape == A.shape and tau.shape == (b, nn)
    rep = check(A, H, tau)
    assert rep.ok, str(rep)


@pytest.mark.parametrize("variant,params", F32_VARIANTS + [("f16", {"nb": 16})])
@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (33, 20), (20, 33), (64, 64),
                                   (3, 45, 31), (2, 31, 45), (5, 32, 32)])
def test_variants_shapes(variant, params, shape):
    A = _rand(shape, seed=sum(shape))
    H, tau = qr(A, variant, **params)
    if variant == "f16":
        assert H.dtype == np.float16 and tau.dtype == np.float32
        rep = check(A.astype(np.float16), H, tau)
        # Half storage meets LAPACK's ratios with eps16; the float32 contest
        # bound is reported, not assumed (it fails for small n).
        assert rep.lapack_ok, str(rep)
    else:
        rep = check(A, H, tau)
        assert rep.ok, str(rep)


@pytest.mark.parametrize("variant", ["unblocked", "blocked"])
def test_float64(variant):
    A = _rand((2, 50, 37), np.float64, seed=3)
    H, tau = qr(A, variant, nb=8) if variant == "blocked" else qr(A, variant)
    assert H.dtype == np.float64
    rep = check(A, H, tau)
    assert rep.ok and rep.worst()["resid"] < 30, str(rep)


@pytest.mark.parametrize("variant,params", F32_VARIANTS + [("f16", {"nb": 16})])
def test_checked_equals_raw_bitwise(variant, params):
    A = _rand((3, 70, 53), seed=11)
    H1, t1 = qr(A, variant, checked=True, **params)
    H2, t2 = qr(A, variant, checked=False, **params)
    assert H1.tobytes() == H2.tobytes() and t1.tobytes() == t2.tobytes()


def test_batched_equals_single():
    A = _rand((4, 40, 30), seed=5)
    H, tau = qr(A, "blocked", nb=16)
    for i in range(4):
        h, t = qr(A[i], "blocked", nb=16)
        assert h.tobytes() == H[i].tobytes() and t.tobytes() == tau[i].tobytes()


def test_grid_smaller_than_batch():
    A = _rand((5, 20, 20), seed=6)
    H, tau = qr(A, "blocked", grid=2)
    H1, tau1 = qr(A, "blocked")
    assert H.tobytes() == H1.tobytes()


def test_nonfinite_input_rejected():
    A = _rand((6, 6))
    A[2, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        qr(A)
    H, tau = qr(A, allow_nonfinite=True)
    rep = check(A, H, tau)
    assert not rep.ok and "NaN/Inf" in rep.matrices[0].reason


@pytest.mark.skipif(runtime.threads() < 2, reason="the worker copy needs two workers")
def test_large_input_copied_and_checked_on_the_workers(monkeypatch):
    """From COPY_ON_WORKERS_MIN elements the input copy and its NaN/Inf check run as
    a kernel on every worker: the same refusals, bitwise the same result."""
    import importlib

    qr_mod = importlib.import_module("capqr.kernels.qr")  # the module (kernels.qr is the function)

    A = _rand((2, 1024, 2048), seed=8)
    assert A.size >= qr_mod.COPY_ON_WORKERS_MIN
    for bad in (np.nan, np.inf, -np.inf):
        B = A.copy()
        B[1, 1023, 2047] = bad  # the last element: the last block's slice
        with pytest.raises(ValueError, match="NaN or Inf"):
            qr(B, "parallel", nb=16)
    H, tau = qr(A, "parallel", nb=16)
    monkeypatch.setattr(qr_mod, "COPY_ON_WORKERS_MIN", A.size + 1)  # numpy copies
    H1, tau1 = qr(A, "parallel", nb=16)
    assert H.tobytes() == H1.tobytes() and tau.tobytes() == tau1.tobytes()


def test_the_factored_copy_starts_on_a_cache_line(monkeypatch):
    """kernels.qr factors a copy whose data starts on a 64-byte line, whichever path
    made it (numpy's copy in every dtype, or the workers' copy): H is that copy, and
    it holds what the unaligned input gives factored in place by the same kernel."""
    import importlib

    qr_mod = importlib.import_module("capqr.kernels.qr")
    for variant, dtype in (("parallel", np.float32), ("parallel", np.float64),
                           ("blocked", np.float64), ("f16", np.float16)):
        A = (_rand((3, 40, 24), seed=9) * 4).astype(dtype)
        H, _ = qr(A, variant)
        assert H.ctypes.data % 64 == 0 and H.flags.c_contiguous, (variant, dtype)
    A = _rand((2, 64, 64), seed=10)
    monkeypatch.setattr(qr_mod, "COPY_ON_WORKERS_MIN", 1)  # the workers copy
    H, tau = qr(A, "parallel")
    assert H.ctypes.data % 64 == 0
    raw = np.empty(A.size + 4, np.float32)[1:1 + A.size].reshape(A.shape)  # 4 bytes off a line
    raw[...] = A
    t = np.zeros((2, 64), np.float32)
    from capqr.kernels import parallel

    parallel.run(raw, t, "float32", parallel.default_nb(64, 64), parallel.TW_MAX, True, None, None)
    assert raw.tobytes() == H.tobytes() and t.tobytes() == tau.tobytes()


def test_f16_overflow_raises_or_flags():
    A = _rand((16, 16)) * 3e4  # entries fit in half, R's diagonal (~1e5) does not
    with pytest.raises(kernels.HalfOverflowError):
        qr(A, "f16")
    H, tau = qr(A, "f16", allow_nonfinite=True)
    assert not check(A, H, tau).ok
    with pytest.raises(kernels.HalfOverflowError):
        qr(_rand((4, 4)) * 1e6, "f16")


def test_bad_arguments():
    with pytest.raises(ValueError):
        qr(_rand((4, 4)), "nope")
    with pytest.raises(ValueError):
        qr(_rand((4, 4)), nb=0)
    with pytest.raises(ValueError):
        qr(_rand((4,)))


def test_variants_listing():
    v = kernels.variants()
    assert {"unblocked", "blocked", "f16"} <= set(v)
    assert v["blocked"].params["nb"] == 32 and "float32" in v["blocked"].dtypes


def test_householder_product_orthonormal():
    A = _rand((2, 30, 12), seed=9)
    H, tau = qr(A)
    Q = kernels.householder_product(H, tau)
    assert Q.shape == (2, 30, 12) and Q.dtype == np.float64
    for i in range(2):
        np.testing.assert_allclose(Q[i].T @ Q[i], np.eye(12), atol=1e-5)
        np.testing.assert_allclose(Q[i] @ np.triu(H[i][:12]), A[i], atol=1e-5)


def test_checker_zero_matrix_and_garbage():
    Z = np.zeros((5, 4), np.float32)
    H, tau = qr(Z)
    rep = check(Z, H, tau)
    assert rep.ok and rep.matrices[0].resid == 0.0
    A = _rand((2, 8, 8), seed=1)
    H, tau = qr(A)
    bad = H.copy()
    bad[1, 0, 3] += 1.0  # corrupt R of the second matrix only
    rep = check(A, bad, tau)
    assert rep.matrices[0].ok and not rep.matrices[1].ok and not rep.ok
    assert "residual" in str(rep)
    badtau = tau.copy()
    badtau[0, 2] = 0.5  # not a reflector: Q loses orthogonality
    assert not check(A, H, badtau).matrices[0].lapack_ok
    # R nonzero for a zero matrix: infinite ratio, not a division error
    rep = check(Z, np.ones_like(Z), np.zeros(4, np.float32))
    assert not rep.ok and rep.matrices[0].resid == float("inf")


def test_torch_roundtrip():
    torch = pytest.importorskip("torch")
    A = torch.randn(3, 20, 15, dtype=torch.float32)
    H, tau = qr(A)
    assert isinstance(H, torch.Tensor) and isinstance(tau, torch.Tensor)
    assert check(A, H, tau).ok
