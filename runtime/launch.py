"""runtime.launch: run a kernel's blocks on the C worker pool; launch sequences.

``launch(..., sync=False)`` adds a launch to the lane's sequence and
``sync()`` ends the sequence, raising its first fault.  On the GPU the
launches are only enqueued (runtime/cuda/lane.py).  On the CPU a sync=False
launch runs at once, but its fault is recorded instead of raised, the later
sync=False launches are skipped while a fault is pending, and ``sync()``
raises it: the same observable semantics, so one API (and its tests) works
on both lanes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..capabilities import abi
from . import core
from .argcheck import check_counts, check_grid, check_timeout, group_arg, plain_int64, scalar_arg
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
        from ..capabilities.handle import Capability, NoBoundsCap
        from . import cuda

        _classes = (Capability, NoBoundsCap, cuda.CudaKernel)
    return _classes


class _CpuSequence:
    """The CPU lane's sync=False launches since the last sync (one per process,
    as on the GPU lane): how many, and the first fault among them."""

    __slots__ = ("lock", "launches", "fault")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.launches = 0
        self.fault: CapabilityFault | None = None


_cpu_seq = _CpuSequence()


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
    runs otherwise.
    """
    capability, nobounds, cuda_kernel = _classes or _launch_classes()
    if isinstance(kernel, cuda_kernel):
        from . import cuda

        return cuda.launch(kernel, caps, args=args, grid=grid, timeout=timeout, sync=sync,
                           group=group, **kw)
    if kw:
        raise TypeError(f"unexpected launch options {sorted(kw)} for a CPU kernel")
    if sync:
        if _cpu_seq.launches:
            _cpu_sync()
    elif timeout is not None:
        raise ValueError("a sync=False launch takes no timeout: pass it to runtime.sync()")
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
    if type(grid) is not int or grid < 1 or timeout is not None:
        check_grid(grid, timeout)
    if group is not None or sig.group_sync:
        group = check_group(kernel.name, sig.group_sync, group, grid)

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
                if kind == "int64" and plain_int64(v):
                    argv[i].i64 = v  # the common case, without scalar_arg's general path
                else:
                    field, v = scalar_arg(kind, v, pname, kernel.name)
                    setattr(argv[i], field, v)
        if sync:
            _run(kernel, argv, grid, timeout, group=group or 0)
        elif grid:
            _run_in_sequence(kernel, argv, grid, group or 0)
    finally:
        for obj in held:
            lib.gc_unhold(obj)


def check_group(name: str, uses: bool, group: Any, grid: int) -> int:
    """``group`` as an int, or ValueError unless it fits a CPU launch of kernel ``name``
    on ``grid`` blocks (``uses``: the kernel calls rt_group_sync)."""
    group = group_arg(name, uses, group, grid,
                      "group=N (the blocks 0 .. N-1 wait for each other there)")
    workers = lib.rt_core_threads()
    if group > workers:
        raise ValueError(f"a group of {group} blocks must run at once and the pool has "
                         f"{workers} workers ($CAPQR_THREADS): they would wait forever")
    return group


def _run_in_sequence(kernel: Any, argv: Any, grid: int, group: int = 0) -> None:
    """Run a sync=False launch now; record its fault for sync() instead of raising."""
    seq = _cpu_seq
    with seq.lock:
        index = seq.launches
        seq.launches += 1
        if seq.fault is not None:
            return  # an earlier launch of the sequence faulted: this one does not run
    try:
        _run(kernel, argv, grid, None, index, group)
    except CapabilityFault as e:
        with seq.lock:
            if seq.fault is None:
                seq.fault = e


def _cpu_sync() -> None:
    """End the CPU lane's sequence; raise its first fault."""
    seq = _cpu_seq
    with seq.lock:
        fault, seq.fault, seq.launches = seq.fault, None, 0
    if fault is not None:
        raise fault


def _gpu_lane() -> Any:
    """The GPU lane's module if it was ever imported (sync never loads it)."""
    return sys.modules.get(f"{__package__}.cuda.lane")


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
    lane = _gpu_lane()
    if lane is not None:
        lane.sync(timeout)
    _cpu_sync()


def pending() -> int:
    """Launches (both lanes) added to a sequence since the last sync."""
    lane = _gpu_lane()
    return _cpu_seq.launches + (lane.pending() if lane is not None else 0)


def _run(kernel: Any, argv: Any, grid: int, timeout: float | None,
         launch_index: int | None = None, group: int = 0) -> None:
    L = lib.rt_launch_start(ffi.cast("void *", kernel.entry_address), argv, grid, group)
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
    raise fault_from_record(kernel.name, rec, launch_index)


def fault_from_record(kernel_name: str, rec: Any,
                      launch_index: int | None = None) -> CapabilityFault:
    """Build the exception for a C fault record (``launch_index``: in a sequence)."""
    reason = FAULT_REASONS.get(int(rec.kind), f"fault-{int(rec.kind)}")
    buf = ffi.string(rec.buffer).decode(errors="replace")
    access = ACCESS.get(int(rec.access))
    detail = fault_detail(reason, int(rec.index))
    if reason == "division-by-zero":
        buf = None
    return CapabilityFault(
        reason, kernel=kernel_name, block=int(rec.block), buffer=buf, index=int(rec.index),
        access=access, line=int(rec.line) or None,
        thread=int(rec.thread) if int(rec.thread) >= 0 else None, detail=detail,
        launch_index=launch_index)
