"""The GPU lane's launch sequence: its device record, waiting for it, its sync.

A launch is synchronous by default, but ``launch(..., sync=False)`` only
enqueues it (runtime/cuda/launches.py): launches form a *sequence* on one
stream that shares one device record (``rt_gpu_fault``, capabilities/abi.py),
and :func:`sync` waits once and raises the sequence's first fault.  The holds
of a sequence's launches are dropped at that sync, so a payload outlives
every launch that may use it (runtime/cuda/memory.py).  A deadline raises
the record's cancel flag; a kernel that has not stopped once the grace after
it has passed (a barrier or shuffle that some threads never reach, which the
verifier missed, or a raw kernel, which has no pollchecks) can only be ended by
ending the process that owns its context.  The isolated lane (runtime/cuda/remote.py)
restarts its device process (driver.reset_context), which loses every device buffer
allocated before (memory.py), and raises KernelTimeout saying so; kernels load again
at their next launch (kernel.py).  The direct lane cannot: KernelTimeout says the
kernel is stuck, and every later GPU call raises DeviceStuck until it ends, rather
than block the host behind it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...capabilities import abi
from ..argcheck import check_timeout
from ..errors import CapabilityFault, KernelTimeout
from ..faults import fault_from_record, slot_buffer
from . import driver as drv
from .memory import unhold_all
from .remote import CUDA_ERROR_UNKNOWN

if TYPE_CHECKING:
    from .kernel import CudaKernel

RT_FAULT_TIMEOUT, RT_FAULT_CANCELLED = abi.FAULT_CODE["TIMEOUT"], abi.FAULT_CODE["CANCELLED"]
#: seconds a cancelled sequence gets to notice the cancel flag before sync gives up
CANCEL_GRACE = 10.0


class _Sequence:
    """The launches enqueued since the last sync, and what they hold.

    One per process: every launch goes to the same stream and every checked
    kernel gets the same device record (``rt_gpu_fault``, capabilities/abi.py),
    so a fault of any launch stops all later ones.  ``lock`` (reentrant:
    ``time_launch``'s ``before`` may launch) serialises enqueueing and syncing.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.launches: list[tuple[CudaKernel, list[str]]] = []  # per launch: kernel, buffer names
        self.held: list[Any] = []   # collector holds of the pending launches
        self.stuck: list[Any] = []  # holds of launches that may still run (Ctrl-C in a wait)
        self.abandoned = 0  # launches lost with a device process (the next sync says so)


current = _Sequence()


def _abandon() -> None:
    """The isolated lane's device process was lost with the pending launches in it: drop
    their holds (no kernel of that process runs any more), and let the next sync say
    they did not finish rather than return as if they had."""
    if current.launches:
        current.abandoned = len(current.launches)
    current.launches = []
    unhold_all(current.held + current.stuck)
    current.held, current.stuck = [], []


drv.on_device_process_replaced(_abandon)

# ---------------------------------------------------------------------------
# the device record
# ---------------------------------------------------------------------------
_ffi_lock = threading.Lock()
_cffi: list[Any] = []
_RECORD_BYTES: list[int] = []


def record_ffi() -> Any:
    """A cffi FFI that knows ``rt_gpu_fault`` (capabilities/abi.py GPU_FAULT_DECL)."""
    with _ffi_lock:
        if not _cffi:
            import cffi

            f = cffi.FFI()
            f.cdef(abi.GPU_FAULT_DECL + "\n")
            _cffi.append(f)
        return _cffi[0]


def device_record(dev: Any) -> int:
    """The device address of the sequence record (allocated on first use, never freed)."""
    if not dev.seq_record:
        if not _RECORD_BYTES:
            _RECORD_BYTES.append(record_ffi().sizeof("rt_gpu_fault"))
        p = drv.ffi().new("CUdeviceptr *")
        drv.check(drv.lib().cuMemAlloc_v2(p, _RECORD_BYTES[0]), "cuMemAlloc")
        drv.check(drv.lib().cuMemsetD8_v2(p[0], 0, _RECORD_BYTES[0]), "cuMemsetD8")
        dev.seq_record = int(p[0])
    return dev.seq_record


def reset_record(record: int) -> None:
    """Clear the record (fault flag and cancel) before the first launch of a sequence.

    Issued on the launch stream, so it is ordered after any kernel still running
    from an earlier, timed-out sequence and before the launches that follow.
    """
    drv.check(drv.lib().cuMemsetD8_v2(record, 0, record_ffi().sizeof("rt_gpu_fault")),
              "cuMemsetD8")


def read_record(record: int) -> Any:
    f = record_ffi()
    rec = f.new("rt_gpu_fault *")
    drv.check(drv.lib().cuMemcpyDtoH_v2(drv.ffi().cast("void *", int(f.cast("uintptr_t", rec))),
                                        record, f.sizeof("rt_gpu_fault")), "cuMemcpyDtoH")
    return rec


_CANCEL_OFFSET = record_ffi().offsetof("rt_gpu_fault", "cancel")


def cancel(record: int) -> None:
    """Raise the record's cancel flag through the side stream (the launch stream is
    busy): every thread reads it at its next pollcheck that reads the record (within
    RT_POLL_CYCLES) and exits, and the launches still queued exit at entry."""
    L, f = drv.lib(), drv.ffi()
    one = f.new("int *", 1)
    side = drv.device().side_stream
    drv.check(L.cuMemcpyHtoDAsync_v2(record + _CANCEL_OFFSET, one, 4, side), "cuMemcpyHtoDAsync")
    drv.check(L.cuStreamSynchronize(side), "cuStreamSynchronize")


def capability_fault(rec: Any, kernel: CudaKernel, names: Sequence[str],
                     index: int | None) -> CapabilityFault:
    """The fault of a record written by ``kernel`` (``names``: its launch's buffers)."""
    return fault_from_record(rec, kernel.name, slot_buffer(rec, names, kernel.cuda.local_arrays),
                             index)


# ---------------------------------------------------------------------------
# waiting and syncing
# ---------------------------------------------------------------------------
def sync_locked(timeout: float | None, sequence: bool = True) -> None:
    """Wait for the pending launches, release their holds, raise their first fault
    (``sequence=False``: the one launch of a synchronous ``launch``)."""
    drv.replace_lost_process()  # before the state: a lost process abandons the launches
    if current.stuck and _stream_idle():
        unhold_all(current.stuck)
    if current.abandoned:
        n, current.abandoned = current.abandoned, 0
        raise drv.CudaError("sync", CUDA_ERROR_UNKNOWN, "CAPQR_DEVICE_PROCESS_LOST",
                            f"the {n} launch(es) enqueued since the last sync were lost with "
                            "the lane's device process and did not finish")
    if not current.launches:
        return
    launches, held = current.launches, current.held
    current.launches, current.held = [], []
    record = drv.device().seq_record
    drained = False
    try:
        try:
            timed_out, drained = _wait(record, timeout)
        except drv.CudaError:
            drained = True  # the context failed: none of its kernels runs any more
            raise
        # A copy on the launch stream would wait for a kernel that ignored the
        # cancel: read the record only once the stream drained.
        rec = read_record(record) if drained else None
    finally:
        if drained:
            unhold_all(held)
        else:  # a kernel may still use these buffers: keep them rooted until it ends
            current.stuck.extend(held)
    if rec is not None and rec.flag:
        index = rec.launch if 0 <= rec.launch < len(launches) else len(launches) - 1
        kernel, names = launches[index]
        if rec.kind in (RT_FAULT_TIMEOUT, RT_FAULT_CANCELLED):
            raise KernelTimeout(kernel.name, timeout or 0.0)
        raise capability_fault(rec, kernel, names, index if sequence else None)
    if timed_out:  # no block recorded the cancel (or all had ended): name the sequence
        first, last = launches[0][0].name, launches[-1][0].name
        what = first if len(launches) == 1 else (
            f"sequence of {len(launches)} launches ({first} .. {last})")
        if not drained:  # still running after the grace: only ending its process ends it
            if drv.can_reset():
                drv.reset_context()
                unhold_all(current.stuck)  # no kernel of the old context runs any more
                raise KernelTimeout(what, timeout or 0.0, context_reset=True,
                                    grace=CANCEL_GRACE)
            drv.mark_stuck(what)  # its holds stay in current.stuck until the stream drains
            raise KernelTimeout(what, timeout or 0.0, stuck=True, grace=CANCEL_GRACE)
        raise KernelTimeout(what, timeout or 0.0)


def _stream_idle() -> bool:
    rc = drv.lib().cuStreamQuery(drv.ffi().NULL)
    if rc not in (drv.CUDA_SUCCESS, drv.CUDA_ERROR_NOT_READY):
        drv.check(rc, "cuStreamQuery")
    return rc == drv.CUDA_SUCCESS


def _wait(record: int, timeout: float | None) -> tuple[bool, bool]:
    """Wait for the launch stream; (deadline passed, stream drained)."""
    L, f = drv.lib(), drv.ffi()
    if timeout is None:
        drv.check(L.cuStreamSynchronize(f.NULL), "cuStreamSynchronize")
        return False, True
    deadline = time.monotonic() + timeout
    sleep = 1e-5
    try:
        while True:
            if _stream_idle():
                return False, True
            if time.monotonic() >= deadline:
                break
            time.sleep(sleep)
            sleep = min(sleep * 2, 2e-3)
    except BaseException:  # Ctrl-C: stop the sequence as a deadline would (holds stay)
        cancel(record)
        raise
    cancel(record)
    # Bounded wait for the blocks to notice (never block forever in C: a kernel
    # without pollchecks, e.g. stuck in a barrier it cannot leave, would hang us).
    grace = time.monotonic() + CANCEL_GRACE
    while not _stream_idle():
        if time.monotonic() >= grace:
            return True, False
        time.sleep(1e-3)
    return True, True


def sync(timeout: float | None = None) -> None:
    """Wait for every launch enqueued since the last sync and release their holds.

    Raises the first fault of the sequence exactly as a synchronous launch
    would (CapabilityFault with kernel, block, thread, index, buffer, line, and
    ``launch_index``: the launch's position in the sequence), or KernelTimeout
    when ``timeout`` seconds pass first (the running kernel is cancelled at its
    next pollcheck, the queued ones exit at entry).  No-op without pending launches.
    """
    check_timeout(timeout)
    with current.lock:
        sync_locked(timeout)


def pending() -> int:
    """Launches enqueued since the last sync."""
    return len(current.launches)
