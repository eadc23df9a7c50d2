"""The GPU lane: device capabilities, kernel compilation and checked launches.

Device capabilities are collector objects.  A :class:`DeviceCapability` is a
Python handle on an ``rt_obj`` header in the collector's heap (gc/), exactly
like a host :class:`capabilities.Capability`; only the payload lives on the
GPU.  Its roots are the handle (a pin, dropped when the handle dies or at
``free()``) and every launch in flight (a ``gc_hold`` taken at the launch and
dropped by the sync that sees it finished, as on the CPU lane).  The payload
is released by the collector's sweep, never by Python reference counting: the
sweep queues a record and :func:`drain_device_releases`, run on host threads
(every device alloc and synchronous launch, ``runtime.gc_collect()``,
interpreter exit; never the collector
thread), calls ``cuMemFree``.  So a payload is never released while a launch
that holds it is in flight.  Memory from ``cuMemAlloc`` is a device object
(``gc_wrap_device_pinned``: its bytes pace the collector); a wrapped torch
CUDA tensor is an external object (``gc_wrap_pinned``): the deferred release
drops the reference to the tensor, and torch frees its own memory.

A launch passes each buffer as a by-value ``cap_t`` built from the header at
launch time, after taking the hold; after ``free()`` that snapshot has zero
bounds and the "freed" tag, so any access in a later launch faults with
reason ``freed``.

A launch is synchronous by default: ``launch`` returns after the kernel
finished and raises :class:`CapabilityFault` for the first refused access.
``launch(..., sync=False)`` only enqueues it: launches form a *sequence* on
one stream that shares one device record (``rt_gpu_fault``), :func:`sync`
waits once and raises the sequence's first fault.  The holds of a sequence's
launches are dropped at that sync, so the lifetime rule above covers them.
"""

from __future__ import annotations

import atexit
import ctypes
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ...capabilities import abi
from ...capabilities.protocol import RecordedAttributes
from .. import core, heap, records
from ..argcheck import (
    check_counts,
    check_grid,
    check_perms,
    check_timeout,
    group_arg,
    plain_int64,
    scalar_arg,
)
from ..build import content_hash
from ..compiler.parse import parse
from ..compiler.verifier import KernelSig, VerifiedSource, select_kernel, verify
from ..errors import CapabilityFault, KernelTimeout, fault_detail
from . import driver as drv
from . import nvrtc
from .lower import FAULT_KINDS, CudaSource, entry_symbol, instrument

RECORD_CDEF = abi.GPU_FAULT_DECL + "\n"
TAG_FREED = abi.GPU_TAG_FREED
#: numpy dtype name -> RT_DT code (capabilities/abi.py)
_DT_CODES = {d.numpy: d.code for d in abi.DTYPES if d.numpy}
CUDA_ERROR_OUT_OF_MEMORY = 2
#: longest a device allocation waits for the collector's cycle (seconds)
PACE_WAIT_LIMIT = 2.0

_ffi_lock = threading.Lock()
_cffi: dict = {}


def _ffi():
    with _ffi_lock:
        if "ffi" not in _cffi:
            import cffi

            f = cffi.FFI()
            f.cdef(RECORD_CDEF)
            _cffi["ffi"] = f
        return _cffi["ffi"]


# ---------------------------------------------------------------------------
# deferred device releases
# ---------------------------------------------------------------------------
#: ids of device objects whose payload came from cuMemAlloc (the collector
#: owns it); a queued record with another id is not this lane's to free
_OWNED: set[int] = set()
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
    if not _OWNED:
        return 0
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
                if rid not in _OWNED:
                    continue
                _OWNED.discard(rid)
                n += 1
                if not address:
                    continue
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


def _drain_all() -> None:
    drain_device_releases()
    heap.drain_releases()


heap.add_release_hook(drain_device_releases)
atexit.register(drain_device_releases, at_exit=True)


class DeviceCapability(RecordedAttributes):
    """A capability on a device buffer: collector header, device payload.

    Attributes (recorded when the handle is made, so all of them stay defined
    after ``free()``): ``nbytes``, ``dtype`` (numpy dtype), ``shape``,
    ``size``, ``name``, ``perms`` ("r" or "rw"), ``device`` ("cuda"), ``id``
    (the collector's serial), ``freed``.  ``ptr`` (the device address) and
    ``numpy()`` raise ``CapabilityFault("freed")`` after ``free()``, as
    ``int(cap)`` and ``numpy()`` do on the host.
    """

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, perms: str = "rw",
                 name: str | None = None, *, owned: bool = True, keepalive: Any = None):
        """Hand ``ptr`` to the collector: ``owned`` payloads (cuMemAlloc) are
        cuMemFree'd by it; otherwise ``keepalive`` (e.g. the torch tensor whose
        memory this is) stays referenced until the collector releases the object."""
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
        label = (name or "dev").encode()[:abi.NAME_MAX - 1]
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
        self._name = (name or f"dev{self._id}")[:abi.NAME_MAX - 1]
        if owned:
            _OWNED.add(self._id)
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
        ptr = self.ptr
        self._export_pin = self._pin
        return {"shape": self._shape, "typestr": self._dtype.str,
                "data": (ptr, self._perms == "r"), "version": 3, "strides": None,
                "stream": None}

    def __dlpack__(self, *, stream: Any = None, **kw: Any) -> Any:
        """DLPack export through torch (``torch.from_dlpack(cap)``), zero-copy."""
        try:
            import torch
        except ImportError:
            raise BufferError("DLPack export of a device buffer needs torch; use "
                              "__cuda_array_interface__") from None
        return torch.as_tensor(self, device="cuda").__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, drv.device().ordinal)  # kDLCUDA

    def __repr__(self) -> str:
        st = " freed" if self._freed else ""
        return f"<DeviceCapability {self._name!r} {self._dtype} {self._shape} {self._perms}{st}>"

    def _check_live(self, access: str) -> None:
        if self._freed:
            raise CapabilityFault("freed", buffer=self._name, access=access,
                                  detail="capability used after free()")

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
    _drain_all()
    L, f = drv.lib(), drv.ffi()
    p = f.new("CUdeviceptr *")
    if nbytes:
        rc = L.cuMemAlloc_v2(p, nbytes)
        if rc == CUDA_ERROR_OUT_OF_MEMORY:
            # Unreachable payloads may still hold the memory: collect, release, retry once.
            heap.gc_collect()
            heap.gc_collect()  # a freed object is released by the sweep after the latching one
            _drain_all()
            rc = L.cuMemAlloc_v2(p, nbytes)
        drv.check(rc, "cuMemAlloc")
        try:
            drv.check(L.cuMemsetD8_v2(p[0], 0, nbytes), "cuMemsetD8")
        except drv.CudaError:
            _free_payload(p[0])
            raise
    return DeviceCapability(p[0], shape, dt, perms, name)


def to_device(array: Any, perms: str = "rw", name: str | None = None) -> DeviceCapability:
    """Allocate a device buffer holding a copy of a host array."""
    check_perms(perms)
    a = np.ascontiguousarray(array)
    cap = alloc_device(a.shape, a.dtype, "rw", name)
    cap.copy_from(a)
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
    if not tensor.is_contiguous():
        raise ValueError("wrap_device needs a contiguous tensor (call .contiguous())")
    dt = str(tensor.dtype).replace("torch.", "")
    drv.device()
    _drain_all()
    return DeviceCapability(tensor.data_ptr(), tuple(tensor.shape), dt, perms, name,
                            owned=False, keepalive=tensor)


# ---------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------
@dataclass
class CudaKernel:
    """A compiled entry point: module, function, launch metadata."""

    name: str
    source: str
    checked: bool
    cuda: CudaSource
    info: KernelSig
    module: Any
    function: Any
    cubin_bytes: int
    param_block: Any = field(default=None, repr=False, compare=False)  # see _ParamBlock
    resident: dict = field(default_factory=dict, repr=False, compare=False)  # see max_group
    dynamic_smem: int = 0  # bytes every launch adds to shared_bytes (its smem_ arrays)

    def __repr__(self) -> str:
        # One line: the generated CUDA is self.cuda.text, the dialect source self.source.
        return (f"<capqr.runtime.cuda.CudaKernel {self.info.text()} target=cuda "
                f"mode={'checked' if self.checked else 'raw'} cubin={self.cubin_bytes} B>")

    def registers(self) -> int:
        """Registers per thread of the compiled kernel."""
        f = drv.ffi()
        v = f.new("int *")
        drv.check(drv.lib().cuFuncGetAttribute(v, drv.CU_FUNC_ATTRIBUTE_NUM_REGS,
                                               self.function), "cuFuncGetAttribute")
        return v[0]

    def max_group(self, block: int, shared_bytes: int = 0) -> int:
        """Blocks of ``block`` threads that the device runs at once (the largest grid of
        a cooperative launch; 0 where the device makes none)."""
        key = (block, shared_bytes)
        if key not in self.resident:
            dev = drv.device()
            if not dev.attribute(drv.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH):
                self.resident[key] = 0
            else:
                v = drv.ffi().new("int *")
                drv.check(drv.lib().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    v, self.function, int(block), int(shared_bytes) + self.dynamic_smem),
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor")
                self.resident[key] = v[0] * dev.sm_count
        return self.resident[key]


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


def check_group(kernel: CudaKernel, group: Any, grid: int, block: int,
                shared_bytes: int = 0) -> bool:
    """Whether the launch is cooperative (the kernel calls rt_group_sync); ValueError
    unless ``group`` is the whole grid and the grid fits on the device at once."""
    if group is None and not kernel.info.group_sync:
        return False
    g = group_arg(kernel.name, kernel.info.group_sync, group, grid,
                  f"group={grid} (on the GPU the group is the whole grid, launched "
                  "cooperatively)")
    if grid and g != grid:
        raise ValueError(f"kernel {kernel.name!r}: on the GPU a group is the whole grid (a "
                         f"cooperative launch), so group must be {grid}, got {g}")
    fits = kernel.max_group(block, shared_bytes)
    if grid > fits:
        raise ValueError(f"kernel {kernel.name!r}: its {grid} blocks of {block} threads must "
                         f"all run at once and the device runs at most {fits} of them "
                         "(cooperative launch): they would wait forever")
    return True


def translate(source: str, *, checked: bool = True, hoist: bool = True) -> CudaSource:
    """Parse, verify for target "cuda" and lower to CUDA C; no GPU needed."""
    return _lowered(source, checked, hoist)[1]


@lru_cache(maxsize=32)
def _lowered(source: str, checked: bool, hoist: bool) -> tuple[VerifiedSource, CudaSource]:
    """The verified source and its CUDA text, once per process for the kernels of one
    source (update.c holds four)."""
    verified = verify(parse(source), target="cuda")
    return verified, instrument(verified, checked=checked, hoist=hoist)


def front_end(source: str, name: str | None, *, checked: bool = True,
              hoist: bool = True) -> tuple[str, CudaSource]:
    """The entry point's name and the lowered source, from the record kept under the
    cache key when a process has built it before (runtime/records.py), else from
    :func:`translate` (VerifyError for an unsafe source or an unknown name)."""
    key = content_hash(source, str(name), str(checked), str(hoist),
                       records.toolchain_version("cuda"))
    path = nvrtc.cache_dir() / f"_capqr_cu_{key[:20]}.json"
    rec = records.read(path, key)
    if rec is not None:
        try:
            kernels = {k: records.signature_from_json(v) for k, v in rec["kernels"].items()}
            return rec["name"], CudaSource(rec["text"], kernels, list(rec["local_arrays"]),
                                           bool(rec["checked"]),
                                           {k: int(v) for k, v in rec["dynamic_smem"].items()})
        except (KeyError, TypeError, ValueError, AttributeError):  # another shape
            pass
    verified, cs = _lowered(source, checked, hoist)
    name = select_kernel(verified, name)
    records.write(path, key, {"name": name, "text": cs.text, "checked": cs.checked,
                              "local_arrays": cs.local_arrays, "dynamic_smem": cs.dynamic_smem,
                              "kernels": {k: records.signature_json(v)
                                          for k, v in cs.kernels.items()}})
    return name, cs


def compile(source: str, name: str | None = None, *, checked: bool = True, hoist: bool = True,
            options: Sequence[str] = ()) -> CudaKernel:
    """Verify, instrument and compile dialect source; return entry point ``name``.

    ``checked=False`` builds the same source with raw pointers (overhead baseline);
    ``hoist=False`` disables loop versioning.
    """
    name, cs = front_end(source, name, checked=checked, hoist=hoist)
    dev = drv.device()
    cubin = nvrtc.compile_cubin(cs.text, arch=dev.arch, options=tuple(options) + ("-lineinfo",))
    L, f = drv.lib(), drv.ffi()
    mod = f.new("CUmodule *")
    drv.check(L.cuModuleLoadData(mod, cubin), "cuModuleLoadData")
    fn = f.new("CUfunction *")
    drv.check(L.cuModuleGetFunction(fn, mod[0], entry_symbol(name).encode()),
              "cuModuleGetFunction")
    dynamic = cs.dynamic_smem.get(name, 0)
    if dynamic:
        opt_in_dynamic_smem(name, fn[0], dynamic, dev)
    return CudaKernel(name, source, checked, cs, cs.kernels[name], mod[0], fn[0], len(cubin),
                      dynamic_smem=dynamic)


def opt_in_dynamic_smem(name: str, function: Any, nbytes: int, dev: Any) -> None:
    """Let ``function`` launch with ``nbytes`` of dynamic shared memory (its smem_ arrays
    beyond CUDA's 48 KB static limit, runtime/cuda/lower.py dynamic_shared);
    ValueError when that and its static shared data exceed the device's opt-in limit."""
    L, f = drv.lib(), drv.ffi()
    v = f.new("int *")
    drv.check(L.cuFuncGetAttribute(v, drv.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
              "cuFuncGetAttribute")
    if nbytes + v[0] > dev.max_smem_optin:
        raise ValueError(f"kernel {name!r} needs {nbytes} bytes of shared arrays (+{v[0]} "
                         f"static) and the device allows at most {dev.max_smem_optin} per block")
    drv.check(L.cuFuncSetAttribute(function, drv.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   int(nbytes)), "cuFuncSetAttribute")


# ---------------------------------------------------------------------------
# launch sequences
# ---------------------------------------------------------------------------
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
        self.stuck: list[Any] = []  # holds of launches still running after a timeout's grace


_seq = _Sequence()
_RECORD_BYTES: list[int] = []


def _record(dev: Any) -> int:
    """The device address of the sequence record (allocated on first use, never freed)."""
    if not dev.seq_record:
        if not _RECORD_BYTES:
            _RECORD_BYTES.append(_ffi().sizeof("rt_gpu_fault"))
        p = drv.ffi().new("CUdeviceptr *")
        drv.check(drv.lib().cuMemAlloc_v2(p, _RECORD_BYTES[0]), "cuMemAlloc")
        drv.check(drv.lib().cuMemsetD8_v2(p[0], 0, _RECORD_BYTES[0]), "cuMemsetD8")
        dev.seq_record = int(p[0])
    return dev.seq_record


def _reset_record(record: int) -> None:
    """Clear the record (fault flag and cancel) before the first launch of a sequence.

    Issued on the launch stream, so it is ordered after any kernel still running
    from an earlier, timed-out sequence and before the launches that follow.
    """
    drv.check(drv.lib().cuMemsetD8_v2(record, 0, _ffi().sizeof("rt_gpu_fault")), "cuMemsetD8")


def _read_record(record: int) -> Any:
    f = _ffi()
    rec = f.new("rt_gpu_fault *")
    drv.check(drv.lib().cuMemcpyDtoH_v2(drv.ffi().cast("void *", int(f.cast("uintptr_t", rec))),
                                        record, f.sizeof("rt_gpu_fault")), "cuMemcpyDtoH")
    return rec


#: struct format of one parameter by kind: a cap_t by value (capabilities/abi.py
#: CAP_WORDS, unsigned 64-bit words), the scalars, and the hidden parameters
_PARAM_FORMAT = {"cap": f"{len(abi.CAP_WORDS)}Q", "int64": "q", "double": "d", "float": "f",
                 "record": "Q", "launch": "i"}


class _ParamBlock:
    """A kernel's parameters packed into one buffer, laid out once per kernel.

    cuLaunchKernel copies the parameters when it is called, so one block is
    reused for every launch of the kernel (callers hold ``_seq.lock``; a
    ``time_launch`` makes its own).  Every parameter starts on an 8-byte
    boundary; the pointer array handed to the driver points at each.
    Checked kernels take two hidden trailing parameters (sequence record,
    launch index; runtime/cuda/lower.py).
    """

    def __init__(self, kernel: Any):
        self.kernel_name = kernel.name
        self.kinds = [kind for _, kind in kernel.info.params]
        self.info = kernel.info
        self.n_caps = self.kinds.count("cap")
        self.n_scalars = len(self.kinds) - self.n_caps
        self.hidden = bool(getattr(kernel, "checked", False))
        kinds = self.kinds + (["record", "launch"] if self.hidden else [])
        fmt, offsets, off = "<", [], 0
        for kind in kinds:
            pad = -off % 8
            fmt += f"{pad}x" if pad else ""
            off += pad
            offsets.append(off)
            fmt += _PARAM_FORMAT[kind]
            off += struct.calcsize("<" + _PARAM_FORMAT[kind])
        self.struct = struct.Struct(fmt)
        # (kind, index into caps or args, name) per parameter, in declaration order
        self.order: list[tuple[str, int, str]] = []
        counts = {"cap": 0, "scalar": 0}
        for (pname, _), kind in zip(kernel.info.params, self.kinds, strict=True):
            group = "cap" if kind == "cap" else "scalar"
            self.order.append((kind, counts[group], pname))
            counts[group] += 1
        self.buf = bytearray(max(self.struct.size, 8))
        d = drv.ffi()
        self._cbuf = d.from_buffer(self.buf)
        self.params = d.new("void *[]", [self._cbuf + o for o in offsets] or [d.NULL])

    def pack(self, caps: Sequence[DeviceCapability], args: Sequence[Any], record: int = 0,
             index: int = 0) -> list[str]:
        """Write one launch's parameters; returns the buffers' names (fault reports).

        The caller holds the buffers (:func:`_hold_all` checked them); a free()
        since then leaves a snapshot with zero bounds and the freed tag.  Keeps
        the names, not the handles: once a launch holds its buffers, dropping
        the last handle is the collector's business.
        """
        if len(caps) != self.n_caps or len(args) != self.n_scalars:
            check_counts(self.info, len(caps), len(args), self.kernel_name)
        values: list[Any] = []
        for kind, i, pname in self.order:
            if kind == "cap":
                values.extend(caps[i].cap_value(i))
            elif kind == "int64" and plain_int64(args[i]):
                values.append(args[i])  # the common case, without the call (not bool)
            else:
                slot, value = scalar_arg(kind, args[i], pname, self.kernel_name)
                if slot == "f32":  # C's double -> float conversion (inf past FLT_MAX)
                    value = ctypes.c_float(value).value
                values.append(value)
        if self.hidden:
            values += (record, index)
        self.struct.pack_into(self.buf, 0, *values)
        return [c.name for c in caps]


def _param_block(kernel: CudaKernel) -> _ParamBlock:
    """The kernel's shared parameter block (made on its first launch)."""
    if kernel.param_block is None:
        kernel.param_block = _ParamBlock(kernel)
    return kernel.param_block


def _check_device_cap(c: Any) -> None:
    if not isinstance(c, DeviceCapability):
        raise TypeError(f"GPU kernels take device capabilities, not {type(c).__name__}"
                        " (allocate with device='cuda')")
    c._check_live("launch")  # as on the CPU: refused before anything runs


def _hold_all(caps: Sequence[DeviceCapability]) -> list[Any]:
    """Root every buffer of a launch (all or none); returns the held headers.

    Taken before the bounds snapshot (:meth:`_ParamBlock.pack`, which checks
    the counts), so a free() racing with the launch either is refused here or
    leaves a snapshot whose payload the hold keeps alive.
    """
    held: list[Any] = []
    try:
        for c in caps:
            _check_device_cap(c)
            held.append(c._hold())
    except BaseException:
        _unhold_all(held)
        raise
    return held


def _unhold_all(held: list[Any]) -> None:
    for obj in held:
        core.lib.gc_unhold(obj)
    held.clear()


def _launch_async(kernel: CudaKernel, params: _ParamBlock, grid: int, block: int,
                  shared_bytes: int, driver: tuple[Any, Any] | None = None,
                  cooperative: bool = False) -> None:
    """cuLaunchKernel (cuLaunchCooperativeKernel: every block resident at once) on the
    launch stream; ``driver``: (cuLaunchKernel, NULL) looked up once by a caller that
    launches many times."""
    if driver is None:
        L, f = drv.lib(), drv.ffi()
        driver = (L.cuLaunchKernel, f.NULL)
    fn, null = driver
    shared_bytes += kernel.dynamic_smem  # its smem_ arrays when they exceed 48 KB
    if cooperative:
        drv.check(drv.lib().cuLaunchCooperativeKernel(
            kernel.function, int(grid), 1, 1, int(block), 1, 1, int(shared_bytes), null,
            params.params), "cuLaunchCooperativeKernel")
        return
    drv.check(fn(kernel.function, int(grid), 1, 1, int(block), 1, 1, int(shared_bytes), null,
                 params.params, null), "cuLaunchKernel")


def _fault_from_record(rec: Any, kernel: CudaKernel, names: Sequence[str],
                       index: int | None) -> CapabilityFault:
    return fault_from_record(rec, kernel.name, kernel.cuda.local_arrays, names, index)


def fault_from_record(rec: Any, kernel_name: str, local_arrays: Sequence[str],
                      names: Sequence[str], index: int | None = None) -> CapabilityFault:
    """The CapabilityFault a fault record (rt_gpu_fault's fields) stands for: the
    buffer named from the record's slot (``names``: the launch's cap names; a
    negative slot below -1: ``local_arrays``)."""
    slot = rec.slot
    reason = FAULT_KINDS.get(rec.kind, f"fault-{rec.kind}")
    if reason in ("division-by-zero", "argument"):
        buf = None
    elif slot >= 0:
        buf = names[slot] if slot < len(names) else f"cap#{slot}"
    elif slot == -1 and reason == "no-bounds":
        buf = "<int-derived>"  # cap_from_int: no object (the CPU lane's name)
    else:
        buf = local_arrays[-slot - 1] if 0 <= -slot - 1 < len(local_arrays) else None
    return CapabilityFault(reason, kernel=kernel_name, block=rec.block, thread=rec.thread,
                           buffer=buf, index=rec.index, access=abi.ACCESS.get(rec.access),
                           line=rec.line or None, detail=fault_detail(reason, rec.index),
                           launch_index=index)


def _enqueue(kernel: CudaKernel, caps: list[DeviceCapability], args: Sequence[Any], grid: int,
             block: int, shared_bytes: int, caller_holds: bool = False, dev: Any = None,
             driver: tuple[Any, Any] | None = None, group: Any = None) -> None:
    """Add one launch to the pending sequence (caller holds ``_seq.lock``).

    ``caller_holds``: the caller already holds every buffer of ``caps`` until the
    sync (:func:`launch_many`); otherwise this launch takes its own holds.
    ``dev`` and ``driver``: the device (current on this thread) and the launch
    entry point, when the caller looked them up once for many launches.
    ``group``: see :func:`launch`."""
    dev = dev or drv.device()
    check_block(kernel, block, dev)
    cooperative = check_group(kernel, group, grid, block, shared_bytes)
    record = dev.seq_record or _record(dev)
    own = [] if caller_holds else _hold_all(caps)
    try:
        params = kernel.param_block or _param_block(kernel)
        names = params.pack(caps, args, record, len(_seq.launches))
        if grid == 0:
            _unhold_all(own)  # arguments checked; no block to run (as on the CPU)
            return
        if not _seq.launches:
            _reset_record(record)
        _launch_async(kernel, params, grid, block, shared_bytes, driver, cooperative)
    except BaseException:
        _unhold_all(own)
        raise
    _seq.launches.append((kernel, names))
    _seq.held.extend(own)


def launch_many(launches: Sequence[tuple[Any, ...]]) -> None:
    """Enqueue ``(kernel, caps, args, grid, block)`` launches (or ``(..., block, group)``)
    in order, each as ``launch(kernel, caps, args=args, grid=grid, block=block,
    group=group, sync=False)``.

    The same sequence semantics (one :func:`sync` raises the first fault, with
    its ``launch_index``), at a lower host cost per launch: the lock is taken
    once and each distinct buffer is held once for the whole batch, so a long
    host-driven plan (thousands of launches) costs the host less per launch.  An
    argument error raises at its launch; the launches before it stay enqueued.
    """
    for entry in launches:
        if len(entry) not in (5, 6):
            raise TypeError("launch_many takes (kernel, caps, args, grid, block) or (kernel, "
                            f"caps, args, grid, block, group) tuples, got {len(entry)} items")
    plan = [(kernel, [caps] if isinstance(caps, DeviceCapability) else list(caps), args, grid,
             block, group[0] if group else None)
            for kernel, caps, args, grid, block, *group in launches]
    for _, _, _, grid, _, _ in plan:
        check_grid(grid, None)
    with _seq.lock:
        distinct = {id(c): c for _, caps, _, _, _, _ in plan for c in caps}
        held = _hold_all(list(distinct.values()))  # all or none, before any launch
        before = len(_seq.launches)
        try:
            dev = drv.device()  # binds the context to this thread for the whole batch
            L, f = drv.lib(), drv.ffi()
            driver = (L.cuLaunchKernel, f.NULL)
            for kernel, caps, args, grid, block, group in plan:
                _enqueue(kernel, caps, args, grid, block, 0, caller_holds=True, dev=dev,
                         driver=driver, group=group)
        finally:
            if len(_seq.launches) > before:
                _seq.held.extend(held)  # released by the sync that covers the batch
            else:
                _unhold_all(held)  # nothing enqueued: no sync will cover them


def _sync_locked(timeout: float | None, sequence: bool = True) -> None:
    """Wait for the pending launches, release their holds, raise their first fault
    (``sequence=False``: the one launch of a synchronous ``launch``)."""
    if _seq.stuck and _stream_idle():
        _unhold_all(_seq.stuck)
    if not _seq.launches:
        return
    launches, held = _seq.launches, _seq.held
    _seq.launches, _seq.held = [], []
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
        rec = _read_record(record) if drained else None
    finally:
        if drained:
            _unhold_all(held)
        else:  # a kernel may still use these buffers: keep them rooted until it ends
            _seq.stuck.extend(held)
    if rec is not None and rec.flag:
        index = rec.launch if 0 <= rec.launch < len(launches) else len(launches) - 1
        kernel, names = launches[index]
        if rec.kind in (RT_FAULT_TIMEOUT, RT_FAULT_CANCELLED):
            raise KernelTimeout(kernel.name, timeout or 0.0)
        raise _fault_from_record(rec, kernel, names, index if sequence else None)
    if timed_out:  # no block recorded the cancel (or all had ended): name the sequence
        first, last = launches[0][0].name, launches[-1][0].name
        what = first if len(launches) == 1 else (
            f"sequence of {len(launches)} launches ({first} .. {last})")
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
        _cancel(record)
        raise
    _cancel(record)
    # Bounded wait for the blocks to notice (never block forever in C: a kernel
    # without pollchecks, e.g. stuck in a barrier it cannot leave, would hang us).
    grace = time.monotonic() + CANCEL_GRACE
    while not _stream_idle():
        if time.monotonic() >= grace:
            return True, False
        time.sleep(1e-3)
    return True, True


#: seconds a cancelled sequence gets to notice the cancel flag before sync gives up
CANCEL_GRACE = 10.0
_CANCEL_OFFSET = _ffi().offsetof("rt_gpu_fault", "cancel")
RT_FAULT_TIMEOUT, RT_FAULT_CANCELLED = abi.FAULT_CODE["TIMEOUT"], abi.FAULT_CODE["CANCELLED"]


def _cancel(record: int) -> None:
    """Raise the record's cancel flag through the side stream (the launch stream is
    busy): every thread reads it at its next amortised pollcheck and exits, and
    the launches still queued exit at entry."""
    L, f = drv.lib(), drv.ffi()
    one = f.new("int *", 1)
    side = drv.device().side_stream
    drv.check(L.cuMemcpyHtoDAsync_v2(record + _CANCEL_OFFSET, one, 4, side), "cuMemcpyHtoDAsync")
    drv.check(L.cuStreamSynchronize(side), "cuStreamSynchronize")


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

    ``sync=False``: enqueue the launch on the stream and return; :func:`sync`
    waits for the sequence and raises its first fault.  A fault stops every
    later checked launch of the sequence at its entry.  ``timeout`` belongs to
    :func:`sync` then.  Argument errors (count, type, a freed handle) raise at
    this call in both modes, before anything is enqueued.

    The buffers are collector roots (holds) until the sync that covers the
    launch, whatever happens to their handles meanwhile.
    """
    caps = [caps] if isinstance(caps, DeviceCapability) else list(caps)
    check_grid(grid, timeout)
    if not sync and timeout is not None:
        raise ValueError("a sync=False launch takes no timeout: pass it to runtime.sync()")
    with _seq.lock:
        if sync:
            _drain_all()
            _sync_locked(timeout)
        _enqueue(kernel, caps, args, grid, block, shared_bytes, group=group)
        del caps  # the launch holds the objects, not the handles
        if sync:
            _sync_locked(timeout, sequence=False)


def sync(timeout: float | None = None) -> None:
    """Wait for every launch enqueued since the last sync and release their holds.

    Raises the first fault of the sequence exactly as a synchronous launch
    would (CapabilityFault with kernel, block, thread, index, buffer, line, and
    ``launch_index``: the launch's position in the sequence), or KernelTimeout
    when ``timeout`` seconds pass first (the running kernel is cancelled at its
    next pollcheck, the queued ones exit at entry).  No-op without pending launches.
    """
    check_timeout(timeout)
    with _seq.lock:
        _sync_locked(timeout)


def pending() -> int:
    """Launches enqueued since the last sync."""
    return len(_seq.launches)


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
    cooperative = check_group(kernel, group, grid, block, shared_bytes)
    _drain_all()
    out = []
    start, end = drv.Event(), drv.Event()
    with _seq.lock:
        _sync_locked(None)
        record = _record(dev)
        held = _hold_all(caps)
        try:
            params = _ParamBlock(kernel)  # its own: ``before`` may launch this kernel
            names = params.pack(caps, args, record, 0)
            for it in range(warmup + repeat):
                if before is not None:
                    before()
                    _sync_locked(None)  # ``before`` may have launched
                _reset_record(record)
                start.record()
                _launch_async(kernel, params, grid, block, shared_bytes,
                              cooperative=cooperative)
                end.record()
                end.synchronize()
                rec = _read_record(record)
                if rec.flag:
                    raise _fault_from_record(rec, kernel, names, None)
                if it >= warmup:
                    out.append(start.elapsed_ms(end))
        finally:
            _unhold_all(held)
    return out
