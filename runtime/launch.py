"""runtime.launch: run a kernel's blocks on the C worker pool."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from capabilities import abi

from . import core
from .argcheck import check_counts, check_grid, scalar_arg
from .errors import CapabilityFault, KernelTimeout, fault_detail

ffi, lib = core.ffi, core.lib

FAULT_REASONS = abi.FAULT_REASON
RT_FAULT_TIMEOUT, RT_FAULT_CANCELLED = abi.FAULT_CODE["TIMEOUT"], abi.FAULT_CODE["CANCELLED"]
ACCESS = abi.ACCESS
#: How often the waiting host thread wakes to deliver signals (Ctrl-C) and
#: enforce the deadline.
WAIT_SLICE = 0.05


def launch(kernel: Any, caps: Sequence[Any] = (), *, args: Sequence[Any] = (), grid: int = 1,
           timeout: float | None = None, **kw: Any) -> None:
    """Run ``grid`` blocks of ``kernel``; return when all have ended.

    Caps are matched in order to the kernel's ``cap_t`` parameters and
    ``args`` to its scalar parameters.  Raises ``TypeError`` before anything
    runs on a count/type mismatch, ``CapabilityFault`` if any block made a
    refused access (the access did not happen and all blocks stopped), and
    ``KernelTimeout`` when ``timeout`` seconds pass first.
    """
    from capabilities.handle import Capability, NoBoundsCap

    from . import cuda  # importing the GPU lane never touches the driver

    if isinstance(kernel, cuda.CudaKernel):
        return cuda.launch(kernel, caps, args=args, grid=grid, timeout=timeout, **kw)
    if kw:
        raise TypeError(f"unexpected launch options {sorted(kw)} for a CPU kernel")
    sig = kernel.signature
    caps = list(caps) if not isinstance(caps, (Capability, NoBoundsCap)) else [caps]
    args = list(args)
    check_counts(sig, len(caps), len(args), kernel.name)
    check_grid(grid, timeout)

    argv = ffi.new("rt_arg[]", max(1, len(sig.params)))
    held: list[Any] = []
    ci = si = 0
    try:
        for i, (pname, kind) in enumerate(sig.params):
            if kind == "cap":
                c = caps[ci]
                ci += 1
                if isinstance(c, NoBoundsCap):
                    lib.rt_arg_set_nobounds(argv + i, c.address)
                elif isinstance(c, Capability):
                    if c.device != "cpu":
                        raise TypeError(f"{c!r} lives on {c.device}; kernel {kernel.name!r} "
                                        "runs on the CPU")
                    obj = c._arg_obj()
                    lib.gc_hold(obj)
                    held.append(obj)
                    lib.rt_arg_set_cap(argv + i, obj, 0)
                else:
                    raise TypeError(f"kernel {kernel.name!r}: parameter {pname!r} needs a "
                                    f"capability (capabilities.alloc/wrap), got "
                                    f"{type(c).__name__}")
            else:
                field, v = scalar_arg(kind, args[si], pname, kernel.name)
                si += 1
                setattr(argv[i], field, v)
        _run(kernel, argv, grid, timeout)
    finally:
        for obj in held:
            lib.gc_unhold(obj)


def _run(kernel: Any, argv: Any, grid: int, timeout: float | None) -> None:
    L = lib.rt_launch_start(ffi.cast("void *", kernel.entry_address), argv, grid)
    if L == ffi.NULL:
        raise MemoryError("capqr: cannot start launch")
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    try:
        try:
            while not lib.rt_launch_wait(L, WAIT_SLICE):
                if deadline is not None and time.monotonic() >= deadline and not timed_out:
                    timed_out = True
                    lib.rt_launch_cancel(L, RT_FAULT_TIMEOUT)
        except BaseException:
            # Ctrl-C or similar: stop the blocks, wait for them, then re-raise.
            lib.rt_launch_cancel(L, RT_FAULT_CANCELLED)
            while not lib.rt_launch_wait(L, WAIT_SLICE):
                pass
            raise
        rec = ffi.new("rt_fault_rec *")
        finished = ffi.new("int64_t *")
        kind = lib.rt_launch_result(L, rec, finished)
    finally:
        lib.rt_launch_free(L)
    if kind == 0:
        return
    if kind == RT_FAULT_TIMEOUT:
        raise KernelTimeout(kernel.name, timeout or 0.0, int(finished[0]))
    if kind == RT_FAULT_CANCELLED:
        raise KeyboardInterrupt
    raise fault_from_record(kernel.name, rec)


def fault_from_record(kernel_name: str, rec: Any) -> CapabilityFault:
    """Build the exception for a C fault record."""
    reason = FAULT_REASONS.get(int(rec.kind), f"fault-{int(rec.kind)}")
    buf = ffi.string(rec.buffer).decode(errors="replace")
    access = ACCESS.get(int(rec.access))
    detail = fault_detail(reason, int(rec.index))
    if reason == "division-by-zero":
        buf = None
    return CapabilityFault(
        reason, kernel=kernel_name, block=int(rec.block), buffer=buf, index=int(rec.index),
        access=access, line=int(rec.line) or None,
        thread=int(rec.thread) if int(rec.thread) >= 0 else None, detail=detail)
