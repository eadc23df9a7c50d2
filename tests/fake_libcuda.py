"""A stand-in for libcuda: its entry points and calling convention (cffi arguments), a
GPU in host memory, and the H100's behaviour around a kernel that never stops.

Measured on an H100 (bench/results/gpu-hang-probe-2026-12-06-h100-c0bfd1d.jsonl) and
played here: while such a kernel runs, cuDevicePrimaryCtxReset, cuCtxSynchronize,
cuStreamSynchronize of its stream, cuMemcpyDtoH and cuMemFree block forever;
cuStreamQuery answers CUDA_ERROR_NOT_READY; the non-blocking side stream still works.
Only ending the process ends the kernel.

``CAPQR_LIBCUDA_PY=fake_libcuda:FakeLibcuda`` (tests/ on the path) makes the lane open
this instead of libcuda, in this process (direct lane) or in the device process (the
isolated lane, runtime/cuda/remote.py).  A module image is ``FAKECUBIN`` and a JSON
map of kernel name -> parameter kinds (:func:`image`); kernels behave by name:

- ``put(cap x, int64 i, float v)``: stores ``v`` at ``x[i]`` (float32);
- ``hang(...)``: never ends and ignores the cancel flag;
- ``crash(...)``: fails as an illegal address does: every later call of the context
  answers CUDA_ERROR_ILLEGAL_ADDRESS (700).
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from typing import Any

from capqr.capabilities import abi
from capqr.runtime.cuda import driver as drv
from capqr.runtime.cuda.params import PARAM_FORMAT

NOT_READY = 600
SIDE_FLAG = 1  # CU_STREAM_NON_BLOCKING



def image(kernels: dict[str, list[str]]) -> bytes:
    """A module image of kernels (name -> parameter kinds) for :class:`FakeLibcuda`."""
    return b"FAKECUBIN" + json.dumps(kernels).encode()


def _forever(what: str) -> None:
    """What the driver does behind a kernel that never ends."""
    while True:
        time.sleep(3600)


class FakeLibcuda:
    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}
        self.next_address = 0x7F00_0000_0000
        self.handles = itertools.count(0x1000, 0x10)
        self.functions: dict[int, tuple[str, list[str]]] = {}
        self.modules: dict[int, dict[str, list[str]]] = {}
        self.side_streams: set[int] = set()
        self.hung: str | None = None
        self.sticky = 0  # a context that failed for good answers this to every call

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("cu") and object.__getattribute__(self, "sticky"):
            return lambda *a: object.__getattribute__(self, "sticky")
        return attr

    @staticmethod
    def _int(x: Any) -> int:
        return int(drv.ffi().cast("uintptr_t", x))

    def _at(self, address: int, n: int) -> tuple[bytearray, int]:
        for base, buf in self.mem.items():
            if base <= address and address + n <= base + len(buf):
                return buf, address - base
        raise AssertionError(f"fake GPU: {n} bytes at 0x{address:x} are not allocated")

    # -- device and context -------------------------------------------------------
    def cuInit(self, flags: int) -> int:
        return 0

    def cuDriverGetVersion(self, v: Any) -> int:
        v[0] = 12080
        return 0

    def cuDeviceGetCount(self, n: Any) -> int:
        n[0] = 1
        return 0

    def cuDeviceGet(self, d: Any, ordinal: int) -> int:
        d[0] = ordinal
        return 0

    def cuDeviceGetName(self, buf: Any, n: int, dev: int) -> int:
        drv.ffi().memmove(buf, b"Fake GPU\0", 9)
        return 0

    def cuDeviceGetAttribute(self, v: Any, attr: int, dev: int) -> int:
        v[0] = {75: 9, 76: 0, 16: 4, 1: 1024, 97: 232448, 95: 1}.get(attr, 1)
        return 0

    def cuDevicePrimaryCtxRetain(self, c: Any, dev: int) -> int:
        c[0] = drv.ffi().cast("CUcontext", 0xC0)
        return 0

    def cuDevicePrimaryCtxReset_v2(self, dev: int) -> int:
        if self.hung:
            _forever("reset")
        self.mem.clear()
        return 0

    def cuCtxSetCurrent(self, ctx: Any) -> int:
        return 0

    def cuCtxGetCurrent(self, c: Any) -> int:
        c[0] = drv.ffi().cast("CUcontext", 0xC0)
        return 0

    def cuCtxSynchronize(self) -> int:
        if self.hung:
            _forever("cuCtxSynchronize")
        return 0

    def cuGetErrorName(self, code: int, s: Any) -> int:
        return 1

    def cuGetErrorString(self, code: int, s: Any) -> int:
        return 1

    # -- memory -------------------------------------------------------------------
    def cuMemAlloc_v2(self, p: Any, n: int) -> int:
        p[0] = self.next_address
        self.mem[self.next_address] = bytearray(n)
        self.next_address += (n + 0xFFFF) & ~0xFFFF
        return 0

    def cuMemFree_v2(self, address: int) -> int:
        if self.hung:
            _forever("cuMemFree")
        assert address in self.mem, f"fake GPU: cuMemFree of 0x{address:x}"
        del self.mem[address]
        return 0

    def cuMemsetD8_v2(self, address: int, value: int, n: int) -> int:
        buf, off = self._at(address, n)
        buf[off:off + n] = bytes([value]) * n
        return 0

    def cuMemcpyHtoD_v2(self, dst: int, src: Any, n: int) -> int:
        if self.hung:
            _forever("cuMemcpyHtoD")
        buf, off = self._at(dst, n)
        buf[off:off + n] = drv.ffi().buffer(drv.ffi().cast("char *", src), n)[:]
        return 0

    def cuMemcpyHtoDAsync_v2(self, dst: int, src: Any, n: int, stream: Any) -> int:
        assert self._int(stream) in self.side_streams, "only the side stream copies async"
        buf, off = self._at(dst, n)
        buf[off:off + n] = drv.ffi().buffer(drv.ffi().cast("char *", src), n)[:]
        return 0

    def cuMemcpyDtoH_v2(self, dst: Any, src: int, n: int) -> int:
        if self.hung:
            _forever("cuMemcpyDtoH")
        buf, off = self._at(src, n)
        drv.ffi().memmove(dst, bytes(buf[off:off + n]), n)
        return 0

    # -- streams ------------------------------------------------------------------
    def cuStreamCreate(self, s: Any, flags: int) -> int:
        h = next(self.handles)
        if flags & SIDE_FLAG:
            self.side_streams.add(h)
        s[0] = drv.ffi().cast("CUstream", h)
        return 0

    def cuStreamQuery(self, s: Any) -> int:
        return NOT_READY if self.hung and self._int(s) not in self.side_streams else 0

    def cuStreamSynchronize(self, s: Any) -> int:
        if self.hung and self._int(s) not in self.side_streams:
            _forever("cuStreamSynchronize")
        return 0

    # -- modules and launches -----------------------------------------------------
    def cuModuleLoadDataEx(self, mod: Any, img: Any, n: int, keys: Any, values: Any) -> int:
        data = bytes(img) if isinstance(img, bytes) else drv.ffi().string(
            drv.ffi().cast("char *", img))
        if not data.startswith(b"FAKECUBIN"):
            return 200  # CUDA_ERROR_INVALID_IMAGE
        h = next(self.handles)
        self.modules[h] = json.loads(data[len(b"FAKECUBIN"):])
        mod[0] = drv.ffi().cast("CUmodule", h)
        return 0

    def cuModuleGetFunction(self, fn: Any, mod: Any, name: Any) -> int:
        text = name if isinstance(name, bytes) else drv.ffi().string(name)
        kernels = self.modules[self._int(mod)]
        entry = text.decode()
        kernel = next((k for k in kernels if entry.endswith(k)), None)
        if kernel is None:
            return 500  # CUDA_ERROR_NOT_FOUND
        h = next(self.handles)
        self.functions[h] = (kernel, kernels[kernel])
        fn[0] = drv.ffi().cast("CUfunction", h)
        return 0

    def cuFuncGetAttribute(self, v: Any, attr: int, fn: Any) -> int:
        v[0] = 32
        return 0

    def cuLaunchKernel(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                       shared: int, stream: Any, params: Any, extra: Any) -> int:
        f = drv.ffi()
        name, kinds = self.functions[self._int(fn)]
        values = []  # each parameter's first value (a cap's first word is its address)
        for i, k in enumerate(kinds):
            fmt = struct.Struct("<" + PARAM_FORMAT[k])
            values.append(fmt.unpack(f.buffer(f.cast("char *", params[i]), fmt.size)[:])[0])
        if self.hung:
            return 0  # queued behind the kernel that never ends
        if name == "hang":
            self.hung = name
        elif name == "crash":
            self.sticky = 700
        elif name == "put":
            address, i, v = values
            buf, off = self._at(address + 4 * i, 4)
            buf[off:off + 4] = struct.pack("<f", v)
        return 0

    def cuLaunchCooperativeKernel(self, *args: Any) -> int:
        return self.cuLaunchKernel(*args, None)


assert abi.CAP_WORDS[0] == "p", "a cap's first word is its address"
