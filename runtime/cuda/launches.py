"""GPU launches: the launch rules, and enqueueing on the sequence's stream.

:func:`launch` runs one kernel (``sync=False``: enqueues it on the pending
sequence, runtime/cuda/sequence.py); :func:`launch_many` enqueues a list at a
lower host cost per launch.  Each launch holds its buffers (collector roots)
until the sync that covers it, passes each as a ``cap_t`` snapshot taken
after the hold (runtime/cuda/params.py), and a checked kernel gets the
sequence's device record and its index in the sequence as hidden parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..argcheck import GroupRules, check_grid, check_group
from . import driver as drv
from .kernel import CudaKernel
from .lanes import LaneSchedule, check_lanes
from .memory import DeviceCapability, drain_all, hold_all, unhold_all
from .params import ParamBlock, param_block
from .sequence import current, device_record, reset_record, sync_locked

#: a GPU group is the whole grid, run by a cooperative launch
GROUPS = GroupRules(
    wanted="group={grid} (on the GPU the group is the whole grid, launched cooperatively)",
    whole_grid="kernel {name!r}: on the GPU a group is the whole grid (a cooperative "
               "launch), so group must be {grid}, got {group}",
    too_many="kernel {name!r}: its {blocks} blocks of {block} threads must all run at once "
             "and the device runs at most {at_once} of them (cooperative launch): they would "
             "wait forever")


def check_block(kernel: CudaKernel, block: int, dev: Any) -> None:
    """ValueError unless the device runs blocks of ``block`` threads and the kernel
    was written for that size (its rt_require_block_dim, which the compiler took
    as a bound on rt_thread_idx())."""
    if not 1 <= block <= dev.max_threads:
        raise ValueError(f"block must be in 1..{dev.max_threads}")
    want = kernel.info.block_dim
    if want is not None and block != want:
        raise ValueError(f"kernel {kernel.name!r} states rt_require_block_dim({want}) and "
                         f"was compiled for it: launch it with block={want}, not {block}")


def check_cooperative(kernel: CudaKernel, group: Any, grid: int, block: int,
                      shared_bytes: int = 0) -> bool:
    """Whether the launch is cooperative (the kernel calls rt_group_sync); ValueError
    unless ``group`` is the whole grid and the grid fits on the device at once."""
    return bool(check_group(kernel.name, kernel.info.group_sync, group, grid, GROUPS,
                            lambda: kernel.max_group(block, shared_bytes), block=block))


def launch_async(kernel: CudaKernel, params: ParamBlock, grid: int, block: int,
                 shared_bytes: int, cooperative: bool = False, stream: Any = None) -> None:
    """Enqueue ``kernel`` on ``stream`` (None: the launch stream; driver.launch_kernel;
    ``cooperative``: every block resident at once)."""
    shared_bytes += kernel.dynamic_smem  # its smem_ arrays when they exceed 48 KB
    function = kernel.live_function()  # (loaded again after a reset of the context)
    drv.launch_kernel(function, int(grid), int(block), int(shared_bytes), params, cooperative,
                      stream)


def _enqueue(kernel: CudaKernel, caps: list[DeviceCapability], args: Sequence[Any], grid: int,
             block: int, shared_bytes: int, caller_holds: bool = False, dev: Any = None,
             group: Any = None, stream: Any = None, reset: bool = True) -> None:
    """Add one launch to the pending sequence (caller holds ``current.lock``).

    ``caller_holds``: the caller already holds every buffer of ``caps`` until the
    sync (:func:`launch_many`); otherwise this launch takes its own holds.
    ``dev``: the device (current on this thread), when the caller looked it up once
    for many launches.
    ``group``: see :func:`launch`.  ``stream``: launch_many's lane (None: the launch
    stream).  ``reset``: clear the record if this launch starts the sequence (False:
    the caller did, before a fork to lane 1)."""
    dev = dev or drv.device()
    check_block(kernel, block, dev)
    cooperative = check_cooperative(kernel, group, grid, block, shared_bytes)
    record = dev.seq_record or device_record(dev)
    own = [] if caller_holds else hold_all(caps)
    try:
        params = kernel.param_block or param_block(kernel)
        names = params.pack(caps, args, record, len(current.launches))
        if grid == 0:
            unhold_all(own)  # arguments checked; no block to run (as on the CPU)
            return
        if reset and not current.launches:
            reset_record(record)
        launch_async(kernel, params, grid, block, shared_bytes, cooperative, stream)
    except BaseException:
        unhold_all(own)
        raise
    current.launches.append((kernel, names))
    current.held.extend(own)


def launch_entries(launches: Sequence[tuple[Any, ...]], who: str) -> list[tuple[Any, ...]]:
    """``(kernel, caps, args, grid, block)`` or ``(..., block, group)`` tuples as
    ``(kernel, [caps], args, grid, block, group or None)``; TypeError for another length,
    ValueError for a grid that is not a positive int (``who``: the caller, for messages)."""
    for entry in launches:
        if len(entry) not in (5, 6):
            raise TypeError(f"{who} takes (kernel, caps, args, grid, block) or (kernel, "
                            f"caps, args, grid, block, group) tuples, got {len(entry)} items")
    plan = [(kernel, [caps] if isinstance(caps, DeviceCapability) else list(caps), args, grid,
             block, group[0] if group else None)
            for kernel, caps, args, grid, block, *group in launches]
    for _, _, _, grid, _, _ in plan:
        check_grid(grid, None)
    return plan


def distinct_caps(plan: Sequence[tuple[Any, ...]]) -> list[DeviceCapability]:
    """Each buffer of :func:`launch_entries`' launches once, in first-use order."""
    return list({id(c): c for _, caps, *_ in plan for c in caps}.values())


def launch_many(launches: Sequence[tuple[Any, ...]],
                lanes: Sequence[tuple[int, Sequence[int]]] | None = None) -> None:
    """Enqueue ``(kernel, caps, args, grid, block)`` launches (or ``(..., block, group)``)
    in order, each as ``launch(kernel, caps, args=args, grid=grid, block=block,
    group=group, sync=False)``.

    The same sequence semantics (one ``sync()`` raises the first fault, with
    its ``launch_index``), at a lower host cost per launch: the lock is taken
    once and each distinct buffer is held once for the whole batch, so a long
    host-driven plan (thousands of launches) costs the host less per launch.  An
    argument error raises at its launch; the launches before it stay enqueued.

    ``lanes`` (None: one lane, each launch after the one before): per launch
    ``(lane, after)``, lane 0 or 1, ``after`` the indices of earlier launches it
    waits for besides those before it on its lane; launches that nothing orders
    may overlap on the GPU (runtime/cuda/lanes.py).  A fault still stops every
    launch that starts after it, on either lane.
    """
    plan = launch_entries(launches, "launch_many")
    order = check_lanes(lanes, len(plan))
    with current.lock:
        held = hold_all(distinct_caps(plan))  # all or none, before any launch
        before = len(current.launches)
        schedule = None
        try:
            dev = drv.device()  # binds the context to this thread for the whole batch
            schedule = LaneSchedule(dev, order)
            if schedule.one and not current.launches:  # before lane 1 forks from it
                reset_record(dev.seq_record or device_record(dev))
            schedule.fork()
            for i, (kernel, caps, args, grid, block, group) in enumerate(plan):
                _enqueue(kernel, caps, args, grid, block, 0, caller_holds=True, dev=dev,
                         group=group, stream=schedule.stream(i), reset=not schedule.one)
                schedule.launched(i)
        finally:
            if schedule is not None:
                schedule.finish()
            if len(current.launches) > before:
                current.held.extend(held)  # released by the sync that covers the batch
            else:
                unhold_all(held)  # nothing enqueued: no sync will cover them


def launch(kernel: CudaKernel, caps: Sequence[DeviceCapability] | DeviceCapability, *,
           args: Sequence[Any] = (), grid: int = 1, block: int = 128, shared_bytes: int = 0,
           timeout: float | None = None, sync: bool = True, group: int | None = None) -> None:
    """Run ``kernel`` on ``grid`` blocks of ``block`` threads.

    ``group`` (for kernels that call ``rt_group_sync``, and only for them): the
    whole grid, ``group == grid``; the launch is cooperative, and ValueError
    (before anything runs) when the grid does not fit on the device at once.

    ``sync=True`` (default): first sync the pending sequence (raising its
    fault, if any, before this launch runs), then run the kernel and wait for
    it.  Raises CapabilityFault (first refused access: block, thread, index,
    buffer, line) or KernelTimeout (deadline passed; blocks were cancelled at
    their next pollcheck).

    ``sync=False``: enqueue the launch on the stream and return; ``sync()``
    waits for the sequence and raises its first fault.  A fault stops every
    later checked launch of the sequence at its entry.  ``timeout`` belongs to
    ``sync()`` then.  Argument errors (count, type, a freed handle) raise at
    this call in both modes, before anything is enqueued.

    The buffers are collector roots (holds) until the sync that covers the
    launch, whatever happens to their handles meanwhile.
    """
    caps = [caps] if isinstance(caps, DeviceCapability) else list(caps)
    check_grid(grid, timeout)
    if not sync and timeout is not None:
        raise ValueError("a sync=False launch takes no timeout: pass it to runtime.sync()")
    with current.lock:
        if sync:
            drain_all()
            sync_locked(timeout)
        _enqueue(kernel, caps, args, grid, block, shared_bytes, group=group)
        del caps  # the launch holds the objects, not the handles
        if sync:
            sync_locked(timeout, sequence=False)
