"""The isolated GPU lane: the CUDA driver in a child process the lane can restart.

Why: a kernel that never stops (a barrier or shuffle some threads never reach, a raw
kernel without pollchecks) cannot be ended inside the process that launched it.  On an
H100 (driver 580, bench/results/gpu-hang-probe-2026-12-06-h100-c0bfd1d.jsonl)
cuDevicePrimaryCtxReset and cuCtxDestroy wait for the kernel forever; a ``trap`` kernel
on a second stream ends it only when a block slot is free, and leaves the process's CUDA
state poisoned (every later call fails with CUDA_ERROR_LAUNCH_FAILED); killing the
process that owns the context ends it in about a second and the device is usable again.

So with ``CAPQR_CUDA_ISOLATE=1`` (or :func:`runtime.cuda.isolate` before the first GPU
call) :func:`driver.lib` is a :class:`RemoteLib`: every driver call is shipped to a
device process (``python -m capqr.runtime.cuda.remote``) that owns the context, and
:func:`driver.reset_context` kills it and starts another.  What the lane built in the
old context is then refused as after any reset (memory.py: buffers "lost"; kernel.py:
modules load again).

How a call travels: the client marshals each argument by its declared C type in
driver.CDEF (the one list of entry points): values and handles as integers, ``const
void *`` with its ``size_t`` as bytes in, ``void *`` with its size as bytes out, ``T *``
as one ``T`` out, ``const char **`` as a string out.  Launches (their parameter block)
and module loads (their logs) have their own messages.  Frames are length-prefixed
pickles on the child's stdin and a duplicate of its stdout (its fd 1 goes to stderr,
so nothing the driver prints can corrupt the stream).
"""

from __future__ import annotations

import atexit
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from . import driver as drv

#: driver types passed as opaque handles (typedef void * in driver.CDEF)
HANDLE_TYPES = frozenset({"CUcontext", "CUmodule", "CUfunction", "CUstream", "CUevent"})
#: entry points with a message of their own (their arguments are not self-describing)
SPECIAL = frozenset({"cuLaunchKernel", "cuLaunchCooperativeKernel", "cuModuleLoadDataEx"})
#: the CUresult a call answers when the device process is gone (CUDA_ERROR_UNKNOWN)
CUDA_ERROR_UNKNOWN = 999
#: seconds the reply of an interrupted request may take before the process counts as lost
OWED_WAIT = 10.0
_FRAME = struct.Struct("<Q")


# ---------------------------------------------------------------------------
# signatures, from driver.CDEF
# ---------------------------------------------------------------------------
def _param(text: str) -> tuple[str, int, bool]:
    """(base type, pointer depth, const) of one declared parameter."""
    const = text.startswith("const ")
    body = text[6:] if const else text
    stars = body.count("*")
    base = body.replace("*", " ").split()[0]
    return base, stars, const


def _plans() -> dict[str, list[tuple[Any, ...]]]:
    """Per entry point, how each argument travels (see the module docstring)."""
    plans: dict[str, list[tuple[Any, ...]]] = {}
    for name, args in re.findall(r"CUresult\s+(\w+)\(([^;]*)\);", drv.CDEF):
        params = [_param(" ".join(a.split())) for a in args.split(",") if a.strip() != "void"]
        plan: list[tuple[Any, ...]] = []
        for i, (base, stars, const) in enumerate(params):
            size = next((j for j in range(i + 1, len(params))
                         if params[j][1] == 0 and params[j][0] in ("size_t", "int")), None)
            if stars == 0:
                plan.append(("h",) if base in HANDLE_TYPES else ("v",))
            elif stars == 1 and base in ("void", "char") and not const:
                plan.append(("outbuf", size))
            elif stars == 1 and base == "void":
                plan.append(("in", size))
            elif stars == 1 and base == "char":
                plan.append(("cstr",))
            elif stars == 2 and base == "char" and const:
                plan.append(("outstr",))
            elif stars == 1:
                plan.append(("out", base))
            else:
                plan.append(("special",))
        plans[name] = plan
    return plans


PLANS = _plans()


def _addr(x: Any) -> int:
    """An integer for a handle or pointer-sized value (cffi pointer, int or None)."""
    if x is None:
        return 0
    if isinstance(x, int):
        return x
    return int(drv.ffi().cast("uintptr_t", x))


# ---------------------------------------------------------------------------
# the client
# ---------------------------------------------------------------------------
class DeviceProcess:
    """One device process and its pipes; requests are answered in order.

    A request interrupted while its reply is awaited (Ctrl-C) leaves that reply owed:
    the next request reads and drops it first, waiting at most OWED_WAIT seconds; a
    process that does not answer by then (it is blocked behind a kernel that does not
    stop) is killed and counts as lost, so an interrupt never leaves the lane waiting
    forever."""

    def __init__(self) -> None:
        env = dict(os.environ, CAPQR_CUDA_ISOLATE="0", PYTHONUNBUFFERED="1")
        # The package may be imported from a checkout that is not installed: the child
        # finds capqr where this process found it.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", f"{__package__}.remote"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     bufsize=0)
        self.lock = threading.Lock()
        self.owed = 0  # replies of requests interrupted while waiting (read and dropped)
        self.inbox = bytearray()  # reply bytes read but not yet a whole frame

    def request(self, msg: tuple[Any, ...]) -> Any:
        with self.lock:
            while self.owed:
                try:
                    self._read(OWED_WAIT)
                except TimeoutError:
                    self.kill()
                    return self._gone(f"it did not answer within {OWED_WAIT:g} s of an "
                                      "interrupted call")
                self.owed -= 1
            data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
            frame = memoryview(_FRAME.pack(len(data)) + data)
            try:
                while frame:
                    frame = frame[os.write(self.proc.stdin.fileno(), frame):]
            except OSError:
                return self._gone("it exited" if self.proc.poll() is not None
                                  else "its pipe closed")
            except BaseException:  # a frame cut in two cannot be answered: start afresh
                self.kill()
                drv.device_process_lost()
                raise
            try:
                reply = self._read(None)
            except BaseException:  # Ctrl-C while the device process works: stay in step
                self.owed += 1
                raise
        if reply is None:
            return self._gone("it exited")
        if reply[0] == "unavailable":
            raise drv.CudaUnavailable(f"the device process: {reply[1]}")
        if reply[0] == "err":
            raise drv.CudaError(msg[1] if msg[0] == "call" else msg[0], CUDA_ERROR_UNKNOWN,
                                "CAPQR_DEVICE_PROCESS", reply[1])
        return reply[1]

    def _read(self, wait: float | None) -> Any:
        """The next reply (None: the process closed its end); TimeoutError when none is
        whole within ``wait`` seconds (None: no limit).  Bytes read stay in ``inbox``
        whatever interrupts, so a later read goes on from them."""
        fd = self.proc.stdout.fileno()
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            if len(self.inbox) >= _FRAME.size:
                (n,) = _FRAME.unpack_from(self.inbox)
                if len(self.inbox) >= _FRAME.size + n:
                    body = bytes(self.inbox[_FRAME.size:_FRAME.size + n])
                    del self.inbox[:_FRAME.size + n]
                    return pickle.loads(body)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self.inbox += chunk

    def _gone(self, why: str) -> Any:
        code = self.proc.poll()
        drv.device_process_lost()
        raise drv.CudaError("device process", CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN",
                            f"the device process is lost: {why} (status {code}); "
                            f"{drv.REPLACED}")

    def kill(self) -> None:
        """End the process and every kernel of its context (the only way to end a kernel
        that ignores its cancel)."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class RemoteLib:
    """The driver's entry points, served by a device process (same signatures as the
    cffi library of driver.lib, so the lane's modules call either alike)."""

    def __init__(self) -> None:
        self.process = DeviceProcess()
        self._strings: deque[Any] = deque(maxlen=64)  # char arrays of const char ** results
        _OPEN.add(self)

    def __getattr__(self, name: str) -> Callable[..., int]:
        plan = PLANS.get(name)
        if plan is None:
            raise AttributeError(f"the CUDA driver entry point {name} is not declared")
        if name in SPECIAL:
            raise AttributeError(f"{name} goes through driver.launch_kernel / load_module")

        def call(*args: Any) -> int:
            return self._call(name, plan, args)

        call.__name__ = name
        setattr(self, name, call)
        return call

    def _call(self, name: str, plan: list[tuple[Any, ...]], args: tuple[Any, ...]) -> int:
        f = drv.ffi()
        wire: list[Any] = []
        for how, x in zip(plan, args, strict=True):
            kind = how[0]
            if kind == "h":
                wire.append(_addr(x))
            elif kind == "v":
                wire.append(x if isinstance(x, (int, float)) else int(x))
            elif kind == "in":
                n = int(args[how[1]])
                wire.append(bytes(x[:n]) if isinstance(x, (bytes, bytearray)) else
                            f.buffer(f.cast("char *", x), n)[:])
            elif kind == "outbuf":
                wire.append(int(args[how[1]]))
            elif kind == "cstr":
                wire.append(x if isinstance(x, bytes) else f.string(x))
            else:
                wire.append(None)
        rc, outs = self.process.request(("call", name, wire))
        for how, x, out in zip(plan, args, outs, strict=True):
            if out is None:
                continue
            if how[0] == "outbuf":
                f.memmove(x, out, len(out))
            elif how[0] == "outstr":
                self._strings.append(f.new("char[]", out))  # the recent ones stay valid
                x[0] = self._strings[-1]
            elif how[0] == "out":
                x[0] = f.cast(how[1], out) if how[1] in HANDLE_TYPES else out
        return rc

    def launch(self, function: Any, grid: int, block: int, shared: int, stream: Any,
               blob: bytes, offsets: list[int], cooperative: bool) -> int:
        """cuLaunchKernel (cuLaunchCooperativeKernel) with the parameters of ``blob`` at
        ``offsets`` (runtime/cuda/params.py ParamBlock)."""
        return self.process.request(("launch", _addr(function), grid, block, shared,
                                     _addr(stream), blob, offsets, cooperative))

    def load(self, image: bytes) -> tuple[int, int, str, str]:
        """cuModuleLoadDataEx: (CUresult, module handle, error log, info log)."""
        return self.process.request(("load", image))

    def close(self) -> None:
        self.process.kill()
        _OPEN.discard(self)


#: the device processes this process started and has not closed (killed at its exit)
_OPEN: weakref.WeakSet[RemoteLib] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for L in list(_OPEN):
        L.close()


# ---------------------------------------------------------------------------
# the device process
# ---------------------------------------------------------------------------
def _serve_call(L: Any, name: str, wire: list[Any]) -> tuple[int, list[Any]]:
    f = drv.ffi()
    plan = PLANS[name]
    cargs: list[Any] = []
    keep: list[Any] = []
    for how, x in zip(plan, wire, strict=True):
        kind = how[0]
        if kind == "v":
            cargs.append(x)
        elif kind == "h":
            cargs.append(f.cast("void *", x))
        elif kind == "in":
            keep.append(f.from_buffer(x))
            cargs.append(keep[-1])
        elif kind == "outbuf":
            keep.append(f.new("char[]", max(x, 1)))
            cargs.append(keep[-1])
        elif kind == "cstr":
            cargs.append(x)
        elif kind == "outstr":
            keep.append(f.new("const char **"))
            cargs.append(keep[-1])
        else:
            keep.append(f.new(f"{how[1]} *"))
            cargs.append(keep[-1])
    rc = int(getattr(L, name)(*cargs))
    if rc == 0 and name.startswith("cuMemcpyDtoHAsync"):
        rc = int(L.cuStreamSynchronize(cargs[-1]))  # the bytes go back in this reply
    outs: list[Any] = []
    for how, x, c in zip(plan, wire, cargs, strict=True):
        kind = how[0]
        if kind == "outbuf":
            outs.append(f.buffer(c, x)[:])
        elif kind == "outstr":
            outs.append(f.string(c[0]) if c[0] != f.NULL else None)
        elif kind == "out":
            outs.append(_addr(c[0]) if how[1] in HANDLE_TYPES else c[0])
        else:
            outs.append(None)
    return rc, outs


def _serve_launch(L: Any, fn: int, grid: int, block: int, shared: int, stream: int,
                  blob: bytes, offsets: list[int], cooperative: bool) -> int:
    f = drv.ffi()
    buf = f.from_buffer(bytearray(blob))
    params = f.new("void *[]", [buf + o for o in offsets] or [f.NULL])
    s, function = f.cast("void *", stream), f.cast("void *", fn)
    if cooperative:
        return int(L.cuLaunchCooperativeKernel(function, grid, 1, 1, block, 1, 1, shared, s,
                                               params))
    return int(L.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared, s, params, f.NULL))


def serve(inp: Any, out: Any) -> None:
    """Answer requests from ``inp`` on ``out`` until the input ends."""
    try:
        L = drv.open_libcuda()
    except drv.CudaUnavailable as e:
        L, unavailable = None, str(e)
    handlers: dict[str, Callable[..., Any]] = {
        "call": lambda name, wire: _serve_call(L, name, wire),
        "launch": lambda *a: _serve_launch(L, *a),
        "load": lambda image: drv.module_load_with(L, image),
    }
    while True:
        head = inp.read(_FRAME.size)
        if len(head) < _FRAME.size:
            return
        (n,) = _FRAME.unpack(head)
        msg = pickle.loads(inp.read(n))
        if L is None:  # every answer says why there is no driver (the client raises it)
            reply = ("unavailable", unavailable)
        else:
            reply = _answer(handlers, msg)
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(_FRAME.pack(len(data)) + data)
        out.flush()


def _answer(handlers: dict[str, Callable[..., Any]], msg: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return ("ok", handlers[msg[0]](*msg[1:]))
    except Exception as e:  # noqa: BLE001 - the client raises it as a CudaError
        return ("err", f"{type(e).__name__}: {e}")


def main() -> None:
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what anything else prints goes to stderr, not into the frames
    serve(sys.stdin.buffer, protocol)


if __name__ == "__main__":
    main()
