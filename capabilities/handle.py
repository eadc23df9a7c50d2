"""Host-side capabilities: Python handles on collector-owned objects.

A Capability pins its object (a collector root) for as long as the handle or
any numpy view made from it is alive; the pin is a cffi cdata with a
destructor, and every view's buffer references that cdata.  ``free()``
revokes the object at once: kernels then fault with reason "freed", and so
does every later use of the handle from Python.  Every attribute of a handle
is recorded when it is made, so reading one after free() never touches a
header the collector may have released.

Wrapped arrays (and wrapped torch CUDA tensors, runtime/cuda/lane.py): the
collector owns the object, this module owns the array.
The array stays referenced (``_EXTERNAL``) until the collector's sweep finds
the object unreachable from every handle, table and running kernel and queues
its release; ``drain_releases()`` (called on every alloc/wrap and after
``runtime.gc_collect()``) then drops the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime import core, heap
from runtime.errors import CapabilityFault

from . import abi
from .protocol import RecordedAttributes

ffi, lib = core.ffi, core.lib

#: object id -> the Python object that owns a wrapped payload
_EXTERNAL: dict[int, Any] = {}
_DRAIN_BATCH = 256
_drain_buf = ffi.new("gc_release_rec[]", _DRAIN_BATCH)


def drain_releases() -> int:
    """Drop the arrays of wrapped objects the collector has released; returns how many."""
    n = 0
    while True:
        k = int(lib.gc_drain_external_releases(_drain_buf, _DRAIN_BATCH))
        for i in range(k):
            _EXTERNAL.pop(int(_drain_buf[i].id), None)
        n += k
        if k < _DRAIN_BATCH:
            return n


heap.add_release_hook(drain_releases)


def keep_external(obj_id: int, owner: Any) -> None:
    """Keep ``owner`` (the array or tensor whose memory object ``obj_id`` wraps)
    referenced until the collector releases the object."""
    _EXTERNAL[int(obj_id)] = owner

#: numpy dtype -> RT_DT_* code (capabilities/abi.py)
DTYPE_CODES = {np.dtype(d.numpy): d.code for d in abi.DTYPES if d.numpy}
CAP_DTYPE = "cap"
CAP_CODE = abi.CAP_DT_CODE
CAP_SLOT_BYTES = abi.ELEM_SIZE["cap"]
PERM_R, PERM_W = abi.PERM_R, abi.PERM_W
RT_OBJ_FREED = abi.OBJ_FLAG["FREED"]


def _perm_bits(perms: str) -> int:
    if perms not in ("r", "rw"):
        raise ValueError(f"perms must be 'r' or 'rw', not {perms!r}")
    return PERM_R | (PERM_W if "w" in perms else 0)


def _dtype_code(dtype: Any) -> tuple[Any, int, int]:
    """(dtype as stored on the handle, RT_DT code, element size)."""
    if isinstance(dtype, str) and dtype == CAP_DTYPE:
        return CAP_DTYPE, CAP_CODE, CAP_SLOT_BYTES
    dt = np.dtype(dtype)
    if dt not in DTYPE_CODES:
        allowed = ", ".join(sorted(str(d) for d in DTYPE_CODES)) + ", 'cap'"
        raise TypeError(f"unsupported dtype {dt}; capqr buffers hold {allowed}")
    return dt, DTYPE_CODES[dt], dt.itemsize


def _shape_tuple(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return shape


class Capability(RecordedAttributes):
    """A bounded, permissioned handle on one buffer.

    ``int(cap)`` is the plain address and nothing more; a kernel receives
    the capability itself (address + bounds + permissions + object).
    """

    __slots__ = ("_obj", "_pin", "_shape", "_dtype", "_code", "_itemsize", "_name", "_perms",
                 "_freed", "_id", "_nbytes", "__weakref__")

    def __init__(self, obj: Any, shape: tuple[int, ...], dtype: Any, perms: str, name: str):
        """Take over one pin of ``obj`` (already pinned by the allocator)."""
        if obj == ffi.NULL:
            raise MemoryError(f"capqr: cannot allocate buffer {name!r}")
        self._obj = obj
        self._shape = shape
        self._dtype, self._code, self._itemsize = _dtype_code(dtype)
        self._perms = perms
        self._name = name
        self._freed = False
        self._id = int(obj.id)
        self._nbytes = int(obj.nbytes)
        # obj arrives pinned (gc_alloc_pinned/gc_wrap_pinned): no window in
        # which a fresh object is unrooted.

        def unpin(_p: Any, o: Any = obj) -> None:
            lib.gc_unpin(o)

        # The pin is a char* to the payload; numpy views reference it, so the
        # object stays pinned while any view is alive.
        self._pin = ffi.gc(ffi.cast("char *", obj.base), unpin)

    # -- attributes (name, shape, ... from RecordedAttributes) ------------
    @property
    def device(self) -> str:
        return "cpu"

    def _check_live(self, access: str) -> None:
        # _freed first: after free() the pin is gone and the header may be too
        if self._freed or (int(self._obj.flags) & RT_OBJ_FREED):
            raise CapabilityFault("freed", buffer=self._name, access=access,
                                  detail="capability used after free()")

    # -- host access -------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A zero-copy numpy view (read-only for 'r' capabilities)."""
        self._check_live("load")
        if self._dtype == CAP_DTYPE:
            raise TypeError("cap tables hold capabilities, not numbers; they have no numpy view")
        buf = ffi.buffer(self._pin, self.nbytes)
        arr = np.frombuffer(buf, dtype=self._dtype).reshape(self._shape)
        if self._perms == "r":
            arr.flags.writeable = False
        return arr

    def __int__(self) -> int:
        self._check_live("load")
        return int(ffi.cast("uintptr_t", self._obj.base))

    def free(self) -> None:
        """Revoke the object now; later uses fault (a second free() too)."""
        if self._freed:
            raise CapabilityFault("freed", buffer=self._name, access="free",
                                  detail="double free()")
        rc = lib.gc_free(self._obj)
        self._freed = True
        self._pin = None  # the payload goes once no view and no running kernel holds it
        if rc != 0:
            raise CapabilityFault("freed", buffer=self._name, access="free",
                                  detail="double free()")

    def _arg_obj(self) -> Any:
        """The object for a launch argument (raises if freed)."""
        self._check_live("launch")
        return self._obj

    def __repr__(self) -> str:
        state = " freed" if self._freed else ""
        return (f"<Capability {self._name!r} shape={self._shape} dtype={self._dtype} "
                f"perms={self._perms!r}{state}>")


class NoBoundsCap:
    """A capability rebuilt from a plain integer: it has no bounds.

    Every access through it faults; passing it to a kernel is allowed (so the
    fault names the kernel and block).
    """

    __slots__ = ("address", "name")

    def __init__(self, address: int):
        self.address = int(address)
        self.name = "<int-derived>"

    def __int__(self) -> int:
        return self.address

    def __repr__(self) -> str:
        return f"<NoBoundsCap 0x{self.address:x}>"


_counter = 0


def _auto_name(prefix: str) -> str:
    global _counter
    _counter += 1
    return f"{prefix}{_counter}"


def alloc(shape: Any, dtype: Any = np.float32, perms: str = "rw", name: str | None = None,
          *, device: str = "cpu") -> Any:
    """A fresh zeroed buffer owned by the collector."""
    drain_releases()
    if device != "cpu":
        from runtime import cuda  # GPU lane (optional)

        return cuda.alloc_device(shape, dtype, perms=perms, name=name)
    shape = _shape_tuple(shape)
    _, code, itemsize = _dtype_code(dtype)
    bits = _perm_bits(perms)
    n = int(np.prod(shape, dtype=np.int64))
    name = name or _auto_name("buf")
    obj = lib.gc_alloc_pinned(n * itemsize, code, bits, name.encode()[:47])
    return Capability(obj, shape, dtype, perms, name)


def wrap(array: Any, perms: str = "rw", name: str | None = None) -> Any:
    """Zero-copy capability over a C-contiguous numpy array or CPU torch tensor.

    The array stays alive while any handle, cap table or running kernel can
    reach the object; the collector's sweep releases it after that.
    """
    drain_releases()
    keep: Any = array
    if type(array).__module__.startswith("torch"):
        if getattr(array, "is_cuda", False):
            from runtime import cuda

            return cuda.wrap_device(array, perms=perms, name=name)
        if not array.is_contiguous():
            raise ValueError("capabilities.wrap needs a contiguous tensor (call .contiguous())")
        np_arr = array.detach().numpy()
        keep = (array, np_arr)
        array = np_arr
    if not isinstance(array, np.ndarray):
        raise TypeError(f"capabilities.wrap takes a numpy array or torch tensor, "
                        f"not {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError("capabilities.wrap needs a C-contiguous array "
                         "(np.ascontiguousarray makes one; wrap never copies)")
    bits = _perm_bits(perms)
    if "w" in perms and not array.flags.writeable:
        raise ValueError("array is read-only; wrap it with perms='r'")
    _, code, _ = _dtype_code(array.dtype)
    name = name or _auto_name("arr")
    ptr = ffi.cast("void *", array.ctypes.data)
    obj = lib.gc_wrap_pinned(ptr, array.nbytes, code, bits, name.encode()[:47])
    cap = Capability(obj, array.shape, array.dtype, perms, name)
    keep_external(cap.id, keep)
    return cap


def from_int(address: int) -> NoBoundsCap:
    """Turn an integer back into a capability: it has no bounds."""
    return NoBoundsCap(int(address))
