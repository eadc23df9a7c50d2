"""Test matrices for the search gate: the selection set and the held-out set.

Selection inputs (``search_inputs``) are what candidates are timed and
selected on: fresh random normal matrices of the search shape plus a few
stress classes (a zero column, exact rank deficiency, graded column norms).

Held-out inputs (``ood_inputs``) are never seen during selection: other
shapes (tall, wide, tiny, odd sizes that no panel width divides) and value
classes (graded rows over 1e-8..1e8, near rank deficiency, huge and tiny
magnitudes, clustered singular values, near-collinear columns).  Finalists
are re-checked on them; a variant that only works on the selection
distribution fails here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Case = tuple[str, np.ndarray]  # (name, float32 array of shape (batch, m, n))


def _normal(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    return rng.standard_normal((b, m, n))


def _zero_col(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    a = _normal(rng, b, m, n)
    a[:, :, n // 3] = 0.0
    return a


def _rank_def(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    r = max(1, min(m, n) // 2)
    return rng.standard_normal((b, m, r)) @ rng.standard_normal((b, r, n)) / np.sqrt(r)


def _col_scaled(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    return _normal(rng, b, m, n) * np.logspace(0, -6, n)[None, None, :]


def _graded_rows(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    return _normal(rng, b, m, n) * np.logspace(-8, 8, m)[None, :, None]


def _near_rank_def(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    return _rank_def(rng, b, m, n) + 1e-6 * _normal(rng, b, m, n)


def _huge(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    return 1e25 * _normal(rng, b, m, n)


def _tiny(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    return 1e-25 * _normal(rng, b, m, n)


def _clustered(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    out = np.empty((b, m, n))
    k = min(m, n)
    for i in range(b):
        u, _ = np.linalg.qr(rng.standard_normal((m, k)))
        v, _ = np.linalg.qr(rng.standard_normal((n, k)))
        s = np.where(np.arange(k) < k // 2, 1.0, 1e-5) * (1 + 1e-7 * rng.standard_normal(k))
        out[i] = (u * s) @ v.T
    return out


def _collinear(rng: np.random.Generator, b: int, m: int, n: int) -> np.ndarray:
    base = rng.standard_normal((b, m, 1))
    return base + 1e-4 * _normal(rng, b, m, n)


SELECTION: dict[str, Callable] = {
    "normal": _normal, "zero_col": _zero_col, "rank_def": _rank_def, "col_scaled": _col_scaled,
}
OOD_VALUES: dict[str, Callable] = {
    "graded_rows": _graded_rows, "near_rank_def": _near_rank_def, "huge": _huge,
    "tiny": _tiny, "clustered": _clustered, "collinear": _collinear,
}


def _f32(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(a, dtype=np.float32)


def search_inputs(m: int, n: int, batch: int, seed: int) -> list[Case]:
    """Selection inputs: ``normal`` (full batch; also the timing input) + stress classes.

    Stress matrices use a batch of at most 2: they test correctness, not speed.
    """
    rng = np.random.default_rng(seed)
    out = [("normal", _f32(_normal(rng, batch, m, n)))]
    sb = min(batch, 2)
    for name, gen in SELECTION.items():
        if name != "normal":
            out.append((name, _f32(gen(rng, sb, m, n))))
    return out


def ood_shapes(m: int, n: int) -> list[tuple[int, int]]:
    """Held-out shapes: tall, wide, odd square, and tiny, none equal to (m, n)."""
    cand = [(m + m // 2 + 3, max(1, n // 2 + 1)), (max(1, n // 2 + 3), m // 2 + 7),
            (97, 97), (7, 5), (3, 5), (1, 1)]
    return [s for s in dict.fromkeys(cand) if s != (m, n)]


def ood_inputs(m: int, n: int, batch: int, seed: int) -> list[Case]:
    """Held-out inputs: new value classes at the search shape, normal data at new shapes."""
    rng = np.random.default_rng(seed + 7919)
    b = min(batch, 2)
    out = [(name, _f32(gen(rng, b, m, n))) for name, gen in OOD_VALUES.items()]
    for mm, nn in ood_shapes(m, n):
        out.append((f"shape{mm}x{nn}", _f32(_normal(rng, b, mm, nn))))
    return out
