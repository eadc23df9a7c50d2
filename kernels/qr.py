"""Python API of the QR kernel family: ``qr``, ``householder_product``, ``variants``.

Orientation.  Inputs are (m, n) or (batch, m, n) matrices in the usual numpy
(row-major) orientation.  Outputs are LAPACK ``xGEQRF`` compact form in the
same orientation as ``scipy.linalg.qr(a, mode="raw")[0]`` and ``torch.geqrf``:
``H[..., i, j]`` for ``i <= j`` is ``R[i, j]``; for ``i > j`` it is the i-th
entry of the j-th Householder vector ``v_j`` (``v_j[j] = 1`` implicit, zeros
above); ``tau[..., j]`` is its scale, ``Q = H_0 H_1 ... H_{k-1}``,
``H_j = I - tau_j v_j v_j^T``, k = min(m, n).  The kernels work directly on
the row-major buffer (see kernels/src/householder.c), so no transposes.

Sign convention: LAPACK's (beta = -sign(alpha) * norm), the same as scipy and
torch (both call LAPACK), so R agrees with them including signs up to
rounding; only where a column is (numerically) zero below the diagonal can
an implementation choose differently, which the reference tests allow for by
comparing ``|R|`` row signs (see tests/test_kernels_reference.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..capabilities import abi
from . import parallel, sources

#: Largest panel width the blocked kernels accept (their local tiles are 128 rows).
NB_MAX = 128


def work_size(grid: int, m: int, n: int, nb: int | None) -> int:
    """Elements of the ``work`` scratch buffer a QR kernel launched on ``grid`` blocks gets.

    One slot per block: a row of ``n`` for the unblocked kernel (``nb=None``,
    kernels/src/geqr2.c) and ``m*nb + nb*nb + max(nb, m)`` rounded up to 16
    elements for the blocked ones (panel P, T matrix, then a scratch row of nb
    for geqrf.c or a column of m for the per-matrix kernel of qrt.c, whose
    slot_elems rounds its slots up to whole cache lines the same way).  Every
    caller (``qr``, the bench runner, the search gate, the tests) sizes ``work``
    with this.
    """
    per_block = n if nb is None else -(-(m * nb + nb * nb + max(nb, m)) // 16) * 16
    return grid * per_block


class HalfOverflowError(FloatingPointError):
    """The half-precision variant produced non-finite values from finite input."""


@dataclass(frozen=True)
class Variant:
    """One QR kernel variant: its source family, dtypes and tunable parameters."""

    name: str
    family: str
    dtypes: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    description: str = ""


_VARIANTS: dict[str, Variant] = {
    "unblocked": Variant("unblocked", "geqr2", ("float32", "float64"), {},
                         "xGEQR2: one Householder reflector at a time (BLAS-2)"),
    "blocked": Variant("blocked", "geqrf", ("float32", "float64"), {"nb": 32},
                       "xGEQRF: panels of nb columns, compact WY (T matrix), blocked update"),
    "f16": Variant("f16", "geqrf_f16", ("float16",), {"nb": 32},
                   "blocked QR with half storage (matrix, R, V), float32 accumulation"),
    "parallel": Variant("parallel", "qrt", ("float32", "float64"), {"nb": 32, "tw": 64},
                        "blocked QR with register-tiled updates (nb 32; 64 above 512 "
                        "columns); a single matrix is driven from the host panel by panel, "
                        "one block per (matrix, column tile)"),
}

#: What ``variant="auto"`` (the default) runs.
AUTO_VARIANT = "parallel"


def variants() -> dict[str, Variant]:
    """The available variants by name (dtypes they compute in, default parameters)."""
    return dict(_VARIANTS)


def _kernel(family: str, dtype: str, checked: bool) -> Any:
    from .. import runtime

    src = sources.source(family, "float32" if dtype == "float16" else dtype)
    return runtime.compile(src, sources.entry(family, dtype), checked=checked)


NONFINITE = "input contains NaN or Inf (pass allow_nonfinite=True to factor anyway)"
#: Inputs from this many elements on are copied (and checked for NaN/Inf) by a
#: kernel on every worker: numpy's copy of a fresh array is one thread taking
#: every page fault.
COPY_ON_WORKERS_MIN = 1 << 22


#: Alignment of the working copy the kernels factor in place (bytes): a collector
#: payload's (capabilities/abi.py).
ALIGN = abi.PAYLOAD_ALIGN


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-order array whose data starts on a 64-byte line (numpy
    promises 16): rows of 16 floats then start on lines too, and the kernels'
    vector loads split none.  One float32 matrix by ``parallel`` on the 2-core VM,
    median of 7, two runs, 64-aligned vs the other three offsets: n=1024 15.0-15.1
    vs 15.6-16.1 ms, n=2048 106-125 vs 109-150 ms, (8,512) 16.1-17.7 vs 16.5-18.9 ms."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    off = -buf.ctypes.data % ALIGN
    return buf[off:off + nbytes].view(dt).reshape(shape)


#: kernels.qr pads the rows of a single matrix factored by steps to whole cache
#: lines (kernels.parallel.padded_ld): with rows of n % 16 != 0 floats, blocks
#: updating neighbouring tiles wrote lines they share, and an odd n left most
#: rows' vector loads off their natural alignment.  2-core VM, one float32
#: matrix, kernels.qr interleaved with and without (median of 9, two runs):
#: n=2001 0.77-0.81x the time, n=1001 0.81-0.95x, n=1000 and 1016 0.89-1.02x
#: (bench/results/cpu-alignment-2026-12-05-vm.txt).
PAD_ROWS = True


def _unpadded(h: np.ndarray, n: int) -> np.ndarray:
    """The first n columns of every row of h (batch, m, ld), moved to the front of
    its buffer: a C-contiguous (batch, m, n) view, still on a line."""
    batch, m, ld = h.shape
    if ld == n:
        return h
    out = h.reshape(-1)[:batch * m * n].reshape(batch, m, n)
    out[...] = h[:, :, :n]   # overlapping: numpy copies through a buffer
    return out


def _copy_on_workers(a3: np.ndarray, dt: str, allow_nonfinite: bool = False
                     ) -> np.ndarray | None:
    """A copy of ``a3`` made by kernels/src/copy.c on all workers, or None where
    numpy copies instead (small, strided, another dtype, one worker).  Raises
    ValueError for NaN/Inf unless ``allow_nonfinite``."""
    from .. import capabilities, runtime

    workers = runtime.threads()
    if (a3.size < COPY_ON_WORKERS_MIN or workers < 2 or a3.dtype != np.dtype(dt)
            or dt not in ("float32", "float64") or not a3.flags.c_contiguous):
        return None
    h = _alloc_working(a3.shape, a3.dtype, "working copy")
    bad = np.zeros(workers, np.int64)
    runtime.launch(_kernel("copy", dt, True), [capabilities.wrap(a3, "r", "qr.input"),
                   capabilities.wrap(h, name="qr.a"), capabilities.wrap(bad, name="qr.bad")],
                   args=(a3.size,), grid=workers)
    if bad.any() and not allow_nonfinite:
        raise ValueError(NONFINITE)
    return h


def _as_numpy(A: Any) -> tuple[np.ndarray, bool]:
    if type(A).__module__.startswith("torch"):
        return A.detach().cpu().numpy(), True
    return np.asarray(A), False


#: The element types ``qr`` and ``householder_product`` take.  Integers and
#: bools are refused rather than cast: a cast to float is the caller's choice
#: of precision, and an int matrix is more often a mistake than a request.
INPUT_DTYPES = ("float16", "float32", "float64")


def _input(A: Any, what: str) -> tuple[np.ndarray, bool]:
    """``A`` as numpy (zero-copy where it can be) and whether it was a torch tensor,
    or TypeError naming the supported dtypes (``what``: the argument, for messages)."""
    is_torch = type(A).__module__.startswith("torch")
    if is_torch:
        if getattr(A, "requires_grad", False):
            # capqr runs kernels on raw memory: nothing records a graph, so a
            # result would silently have no grad_fn
            raise TypeError(f"{what} requires grad, and capqr does not track gradients; "
                            f"pass {what}.detach() (the result then has no grad_fn)")
        dname = str(A.dtype).removeprefix("torch.")
        if dname not in INPUT_DTYPES:
            raise TypeError(f"{what} has dtype {A.dtype}; kernels.qr takes "
                            f"{', '.join(INPUT_DTYPES)} (convert first, e.g. "
                            f"{what}.to(torch.float32))")
        a = A.detach().cpu().numpy()
    else:
        a = np.asarray(A)
        if a.dtype.name not in INPUT_DTYPES:
            raise TypeError(f"{what} has dtype {a.dtype}; kernels.qr takes "
                            f"{', '.join(INPUT_DTYPES)} (convert first, e.g. "
                            f"{what}.astype(np.float64))")
    return a, is_torch


def _compute_dtype(variant: Variant, dt: np.dtype) -> str:
    if variant.family == "geqrf_f16":
        if dt == np.float64:
            # half storage keeps ~3 decimal digits: rounding float64 input to
            # it is a decision the caller has to make visibly
            raise TypeError("variant 'f16' stores the matrix in float16 and would round "
                            "float64 input to it; pass A.astype(np.float16) (or float32) "
                            "to accept that, or use a float64 variant")
        return "float16"
    if dt == np.float64:
        return "float64"
    return "float32"   # float32 and float16 (_input admits nothing else)


def _check_grid(grid: Any) -> None:
    """``grid`` of kernels.qr: None or a positive int (a bool or 2.5 is a mistake)."""
    if grid is None:
        return
    if isinstance(grid, bool) or not isinstance(grid, (int, np.integer)):
        raise TypeError(f"kernels.qr: grid must be a positive int or None, got {grid!r}")
    if grid < 1:
        raise ValueError(f"kernels.qr: grid must be a positive int or None (blocks per "
                         f"launch), got {grid}")


def _check_working_size(shape: tuple[int, ...], dtype: Any,
                        what: str = "working copy") -> int:
    """The bytes of a working array, or ValueError naming them when no process could
    hold it (capabilities.handle.MAX_ALLOC_BYTES)."""
    from ..capabilities.handle import MAX_ALLOC_BYTES, _human

    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes > MAX_ALLOC_BYTES:
        raise ValueError(f"kernels.qr: the {what} of shape {shape} ({np.dtype(dtype)}) needs "
                         f"{nbytes} bytes ({_human(nbytes)}), more than any process can "
                         f"address ({_human(MAX_ALLOC_BYTES)})")
    return nbytes


def _alloc_working(shape: tuple[int, ...], dtype: Any, what: str) -> np.ndarray:
    """aligned_empty, or ValueError/MemoryError naming the bytes the factorisation needs."""
    from ..capabilities.handle import _human

    nbytes = _check_working_size(shape, dtype, what)
    try:
        return aligned_empty(shape, dtype)
    except MemoryError:
        raise MemoryError(f"kernels.qr: cannot allocate the {what} of shape {shape} "
                          f"({np.dtype(dtype)}): {nbytes} bytes ({_human(nbytes)})") from None


def qr(A: Any, variant: str = "auto", checked: bool = True, *, nb: int | None = None,
       grid: int | None = None, allow_nonfinite: bool = False,
       timeout: float | None = None) -> tuple[Any, Any]:
    """Householder QR of A, shape (m, n) or (batch, m, n), in LAPACK compact form.

    Returns ``(H, tau)`` (numpy, or torch CPU tensors for torch input); see the
    module docstring for the layout.  ``variant`` is a name from
    :func:`variants` or ``"auto"`` (the default: ``parallel``);
    ``checked=False`` runs the raw (unchecked) build of the same kernel.  ``nb`` is the panel
    width of the blocked variants (1..128; ``parallel``: 1..64).  ``grid``
    defaults to the batch size (one block per matrix); for ``parallel`` it
    caps the blocks of each launch (default: one per work item).
    float64 input is factored in float64, float32/float16 in float32 (the
    ``f16`` variant stores in half: H is float16, tau float32; it refuses
    float64 input rather than round it to half).  Other dtypes (integers,
    bools, complex, bfloat16) raise TypeError: cast first.  A torch tensor
    that requires grad raises TypeError (capqr does not track gradients:
    pass ``A.detach()``).  ``grid`` must be None or a positive int.

    Raises ValueError for NaN/Inf input unless ``allow_nonfinite`` (then NaNs
    propagate and :func:`kernels.check` flags them), ``HalfOverflowError``
    when the f16 variant overflows half precision (unless ``allow_nonfinite``),
    and the runtime's CapabilityFault/KernelTimeout if the kernel misbehaves.
    """
    from . import gpu
    _check_grid(grid)
    if gpu.on_device(A):  # a DeviceCapability or CUDA tensor: the blocked GPU QR (kernels/gpu)
        return gpu.qr_device(A, checked=checked, timeout=timeout)
    from .. import capabilities, runtime

    if variant == "auto":
        variant = AUTO_VARIANT
    if variant not in _VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; have {sorted(_VARIANTS)} or 'auto'")
    v = _VARIANTS[variant]
    a, is_torch = _input(A, "A")
    if a.ndim not in (2, 3):
        raise ValueError(f"expected a (m, n) or (batch, m, n) matrix, got shape {a.shape}")
    batched = a.ndim == 3
    a3 = a if batched else a[None]
    batch, m, n = a3.shape
    if m == 0 or n == 0:
        raise ValueError(f"empty matrix of shape {a.shape}")
    dt = _compute_dtype(v, a3.dtype)
    k = min(m, n)
    ld = n
    if v.family == "qrt":
        b = (parallel.default_nb(m, n, batch, runtime.threads()) if nb is None
             else int(nb))
        if not 1 <= b <= parallel.NB_MAX:
            raise ValueError(f"panel width nb={b} outside 1..{parallel.NB_MAX}")
        if parallel.use_small(m, n, dt) and a3.dtype == np.float32 and a3.flags.c_contiguous:
            # qr_small copies and scans the input itself (parallel.run_small)
            h = _alloc_working((batch, m, n), dt, "working copy")
            tau = np.empty((batch, k), np.float32)
            if (parallel.run_small(h, tau, checked, grid, timeout, n, src=a3)
                    and not allow_nonfinite):
                raise ValueError(NONFINITE)
            return _result(h, tau, batched, is_torch)
        if PAD_ROWS:
            ld = parallel.working_ld(batch, m, n, b, np.dtype(dt).itemsize, runtime.threads())
    # before anything reads the input (the NaN scan alone would take hours on a
    # broadcast (2^20, 2^20) matrix): can the working copy exist at all?
    _check_working_size((batch, m, ld), dt)
    h = _copy_on_workers(a3, dt, allow_nonfinite) if ld == n else None
    if h is None and not allow_nonfinite and not np.isfinite(a3).all():
        raise ValueError(NONFINITE)
    if h is not None:
        tdt = np.dtype(dt)
    elif dt == "float16":
        h = _alloc_working(a3.shape, np.float16, "working copy")
        with np.errstate(over="ignore"):
            np.copyto(h, a3, casting="unsafe")
        if not allow_nonfinite and not np.isfinite(h).all():
            raise HalfOverflowError("input exceeds the float16 range (max 65504)")
        tdt = np.float32
    else:
        h = _alloc_working((batch, m, ld), dt, "working copy")
        np.copyto(h[:, :, :n], a3, casting="unsafe")
        h[:, :, n:] = 0   # never read; zero so that nothing depends on old memory
        tdt = np.dtype(dt)
    tau = np.zeros((batch, k), dtype=tdt)
    if v.family == "qrt":
        # without an nb, the path parallel.run takes chooses its own panel width
        parallel.run(h, tau, dt, None if nb is None else b, v.params["tw"], checked, grid,
                     timeout, n=n)
        return _result(_unpadded(h, n), tau, batched, is_torch)
    g = batch if grid is None else max(1, min(int(grid), batch))
    kern = _kernel(v.family, dt, checked)
    hc = capabilities.wrap(h, name="qr.a")
    tc = capabilities.wrap(tau, name="qr.tau")
    if v.family == "geqr2":
        work = capabilities.alloc((work_size(g, m, n, None),), tdt, name="qr.work")
        scalars: tuple = (batch, m, n)
    else:
        b = v.params["nb"] if nb is None else int(nb)
        if not 1 <= b <= NB_MAX:
            raise ValueError(f"panel width nb={b} outside 1..{NB_MAX}")
        work = capabilities.alloc((work_size(g, m, n, b),), np.float32 if dt == "float16"
                                  else tdt, name="qr.work")
        scalars = (batch, m, n, b)
    try:
        runtime.launch(kern, [hc, tc, work], args=scalars, grid=g, timeout=timeout)
    finally:
        work.free()
    if dt == "float16" and not allow_nonfinite and not np.isfinite(h).all():
        raise HalfOverflowError("float16 storage overflowed during the factorisation "
                                "(values beyond 65504); use a float32 variant")
    return _result(h, tau, batched, is_torch)


def _result(h: np.ndarray, tau: np.ndarray, batched: bool, is_torch: bool) -> tuple[Any, Any]:
    H, T = (h, tau) if batched else (h[0], tau[0])
    if is_torch:
        import torch

        return torch.from_numpy(H), torch.from_numpy(T)
    return H, T


def householder_product(H: Any, tau: Any) -> Any:
    """Form the m x min(m,n) Q of a compact-form QR (float64, reference code).

    Accepts (m, n) or (batch, m, n) with tau (k,) or (batch, k), k = min(m, n)
    (ValueError naming both shapes otherwise); returns the same container type
    (numpy or torch) as H, always float64.  dtypes and torch tensors as for
    :func:`qr`.
    """
    h, is_torch = _input(H, "H")
    t, _ = _input(tau, "tau")
    h = np.asarray(h, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    if h.ndim not in (2, 3):
        raise ValueError(f"expected H of shape (m, n) or (batch, m, n), got {h.shape}")
    # tau holds one scale per reflector: min(m, n) of them per matrix.  A
    # shorter one would make LAPACK read past it, a longer one is some other
    # matrix's
    k = min(h.shape[-2:])
    want = h.shape[:-2] + (k,)
    if t.shape != want:
        given = t.shape[-1] if t.ndim else "a scalar"
        raise ValueError(f"tau has length {given} (shape {t.shape}), expected {k} (shape "
                         f"{want}): min(m, n) scales per matrix for H of shape {h.shape}")
    if h.ndim == 2:
        q = _orgqr(h, t)
    else:
        q = np.stack([_orgqr(h[i], t[i]) for i in range(h.shape[0])])
    if is_torch:
        import torch

        return torch.from_numpy(q)
    return q


def _orgqr(h: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Q (m x k) from one compact-form matrix: LAPACK dorgqr, or a numpy loop."""
    m, n = h.shape
    k = min(m, n)
    try:
        from scipy.linalg import lapack
    except ImportError:  # pragma: no cover - scipy is a test dependency
        lapack = None
    if lapack is not None and np.isfinite(h).all() and np.isfinite(t).all():
        q, _, info = lapack.dorgqr(np.asfortranarray(h[:, :k]), t[:k], lwork=max(1, 64 * k))
        if info == 0:
            return np.ascontiguousarray(q)
    q = np.eye(m, k)
    for j in range(k - 1, -1, -1):
        v = np.concatenate(([1.0], h[j + 1:, j]))
        q[j:, :] -= t[j] * np.outer(v, v @ q[j:, :])
    return q


def apply_qt(H: np.ndarray, tau: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Q^T C (float64) for one compact-form matrix: LAPACK dormqr, or a numpy loop."""
    h = np.asarray(H, dtype=np.float64)
    t = np.asarray(tau, dtype=np.float64)
    c = np.array(C, dtype=np.float64)
    m, n = h.shape
    k = min(m, n)
    try:
        from scipy.linalg import lapack
    except ImportError:  # pragma: no cover
        lapack = None
    if lapack is not None and np.isfinite(h).all() and np.isfinite(t).all() \
            and np.isfinite(c).all():
        cq, _, info = lapack.dormqr("L", "T", np.asfortranarray(h[:, :k]), t[:k],
                                    np.asfortranarray(c), lwork=max(1, 64 * c.shape[1]))
        if info == 0:
            return np.ascontiguousarray(cq)
    for j in range(k):
        v = np.concatenate(([1.0], h[j + 1:, j]))
        c[j:, :] -= t[j] * np.outer(v, v @ c[j:, :])
    return c
