"""The QR checker: LAPACK's test ratios and the contest bounds, in float64.

For each matrix (each of a batch on its own), with k = min(m, n), Q the
m x k orthonormal factor formed from (H, tau) and R = triu(H) (k x n):

* LAPACK (xQRT01): ``resid = ||R - Q^T A||_1 / (m ||A||_1 eps)`` and
  ``orth = ||I - Q^T Q||_1 / (m eps)``, both < 30.  Q^T A is the full m x n
  product (all m reflector rows, as with LAPACK's square Q), so a component
  of A outside range(Q) also counts.  ``eps`` is the unit roundoff of the
  storage dtype (LAPACK's dlamch('E'): 2^-53 float64, 2^-24 float32, 2^-11
  float16).  Half-precision storage is judged against eps16 here: that is
  the accuracy half storage can give.
* Contest: ``||R - Q^T A||_1 <= 20 N eps32 ||A||_1`` and
  ``||Q^T Q - I||_1 <= 100 N eps32`` with eps32 = 2^-23 (numpy's
  finfo(float32).eps) and N = max(m, n) (n for the square contest shapes),
  whatever the storage dtype: the f16 variant must meet float32 accuracy
  here or be reported failing.
* Every output must be finite (and so must the input: non-finite input
  cannot be checked and is reported as a failure).

``||A||_1 = 0`` is handled exactly: the residual ratio is 0 if the residual is
0 and infinite otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .qr import _as_numpy, _orgqr, apply_qt

LAPACK_THRESHOLD = 30.0
CONTEST_RESID = 20.0
CONTEST_ORTH = 100.0
EPS32 = float(np.finfo(np.float32).eps)


def unit_roundoff(dtype: Any) -> float:
    """LAPACK's eps (dlamch('E')): half the machine epsilon of ``dtype``."""
    return float(np.finfo(np.dtype(dtype)).eps) / 2.0


@dataclass
class MatrixReport:
    """Check result of one matrix."""

    index: int
    shape: tuple[int, int]
    resid: float            # LAPACK ratio ||R - Q^T A||_1 / (m ||A||_1 eps)
    orth: float             # LAPACK ratio ||I - Q^T Q||_1 / (m eps)
    contest_resid: float    # ||R - Q^T A||_1 / (N eps32 ||A||_1), bound 20
    contest_orth: float     # ||Q^T Q - I||_1 / (N eps32), bound 100
    finite: bool
    lapack_ok: bool
    contest_ok: bool
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.finite and self.lapack_ok and self.contest_ok


@dataclass
class CheckReport:
    """Per-matrix reports of a (batched) QR result; ``ok`` only if all pass."""

    matrices: list[MatrixReport] = field(default_factory=list)
    dtype: str = "float32"
    eps: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.matrices)

    @property
    def lapack_ok(self) -> bool:
        return all(r.finite and r.lapack_ok for r in self.matrices)

    @property
    def contest_ok(self) -> bool:
        return all(r.finite and r.contest_ok for r in self.matrices)

    @property
    def failures(self) -> list[MatrixReport]:
        return [r for r in self.matrices if not r.ok]

    def worst(self) -> dict[str, float]:
        """Largest value of each ratio over the batch."""
        keys = ("resid", "orth", "contest_resid", "contest_orth")
        return {k: max((getattr(r, k) for r in self.matrices), default=0.0) for k in keys}

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        n = len(self.matrices)
        w = self.worst()
        head = (f"QR check ({self.dtype}, eps={self.eps:.3g}): "
                f"{'PASS' if self.ok else 'FAIL'}, {n - len(self.failures)}/{n} matrices pass; "
                f"worst LAPACK resid {w['resid']:.3g} orth {w['orth']:.3g} "
                f"(< {LAPACK_THRESHOLD:g}), "
                f"contest resid {w['contest_resid']:.3g} (<= {CONTEST_RESID:g}) "
                f"orth {w['contest_orth']:.3g} (<= {CONTEST_ORTH:g})")
        lines = [head]
        for r in self.failures[:10]:
            lines.append(f"  matrix {r.index} {r.shape[0]}x{r.shape[1]}: {r.reason}")
        if len(self.failures) > 10:
            lines.append(f"  ... {len(self.failures) - 10} more failing")
        return "\n".join(lines)


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else float("inf")


def check_one(a: np.ndarray, h: np.ndarray, tau: np.ndarray, eps: float,
              index: int = 0) -> MatrixReport:
    """Check one m x n matrix (see the module docstring)."""
    m, n = a.shape
    k = min(m, n)
    A = np.asarray(a, dtype=np.float64)
    Hd = np.asarray(h, dtype=np.float64)
    T = np.asarray(tau, dtype=np.float64)
    N = max(m, n)
    reasons = []
    finite = bool(np.isfinite(Hd).all() and np.isfinite(T).all())
    if not np.isfinite(A).all():
        reasons.append("input has NaN/Inf")
        finite = False
    elif not finite:
        reasons.append("output has NaN/Inf")
    if not finite:
        inf = float("inf")
        return MatrixReport(index, (m, n), inf, inf, inf, inf, False, False, False,
                            "; ".join(reasons))
    R = np.zeros((m, n))
    R[:k] = np.triu(Hd[:k])
    QtA = apply_qt(Hd, T, A)
    Q = _orgqr(Hd, T)
    anorm = np.abs(A).sum(axis=0).max()
    r_norm = np.abs(R - QtA).sum(axis=0).max()
    o_norm = np.abs(Q.T @ Q - np.eye(k)).sum(axis=0).max()
    resid = _ratio(r_norm, m * anorm * eps)
    orth = o_norm / (m * eps)
    c_resid = _ratio(r_norm, N * EPS32 * anorm)
    c_orth = o_norm / (N * EPS32)
    if not np.isfinite([resid, orth, c_resid, c_orth]).all():
        finite = False
        reasons.append("check overflowed (non-finite residual)")
    lapack_ok = resid < LAPACK_THRESHOLD and orth < LAPACK_THRESHOLD
    contest_ok = c_resid <= CONTEST_RESID and c_orth <= CONTEST_ORTH
    if resid >= LAPACK_THRESHOLD:
        reasons.append(f"LAPACK residual ratio {resid:.3g} >= {LAPACK_THRESHOLD:g}")
    if orth >= LAPACK_THRESHOLD:
        reasons.append(f"LAPACK orthogonality ratio {orth:.3g} >= {LAPACK_THRESHOLD:g}")
    if c_resid > CONTEST_RESID:
        reasons.append(f"contest residual {c_resid:.3g} x (N eps32 ||A||) > {CONTEST_RESID:g}")
    if c_orth > CONTEST_ORTH:
        reasons.append(f"contest orthogonality {c_orth:.3g} x (N eps32) > {CONTEST_ORTH:g}")
    return MatrixReport(index, (m, n), float(resid), float(orth), float(c_resid), float(c_orth),
                        finite, bool(lapack_ok), bool(contest_ok), "; ".join(reasons))


def check(A: Any, H: Any, tau: Any, *, dtype: Any = None) -> CheckReport:
    """Check a QR result (H, tau) of A, each matrix of a batch on its own.

    ``dtype`` selects the LAPACK eps; default: H's dtype (float16 H from the
    half variant -> eps16), float64 for non-float H.
    """
    a, _ = _as_numpy(A)
    h, _ = _as_numpy(H)
    t, _ = _as_numpy(tau)
    if a.ndim == 2:
        a, h, t = a[None], h[None], t[None]
    if a.shape != h.shape or a.ndim != 3 or t.shape != (a.shape[0], min(a.shape[1:])):
        raise ValueError(f"shape mismatch: A {a.shape}, H {h.shape}, tau {t.shape}")
    dt = np.dtype(dtype) if dtype is not None else (
        h.dtype if h.dtype in (np.float16, np.float32, np.float64) else np.dtype(np.float64))
    eps = unit_roundoff(dt)
    rep = CheckReport(dtype=str(dt), eps=eps)
    for i in range(a.shape[0]):
        rep.matrices.append(check_one(a[i], h[i], t[i], eps, i))
    return rep
