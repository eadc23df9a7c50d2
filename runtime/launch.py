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


class _Plan:
    """What a launch of one kernel needs from its signature, worked out once:
    per parameter, whether it is a cap, its name and the rt_arg field a
    scalar goes to."""

    __slots__ = ("params", "n_caps", "n_scalars", "size")

    def __init__(self, sig: Any):
        self.params = [(k == "cap", name, k) for name, k in sig.params]
        self.n_caps = sum(1 for is_cap, _, _ in self.params if is_cap)
        self.n_scalars = len(self.params) - self.n_caps
        self.size = max(1, len(self.params))


_plans: dict[int, tuple[Any, _Plan]] = {}  # id(signature) -> (signature, plan)
_classes: tuple[type, type, type] | None = None


def _plan(sig: Any) -> _Plan:
    hit = _plans.get(id(sig))
    if hit is not None and hit[0] is sig:
        return hit[1]
    plan = _Plan(sig)
    _plans[id(sig)] = (sig, plan)  # holds sig, so its id is not reused
    return plan


def _launch_classes() -> tuple[type, type, type]:
    """(Capability, NoBoundsCap, CudaKernel), imported on first use (the GPU lane's
    module never touches the driver on import)."""
    global _classes
    if _classes is None:
        from capabilities.handle import Capability, NoBoundsCap

        from . import cuda

        _classes = (Capability, NoBoundsCap, cuda.CudaKernel)
    return _classes


def launch(kernel: Any, caps: Sequence[Any] = (), *, args: Sequence[Any] = (), grid: int = 1,
           timeout: float | None = None, **kw: Any) -> None:
    """Run ``grid`` blocks of ``kernel``; return when all have ended.

    Caps are matched in order to the kernel's ``cap_t`` parameters and
    ``args`` to its scalar parameters.  Raises ``TypeError`` before anything
    runs on a count/type mismatch, ``CapabilityFault`` if any block made a
    refused access (the access did not happen and all blocks stopped), and
    ``KernelTimeout`` when ``timeout`` seconds pass first.
    """
    capability, nobounds, cuda_kernel = _classes or _launch_classes()
    if isinstance(kernel, cuda_kernel):
        from . import cuda

        return cuda.launch(kernel, caps, args=args, grid=grid, timeout=timeout, **kw)
    if kw:
        raise TypeError(f"unexpected launch options {sorted(kw)} for a CPU kernel")
    sig = kernel.signature
    plan = _plan(sig)
    if isinstance(caps, (capability, nobounds)):
        caps = [caps]
    elif not isinstance(caps, (list, tuple)):
        caps = list(caps)
    if not isinstance(args, (list, tuple)):
        args = list(args)
    if len(caps) != plan.n_caps or len(args) != plan.n_scalars:
        check_counts(sig, len(caps), len(args), kernel.name)
    if type(grid) is not int or grid < 0 or timeout is not None:
        check_grid(grid, timeout)

    argv = ffi.new("rt_arg[]", plan.size)
    held: list[Any] = []
    ci = si = 0
    try:
        for i, (is_cap, pname, kind) in enumerate(plan.params):
            if is_cap:
                c = caps[ci]
                ci += 1
                if type(c) is capability or isinstance(c, capability):
                    if c.device != "cpu":
                        raise TypeError(f"{c!r} lives on {c.device}; kernel {kernel.name!r} "
                                        "runs on the CPU")
                    obj = c._arg_obj()
                    lib.gc_hold(obj)
                    held.append(obj)
                    lib.rt_arg_set_cap(argv + i, obj, 0)
                elif isinstance(c, nobounds):
                    lib.rt_arg_set_nobounds(argv + i, c.address)
                else:
                    raise TypeError(f"kernel {kernel.name!r}: parameter {pname!r} needs a "
                                    f"capability (capabilities.alloc/wrap), got "
                                    f"{type(c).__name__}")
            else:
                v = args[si]
                si += 1
                if kind == "int64" and type(v) is int and -(2**63) <= v < 2**63:
                    argv[i].i64 = v  # the common case, without scalar_arg's general path
                else:
                    field, v = scalar_arg(kind, v, pname, kernel.name)
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
    rec = finished = None
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
        kind = lib.rt_launch_result(L, ffi.NULL, ffi.NULL)
        if kind != 0:  # only now the record is copied out
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
