"""Micro kernels for the overhead table: axpy, a gemm-like triple loop, a 5-point stencil.

Written in the dialect the way the instrumenter rewards (runtime/compiler/hoist/):
innermost loops are ``for (int64_t i = A; i < B; i++)`` with indices affine in
``i``, so their range checks are hoisted into one guard before the loop.
axpy works in tiles of 4096 elements because a fast loop of fewer than 2^16
iterations polls once after the loop instead of at every back-edge (a call in
the body would stop gcc vectorising it) - the same tiling a real kernel uses.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from .case import Case, LaunchRunner

SOURCE = r"""
KERNEL void axpy_f32(cap_t x, cap_t y, int64_t n, float alpha)
{
    int64_t ntiles = (n + 4095) / 4096;
    for (int64_t t = rt_block_idx(); t < ntiles; t += rt_grid_dim()) {
        int64_t lo = t * 4096;
        int64_t hi = lo + 4096 < n ? lo + 4096 : n;
        for (int64_t i = lo; i < hi; i++)
            cap_store_f32(y, i, cap_load_f32(y, i) + alpha * cap_load_f32(x, i));
    }
}

KERNEL void gemm_f32(cap_t a, cap_t b, cap_t c, int64_t n)
{
    for (int64_t i = rt_block_idx(); i < n; i += rt_grid_dim()) {
        for (int64_t k = 0; k < n; k++) {
            float aik = cap_load_f32(a, i * n + k);
            for (int64_t j = 0; j < n; j++)
                cap_store_f32(c, i * n + j,
                              cap_load_f32(c, i * n + j) + aik * cap_load_f32(b, k * n + j));
        }
    }
}

KERNEL void stencil_f32(cap_t src, cap_t dst, int64_t n)
{
    for (int64_t i = 1 + rt_block_idx(); i < n - 1; i += rt_grid_dim()) {
        for (int64_t j = 1; j < n - 1; j++)
            cap_store_f32(dst, i * n + j,
                          0.25f * (cap_load_f32(src, (i - 1) * n + j)
                                   + cap_load_f32(src, (i + 1) * n + j)
                                   + cap_load_f32(src, i * n + j - 1)
                                   + cap_load_f32(src, i * n + j + 1)));
    }
}
"""

#: (kernel, full-run sizes, quick sizes)
SIZES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "axpy": ((1 << 16, 1 << 20, 1 << 23), (1 << 14,)),
    "gemm": ((128, 256, 512), (64,)),
    "stencil": ((256, 1024, 2048), (128,)),
}


def _grid() -> int:
    from .. import runtime

    return max(1, runtime.threads())


def _buffers(arrays: list[np.ndarray]) -> tuple[list, list[np.ndarray]]:
    """Fresh collector-owned buffers holding copies of ``arrays`` (caps, numpy views)."""
    from .. import capabilities

    caps, views = [], []
    for a in arrays:
        c = capabilities.alloc(a.shape, a.dtype)
        v = c.numpy()
        np.copyto(v, a)
        caps.append(c)
        views.append(v)
    return caps, views


def _maker(kernel: str, n: int, seed: int):
    """Build the ``make(mode)`` of one case: same initial arrays for every mode."""
    rng = np.random.default_rng(seed)
    if kernel == "axpy":
        init = [rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)]
        args: tuple = (n, 0.5)
        written = [1]
    elif kernel == "gemm":
        init = [rng.standard_normal((n, n), dtype=np.float32) for _ in range(2)]
        init.append(np.zeros((n, n), np.float32))
        args = (n,)
        written = [2]
    else:
        init = [rng.standard_normal((n, n), dtype=np.float32), np.zeros((n, n), np.float32)]
        args = (n,)
        written = [1]

    def make(mode: str) -> LaunchRunner:
        k = _build(kernel, mode)
        caps, views = _buffers(init)
        return LaunchRunner(k, caps, args, _grid(), [(views[i], init[i]) for i in written])

    return make


def _build(kernel: str, mode: str) -> Any:
    """The kernel a case's make(mode) compiles."""
    from .. import runtime

    return runtime.compile(SOURCE, f"{kernel}_f32", mode=mode)


def _flops(kernel: str, n: int) -> float:
    return {"axpy": 2.0 * n, "gemm": 2.0 * n**3, "stencil": 4.0 * (n - 2) ** 2}[kernel]


def cases(quick: bool) -> list[Case]:
    """The micro-kernel cases (smallest sizes only when ``quick``)."""
    out = []
    for i, (kernel, (full, small)) in enumerate(SIZES.items()):
        for n in small if quick else full:
            out.append(Case("micro", kernel, f"n={n}", _maker(kernel, n, seed=1000 * i + n),
                            flops=_flops(kernel, n), build=partial(_build, kernel),
                            build_key=kernel))
    return out


LAUNCH_SOURCE = r"""
KERNEL void empty_f32(cap_t a, cap_t b, cap_t c, int64_t m, int64_t n, int64_t k, int64_t nb) {}
"""


def launch_cost(launches: int = 1000, samples: int = 21) -> list[dict]:
    """Microseconds per launch of an empty kernel with a QR-like signature (3 caps,
    4 int64), grid 1 and grid = cores: wall time (min and median of ``samples``
    batches of ``launches``) and process CPU time (launcher plus workers)."""
    import time

    from .. import capabilities, runtime

    k = runtime.compile(LAUNCH_SOURCE, "empty_f32")
    caps = [capabilities.alloc((16,), np.float32) for _ in range(3)]
    rows = []
    for grid in (1, _grid()):
        row: dict = {"kernel": "empty", "grid": grid}
        for clock_name, clock in (("wall", time.perf_counter), ("cpu", time.process_time)):
            per = []
            for _ in range(samples):
                t0 = clock()
                for _ in range(launches):
                    runtime.launch(k, caps, args=(1, 2, 3, 4), grid=grid)
                per.append((clock() - t0) / launches * 1e6)
            per.sort()
            row[f"{clock_name}_min_us"] = per[0]
            row[f"{clock_name}_median_us"] = per[len(per) // 2]
        rows.append(row)
    return rows


if __name__ == "__main__":
    import json

    print(json.dumps(launch_cost(), indent=1))
