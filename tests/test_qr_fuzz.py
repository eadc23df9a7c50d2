"""Hypothesis fuzzing of the QR kernels.

Numerics: shapes from 1x1 up (non-multiples of the panel width, m < n,
m > n, batches) x value classes that break naive QR codes.  The float32/64
variants must pass the checker on every finite input; the f16 variant must
raise HalfOverflowError or be judged by the checker (and whenever the
checker says ok, the factorisation really is accurate); NaN/Inf input is a
ValueError, or with allow_nonfinite a result the checker flags.

Safety: text mutants of the kernel sources (kernels.mutate) run checked on
buffers with canaries on both sides.  Each run must end in one of: checker
pass, checker failure (wrong but memory-safe: the checker flags it), a
CapabilityFault, or a KernelTimeout; the canaries must be intact.  The same
mutant built raw (checked=False) in a subprocess corrupts the canaries or
crashes: the test has teeth.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from capqr import kernels
from capqr.kernels import check, mutate, qr, sources
from capqr.kernels.qr import work_size
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VALUE_CLASSES = ["normal", "zeros", "zero_col", "rank_def", "near_rank_def", "clustered",
                 "graded_rows", "collinear", "logspace_cols", "huge", "tiny", "nonfinite"]

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def make_matrix(kind: str, batch: int, m: int, n: int, seed: int) -> np.ndarray:
    """A (batch, m, n) float64 matrix of the given value class."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((batch, m, n))
    k = min(m, n)
    if kind == "zeros":
        A[:] = 0
    elif kind == "zero_col":
        A[:, :, rng.integers(n)] = 0
    elif kind in ("rank_def", "near_rank_def", "clustered"):
        r = max(1, k // 2)
        for b in range(batch):
            U, _ = np.linalg.qr(rng.standard_normal((m, k)))
            V, _ = np.linalg.qr(rng.standard_normal((n, k)))
            if kind == "rank_def":
                s = np.r_[np.ones(r), np.zeros(k - r)]
            elif kind == "near_rank_def":
                s = np.r_[np.ones(r), np.full(k - r, 1e-7)]
            else:
                s = 1 + 1e-6 * rng.standard_normal(k)
            A[b] = (U * s) @ V.T
    elif kind == "graded_rows":
        A *= np.logspace(-8, 8, m)[None, :, None]
    elif kind == "collinear":
        A[:] = A[:, :, :1] + 1e-6 * A
    elif kind == "logspace_cols":
        A *= np.logspace(0, -rng.integers(1, 12), n)[None, None, :]
    elif kind == "huge":
        A *= 1e30
    elif kind == "tiny":
        A *= 1e-30
    elif kind == "nonfinite":
        A[0, rng.integers(m), rng.integers(n)] = rng.choice([np.nan, np.inf, -np.inf])
    return A


shapes = st.tuples(st.integers(1, 3), st.integers(1, 45), st.integers(1, 45))


@FUZZ
@given(shape=shapes, kind=st.sampled_from(VALUE_CLASSES), seed=st.integers(0, 2**16),
       variant=st.sampled_from(["unblocked", "blocked"]), nb=st.integers(1, 40),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_fuzz_numerics(shape, kind, seed, variant, nb, dtype):
    A = make_matrix(kind, *shape, seed).astype(dtype)
    if kind == "huge" and dtype == np.float32:
        A = A.astype(np.float32)  # 1e30 is representable; squares are not (scaled nrm2)
    if kind == "nonfinite":
        with pytest.raises(ValueError):
            qr(A, variant, nb=nb) if variant == "blocked" else qr(A, variant)
        H, tau = qr(A, variant, allow_nonfinite=True)
        assert not check(A, H, tau).ok
        return
    H, tau = qr(A, variant, nb=nb) if variant == "blocked" else qr(A, variant)
    rep = check(A, H, tau)
    assert rep.ok, f"{kind} {shape} {variant} nb={nb}\n{rep}"


@FUZZ
@given(shape=shapes, kind=st.sampled_from(VALUE_CLASSES + ["half_overflow"]),
       seed=st.integers(0, 2**16), nb=st.integers(1, 40))
def test_fuzz_f16_never_silent(shape, kind, seed, nb):
    if kind == "half_overflow":
        A = make_matrix("normal", *shape, seed) * 4e4
    else:
        A = make_matrix(kind, *shape, seed)
    A = A.astype(np.float32)
    try:
        H, tau = qr(A, "f16", nb=nb)
    except kernels.HalfOverflowError:
        # Orthogonal reflections keep every column norm, so all stored values stay below
        # the largest column norm: with it well inside half range, overflow is a false alarm.
        assert np.linalg.norm(A.astype(np.float64), axis=-2).max() > 3e4, kind
        return
    except ValueError:
        assert kind == "nonfinite"
        return
    assert np.isfinite(H.astype(np.float32)).all()
    rep = check(A, H, tau)
    if rep.ok:
        # The checker's verdict is the contract; cross-check it independently.
        Q = kernels.householder_product(H, tau)
        k = min(A.shape[1:])
        QR = Q @ np.triu(H.astype(np.float64)[:, :k])
        an = np.abs(A.astype(np.float64)).sum(axis=1).max()
        assert np.abs(QR - A).sum(axis=1).max() <= 20 * max(A.shape[1:]) * 1.2e-7 * an + 1e-300
    # The LAPACK ratios against eps16 must hold for data representable in half.
    A16 = A.astype(np.float16)
    if np.isfinite(A16).all() and np.abs(A).max() < 6e4 and (np.abs(A[A != 0]) > 1e-4).all():
        assert check(A16, H, tau).lapack_ok, str(check(A16, H, tau))


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.tuples(st.integers(1, 2), st.integers(64, 1500), st.integers(1, 80)),
       kind=st.sampled_from([k for k in VALUE_CLASSES if k != "nonfinite"]),
       seed=st.integers(0, 2**16), nb=st.integers(1, 64))
def test_fuzz_tall_numerics(shape, kind, seed, nb):
    """The tall path (rows shared out between the workers, sums in double, no rescaling
    loop) on the value classes, forced on whatever the pool and shape."""
    from capqr.kernels import parallel

    batch, m, n = shape
    A = make_matrix(kind, batch, m, min(n, m), seed).astype(np.float32)
    H = A.copy()
    tau = np.zeros((batch, min(A.shape[1:])), np.float32)
    parallel.run(H, tau, "float32", nb, 64, True, None, None, tall=True)
    rep = check(A, H, tau)
    assert rep.ok, f"{kind} {A.shape} nb={nb}\n{rep}"


# ---------------------------------------------------------------- safety fuzz

GUARD = 256
PATTERN = {np.dtype(np.float32): np.float32(-12345.678), np.dtype(np.float64): -12345.678,
           np.dtype(np.float16): np.float16(-1234.0), np.dtype(np.int64): np.int64(-1234567)}


def guarded(data: np.ndarray):
    """(capability over data's copy, backing array with GUARD canaries each side)."""
    from capqr import capabilities

    flat = np.ascontiguousarray(data).reshape(-1)
    back = np.full(flat.size + 2 * GUARD, PATTERN[flat.dtype], dtype=flat.dtype)
    back[GUARD:GUARD + flat.size] = flat
    return capabilities.wrap(back[GUARD:GUARD + flat.size]), back


def canaries_intact(back: np.ndarray) -> bool:
    pat = np.full(GUARD, PATTERN[back.dtype], dtype=back.dtype).tobytes()
    return back[:GUARD].tobytes() == pat and back[-GUARD:].tobytes() == pat


FAMILY_CASES = {"geqr2": "float32", "geqrf": "float32", "geqrf_f16": "float16"}


def run_mutant(src: str, family: str, checked: bool, batch: int, m: int, n: int, nb: int,
               seed: int = 0):
    """Run (a mutant of) a kernel family on guarded buffers; return (outcome, A, H, tau, ok)."""
    from capqr import runtime

    dt = FAMILY_CASES[family]
    kern = runtime.compile(src, sources.entry(family, dt), checked=checked)
    A = np.random.default_rng(seed).standard_normal((batch, m, n)).astype(dt)
    tdt = np.float32 if dt == "float16" else np.dtype(dt)
    k = min(m, n)
    a, aback = guarded(A)
    t, tback = guarded(np.zeros((batch, k), tdt))
    if family == "geqr2":
        w, wback = guarded(np.zeros(work_size(batch, m, n, None), tdt))
        args: tuple = (batch, m, n)
    else:
        w, wback = guarded(np.zeros(work_size(batch, m, n, nb), tdt))
        args = (batch, m, n, nb)
    try:
        runtime.launch(kern, [a, t, w], args=args, grid=batch, timeout=20)
        outcome = "ran"
    except runtime.CapabilityFault:
        outcome = "fault"
    except runtime.KernelTimeout:
        outcome = "timeout"
    intact = all(canaries_intact(b) for b in (aback, tback, wback))
    H = aback[GUARD:GUARD + A.size].reshape(A.shape)
    T = tback[GUARD:GUARD + batch * k].reshape(batch, k)
    return outcome, intact, A, H, T


def _mutants(family: str, count: int, seed: int) -> list:
    return mutate.sample(sources.source(family, "float32"), count, seed=seed)


@pytest.mark.parametrize("family", sorted(FAMILY_CASES))
def test_mutants_checked_are_safe(family):
    from capqr import runtime

    entry = sources.entry(family, FAMILY_CASES[family])

    def compiles(mu) -> bool:
        try:
            runtime.compile(mu.source, entry)
        except (runtime.VerifyError, runtime.CompileError):
            return False
        return True

    mutants = _mutants(family, 7, seed=4)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:   # gcc on every core
        built = list(pool.map(compiles, mutants))
    outcomes = {}
    for mu in (mu for mu, ok in zip(mutants, built, strict=True) if ok):
        outcome, intact, A, H, T = run_mutant(mu.source, family, True, 2, 37, 29, 8)
        assert intact, f"canary overwritten by checked mutant {mu.description}"
        if outcome == "ran":
            rep = check(A, H, T, dtype=np.float16 if family == "geqrf_f16" else None)
            outcome = "pass" if (rep.lapack_ok) else "flagged"
        outcomes[mu.description] = outcome
    assert outcomes, "no mutant compiled"
    assert "fault" in outcomes.values(), outcomes


# The mutant used to show the raw build really corrupts memory: the last panel
# is no longer clamped to min(m, n), so tau and the matrix are written past
# their ends (n = 29 is not a multiple of nb = 8).
def _teeth_mutant():
    src = sources.source("geqrf", "float32")
    for mu in mutate.panel_not_dividing(src):
        if "k - j" in mu.description:
            return mu
    raise AssertionError("panel clamp not found in geqrf source")


def test_teeth_checked_faults():
    mu = _teeth_mutant()
    outcome, intact, *_ = run_mutant(mu.source, "geqrf", True, 2, 37, 29, 8)
    assert outcome == "fault" and intact


#: Signals a process dies of when a stray store corrupts its heap or hits unmapped memory.
CORRUPTION_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT}


def test_teeth_raw_corrupts_in_subprocess():
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from test_qr_fuzz import run_mutant, _teeth_mutant
        outcome, intact, *_ = run_mutant(_teeth_mutant().source, "geqrf", False, 2, 37, 29, 8)
        print(json.dumps({{"outcome": outcome, "intact": intact}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if r.returncode < 0:
        # Killed by a signal: the raw build corrupted memory badly enough to crash.  Any
        # other non-zero exit (an ImportError, a Python exception) is a failure of the test.
        assert -r.returncode in CORRUPTION_SIGNALS, f"signal {-r.returncode}\n{r.stderr[-3000:]}"
        return
    assert r.returncode == 0, f"child failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == {"outcome": "ran", "intact": False}, res
