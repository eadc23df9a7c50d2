"""Timing GPU launches with CUDA events (benchmarks; no sequence semantics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import driver as drv
from .kernel import CudaKernel
from .launches import check_block, check_cooperative, launch_async
from .memory import DeviceCapability, drain_all, hold_all, unhold_all
from .params import ParamBlock
from .sequence import (
    capability_fault,
    current,
    device_record,
    read_record,
    reset_record,
    sync_locked,
)


def time_launch(kernel: CudaKernel, caps: Sequence[DeviceCapability] | DeviceCapability, *,
                args: Sequence[Any] = (), grid: int = 1, block: int = 128,
                shared_bytes: int = 0, repeat: int = 7, warmup: int = 1,
                before: Any = None, group: int | None = None) -> list[float]:
    """Milliseconds per launch measured with CUDA events (``repeat`` samples).

    ``before`` (optional callable) runs before each launch outside the timed
    region, e.g. to restore the input that the kernel overwrites in place.
    Syncs the pending sequence first; raises CapabilityFault if any launch faulted.
    """
    caps = [caps] if isinstance(caps, DeviceCapability) else list(caps)
    dev = drv.device()
    check_block(kernel, block, dev)
    cooperative = check_cooperative(kernel, group, grid, block, shared_bytes)
    drain_all()
    out = []
    start, end = drv.Event(), drv.Event()
    with current.lock:
        sync_locked(None)
        record = device_record(dev)
        held = hold_all(caps)
        try:
            params = ParamBlock(kernel)  # its own: ``before`` may launch this kernel
            names = params.pack(caps, args, record, 0)
            for it in range(warmup + repeat):
                if before is not None:
                    before()
                    sync_locked(None)  # ``before`` may have launched
                reset_record(record)
                start.record()
                launch_async(kernel, params, grid, block, shared_bytes,
                             cooperative=cooperative)
                end.record()
                end.synchronize()
                rec = read_record(record)
                if rec.flag:
                    raise capability_fault(rec, kernel, names, None)
                if it >= warmup:
                    out.append(start.elapsed_ms(end))
        finally:
            unhold_all(held)
    return out
