"""capabilities: bounded, permissioned handles on collector-owned buffers.

The C side of a capability is ``cap_t`` in ``capabilities/cap.h`` (the one C
ABI header of capqr).

The handles (``alloc``, ``wrap``, ``Capability``, ...) live in ``handle`` and
load on first use (PEP 562 ``__getattr__``), and the first handle made binds them to
the runtime core (the collector's C library, one layer up): ``abi`` (the layouts and
codes the core is built from) imports without it, so ``from capqr.capabilities
import abi`` never starts a build.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

#: Directory holding cap.h (the header kernels are compiled against).
INCLUDE_DIR = Path(__file__).resolve().parent

_HANDLE_NAMES = ("CAP_DTYPE", "Capability", "NoBoundsCap", "alloc", "from_int", "wrap")

__all__ = [*_HANDLE_NAMES, "INCLUDE_DIR"]


def __getattr__(name: str) -> Any:
    if name in _HANDLE_NAMES or name == "handle":
        # import_module, not `from . import handle`: the latter asks this
        # __getattr__ for "handle" again before the submodule is bound.
        handle = importlib.import_module(f"{__name__}.handle")
        value = handle if name == "handle" else getattr(handle, name)
        globals()[name] = value  # bound: later uses skip this hook (kernels.qr makes
        return value             # three handles per call)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
