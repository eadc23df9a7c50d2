"""The GPU lane: device capabilities, kernel compilation and checked launches.

Device capabilities.  A :class:`DeviceCapability` is the host-side header of a
device buffer (shape, dtype, perms, name, bounds, freed flag) and owns the
device payload (``cuMemAlloc``) unless it wraps memory owned elsewhere (a
PyTorch tensor).  A launch passes each buffer as a by-value ``cap_t`` built
from the header at launch time; after ``free()`` that snapshot has zero bounds
and the "freed" tag, so any access in a later launch faults with reason
``freed``.  The payload itself is released once no launch holds the buffer.

Launches are synchronous: ``launch`` returns after the kernel finished and
raises :class:`CapabilityFault` for the first refused access of the launch.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from capabilities import abi

from ..argcheck import check_counts, check_grid, check_perms, scalar_arg
from ..errors import CapabilityFault, KernelTimeout, fault_detail
from ..parse import parse
from ..verifier import KernelSig, select_kernel, verify
from . import driver as drv
from . import nvrtc
from .instrument_cuda import FAULT_KINDS, CudaSource, instrument

CAP_CDEF = abi.cffi_cap_cdef() + """
typedef struct { int flag; int kind; int access; int line; long long block; long long index;
                 long long elsize; long long offset; int thread; int slot; } rt_gpu_fault;
"""
TAG_FREED = abi.GPU_TAG_FREED
_DTYPES = {"float16", "float32", "float64", "int32", "int64", "uint8"}

_ffi_lock = threading.Lock()
_cffi: dict = {}


def _ffi():
    with _ffi_lock:
        if "ffi" not in _cffi:
            import cffi

            f = cffi.FFI()
            f.cdef(CAP_CDEF)
            _cffi["ffi"] = f
        return _cffi["ffi"]


def _release(ptr: int) -> None:
    """Finalizer: free a device payload (the context may be gone at exit: ignore)."""
    try:
        drv.lib().cuMemFree_v2(ptr)
    except drv.CudaUnavailable:  # interpreter shutdown after the driver went away
        return


class DeviceCapability:
    """A capability on a device buffer: host header, device payload.

    Attributes: ``nbytes``, ``dtype`` (numpy dtype), ``shape``, ``name``,
    ``perms`` ("r", "w" or "rw"), ``device`` ("cuda"), ``ptr`` (device address),
    ``freed``.
    """

    _serial = 0

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, perms: str = "rw",
                 name: str | None = None, *, owned: bool = True, keepalive: Any = None):
        self.dtype = np.dtype(dtype)
        if self.dtype.name not in _DTYPES:
            raise TypeError(f"unsupported device dtype {self.dtype}")
        self.shape = tuple(int(s) for s in shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.perms = check_perms(perms)
        DeviceCapability._serial += 1
        self.id = DeviceCapability._serial
        self.name = (name or f"dev{self.id}")[:47]
        self.device = "cuda"
        self._ptr = int(ptr)
        self._owned = owned
        self._keepalive = keepalive  # e.g. the torch tensor whose memory this is
        self._freed = False
        self._holds = 0
        self._lock = threading.Lock()
        self._fin = weakref.finalize(self, _release, self._ptr) if owned and ptr else None

    # -- header ------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """Device address of the payload (0 once released)."""
        return self._ptr

    @property
    def freed(self) -> bool:
        """True after free()."""
        return self._freed

    def __repr__(self) -> str:
        st = " freed" if self._freed else ""
        return f"<DeviceCapability {self.name!r} {self.dtype} {self.shape} {self.perms}{st}>"

    def cap_value(self, slot: int) -> tuple[int, int, int, int, int]:
        """(p, lo, rlen, wlen, tag) as a launch passes it; ``slot`` is the argument index."""
        with self._lock:
            if self._freed:
                return 0, 0, 0, 0, (slot + 1) | TAG_FREED
            return (self._ptr, self._ptr, self.nbytes, self.nbytes if "w" in self.perms else 0,
                    slot + 1)

    def _hold(self) -> None:
        with self._lock:
            self._holds += 1

    def _unhold(self) -> None:
        with self._lock:
            self._holds -= 1
            release = self._freed and self._holds == 0
        if release:
            self._drop_payload()

    def _drop_payload(self) -> None:
        if self._fin is not None:
            self._fin()  # runs _release once
            self._fin = None
        self._keepalive = None
        self._ptr = 0

    def free(self) -> None:
        """Revoke the capability now; release the payload when no launch holds it.

        Later launches see zero bounds and fault with reason "freed"; a second
        free() raises CapabilityFault("freed"), as on the CPU.
        """
        with self._lock:
            if self._freed:
                raise CapabilityFault("freed", buffer=self.name, access="free",
                                      detail="double free()")
            self._freed = True
            idle = self._holds == 0
        if idle:
            self._drop_payload()

    # -- data movement ------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Copy the payload back to a new host array of ``shape`` and ``dtype``."""
        if self._freed:
            raise CapabilityFault("freed", buffer=self.name, access="load")
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            drv.device()
            f = drv.ffi()
            drv.check(drv.lib().cuMemcpyDtoH_v2(f.cast("void *", out.ctypes.data), self._ptr,
                                                self.nbytes), "cuMemcpyDtoH")
        return out

    def copy_from(self, array: Any) -> None:
        """Upload a host array of the same number of bytes into the payload."""
        if self._freed:
            raise CapabilityFault("freed", buffer=self.name, access="store")
        a = np.ascontiguousarray(array, dtype=self.dtype)
        if a.nbytes != self.nbytes:
            raise ValueError(f"size mismatch: {a.nbytes} bytes into {self.nbytes}")
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
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    drv.device()
    L, f = drv.lib(), drv.ffi()
    p = f.new("CUdeviceptr *")
    if nbytes:
        drv.check(L.cuMemAlloc_v2(p, nbytes), "cuMemAlloc")
        drv.check(L.cuMemsetD8_v2(p[0], 0, nbytes), "cuMemsetD8")
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

    Holds a reference to the tensor so the memory outlives the capability;
    free() revokes the capability but never releases torch's memory.
    """
    if not getattr(tensor, "is_cuda", False):
        raise TypeError("wrap_device needs a CUDA tensor")
    if not tensor.is_contiguous():
        raise ValueError("wrap_device needs a contiguous tensor (call .contiguous())")
    dt = str(tensor.dtype).replace("torch.", "")
    drv.device()
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
    fault_ptr: int
    cancel_ptr: int
    cubin_bytes: int
    lock: Any

    def registers(self) -> int:
        """Registers per thread of the compiled kernel."""
        f = drv.ffi()
        v = f.new("int *")
        drv.check(drv.lib().cuFuncGetAttribute(v, drv.CU_FUNC_ATTRIBUTE_NUM_REGS,
                                               self.function), "cuFuncGetAttribute")
        return v[0]


def translate(source: str, *, checked: bool = True, hoist: bool = True) -> CudaSource:
    """Parse, verify for target "cuda" and lower to CUDA C; no GPU needed."""
    return instrument(verify(parse(source), target="cuda"), checked=checked, hoist=hoist)


def compile(source: str, name: str | None = None, *, checked: bool = True, hoist: bool = True,
            options: Sequence[str] = ()) -> CudaKernel:
    """Verify, instrument and compile dialect source; return entry point ``name``.

    ``checked=False`` builds the same source with raw pointers (overhead baseline);
    ``hoist=False`` disables loop versioning.
    """
    verified = verify(parse(source), target="cuda")
    name = select_kernel(verified, name)
    cs = instrument(verified, checked=checked, hoist=hoist)
    dev = drv.device()
    cubin = nvrtc.compile_cubin(cs.text, arch=dev.arch, options=tuple(options) + ("-lineinfo",))
    L, f = drv.lib(), drv.ffi()
    mod = f.new("CUmodule *")
    drv.check(L.cuModuleLoadData(mod, cubin), "cuModuleLoadData")
    fn = f.new("CUfunction *")
    drv.check(L.cuModuleGetFunction(fn, mod[0], name.encode()), "cuModuleGetFunction")
    ptr, size = f.new("CUdeviceptr *"), f.new("size_t *")
    drv.check(L.cuModuleGetGlobal_v2(ptr, size, mod[0], b"__rt_fault"), "cuModuleGetGlobal")
    fault_ptr = ptr[0]
    drv.check(L.cuModuleGetGlobal_v2(ptr, size, mod[0], b"__rt_cancel"), "cuModuleGetGlobal")
    return CudaKernel(name, source, checked, cs, cs.kernels[name], mod[0], fn[0], fault_ptr,
                      ptr[0], len(cubin), threading.Lock())


class _Prepared:
    """Kernel parameter storage for one launch (kept alive until it completes)."""

    def __init__(self, kernel: CudaKernel, caps: Sequence[DeviceCapability],
                 args: Sequence[Any]):
        info = kernel.info
        check_counts(info, len(caps), len(args), kernel.name)
        for c in caps:
            if not isinstance(c, DeviceCapability):
                raise TypeError(f"GPU kernels take device capabilities, not {type(c).__name__}"
                                " (allocate with device='cuda')")
            if c.freed:  # as on the CPU: refused before anything runs
                raise CapabilityFault("freed", buffer=c.name, access="launch",
                                      detail="capability used after free()")
        f = _ffi()
        ctype = {"i64": "long long *", "f64": "double *", "f32": "float *"}
        self.keep = []
        ci = ai = 0
        for pname, kind in info.params:
            if kind == "cap":
                v = f.new("rt_cap *")
                v.p, v.lo, v.rlen, v.wlen, v.tag = (f.cast("char *", x) if k < 2 else x
                                                    for k, x in
                                                    enumerate(caps[ci].cap_value(ci)))
                ci += 1
            else:
                field, value = scalar_arg(kind, args[ai], pname, kernel.name)
                v = f.new(ctype[field], value)
                ai += 1
            self.keep.append(v)
        self.params = drv.ffi().new("void *[]", [drv.ffi().cast("void *", int(f.cast(
            "uintptr_t", v))) for v in self.keep] or [drv.ffi().NULL])


def _launch_async(kernel: CudaKernel, prep: _Prepared, grid: int, block: int,
                  shared_bytes: int) -> None:
    L, f = drv.lib(), drv.ffi()
    drv.check(L.cuLaunchKernel(kernel.function, int(grid), 1, 1, int(block), 1, 1,
                               int(shared_bytes), f.NULL, prep.params, f.NULL),
              "cuLaunchKernel")


def _reset_flags(kernel: CudaKernel) -> None:
    L = drv.lib()
    drv.check(L.cuMemsetD8_v2(kernel.fault_ptr, 0, _ffi().sizeof("rt_gpu_fault")), "cuMemsetD8")
    drv.check(L.cuMemsetD8_v2(kernel.cancel_ptr, 0, 4), "cuMemsetD8")


def _read_fault(kernel: CudaKernel, caps: Sequence[DeviceCapability]) -> CapabilityFault | None:
    f = _ffi()
    rec = f.new("rt_gpu_fault *")
    drv.check(drv.lib().cuMemcpyDtoH_v2(drv.ffi().cast("void *", int(f.cast("uintptr_t", rec))),
                                        kernel.fault_ptr, f.sizeof("rt_gpu_fault")),
              "cuMemcpyDtoH")
    if not rec.flag:
        return None
    slot = rec.slot
    reason = FAULT_KINDS.get(rec.kind, f"fault-{rec.kind}")
    if reason == "division-by-zero":
        buf = None
    elif slot >= 0:
        buf = caps[slot].name if slot < len(caps) else f"cap#{slot}"
    elif slot == -1 and reason == "no-bounds":
        buf = "<int-derived>"  # cap_from_int: no object (the CPU lane's name)
    else:
        arrays = kernel.cuda.local_arrays
        buf = arrays[-slot - 1] if 0 <= -slot - 1 < len(arrays) else None
    return CapabilityFault(reason, kernel=kernel.name, block=rec.block, thread=rec.thread,
                           buffer=buf, index=rec.index, access=abi.ACCESS.get(rec.access),
                           line=rec.line or None, detail=fault_detail(reason, rec.index))


def launch(kernel: CudaKernel, caps: Sequence[DeviceCapability], *, args: Sequence[Any] = (),
           grid: int = 1, block: int = 128, shared_bytes: int = 0,
           timeout: float | None = None) -> None:
    """Run ``kernel`` on ``grid`` blocks of ``block`` threads and wait for it.

    Raises CapabilityFault (first refused access: block, thread, index, buffer,
    line) or KernelTimeout (deadline passed; blocks were cancelled at their
    next pollcheck).
    """
    check_grid(grid, timeout)
    dev = drv.device()
    if not 1 <= block <= dev.max_threads:
        raise ValueError(f"block must be in 1..{dev.max_threads}")
    prep = _Prepared(kernel, caps, args)
    if grid == 0:
        return  # arguments checked; no block to run (as on the CPU)
    held = list(caps)
    for c in held:
        c._hold()
    try:
        with kernel.lock:  # the fault record is per module: one launch at a time
            _reset_flags(kernel)
            _launch_async(kernel, prep, grid, block, shared_bytes)
            _wait(kernel, timeout)
            fault = _read_fault(kernel, caps)
    finally:
        for c in held:
            c._unhold()
    if fault is not None:
        raise fault


def _wait(kernel: CudaKernel, timeout: float | None) -> None:
    L, f = drv.lib(), drv.ffi()
    if timeout is None:
        drv.check(L.cuStreamSynchronize(f.NULL), "cuStreamSynchronize")
        return
    deadline = time.monotonic() + timeout
    sleep = 1e-5
    while True:
        rc = L.cuStreamQuery(f.NULL)
        if rc == drv.CUDA_SUCCESS:
            return
        if rc != drv.CUDA_ERROR_NOT_READY:
            drv.check(rc, "cuStreamQuery")
        if time.monotonic() >= deadline:
            break
        time.sleep(sleep)
        sleep = min(sleep * 2, 2e-3)
    # Deadline: raise the cancel flag through the side stream (the launch stream is busy);
    # every thread reads it at its next amortised pollcheck and exits.
    one = f.new("int *", 1)
    drv.check(L.cuMemcpyHtoDAsync_v2(kernel.cancel_ptr, one, 4, drv.device().side_stream),
              "cuMemcpyHtoDAsync")
    drv.check(L.cuStreamSynchronize(drv.device().side_stream), "cuStreamSynchronize")
    # Bounded wait for the blocks to notice (never block forever in C: a kernel
    # without pollchecks, e.g. stuck in a barrier it cannot leave, would hang us).
    grace = time.monotonic() + 10.0
    while L.cuStreamQuery(f.NULL) == drv.CUDA_ERROR_NOT_READY and time.monotonic() < grace:
        time.sleep(1e-3)
    raise KernelTimeout(kernel.name, timeout)


def time_launch(kernel: CudaKernel, caps: Sequence[DeviceCapability], *,
                args: Sequence[Any] = (), grid: int = 1, block: int = 128,
                shared_bytes: int = 0, repeat: int = 7, warmup: int = 1,
                before: Any = None) -> list[float]:
    """Milliseconds per launch measured with CUDA events (``repeat`` samples).

    ``before`` (optional callable) runs before each launch outside the timed
    region, e.g. to restore the input that the kernel overwrites in place.
    Raises CapabilityFault if any launch faulted.
    """
    drv.device()
    prep = _Prepared(kernel, caps, args)
    out = []
    start, end = drv.Event(), drv.Event()
    for c in caps:
        c._hold()
    try:
        with kernel.lock:
            for it in range(warmup + repeat):
                if before is not None:
                    before()
                _reset_flags(kernel)
                start.record()
                _launch_async(kernel, prep, grid, block, shared_bytes)
                end.record()
                end.synchronize()
                fault = _read_fault(kernel, caps)
                if fault is not None:
                    raise fault
                if it >= warmup:
                    out.append(start.elapsed_ms(end))
    finally:
        for c in caps:
            c._unhold()
    return out
