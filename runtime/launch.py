"""runtime.launch, runtime.sync, runtime.pending: one face for both lanes.

A kernel's class picks its lane: a ``CudaKernel`` launches through
runtime/cuda/launches.py, any other kernel through runtime/cpu/launches.py.
``launch(..., sync=False)`` adds a launch to the lane's sequence and
``sync()`` ends the sequences, raising the first fault.  On the GPU the
launches are only enqueued; on the CPU a sync=False launch runs at once, but
its fault is recorded instead of raised and the later ones are skipped: the
same observable semantics, so one API (and its tests) works on both lanes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from .argcheck import check_timeout
from .cpu import launches as cpu_lane
from .cpu.kernel import Kernel

_gpu_class: list[type] = []


def _cuda_kernel() -> type:
    """CudaKernel, imported on first use (the GPU lane's modules never touch the driver
    on import)."""
    if not _gpu_class:
        from .cuda.kernel import CudaKernel

        _gpu_class.append(CudaKernel)
    return _gpu_class[0]


def launch(kernel: Any, caps: Sequence[Any] = (), *, args: Sequence[Any] = (), grid: int = 1,
           timeout: float | None = None, sync: bool = True, group: int | None = None,
           **kw: Any) -> None:
    """Run ``grid`` blocks of ``kernel``; return when all have ended.

    Caps are matched in order to the kernel's ``cap_t`` parameters and
    ``args`` to its scalar parameters.  Raises ``TypeError`` before anything
    runs on a count/type mismatch, ``CapabilityFault`` if any block made a
    refused access (the access did not happen and all blocks stopped), and
    ``KernelTimeout`` when ``timeout`` seconds pass first.

    ``sync=False`` adds the launch to a sequence instead: its fault (and on
    the GPU, its waiting) is deferred to :func:`sync`, and once a launch of
    the sequence faulted the later ones do not run.  ``timeout`` then belongs
    to :func:`sync`.  Argument errors still raise here.  A ``sync=True``
    launch first ends a pending sequence, raising its fault (this launch then
    does not run).

    ``group`` (for kernels that call ``rt_group_sync``): blocks
    0 .. group-1 run at the same time and wait for each other at every
    ``rt_group_sync()``.  On the CPU it needs 1 <= group <= grid and group <=
    the worker count; on the GPU group == grid (a cooperative launch: the
    whole grid must fit on the device at once).  ValueError before anything
    runs otherwise.  ``kw``: the GPU lane's own options (``block``,
    ``shared_bytes``).
    """
    if type(kernel) is not Kernel and isinstance(kernel, _cuda_kernel()):
        from .cuda import launches as gpu_lane

        return gpu_lane.launch(kernel, caps, args=args, grid=grid, timeout=timeout,
                               sync=sync, group=group, **kw)
    if kw:
        raise TypeError(f"unexpected launch options {sorted(kw)} for a CPU kernel")
    return cpu_lane.launch(kernel, caps, args, grid, timeout, sync, group)  # positional: cheaper


def _gpu_sequence() -> Any:
    """The GPU lane's sequence module if it was ever imported (sync never loads it)."""
    return sys.modules.get(f"{__package__}.cuda.sequence")


def sync(timeout: float | None = None) -> None:
    """End the pending launch sequences: wait for them and raise the first fault.

    Waits for the GPU lane's enqueued launches (``timeout``: KernelTimeout,
    the running kernel is cancelled and the queued ones do not run), then ends
    the CPU lane's sequence.  The first fault of a sequence is raised exactly
    as a synchronous launch raises it, with ``launch_index`` (its position in
    the sequence).  If the GPU sequence raises, a CPU sequence stays pending
    for the next sync.  Every hold taken by the sequences' launches is released.
    """
    check_timeout(timeout)
    gpu = _gpu_sequence()
    if gpu is not None:
        gpu.sync(timeout)
    cpu_lane.end_sequence()


def pending() -> int:
    """Launches (both lanes) added to a sequence since the last sync."""
    gpu = _gpu_sequence()
    return cpu_lane.pending() + (gpu.pending() if gpu is not None else 0)
