"""Device capabilities: collector objects whose payload lives on the GPU.

A :class:`DeviceCapability` is a Python handle on an ``rt_obj`` header in the
collector's heap (gc/), exactly like a host :class:`capabilities.Capability`;
only the payload lives on the GPU.  Its roots are the handle (a pin, dropped
when the handle dies or at ``free()``) and every launch in flight (a
``gc_hold`` taken at the launch and dropped by the sync that sees it
finished, as on the CPU lane: runtime/cuda/launches.py, sequence.py).  The
payload is released by the collector's sweep, never by Python reference
counting: the sweep queues a record and :func:`drain_device_releases`, run on
host threads (every device alloc and synchronous launch,
``runtime.gc_collect()``, interpreter exit; never the collector thread),
calls ``cuMemFree``.  So a payload is never released while a launch that
holds it is in flight.  Memory from ``cuMemAlloc`` is a device object
(``gc_wrap_device_pinned``: its bytes pace the collector); a wrapped torch
CUDA tensor is an external object (``gc_wrap_pinned``): the deferred release
drops the reference to the tensor, and torch frees its own memory.

A launch passes each buffer as a by-value ``cap_t`` built from the header at
launch time, after taking the hold (:meth:`DeviceCapability.cap_value`);
after ``free()`` that snapshot has zero bounds and the "freed" tag, so any
access in a later launch faults with reason ``freed``.

A buffer belongs to the context it was allocated in (its ``driver.context_epoch``).
When a kernel that never stops forces a reset of the context
(runtime/cuda/sequence.py), every earlier buffer is *lost*: every use (a launch,
``numpy()``, ``copy_from``, ``ptr``, an export) raises ``CapabilityFault("lost")``,
and its payload, gone with the context, is never freed (the new context may hand
out the same address again).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...capabilities import abi
from ...capabilities.protocol import RecordedAttributes
from .. import core, heap
from ..argcheck import check_perms
from ..errors import CapabilityFault
from . import driver as drv

TAG_FREED = abi.GPU_TAG_FREED
#: numpy dtype name -> RT_DT code (capabilities/abi.py)
_DT_CODES = {d.numpy: d.code for d in abi.DTYPES if d.numpy}
CUDA_ERROR_OUT_OF_MEMORY = 2
#: longest a device allocation waits for the collector's cycle (seconds)
PACE_WAIT_LIMIT = 2.0

#: ids of device objects whose payload came from cuMemAlloc (the collector
#: owns it), each with the context epoch it was allocated in; a queued record with
#: another id is not this lane's to free
_OWNED: dict[int, int] = {}
_drain_lock = threading.RLock()
_DRAIN_BATCH = 256
_drain_buf: list = []
_released = [0]


def _free_payload(address: int) -> None:
    drv.device()
    drv.check(drv.lib().cuMemFree_v2(address), "cuMemFree")


def drain_device_releases(*, at_exit: bool = False) -> int:
    """cuMemFree every device payload the collector's sweep has released.

    Runs on the calling host thread; returns how many payloads it freed.
    Wrapped torch tensors go through the external queue
    (``runtime.heap.drain_releases``), which drops their reference.
    """
    if not _OWNED or drv.stuck():
        return 0  # (a cuMemFree behind a stuck kernel would block: they stay queued)
    with _drain_lock:
        if not _drain_buf:
            _drain_buf.append(core.ffi.new("gc_release_rec[]", _DRAIN_BATCH))
        buf = _drain_buf[0]
        n = 0
        error: Exception | None = None
        while True:
            k = int(core.lib.gc_drain_device_releases(buf, _DRAIN_BATCH))
            for i in range(k):
                rid, address = int(buf[i].id), int(buf[i].handle)
                epoch = _OWNED.pop(rid, None)
                if epoch is None:
                    continue
                n += 1
                if not address or epoch != drv.context_epoch():
                    continue  # (a payload of a destroyed context went with it)
                try:
                    _free_payload(address)
                except (drv.CudaError, drv.CudaUnavailable) as e:
                    error = error or e  # free the rest of the batch first
            if k < _DRAIN_BATCH:
                break
        _released[0] += n
    if error is not None and not at_exit:
        raise error
    return n


def device_payloads_released() -> int:
    """How many device payloads this process has cuMemFree'd through the collector."""
    return _released[0]


def payload_pending(obj_id: int) -> bool:
    """True until the collector has released (and this lane cuMemFree'd) the
    device payload of object ``obj_id``."""
    return int(obj_id) in _OWNED


def device_payloads_owned() -> int:
    """Device payloads the collector owns now (live, or released but not yet drained)."""
    return len(_OWNED)


def _pace() -> None:
    """Allocation debt for device memory: once earlier allocations took the
    heap past the collector's goal (which lies above its trigger, so a cycle
    was requested), wait for one cycle to end, as kernel threads do at their
    pollchecks (gc/pace.c); the caller then releases what it swept."""
    L = core.lib
    if L.gc_heap_occupancy() <= L.gc_heap_goal() or not heap.gc_stats()["enabled"]:
        return
    c0 = L.gc_cycles_completed()
    deadline = time.monotonic() + PACE_WAIT_LIMIT
    while (L.gc_heap_occupancy() > L.gc_heap_goal() and L.gc_cycles_completed() == c0
           and time.monotonic() < deadline):
        time.sleep(2e-4)


def drain_all() -> None:
    """Release what the collector swept: device payloads, then wrapped (external) ones."""
    drain_device_releases()
    heap.drain_releases()


heap.add_release_hook(drain_device_releases)
atexit.register(drain_device_releases, at_exit=True)


class DeviceCapability(RecordedAttributes):
    """A capability on a device buffer: collector header, device payload.

    Attributes (recorded when the handle is made, so all of them stay defined
    after ``free()``): ``nbytes``, ``dtype`` (numpy dtype), ``shape``,
    ``size``, ``name``, ``perms`` ("r" or "rw"), ``device`` ("cuda"), ``id``
    (the collector's serial), ``freed``, ``lost``.  ``ptr`` (the device address) and
    ``numpy()`` raise ``CapabilityFault("freed")`` after ``free()``, as
    ``int(cap)`` and ``numpy()`` do on the host, and ``CapabilityFault("lost")`` once
    the context was reset (module doc).
    """

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, perms: str = "rw",
                 name: str | None = None, *, owned: bool = True, keepalive: Any = None,
                 epoch: int | None = None):
        """Hand ``ptr`` to the collector: ``owned`` payloads (cuMemAlloc) are
        cuMemFree'd by it; otherwise ``keepalive`` (e.g. the torch tensor whose
        memory this is) stays referenced until the collector releases the object.
        ``epoch``: the context epoch read before ``ptr`` was allocated (default: now)."""
        self._epoch = drv.context_epoch() if epoch is None else epoch
        self._dtype = np.dtype(dtype)
        if self._dtype.name not in _DT_CODES:
            if owned and ptr:
                _free_payload(int(ptr))
            raise TypeError(f"unsupported device dtype {self._dtype}")
        self._perms = check_perms(perms)
        self._shape = tuple(int(s) for s in shape)
        self._nbytes = int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize
        self._ptr = int(ptr)
        self._freed = False
        self._export_pin: Any = None  # set by __cuda_array_interface__: see there
        self._lock = threading.Lock()
        code = _DT_CODES[self._dtype.name]
        bits = abi.PERM_R | (abi.PERM_W if "w" in self._perms else 0)
        label = abi.c_name(name or "dev")
        if owned:
            obj = core.lib.gc_wrap_device_pinned(self._ptr, self._nbytes, code, bits, label)
        else:
            obj = core.lib.gc_wrap_pinned(core.ffi.cast("void *", self._ptr), self._nbytes,
                                          code, bits, label)
        if obj == core.ffi.NULL:
            if owned and ptr:
                _free_payload(self._ptr)
            raise MemoryError(f"capqr: cannot allocate a header for device buffer {name!r}")
        self._obj = obj
        self._id = int(obj.id)
        self._name = abi.c_name(name or f"dev{self._id}").decode()
        if owned:
            _OWNED[self._id] = self._epoch
        elif keepalive is not None:
            heap.keep_external(self._id, keepalive)

        def unpin(_p: Any, o: Any = obj) -> None:
            core.lib.gc_unpin(o)

        # The handle's pin: dropped when the handle dies or at free().
        self._pin = core.ffi.gc(core.ffi.cast("void *", obj), unpin)

    # -- header (name, shape, nbytes, ... from RecordedAttributes) ---------
    @property
    def perms(self) -> str:
        return self._perms

    @perms.setter
    def perms(self, perms: str) -> None:
        """Narrowing only ("rw" -> "r"): to_device uploads, then restricts."""
        perms = check_perms(perms)
        if perms == self._perms:
            return
        if perms != "r":
            raise ValueError("device capability perms can only be narrowed to 'r'")
        with self._lock:
            self._check_live("store")
            self._obj.wlen = 0
            self._obj.perms = abi.PERM_R
            self._perms = perms

    @property
    def device(self) -> str:
        return "cuda"

    @property
    def ptr(self) -> int:
        """Device address of the payload (raises CapabilityFault("freed") after free())."""
        self._check_live("load")
        return self._ptr

    # -- zero-copy export (torch, cupy, numba: CUDA array interface and DLPack) ---------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (``torch.as_tensor(cap, device="cuda")``).  A consumer
        keeps this handle, so the handle keeps a pin of its own from here on, which free()
        does not drop: free() revokes the capability for kernels, and the memory outlives
        every exported tensor."""
        _refuse_sharing_when_isolated("exported")
        ptr = self.ptr
        self._export_pin = self._pin
        return {"shape": self._shape, "typestr": self._dtype.str,
                "data": (ptr, self._perms == "r"), "version": 3, "strides": None,
                "stream": None}

    def __dlpack__(self, *, stream: Any = None, **kw: Any) -> Any:
        """DLPack export through torch (``torch.from_dlpack(cap)``), zero-copy."""
        _refuse_sharing_when_isolated("exported")
        try:
            import torch
        except ImportError:
            raise BufferError("DLPack export of a device buffer needs torch; use "
                              "__cuda_array_interface__") from None
        return torch.as_tensor(self, device="cuda").__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, drv.device().ordinal)  # kDLCUDA

    def __repr__(self) -> str:
        st = " freed" if self._freed else " lost" if self.lost else ""
        return f"<DeviceCapability {self._name!r} {self._dtype} {self._shape} {self._perms}{st}>"

    @property
    def lost(self) -> bool:
        """Whether the context this buffer was allocated in is gone (the isolated lane
        restarted or replaced its device process since): its payload went with it."""
        drv.replace_lost_process()  # a process found dead is replaced before the answer
        return self._epoch != drv.context_epoch()

    def _check_live(self, access: str) -> None:
        if self._freed:
            raise CapabilityFault("freed", buffer=self._name, access=access,
                                  detail="capability used after free()")
        if self.lost:
            raise CapabilityFault("lost", buffer=self._name, access=access,
                                  detail="the device process of the isolated GPU lane "
                                         "that held this buffer was restarted (a kernel "
                                         "that did not stop: KernelTimeout) or lost: its "
                                         "contents are gone")

    def cap_value(self, slot: int) -> tuple[int, int, int, int, int]:
        """(p, lo, rlen, wlen, tag) as a launch passes it; ``slot`` is the argument index.

        No lock: each attribute read sees the buffer either before or after a
        concurrent free() or perms narrowing, which is the order a launch racing
        with it may take anyway (its hold keeps the payload)."""
        if self._freed:
            return 0, 0, 0, 0, (slot + 1) | TAG_FREED
        return (self._ptr, self._ptr, self._nbytes,
                self._nbytes if "w" in self._perms else 0, slot + 1)

    def _hold(self) -> Any:
        """Root the object for a launch (refused after free()); returns the header."""
        with self._lock:  # free() takes it too: no hold on an unpinned freed object
            self._check_live("launch")
            core.lib.gc_hold(self._obj)
            return self._obj

    def free(self) -> None:
        """Revoke the capability now; the collector releases the payload later.

        Later launches see zero bounds and fault with reason "freed"; a second
        free() raises CapabilityFault("freed"), as on the CPU.  The payload goes
        once no handle pin, no launch in flight and no shadow frame reaches it.
        """
        with self._lock:
            if self._freed:
                raise CapabilityFault("freed", buffer=self._name, access="free",
                                      detail="double free()")
            core.lib.gc_free(self._obj)  # cannot be a second free: _freed is set under the lock
            self._freed = True
            self._pin = None  # unpin: the header may be reclaimed from now on

    # -- data movement ------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Copy the payload back to a new host array of ``shape`` and ``dtype``."""
        self._check_live("load")
        out = np.empty(self._shape, self._dtype)
        if self._nbytes:
            drv.device()
            f = drv.ffi()
            drv.check(drv.lib().cuMemcpyDtoH_v2(f.cast("void *", out.ctypes.data), self._ptr,
                                                self._nbytes), "cuMemcpyDtoH")
        return out

    def copy_from(self, array: Any) -> None:
        """Upload a host array of the same number of bytes into the payload."""
        self._check_live("store")
        a = np.ascontiguousarray(array, dtype=self._dtype)
        if a.nbytes != self._nbytes:
            raise ValueError(f"size mismatch: {a.nbytes} bytes into {self._nbytes}")
        if a.nbytes:
            drv.device()
            f = drv.ffi()
            drv.check(drv.lib().cuMemcpyHtoD_v2(self._ptr, f.cast("void *", a.ctypes.data),
                                                a.nbytes), "cuMemcpyHtoD")


def _refuse_sharing_when_isolated(how: str) -> None:
    """Zero-copy sharing with torch needs one CUDA context: the isolated lane's buffers
    live in its device process (runtime/cuda/remote.py), torch's in this one."""
    if drv.isolated():
        raise BufferError(f"device memory cannot be {how} zero-copy in the isolated GPU "
                          "lane (CAPQR_CUDA_ISOLATE=1): its buffers live in the lane's device "
                          "process; copy through the host (cap.numpy(), to_device) instead")


def _check_launchable(c: Any) -> None:
    if not isinstance(c, DeviceCapability):
        raise TypeError(f"GPU kernels take device capabilities, not {type(c).__name__}"
                        " (allocate with device='cuda')")
    c._check_live("launch")  # as on the CPU: refused before anything runs


def hold_all(caps: Sequence[DeviceCapability]) -> list[Any]:
    """Root every buffer of a launch (all or none); returns the held headers.

    Taken before the bounds snapshot (params.ParamBlock.pack, which checks
    the counts), so a free() racing with the launch either is refused here or
    leaves a snapshot whose payload the hold keeps alive.
    """
    held: list[Any] = []
    try:
        for c in caps:
            _check_launchable(c)
            held.append(c._hold())
    except BaseException:
        unhold_all(held)
        raise
    return held


def unhold_all(held: list[Any]) -> None:
    """Drop the holds of :func:`hold_all` (or of several: a sequence's)."""
    for obj in held:
        core.lib.gc_unhold(obj)
    held.clear()


def alloc_device(shape: int | Sequence[int], dtype: Any = np.float32, perms: str = "rw",
                 name: str | None = None) -> DeviceCapability:
    """Allocate a zeroed device buffer and return its capability."""
    check_perms(perms)  # before the device allocation, which would leak on a refusal
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    dt = np.dtype(dtype)
    if dt.name not in _DT_CODES:
        raise TypeError(f"unsupported device dtype {dt}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    drv.device()
    _pace()
    drain_all()
    epoch = drv.context_epoch()  # before the allocation: a reset after it makes it lost
    L, f = drv.lib(), drv.ffi()
    p = f.new("CUdeviceptr *")
    if nbytes:
        rc = L.cuMemAlloc_v2(p, nbytes)
        if rc == CUDA_ERROR_OUT_OF_MEMORY:
            # Unreachable payloads may still hold the memory: collect, release, retry once.
            heap.gc_collect()
            heap.gc_collect()  # a freed object is released by the sweep after the latching one
            drain_all()
            rc = L.cuMemAlloc_v2(p, nbytes)
        drv.check(rc, "cuMemAlloc")
        try:
            drv.check(L.cuMemsetD8_v2(p[0], 0, nbytes), "cuMemsetD8")
        except drv.CudaError:
            _free_payload(p[0])
            raise
    return DeviceCapability(p[0], shape, dt, perms, name, epoch=epoch)


def to_device(array: Any, perms: str = "rw", name: str | None = None) -> DeviceCapability:
    """Allocate a device buffer holding a copy of a host array."""
    check_perms(perms)
    a = np.ascontiguousarray(array)
    cap = alloc_device(a.shape, a.dtype, "rw", name)
    try:
        cap.copy_from(a)
    except BaseException:
        cap.free()  # now, not when the collector finds it: a kept traceback holds it
        raise
    cap.perms = perms
    return cap


def wrap_device(tensor: Any, perms: str = "rw", name: str | None = None
                ) -> DeviceCapability:
    """A capability over a contiguous CUDA torch tensor (memory stays owned by torch).

    The tensor stays referenced until the collector releases the object (no
    handle, no launch in flight reaches it); free() revokes the capability at
    once but never releases torch's memory.
    """
    if not getattr(tensor, "is_cuda", False):
        raise TypeError("wrap_device needs a CUDA tensor")
    _refuse_sharing_when_isolated("wrapped")
    if not tensor.is_contiguous():
        raise ValueError("wrap_device needs a contiguous tensor (call .contiguous())")
    dt = str(tensor.dtype).replace("torch.", "")
    drv.device()
    drain_all()
    return DeviceCapability(tensor.data_ptr(), tuple(tensor.shape), dt, perms, name,
                            owned=False, keepalive=tensor)
