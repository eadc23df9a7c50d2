"""cffi ABI-mode bindings to the CUDA driver API (``libcuda.so.1``).

ABI mode (``ffi.dlopen``) needs no C compiler and no CUDA headers at install
time, so importing capqr on a machine without a GPU costs nothing: the library
is opened lazily by :func:`lib` and a missing driver surfaces as
:class:`CudaUnavailable`, which the GPU tests turn into a skip.

Only the entry points the GPU lane uses are declared.  The ``_v2`` names are
the ones ``cuda.h`` maps the plain names to since CUDA 4.0 (64-bit device
pointers); calling the unversioned symbols would get the 32-bit ABI.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..errors import CapqrError, DeviceStuck

try:  # cffi is a hard dependency of capqr, but keep "import" working without it
    import cffi
except ImportError:  # pragma: no cover - exercised only on broken installs
    cffi = None

CDEF = """
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n);
typedef int CUjit_option;
CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n,
                            CUjit_option *options, void **values);
CUresult cuModuleUnload(CUmodule mod);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule mod, const char *name);
CUresult cuFuncGetAttribute(int *pi, int attrib, CUfunction f);
CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz,
                        unsigned int shared, CUstream s, void **params, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                   unsigned int gz, unsigned int bx, unsigned int by,
                                   unsigned int bz, unsigned int shared, CUstream s,
                                   void **params);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f, int block,
                                                     size_t shared);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority);
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest);
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags);
CUresult cuStreamQuery(CUstream s);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuEventDestroy_v2(CUevent e);
CUresult cuGetErrorName(CUresult err, const char **s);
CUresult cuGetErrorString(CUresult err, const char **s);
typedef void *CUgraph;
typedef void *CUgraphNode;
typedef void *CUgraphExec;
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef union { char pad[64]; int cooperative; } CUlaunchAttributeValue;
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                 size_t ndeps, const CUDA_KERNEL_NODE_PARAMS_v2 *params);
CUresult cuGraphKernelNodeSetAttribute(CUgraphNode node, int attr,
                                       const CUlaunchAttributeValue *value);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream s);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
"""

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2
CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1  # static __shared__ bytes
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2  # a graph kernel node that runs as cuLaunchCooperativeKernel
CU_JIT_INFO_LOG_BUFFER = 3
CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
#: bytes of each log cuModuleLoadDataEx may write
JIT_LOG_BYTES = 1 << 14


class CudaUnavailable(CapqrError):
    """No usable CUDA driver or device on this machine (the GPU tests skip on this)."""


class CudaError(CapqrError):
    """A CUDA driver call failed; ``code`` is the CUresult, ``name`` its enum name."""

    def __init__(self, call: str, code: int, name: str, text: str):
        self.call = call
        self.code = code
        self.name = name
        super().__init__(f"{call} failed: {name} ({code}): {text}")


class ModuleLoadError(CudaError):
    """cuModuleLoadDataEx refused an image; ``log`` is what the loader (and the JIT,
    for PTX) wrote to its error log, "" when it wrote nothing."""

    def __init__(self, code: int, name: str, text: str, log: str):
        self.log = log
        super().__init__("cuModuleLoadDataEx", code, name, text)


_lock = threading.RLock()
_state: dict = {}
#: contexts this process destroyed (reset_context): a module, buffer, stream or event
#: made under an earlier count belongs to a context that no longer exists
_epoch = [0]


def context_epoch() -> int:
    """How many times :func:`reset_context` destroyed the device's context in this process."""
    return _epoch[0]


def ffi() -> cffi.FFI:
    """The cffi FFI holding the driver declarations (created once)."""
    with _lock:
        if "ffi" not in _state:
            if cffi is None:
                raise CudaUnavailable("cffi is not installed")
            f = cffi.FFI()
            f.cdef(CDEF)
            _state["ffi"] = f
        return _state["ffi"]


def isolated() -> bool:
    """Whether the lane runs the driver in a device process (runtime/cuda/remote.py):
    :func:`isolate`, else ``CAPQR_CUDA_ISOLATE`` (1/true/yes)."""
    on = _state.get("isolate")
    if on is None:
        on = os.environ.get("CAPQR_CUDA_ISOLATE", "").lower() in ("1", "true", "yes")
    return bool(on)


def isolate(on: bool = True) -> None:
    """Run the GPU lane's driver calls in a device process that the lane restarts to end
    a kernel which ignores its cancel (runtime/cuda/remote.py).  Call before the first
    GPU call; RuntimeError once the driver is open in the other mode."""
    with _lock:
        if "lib" in _state and isolated() != on:
            raise RuntimeError("the CUDA driver is already open "
                               f"{'in a device process' if isolated() else 'in this process'}")
        _state["isolate"] = on


def open_libcuda() -> Any:
    """dlopen libcuda (``$CAPQR_LIBCUDA`` first) and cuInit it; raises CudaUnavailable.

    ``CAPQR_LIBCUDA_PY=module:factory`` puts a Python stand-in with libcuda's entry
    points and calling convention in its place (tests/fake_libcuda.py: the GPU-less
    tests of the isolated lane run it in the device process)."""
    spec = os.environ.get("CAPQR_LIBCUDA_PY")
    if spec:
        import importlib

        module, _, factory = spec.partition(":")
        L = getattr(importlib.import_module(module), factory)()
        _init(L)
        return L
    names = [os.environ["CAPQR_LIBCUDA"]] if os.environ.get("CAPQR_LIBCUDA") else []
    names += ["libcuda.so.1", "libcuda.so"]
    last = None
    for n in names:
        try:
            L = ffi().dlopen(n)
            break
        except OSError as e:
            last = e
    else:
        raise CudaUnavailable(f"cannot load libcuda ({last})")
    _init(L)
    return L


def _init(L: Any) -> None:
    rc = L.cuInit(0)
    if rc != CUDA_SUCCESS:
        # A driver library without a device (or a container without the
        # device nodes) fails here with CUDA_ERROR_NO_DEVICE (100) or similar.
        raise CudaUnavailable(f"cuInit failed with CUresult {rc} (no usable GPU?)")


def lib():
    """The driver: libcuda opened in this process, or its stand-in serving the calls from
    a device process (:func:`isolated`); raises CudaUnavailable when there is none."""
    with _lock:
        if "lib" in _state:
            if _dead[0]:
                _replace_dead_process()
            return _state["lib"]
        if "err" in _state:
            raise CudaUnavailable(_state["err"])
        try:
            _state["lib"] = _open_remote() if isolated() else open_libcuda()
        except CudaUnavailable as e:
            _state["err"] = str(e)
            raise
        return _state["lib"]


#: RemoteLib, once the isolated lane opened one (kept here so that telling the two
#: kinds of driver apart on the launch path costs no import)
_remote_lib_type: list[type] = []


def _is_remote(L: Any) -> bool:
    return bool(_remote_lib_type) and isinstance(L, _remote_lib_type[0])


def _open_remote() -> Any:
    from .remote import RemoteLib

    if not _remote_lib_type:
        _remote_lib_type.append(RemoteLib)
    L = RemoteLib()
    try:
        _init(L)
    except BaseException:
        L.close()
        raise
    return L


#: set when the isolated lane's device process is gone or its context failed for good:
#: the next :func:`lib` starts another (the call that found it raised CudaError)
_dead = [False]
#: what else goes with a lost device process (sequence.py: its pending launches)
_on_replace: list[Any] = []
#: CUresults after which a context fails every later call (the CUDA docs: the process
#: must end): ILLEGAL_ADDRESS, ASSERT, HARDWARE_STACK_ERROR, ILLEGAL_INSTRUCTION,
#: MISALIGNED_ADDRESS, INVALID_ADDRESS_SPACE, INVALID_PC, LAUNCH_FAILED
STICKY = frozenset({700, 710, 714, 715, 716, 717, 718, 719})
#: what the isolated lane does after such an error, for its message
REPLACED = ("the lane's device process is replaced at the next GPU call: every device "
            "buffer allocated before is lost")


def device_process_lost() -> None:
    """The isolated lane's device process died or its context failed for good: the next
    :func:`lib` replaces it (remote.py calls this when the process is gone)."""
    _dead[0] = True


def _replace_dead_process() -> None:
    _dead[0] = False
    _fresh_device_process(_state.get("device"))
    for hook in _on_replace:
        hook()


def replace_lost_process() -> None:
    """Replace the isolated lane's device process now if it was found lost (a no-op
    otherwise): what asks whether a handle is of the current context calls this first,
    so no handle of the lost process passes as current."""
    if _dead[0]:
        lib()


def on_device_process_replaced(hook: Any) -> None:
    """Call ``hook()`` whenever a lost device process was replaced (:func:`lib`)."""
    _on_replace.append(hook)


def error_text(code: int) -> tuple[str, str]:
    """(enum name, description) of a CUresult."""
    f = ffi()
    L = _state.get("lib")
    if L is None:
        return (f"CUresult {code}", "")
    p = f.new("const char **")
    name = f.string(p[0]).decode() if L.cuGetErrorName(code, p) == 0 and p[0] else str(code)
    text = f.string(p[0]).decode() if L.cuGetErrorString(code, p) == 0 and p[0] else ""
    return name, text


def check(rc: int, call: str) -> None:
    """Raise CudaError unless ``rc`` is CUDA_SUCCESS."""
    if rc != CUDA_SUCCESS:
        name, text = error_text(rc)
        if rc in STICKY and isolated():
            device_process_lost()
            text = f"{text}; {REPLACED}" if text else REPLACED
        raise CudaError(call, rc, name, text)


class Device:
    """The one GPU capqr uses (ordinal from ``CAPQR_CUDA_DEVICE``, default 0).

    Uses the device's *primary* context, the one the CUDA runtime (and so
    PyTorch) uses: device pointers from ``torch`` tensors are valid in it,
    which is what makes :func:`runtime.cuda.wrap_device` sound.
    """

    def __init__(self, ordinal: int = 0):
        L = lib()
        f = ffi()
        n = f.new("int *")
        check(L.cuDeviceGetCount(n), "cuDeviceGetCount")
        if n[0] <= ordinal:
            raise CudaUnavailable(f"no CUDA device {ordinal} (found {n[0]})")
        d = f.new("CUdevice *")
        check(L.cuDeviceGet(d, ordinal), "cuDeviceGet")
        self.handle = d[0]
        self.ordinal = ordinal
        open_context(self)
        buf = f.new("char[256]")
        check(L.cuDeviceGetName(buf, 256, self.handle), "cuDeviceGetName")
        self.name = f.string(buf).decode()
        self.cc = (self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                   self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.sm_count = self.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.max_threads = self.attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        self.max_smem_optin = self.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        v = f.new("int *")
        check(L.cuDriverGetVersion(v), "cuDriverGetVersion")
        self.driver_version = v[0]

    def make_current(self) -> None:
        """Bind the primary context to the calling thread (contexts are per thread)."""
        f = ffi()
        cur = f.new("CUcontext *")
        L = lib()
        if L.cuCtxGetCurrent(cur) != 0 or cur[0] != self.ctx:
            check(L.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def attribute(self, attr: int) -> int:
        """cuDeviceGetAttribute."""
        f = ffi()
        v = f.new("int *")
        check(lib().cuDeviceGetAttribute(v, attr, self.handle), "cuDeviceGetAttribute")
        return v[0]

    @property
    def arch(self) -> str:
        """``sm_XY`` of this device."""
        return f"sm_{self.cc[0]}{self.cc[1]}"


def open_context(d: Any) -> None:
    """Retain the primary context of device ``d``, make it current on this thread, and make
    what the lane keeps in it: a non-blocking side stream (timeouts write the cancel flag
    through it while the launch stream is still busy) and no sequence record yet (the
    lane allocates it on first use)."""
    L, f = lib(), ffi()
    c = f.new("CUcontext *")
    check(L.cuDevicePrimaryCtxRetain(c, d.handle), "cuDevicePrimaryCtxRetain")
    d.ctx = c[0]
    # unconditionally: after a reset the thread's current context keeps the old handle,
    # which the new context may reuse
    check(L.cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent")
    s = f.new("CUstream *")
    check(L.cuStreamCreate(s, CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    d.side_stream = s[0]
    d.seq_record = 0
    d.lane_stream = None  # lane 1 of launch_many (lane_stream), made on first use
    d.lane_events = []    # free events for the lanes' waits (lane_record)


def can_reset() -> bool:
    """Whether :func:`reset_context` can end a kernel that ignores its cancel: only by
    ending the process that owns the context, the isolated lane's device process
    (bench/results/gpu-hang-probe-2026-12-06-h100-c0bfd1d.jsonl: cuDevicePrimaryCtxReset
    and cuCtxDestroy wait for the kernel forever)."""
    return isolated()


def reset_context() -> None:
    """End the device process (every kernel of its context with it) and open a fresh
    context in a new one: the isolated lane only (:func:`can_reset`).

    Everything in the old context goes: a kernel that never stops, every allocation,
    module, stream and event.  :func:`context_epoch` counts up, so what the lane made
    before can tell it is gone: buffers refuse every use (runtime/cuda/memory.py),
    kernels load their module again on their next launch (runtime/cuda/kernel.py),
    nothing frees or destroys an old handle."""
    with _lock:
        if not can_reset():
            raise RuntimeError("the direct lane cannot reset a context while a kernel runs")
        _fresh_device_process(device())


def _fresh_device_process(d: Device | None) -> None:
    """A new device process with ``d``'s context open in it (none yet without ``d``);
    what the lane made in the old one counts as gone (:func:`context_epoch`)."""
    restart_device_process()
    _epoch[0] += 1
    if d is not None:
        open_context(d)


def restart_device_process() -> None:
    """Kill the isolated lane's device process (with every kernel of its context) and
    start another, initialised (runtime/cuda/remote.py)."""
    _state.pop("lib").close()
    _state["lib"] = _open_remote()


def mark_stuck(kernel: str) -> None:
    """The direct lane's launch stream holds ``kernel``, which ignored its cancel: every
    later :func:`device` raises DeviceStuck until the stream drains (a driver call
    behind the kernel would block the host forever)."""
    _state["stuck"] = kernel


def stuck() -> str | None:
    """The kernel that ignored its cancel and still holds the direct lane's launch
    stream, or None (cleared once the stream drained)."""
    kernel = _state.get("stuck")
    if kernel is not None:
        rc = lib().cuStreamQuery(ffi().NULL)
        if rc == CUDA_ERROR_NOT_READY:
            return kernel
        _state.pop("stuck", None)
        check(rc, "cuStreamQuery")
    return None


def _check_stuck() -> None:
    kernel = stuck()
    if kernel is not None:
        raise DeviceStuck(kernel)


def launch_kernel(function: Any, grid: int, block: int, shared: int, params: Any,
                  cooperative: bool = False, stream: Any = None) -> None:
    """cuLaunchKernel (cuLaunchCooperativeKernel: every block resident at once) of
    ``function`` with the parameter block ``params`` (runtime/cuda/params.py
    ParamBlock) on ``stream`` (None: the launch stream; the isolated lane has that
    one only)."""
    L, f = lib(), ffi()
    s = f.NULL if stream is None else stream
    if _is_remote(L):
        check(L.launch(function, grid, block, shared, None, bytes(params.buf), params.offsets,
                       cooperative), "cuLaunchCooperativeKernel" if cooperative else
              "cuLaunchKernel")
    elif cooperative:
        check(L.cuLaunchCooperativeKernel(function, grid, 1, 1, block, 1, 1, shared, s,
                                          params.params), "cuLaunchCooperativeKernel")
    else:
        check(L.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared, s,
                               params.params, f.NULL), "cuLaunchKernel")


def lane_stream(d: Any) -> Any:
    """Lane 1 of ``launch_many(..., lanes=)``: a non-blocking stream of the highest
    priority, so its blocks go first when an SM frees up (made on first use, per
    context).  Not on the isolated lane, where every launch takes the launch stream."""
    if d.lane_stream is None:
        L, f = lib(), ffi()
        least, greatest = f.new("int *"), f.new("int *")
        check(L.cuCtxGetStreamPriorityRange(least, greatest), "cuCtxGetStreamPriorityRange")
        s = f.new("CUstream *")
        check(L.cuStreamCreateWithPriority(s, CU_STREAM_NON_BLOCKING, greatest[0]),
              "cuStreamCreateWithPriority")
        d.lane_stream = s[0]
    return d.lane_stream


def lane_record(d: Any, stream: Any) -> Any:
    """An event recorded on ``stream`` (None: the launch stream) now, from ``d``'s pool:
    :func:`lane_wait` makes another stream wait for it; give it back with
    ``d.lane_events.append(e)`` once every wait on it is enqueued (a wait takes the
    record as it is when the wait is enqueued, so recording the event again later does
    not move it)."""
    L, f = lib(), ffi()
    if d.lane_events:
        e = d.lane_events.pop()
    else:
        p = f.new("CUevent *")
        check(L.cuEventCreate(p, CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        e = p[0]
    check(L.cuEventRecord(e, f.NULL if stream is None else stream), "cuEventRecord")
    return e


def lane_wait(stream: Any, event: Any) -> None:
    """Make ``stream`` (None: the launch stream) wait for ``event``'s record."""
    f = ffi()
    check(lib().cuStreamWaitEvent(f.NULL if stream is None else stream, event, 0),
          "cuStreamWaitEvent")


def module_load_with(L: Any, image: bytes) -> tuple[int, int, str, str]:
    """cuModuleLoadDataEx of ``image`` through ``L``: (CUresult, module handle, the
    loader's error log, its info log)."""
    f = ffi()
    err, info = f.new("char[]", JIT_LOG_BYTES), f.new("char[]", JIT_LOG_BYTES)
    keys = f.new("CUjit_option[]", [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                                    CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES])
    size = f.cast("void *", JIT_LOG_BYTES)  # a size option's value travels as the pointer
    values = f.new("void *[]", [err, size, info, size])
    mod = f.new("CUmodule *")
    rc = int(L.cuModuleLoadDataEx(mod, image, 4, keys, values))
    handle = int(f.cast("uintptr_t", mod[0])) if rc == CUDA_SUCCESS else 0
    return (rc, handle, f.string(err).decode(errors="replace"),
            f.string(info).decode(errors="replace"))


def load_module(image: bytes) -> Any:
    """cuModuleLoadDataEx of a cubin (or PTX) ``image`` in the current context, with the
    loader's error log: a refusal raises :class:`ModuleLoadError` carrying it."""
    L = lib()
    rc, handle, err, _info = (L.load(image) if _is_remote(L)
                              else module_load_with(L, image))
    if rc != CUDA_SUCCESS:
        name, text = error_text(rc)
        raise ModuleLoadError(rc, name, text, err)
    return ffi().cast("CUmodule", handle)


def device() -> Device:
    """The process-wide Device (created on first use; raises CudaUnavailable)."""
    with _lock:
        d = _state.get("device")
        if d is None:
            d = Device(int(os.environ.get("CAPQR_CUDA_DEVICE", "0")))
            _state["device"] = d
        d.make_current()
        _check_stuck()
        return d


def available() -> tuple[bool, str]:
    """(True, device name) when a GPU can be used, else (False, why not)."""
    try:
        d = device()
    except CudaUnavailable as e:
        return False, str(e)
    except CudaError as e:
        return False, str(e)
    return True, d.name


class Event:
    """A CUDA event for timing (cuEventElapsedTime has ~0.5 us resolution)."""

    def __init__(self) -> None:
        f = ffi()
        device()
        e = f.new("CUevent *")
        check(lib().cuEventCreate(e, 0), "cuEventCreate")
        self.handle = e[0]
        self.epoch = context_epoch()

    def record(self, stream=None) -> None:
        """Record on ``stream`` (default: the legacy default stream)."""
        check(lib().cuEventRecord(self.handle, stream or ffi().NULL), "cuEventRecord")

    def synchronize(self) -> None:
        """Wait until the event has completed."""
        check(lib().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (both must have completed)."""
        f = ffi()
        ms = f.new("float *")
        check(lib().cuEventElapsedTime(ms, self.handle, end.handle), "cuEventElapsedTime")
        return float(ms[0])

    def __del__(self) -> None:
        L = _state.get("lib")
        if L is not None and getattr(self, "handle", None) is not None:
            if self.epoch == context_epoch():  # else it died with its context
                L.cuEventDestroy_v2(self.handle)
            self.handle = None
