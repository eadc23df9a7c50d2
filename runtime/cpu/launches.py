"""The CPU lane's launches: a kernel's blocks on the C worker pool, and its sequence.

A ``sync=False`` launch runs at once, but its fault is recorded instead of
raised, the later ``sync=False`` launches are skipped while a fault is
pending, and :func:`sync` raises it: the GPU lane's observable semantics
(runtime/cuda/launches.py), so one API (runtime/launch.py) and its tests work
on both lanes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from ...capabilities import abi
from ...capabilities.handle import Capability, NoBoundsCap
from .. import core
from ..argcheck import GroupRules, check_counts, check_grid, check_group, plain_int64, scalar_arg
from ..errors import CapabilityFault, KernelTimeout
from ..faults import fault_from_record, recorded_buffer

ffi, lib = core.ffi, core.lib

RT_FAULT_TIMEOUT, RT_FAULT_CANCELLED = abi.FAULT_CODE["TIMEOUT"], abi.FAULT_CODE["CANCELLED"]
#: a CPU group: blocks 0 .. group-1 of the launch, each on its own worker
GROUPS = GroupRules(
    wanted="group=N (the blocks 0 .. N-1 wait for each other there)", whole_grid=None,
    too_many="a group of {group} blocks must run at once and the pool has {at_once} workers "
             "($CAPQR_THREADS): they would wait forever")
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


def _plan(sig: Any) -> _Plan:
    hit = _plans.get(id(sig))
    if hit is not None and hit[0] is sig:
        return hit[1]
    plan = _Plan(sig)
    _plans[id(sig)] = (sig, plan)  # holds sig, so its id is not reused
    return plan


class _CpuSequence:
    """The CPU lane's sync=False launches since the last sync (one per process,
    as on the GPU lane): how many, and the first fault among them."""

    __slots__ = ("lock", "launches", "fault")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.launches = 0
        self.fault: CapabilityFault | None = None


_cpu_seq = _CpuSequence()


def launch(kernel: Any, caps: Sequence[Any] = (), args: Sequence[Any] = (), grid: int = 1,
           timeout: float | None = None, sync: bool = True, group: int | None = None) -> None:
    """runtime.launch for a CPU kernel (runtime/launch.py says what it does)."""
    if sync:
        if _cpu_seq.launches:
            end_sequence()
    elif timeout is not None:
        raise ValueError("a sync=False launch takes no timeout: pass it to runtime.sync()")
    sig = kernel.signature
    plan = _plan(sig)
    if isinstance(caps, (Capability, NoBoundsCap)):
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
        group = check_group(kernel.name, sig.group_sync, group, grid, GROUPS,
                            lib.rt_core_threads)

    argv = ffi.new("rt_arg[]", plan.size)
    held: list[Any] = []
    ci = si = 0
    try:
        for i, (is_cap, pname, kind) in enumerate(plan.params):
            if is_cap:
                c = caps[ci]
                ci += 1
                if type(c) is Capability or isinstance(c, Capability):
                    if c.device != "cpu":
                        raise TypeError(f"{c!r} lives on {c.device}; kernel {kernel.name!r} "
                                        "runs on the CPU")
                    obj = c._arg_obj()
                    lib.gc_hold(obj)
                    held.append(obj)
                    lib.rt_arg_set_cap(argv + i, obj, 0)
                elif isinstance(c, NoBoundsCap):
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


def end_sequence() -> None:
    """End the CPU lane's sequence (its launches have run): raise its first fault."""
    seq = _cpu_seq
    with seq.lock:
        fault, seq.fault, seq.launches = seq.fault, None, 0
    if fault is not None:
        raise fault


def pending() -> int:
    """sync=False launches since the last sync."""
    return _cpu_seq.launches


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
    raise fault_from_record(rec, kernel.name, recorded_buffer(rec, ffi), launch_index)
