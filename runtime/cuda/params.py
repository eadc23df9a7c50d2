"""A GPU launch's parameters, packed the way cuLaunchKernel takes them."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...capabilities import abi
from ..argcheck import check_counts, plain_int64, scalar_arg
from . import driver as drv

if TYPE_CHECKING:
    from .kernel import CudaKernel
    from .memory import DeviceCapability

#: struct format of one parameter by kind: a cap_t by value (capabilities/abi.py
#: CAP_WORDS, unsigned 64-bit words), the scalars, and the hidden parameters
PARAM_FORMAT = {"cap": f"{len(abi.CAP_WORDS)}Q", "int64": "q", "double": "d", "float": "f",
                 "record": "Q", "launch": "i"}


class ParamBlock:
    """A kernel's parameters packed into one buffer, laid out once per kernel.

    cuLaunchKernel copies the parameters when it is called, so one block is
    reused for every launch of the kernel (callers hold the sequence's lock; a
    ``time_launch`` makes its own).  Every parameter starts on an 8-byte
    boundary; the pointer array handed to the driver points at each.
    Checked kernels take two hidden trailing parameters (sequence record,
    launch index; runtime/cuda/lower.py).
    """

    def __init__(self, kernel: CudaKernel):
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
            fmt += PARAM_FORMAT[kind]
            off += struct.calcsize("<" + PARAM_FORMAT[kind])
        self.struct = struct.Struct(fmt)
        self.offsets = offsets  # of each parameter in ``buf`` (the isolated lane ships both)
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

        The caller holds the buffers (launch.hold_all checked them); a free()
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


def param_block(kernel: CudaKernel) -> ParamBlock:
    """The kernel's shared parameter block (made on its first launch)."""
    if kernel.param_block is None:
        kernel.param_block = ParamBlock(kernel)
    return kernel.param_block
