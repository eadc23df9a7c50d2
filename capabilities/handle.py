"""Host-side capabilities: Python handles on collector-owned objects.

A Capability pins its object (a collector root) for as long as the handle or
any numpy view made from it is alive; the pin is a cffi cdata with a
destructor, and every view's buffer references that cdata.  ``free()``
revokes the object at once: kernels then fault with reason "freed", and so
does every later use of the handle from Python.  Every attribute of a handle
is recorded when it is made, so reading one after free() never touches a
header the collector may have released.

Wrapped arrays (and wrapped torch CUDA tensors, runtime/cuda/memory.py): the
collector owns the object, this module owns the array.
The array stays referenced (``runtime.heap.keep_external``) until the collector's
sweep finds the object unreachable from every handle, table and running kernel and
queues its release; ``runtime.heap.drain_releases()`` (called on every alloc/wrap and
after ``runtime.gc_collect()``) then drops the reference.

Keeping the array object alive is not enough: its data can be freed under it.
For the same lifetime a wrap therefore also pins the data (see ``_host_pins``):
a numpy owner gets a weak reference, which makes ``ndarray.resize`` refuse even
with ``refcheck=False``; a CPU torch tensor's storage gets the memory block
itself held (``_TORCH_PIN_SRC``), so ``resize_``, ``set_``,
``untyped_storage().resize_()`` or ``share_memory_()`` can move the tensor but
never free the block a capability points into.
"""

from __future__ import annotations

import ctypes
import math
import operator
import os
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from . import abi
from .protocol import RecordedAttributes

#: The runtime core's cffi handles (runtime/core.py: the collector's C library), bound
#: by _bind() when the first handle is made.  Capabilities sit below runtime in the
#: layering (tests/test_layering.py): loading this module builds and imports nothing
#: above it, and `capabilities.abi`, which the core is built from, stays importable alone.
ffi: Any = None
lib: Any = None
_heap: Any = None  # runtime.heap: the owners of wrapped payloads (keep_external)
_bind_lock = threading.Lock()


def _bind() -> None:
    """Import the runtime core (the layer above) once, on first use, and drain the
    collector's finished releases (every alloc and wrap does)."""
    global ffi, lib, _heap
    if lib is None:
        with _bind_lock:
            if lib is None:
                from ..runtime import core, heap

                ffi, _heap = core.ffi, heap
                lib = core.lib  # last: a thread that sees lib bound sees the rest
    _heap.drain_releases()


def _fault(*args: Any, **kw: Any) -> Exception:
    """runtime.CapabilityFault, imported where a handle refuses an access (the layer
    above; by then the core is bound)."""
    from ..runtime.errors import CapabilityFault

    return CapabilityFault(*args, **kw)


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
        raise TypeError(f"unsupported dtype {dt}; capqr buffers hold {supported_dtypes()}")
    return dt, DTYPE_CODES[dt], dt.itemsize


#: Largest buffer ``alloc`` tries (bytes): 2^47 is all of an x86-64 or arm64
#: process's user address space, so a larger request can never succeed.
MAX_ALLOC_BYTES = 1 << 47


def _shape_tuple(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        # operator.index: a float (2.5) or a bool is a mistake, never truncated
        shape = tuple(operator.index(s) if not isinstance(s, bool) else None for s in shape)
    except TypeError:
        shape = None
    if shape is None or None in shape:
        raise TypeError("shape must be an int or a sequence of ints")
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return shape


def _check_nbytes(shape: tuple[int, ...], dtype: Any, itemsize: int) -> int:
    """The byte size of a (shape, dtype) buffer, or ValueError naming it when no
    allocation could hold it (Python ints: numpy's int64 product would wrap)."""
    nbytes = math.prod(shape) * itemsize
    if nbytes > MAX_ALLOC_BYTES:
        raise ValueError(f"a buffer of shape {shape} and dtype {dtype} needs {nbytes} bytes "
                         f"({_human(nbytes)}), more than any process can address "
                         f"({_human(MAX_ALLOC_BYTES)})")
    return nbytes


def _human(nbytes: int) -> str:
    for unit, shift in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} B"


class Capability(RecordedAttributes):
    """A bounded, permissioned handle on one buffer.

    ``int(cap)`` is the plain address and nothing more; a kernel receives
    the capability itself (address + bounds + permissions + object).
    """

    __slots__ = ("_obj", "_pin", "_shape", "_dtype", "_code", "_itemsize", "_name", "_perms",
                 "_freed", "_id", "_nbytes", "_guard", "_export_pin", "__weakref__")

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
        self._guard: Any = None  # wrap: a check that the wrapped memory is still there
        self._export_pin: Any = None  # set by __array_interface__: see there
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
            raise _fault("freed", buffer=self._name, access=access,
                                  detail="capability used after free()")
        if self._guard is not None:
            self._guard(self._name, access)

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

    # -- zero-copy export (numpy, torch, any DLPack consumer) -----------------
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface: ``np.asarray(cap)`` is a zero-copy view.  A consumer
        keeps this handle as its base, so the handle keeps a pin of its own from here
        on, which free() does not drop: free() still revokes the capability for
        kernels and numpy(), but the memory outlives every exported array."""
        view = self.numpy()
        self._export_pin = self._pin
        return view.__array_interface__

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Any = None) -> Any:
        """DLPack export (``torch.from_dlpack(cap)``, ``np.from_dlpack(cap)``): the capsule
        holds a numpy view, and the view the payload's pin, so the memory stays while
        the consumer's tensor does (also after free())."""
        kw: dict[str, Any] = {"stream": stream}
        if max_version is not None:
            kw["max_version"] = max_version
        if dl_device is not None:
            kw["dl_device"] = dl_device
        if copy is not None:
            kw["copy"] = copy
        return self.numpy().__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    def free(self) -> None:
        """Revoke the object now; later uses fault (a second free() too)."""
        if self._freed:
            raise _fault("freed", buffer=self._name, access="free",
                                  detail="double free()")
        rc = lib.gc_free(self._obj)
        self._freed = True
        self._pin = None  # the payload goes once no view and no running kernel holds it
        if rc != 0:
            raise _fault("freed", buffer=self._name, access="free",
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
    _bind()
    if device != "cpu":
        from ..runtime import cuda  # GPU lane (optional)

        return cuda.alloc_device(shape, dtype, perms=perms, name=name)
    shape = _shape_tuple(shape)
    dt, code, itemsize = _dtype_code(dtype)
    nbytes = _check_nbytes(shape, dt, itemsize)
    bits = _perm_bits(perms)
    name = name or _auto_name("buf")
    obj = lib.gc_alloc_pinned(nbytes, code, bits, abi.c_name(name))
    if obj == ffi.NULL:
        raise MemoryError(f"capqr: cannot allocate buffer {name!r}: shape {shape} of {dt} "
                          f"needs {nbytes} bytes ({_human(nbytes)})")
    return Capability(obj, shape, dtype, perms, name)


#: The dtype names capqr buffers hold, as torch spells them too (abi.DTYPES' numpy names)
_TORCH_DTYPES = frozenset(d.name for d in DTYPE_CODES)


def supported_dtypes() -> str:
    """The element types a capqr buffer holds, as an error message lists them."""
    return ", ".join(sorted(str(d) for d in DTYPE_CODES)) + ", 'cap'"


def _torch_numpy(t: Any) -> np.ndarray:
    """A zero-copy numpy view of a CPU tensor, or TypeError/ValueError saying why not."""
    dname = str(t.dtype).removeprefix("torch.")
    if dname not in _TORCH_DTYPES:
        raise TypeError(f"unsupported dtype {t.dtype}; capqr buffers hold {supported_dtypes()}"
                        f" (convert first, e.g. t.to(torch.float32))")
    if t.device.type != "cpu":
        raise ValueError(f"capabilities.wrap takes CPU or CUDA tensors, not {t.device.type}")
    if not t.is_contiguous():
        raise ValueError("capabilities.wrap needs a contiguous tensor (call .contiguous())")
    return t.detach().numpy()


def wrap(array: Any, perms: str = "rw", name: str | None = None) -> Any:
    """Zero-copy capability over a C-contiguous numpy array, torch tensor (a CUDA tensor
    gives a device capability) or any DLPack producer (``__dlpack__``: cupy, jax, ...).

    The array stays alive while any handle, cap table or running kernel can
    reach the object; the collector's sweep releases it after that.  For as
    long, its memory cannot be freed: a numpy array that owns it refuses
    ``resize`` (even with ``refcheck=False``); a torch tensor's storage refuses
    to grow (``resize_``) and its block stays allocated through ``set_`` or
    ``share_memory_`` (which move the tensor, not the capability: writes
    through the capability then no longer show in the tensor).
    """
    _bind()
    keep: Any = array
    if type(array).__module__.startswith("torch"):
        if getattr(array, "is_cuda", False):
            from ..runtime import cuda

            return cuda.wrap_device(array, perms=perms, name=name)
        np_arr = _torch_numpy(array)
        keep = (array, np_arr)
        array = np_arr
    elif not isinstance(array, np.ndarray) and hasattr(array, "__dlpack__"):
        dlpack_gpu = _dlpack_on_gpu(array)
        if dlpack_gpu is not None:  # cupy, jax, ... on a CUDA device: through torch
            from ..runtime import cuda

            return cuda.wrap_device(dlpack_gpu, perms=perms, name=name)
        np_arr = np.from_dlpack(array)  # the array holds the producer's capsule
        keep = (array, np_arr)
        array = np_arr
    if not isinstance(array, np.ndarray):
        raise TypeError(f"capabilities.wrap takes a numpy array, a torch tensor or an object "
                        f"with __dlpack__, not {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError("capabilities.wrap needs a C-contiguous array "
                         "(np.ascontiguousarray makes one; wrap never copies)")
    bits = _perm_bits(perms)
    if "w" in perms and not array.flags.writeable:
        raise ValueError("array is read-only; wrap it with perms='r'")
    _, code, _ = _dtype_code(array.dtype)
    name = name or _auto_name("arr")
    pins, guard = _host_pins(array)
    ptr = ffi.cast("void *", array.ctypes.data)
    obj = lib.gc_wrap_pinned(ptr, array.nbytes, code, bits, abi.c_name(name))
    cap = Capability(obj, array.shape, array.dtype, perms, name)
    cap._guard = guard
    # the pins live exactly as long as the array reference: until the collector
    # releases the object, after every handle, table and running kernel
    _heap.keep_external(cap.id, (keep, pins))
    return cap


#: DLPack device types (dlpack.h DLDeviceType) whose memory is a CUDA device's.
_DL_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


def _dlpack_on_gpu(obj: Any) -> Any:
    """A CUDA torch tensor sharing ``obj``'s memory if ``obj`` is a DLPack producer on a
    CUDA device; None for host memory.  TypeError for other devices or without torch."""
    try:
        dev_type = int(obj.__dlpack_device__()[0])
    except (AttributeError, TypeError, ValueError, IndexError):
        dev_type = 1  # no __dlpack_device__: np.from_dlpack decides
    if dev_type in (1, 3):  # kDLCPU, kDLCUDAHost
        return None
    if dev_type not in _DL_CUDA:
        raise TypeError(f"capabilities.wrap takes host or CUDA memory; this DLPack object is "
                        f"on device type {dev_type}")
    try:
        import torch
    except ImportError:
        raise TypeError("wrapping CUDA memory from DLPack goes through torch, which is not "
                        "installed") from None
    return torch.from_dlpack(obj)


def _host_pins(array: np.ndarray) -> tuple[list[Any], Any]:
    """What keeps ``array``'s data allocated while it is wrapped, and a launch-time
    check where nothing can (None when the pins suffice).

    numpy frees an array's data in ``resize`` (and ``__setstate__``) of the array
    that owns it; ``resize`` refuses, even with ``refcheck=False``, while the
    owner has a weak reference (numpy/_core/src/multiarray/shape.c: PyArray_Resize
    checks ``weakreflist``), so each wrap holds one on the owner, found through
    ``.base`` (a view's owner is the array to pin).  A torch tensor at the end of
    the chain (``t.numpy()``) gets its storage pinned (:func:`_pin_torch`).
    """
    obj: Any = array
    while isinstance(obj, np.ndarray):
        if obj.flags.owndata:
            return [weakref.ref(obj)], None
        obj = obj.base
    if obj is not None and type(obj).__module__.startswith("torch"):
        return _pin_torch(obj)
    # a buffer exporter (bytes, bytearray, mmap, ...): numpy holds its buffer
    return [], None


#: Pins a CPU tensor's memory block (compiled against the installed torch's
#: headers, c10/core/StorageImpl.h).  A StorageImpl owns its block through a
#: DataPtr and frees it when the storage grows (resize_), is resized
#: (untyped_storage().resize_), moves to shared memory (share_memory_, whatever
#: ``resizable`` says) or dies.  The pin swaps in a DataPtr to the same memory
#: whose deleter only drops a reference; the original DataPtr (and so the
#: block) goes when both torch and every capqr pin have let go.  It also marks
#: the storage non-resizable, as torch's own Tensor.numpy() does, so that
#: growing the tensor raises instead of moving it away from the capability.
_TORCH_PIN_SRC = r"""
#include <c10/core/StorageImpl.h>
#include <atomic>

namespace {
struct Hold {
    c10::DataPtr orig;
    std::atomic<long> refs;
};
void drop(void *ctx)
{
    Hold *h = static_cast<Hold *>(ctx);
    if (h->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete h;
}
}  // namespace

extern "C" void *capqr_storage_pin(void *impl_)
{
    auto *impl = static_cast<c10::StorageImpl *>(impl_);
    /* mutable_data_ptr() materialises a copy-on-write storage first */
    c10::DataPtr &cur = const_cast<c10::DataPtr &>(impl->mutable_data_ptr());
    Hold *h;
    if (cur.get_deleter() == &drop) {           /* pinned already: one more reference */
        h = static_cast<Hold *>(cur.get_context());
        h->refs.fetch_add(1, std::memory_order_relaxed);
    } else {
        void *data = cur.get();
        c10::Device dev = cur.device();
        h = new Hold{c10::DataPtr(), {2}};      /* the storage's reference and ours */
        h->orig = impl->set_data_ptr(c10::DataPtr(data, h, &drop, dev));
    }
    impl->set_resizable(false);
    return h;
}

extern "C" void capqr_storage_unpin(void *h) { drop(h); }

extern "C" void capqr_storage_freeze(void *impl_)
{
    static_cast<c10::StorageImpl *>(impl_)->set_resizable(false);
}
"""

_torch_pin_lib: Any = None
_torch_pin_error: str | None = None
_torch_pin_lock = threading.Lock()


def _load_torch_pin() -> Any:
    """The compiled pin (cached like the kernels, by a hash of its inputs), or None
    with ``_torch_pin_error`` saying why (no C++ compiler, no torch headers)."""
    global _torch_pin_lib, _torch_pin_error
    if _torch_pin_lib is not None or _torch_pin_error is not None:
        return _torch_pin_lib
    with _torch_pin_lock:
        if _torch_pin_lib is not None or _torch_pin_error is not None:
            return _torch_pin_lib
        import torch

        from ..runtime import build

        tdir = Path(torch.__file__).resolve().parent
        cxx = os.environ.get("CXX", "g++")
        abi_flag = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"
        key = build.content_hash(_TORCH_PIN_SRC, torch.__version__, str(tdir), cxx, abi_flag,
                                 sys.platform)
        target = build.cache_dir() / f"capqr_torchpin_{key[:20]}.so"
        try:
            if not target.exists():
                with tempfile.TemporaryDirectory(dir=build.cache_dir()) as tmp:
                    src = Path(tmp) / "pin.cpp"
                    src.write_text(_TORCH_PIN_SRC)
                    out = Path(tmp) / "pin.so"
                    r = subprocess.run(
                        [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", abi_flag,
                         f"-I{tdir / 'include'}", str(src), f"-L{tdir / 'lib'}", "-lc10",
                         f"-Wl,-rpath,{tdir / 'lib'}", "-o", str(out)],
                        capture_output=True, text=True, timeout=300)
                    if r.returncode != 0:
                        raise OSError(r.stderr.strip()[-500:] or f"{cxx} failed")
                    os.replace(out, target)
            lib_ = ctypes.CDLL(str(target))
            lib_.capqr_storage_pin.restype = ctypes.c_void_p
            lib_.capqr_storage_pin.argtypes = [ctypes.c_void_p]
            lib_.capqr_storage_unpin.restype = None
            lib_.capqr_storage_unpin.argtypes = [ctypes.c_void_p]
            lib_.capqr_storage_freeze.restype = None
            lib_.capqr_storage_freeze.argtypes = [ctypes.c_void_p]
            _torch_pin_lib = lib_
        except (OSError, subprocess.SubprocessError) as e:
            _torch_pin_error = str(e)
        return _torch_pin_lib


class _TorchPin:
    """One reference on a pinned torch memory block; dropping it unpins."""

    __slots__ = ("_lib", "_h")

    def __init__(self, lib_: Any, storage: Any):
        self._lib = lib_
        self._h = lib_.capqr_storage_pin(storage._cdata)

    def __del__(self) -> None:
        h, self._h = self._h, None
        if h:
            self._lib.capqr_storage_unpin(h)


def _pin_torch(t: Any) -> tuple[list[Any], Any]:
    """Pin the block of CPU tensor ``t``'s storage (see ``_TORCH_PIN_SRC``).

    Without a C++ compiler the pin cannot be built: then the storage is kept
    referenced (``set_`` cannot free it; ``Tensor.numpy()`` already made it
    non-resizable) and every use of the capability checks that the storage
    still has its block (``share_memory_`` swaps it), faulting "freed" if not.
    """
    storage = t.untyped_storage()
    lib_ = _load_torch_pin()
    if lib_ is not None and storage.is_shared():
        # Already in shared memory: share_memory_ leaves it alone, and swapping
        # its DataPtr would hide the mapping from torch.multiprocessing (which
        # would then copy it into a new segment, unsharing the tensor).  Kept
        # referenced and non-resizable, nothing in torch frees its block.
        lib_.capqr_storage_freeze(storage._cdata)
        return [storage], None
    if lib_ is not None:
        return [_TorchPin(lib_, storage)], None
    ptr, nbytes = storage.data_ptr(), storage.nbytes()

    def guard(name: str, access: str) -> None:
        if storage.data_ptr() != ptr or storage.nbytes() < nbytes:
            raise _fault("freed", buffer=name, access=access,
                                  detail="the wrapped tensor's storage released its memory "
                                         f"(share_memory_ or resize_); {_torch_pin_error}")

    return [storage], guard


def from_int(address: int) -> NoBoundsCap:
    """Turn an integer back into a capability: it has no bounds."""
    return NoBoundsCap(int(address))
