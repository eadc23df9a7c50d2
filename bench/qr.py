"""capqr's QR kernels as benchmark cases (overhead) and implementations (peers).

Overhead cases launch the kernel directly on prepared buffers, so the timed
region is the kernel alone (``kernels.qr`` also copies and validates its
input, identical work in every mode that would dilute the ratio).  The
launch follows the kernel signatures documented in kernels/src:
``(a, tau, work, batch, m, n[, nb])`` with one workspace slot per block.
tests/test_bench_smoke.py checks that this runner reproduces ``kernels.qr``.
Peer implementations use the public ``kernels.qr`` call, the cost a user sees.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ..kernels import parallel
from ..kernels.parallel import qr_flops
from .case import Case

#: Overhead shapes (label, batch, n) per variant family; the unblocked kernel is
#: BLAS-2 and slow, so it stops earlier.  Batched shapes use one block per matrix.
OVERHEAD_SHAPES = {
    "full": {
        "geqr2": (("n=128", 1, 128), ("n=256", 1, 256), ("n=512", 1, 512),
                  ("(20,32)", 20, 32), ("(40,176)", 40, 176)),
        "blocked": (("n=128", 1, 128), ("n=256", 1, 256), ("n=512", 1, 512),
                    ("n=1024", 1, 1024), ("(20,32)", 20, 32), ("(40,176)", 40, 176),
                    ("(40,352)", 40, 352)),
    },
    "quick": {"geqr2": (("n=48", 1, 48), ("(4,32)", 4, 32)),
              "blocked": (("n=64", 1, 64), ("(4,32)", 4, 32))},
}
GC_SHAPE = {"full": ("(40,176)", 40, 176), "quick": ("(4,32)", 4, 32)}
#: The small path's kernel (qr_small, what ``parallel`` runs on matrices up to 64 x 32).
SMALL_SHAPES = {"full": (("(20,32)", 20, 32), ("(200,32)", 200, 32)),
                "quick": (("(4,32)", 4, 32),)}
#: Single float32 matrices (label, m, n) as kernels.qr factors them on all workers
#: (kernels.parallel.run decides: the steps, the group panel on 8+ workers, or the tall
#: path), so that the overhead covers the launch sequences users get, not only the
#: one-block kernel.
PATH_SHAPES = {"full": (("n=1024", 1024, 1024), ("n=2048", 2048, 2048),
                        ("8192x256", 8192, 256), ("65536x64", 65536, 64)),
               "quick": (("2048x64", 2048, 64),)}


def available() -> dict[str, Any]:
    """The QR variants to benchmark (``kernels.variants()``)."""
    from .. import kernels

    return kernels.variants()


class QrRunner:
    """One QR launch on prepared buffers; reset() restores the input matrix (untimed)."""

    def __init__(self, variant: Any, a3: np.ndarray, mode: str, nb: int | None = None):
        from .. import capabilities, runtime
        from ..kernels.qr import work_size

        self._launch = runtime.launch
        batch, m, n = a3.shape
        k = min(m, n)
        half = variant.family == "geqrf_f16"
        store = np.float16 if half else np.float32
        self.init = np.ascontiguousarray(a3, dtype=store)
        self.kernel = _build_family(variant.family, mode)
        self.grid = batch
        self.a = capabilities.alloc(self.init.shape, store, name="bench.qr.a")
        self.view = self.a.numpy()
        self.tau = capabilities.alloc((batch, k), np.float32, name="bench.qr.tau")
        if variant.family == "geqr2":
            b, self.args = None, (batch, m, n)
        else:
            b = int(nb or variant.params["nb"])
            # qrt_f32 also takes the row length (kernels/src/qrt.c): unpadded here
            self.args = (batch, m, n, b, *((n,) if variant.family == "qrt" else ()))
        self.work = capabilities.alloc((work_size(self.grid, m, n, b),), np.float32,
                                       name="bench.qr.work")

    def reset(self) -> None:
        np.copyto(self.view, self.init)

    def run(self) -> None:
        self._launch(self.kernel, [self.a, self.tau, self.work], args=self.args, grid=self.grid)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(H, tau) of the last run, copied out."""
        return self.view.copy(), self.tau.numpy().copy()


class SmallRunner:
    """One qr_small launch (kernels/src/qr_small.c: it reads the input and writes the
    result, so reset() has nothing to restore)."""

    def __init__(self, a3: np.ndarray, mode: str):
        from .. import capabilities, runtime

        self._launch = runtime.launch
        batch, m, n = a3.shape
        self.kernel = _build_family("qr_small", mode)
        self.init = capabilities.wrap(np.array(a3, np.float32), "r", name="bench.qr.input")
        self.a = capabilities.alloc(a3.shape, np.float32, name="bench.qr.a")
        self.tau = capabilities.alloc((batch, min(m, n)), np.float32, name="bench.qr.tau")
        self.bad = capabilities.alloc((batch,), np.int64, name="bench.qr.bad")
        self.args, self.grid = (batch, m, n, n, n), batch

    def reset(self) -> None:
        pass

    def run(self) -> None:
        self._launch(self.kernel, [self.init, self.a, self.tau, self.bad], args=self.args,
                     grid=self.grid)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self.a.numpy().copy(), self.tau.numpy().copy()


class PathRunner:
    """One float32 matrix through kernels.parallel.run with the path it picks for the pool
    (its launches, workspaces and all), built in the given mode; reset() restores the
    input (untimed)."""

    def __init__(self, a: np.ndarray, mode: str):
        from .. import runtime

        self._run = parallel.run
        m, n = a.shape
        ld = parallel.working_ld(1, m, n, parallel.default_nb(m, n),
                                 np.dtype(np.float32).itemsize, runtime.threads())
        self.init = np.zeros((1, m, ld), np.float32)
        self.init[0, :, :n] = a
        self.h = self.init.copy()
        self.tau = np.zeros((1, min(m, n)), np.float32)
        # the tile width kernels.qr passes for its default variant
        self.mode, self.n, self.tw = mode, n, available()["parallel"].params["tw"]

    def reset(self) -> None:
        np.copyto(self.h, self.init)

    def run(self) -> None:
        self._run(self.h, self.tau, "float32", None, self.tw, self.mode, None, None, n=self.n)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self.h[0, :, :self.n].copy(), self.tau[0].copy()


def path_name(m: int, n: int) -> str:
    """The launch path kernels.parallel.run takes for one float32 m x n matrix here."""
    from .. import runtime

    return parallel.default_path(1, m, n, "float32", runtime.threads())


def _input(batch: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, n, n), dtype=np.float32)


def _family_key(v: Any) -> str:
    return "geqr2" if v.family == "geqr2" else "blocked"


def overhead_cases(quick: bool, sizes: list[int] | None = None) -> list[Case]:
    """Checked-vs-raw cases for every QR variant (``sizes`` overrides the square sizes)."""

    out = []
    shapes = OVERHEAD_SHAPES["quick" if quick else "full"]
    for name, v in available().items():
        sel = list(shapes[_family_key(v)])
        if sizes:
            sel = [(f"n={n}", 1, n) for n in sizes] + [s for s in sel if s[1] > 1]
        for label, batch, n in sel:
            a3 = _input(batch, n, seed=batch * 1009 + n)

            def make(mode: str, v: Any = v, a3: np.ndarray = a3) -> QrRunner:
                return QrRunner(v, a3, mode)

            out.append(Case("qr", name, label, make, flops=batch * qr_flops(n, n),
                            meta={"family_src": v.family},
                            build=partial(_build_family, v.family), build_key=v.family))
    for label, batch, n in SMALL_SHAPES["quick" if quick else "full"]:
        a3 = _input(batch, n, seed=batch * 1009 + n)

        def make_small(mode: str, a3: np.ndarray = a3) -> SmallRunner:
            return SmallRunner(a3, mode)

        out.append(Case("qr", "small", label, make_small, flops=batch * qr_flops(n, n),
                        meta={"family_src": "qr_small"},
                        build=partial(_build_family, "qr_small"), build_key="qr_small"))
    for label, m, n in PATH_SHAPES["quick" if quick else "full"]:
        a = np.random.default_rng(m * 31 + n).standard_normal((m, n), dtype=np.float32)

        def make_path(mode: str, a: np.ndarray = a) -> PathRunner:
            return PathRunner(a, mode)

        path = path_name(m, n)
        out.append(Case("qr", "path", label, make_path, flops=qr_flops(m, n),
                        meta={"path": path},
                        build=partial(parallel.path_kernels, path, "float32"),
                        build_key=f"path {path}"))
    return out


def _build_family(family: str, mode: str) -> Any:
    """The float32 kernel of ``family`` that QrRunner or SmallRunner compiles."""
    from .. import runtime
    from ..kernels import sources

    return runtime.compile(sources.source(family, "float32"), sources.entry(family, "float32"),
                           mode=mode)


def gc_case(quick: bool) -> Case:
    """The case timed with the collector running vs disabled (blocked QR, batched)."""

    blocked = available()["blocked"]
    label, batch, n = GC_SHAPE["quick" if quick else "full"]
    a3 = _input(batch, n, seed=4242)
    return Case("qr", "blocked", label, lambda mode: QrRunner(blocked, a3, mode),
                flops=batch * qr_flops(n, n), build=partial(_build_family, blocked.family),
                build_key=blocked.family)


class _KernelsQr:
    """Peer runner: ``kernels.qr(A, variant, checked)`` exactly as a user calls it."""

    def __init__(self, a: np.ndarray, variant: str, checked: bool):
        from .. import kernels

        self.a, self.variant, self.checked = a, variant, checked
        self.fn = kernels.qr
        self.out: tuple[Any, Any] | None = None

    def reset(self) -> None:
        pass

    def run(self) -> None:
        self.out = self.fn(self.a, variant=self.variant, checked=self.checked)


#: Work above which the secondary variants are skipped in the peer comparison:
#: the unblocked kernel is BLAS-2 (never the fastest at size) and the half
#: variant is timed where it is cheap; "blocked" and the default run on every shape.
SECONDARY_MAX_FLOPS = 2e10
FULL_RANGE_VARIANTS = ("blocked", "parallel")


def peer_limits() -> dict[str, float]:
    """``max_flops`` for peers.run: secondary variants stop at SECONDARY_MAX_FLOPS."""
    return {f"capqr:{n}": SECONDARY_MAX_FLOPS for n in available()
            if n not in FULL_RANGE_VARIANTS}


def peer_impls(include: list[str] | None = None) -> dict[str, Any]:
    """``capqr:<variant>`` implementations (checked builds) for peers.run."""
    out = {}
    for name in available():
        if include is not None and name not in include:
            continue
        out[f"capqr:{name}"] = lambda a, name=name: _KernelsQr(a, name, True)
    return out


def check(a: np.ndarray, runner: Any, max_mats: int | None = None) -> dict[str, Any] | None:
    """Run ``kernels.check`` on the first few matrices of the last result (None before a run).

    The float64 checker costs about as much as several factorisations, so
    big shapes check one matrix and small ones up to four.
    """
    from .. import kernels

    if getattr(runner, "out", None) is None:
        return None
    h, tau = runner.out
    a3, h3, t3 = (a, h, tau) if a.ndim == 3 else (a[None], h[None], tau[None])
    if max_mats is None:
        max_mats = max(1, min(4, int(8 * (1024 / a3.shape[-1]) ** 3)))
    k = min(max_mats, a3.shape[0])
    try:
        rep = kernels.check(a3[:k], h3[:k], t3[:k])
    except Exception as e:  # noqa: BLE001 - report, do not crash the benchmark
        return {"passed": False, "error": f"{type(e).__name__}: {e}"[:300]}
    return {"passed": bool(rep.ok), "matrices_checked": k,
            "worst": {key: float(v) for key, v in rep.worst().items()}}
