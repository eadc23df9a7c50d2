"""GPU kernels in the capqr dialect (compiled through runtime.cuda)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

QR_SOURCE = (Path(__file__).with_name("qr.c")).read_text()
MAX_N = 4096  # smem_v in qr.c


@cache
def qr_kernel(checked: bool = True) -> Any:
    """The compiled batched QR kernel (checked or raw build), cached per process."""
    from runtime import cuda

    return cuda.compile(QR_SOURCE, "gpu_qr", checked=checked)


def qr_block_size(n: int) -> int:
    """Threads per block for order n: a power of two, one thread per trailing column."""
    t = 32
    while t < n and t < 1024:
        t *= 2
    return t


def qr_launch(A: Any, tau: Any, n: int, *, checked: bool = True, timeout: float | None = None
              ) -> None:
    """Factor the batch in place: A (batch, n, n) float32 device cap -> compact (H, tau)."""
    from runtime import cuda

    if n > MAX_N:
        raise ValueError(f"gpu_qr supports n <= {MAX_N}")
    batch = A.nbytes // (4 * n * n)
    cuda.launch(qr_kernel(checked), [A, tau], args=(n,), grid=batch, block=qr_block_size(n),
                timeout=timeout)


def qr(a: np.ndarray, *, checked: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Householder QR of a (batch, n, n) float32 host array on the GPU -> (H, tau).

    H[b] holds R on/above the diagonal and the Householder vectors below it in
    the same orientation as ``scipy.linalg.qr(a[b], mode='raw')[0]``.
    """
    from runtime import cuda

    a = np.ascontiguousarray(a, dtype=np.float32)
    batch, n, _ = a.shape
    A = cuda.to_device(a, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    try:
        qr_launch(A, tau, n, checked=checked)
        return A.numpy(), tau.numpy()
    finally:
        A.free()
        tau.free()
