"""capqr runtime: verify, instrument, compile and launch checked kernels.

Public API::

    kernel = runtime.compile(source, "name")          # VerifyError if unsafe
    runtime.launch(kernel, [cap_a, cap_b], args=(n, 2.0), grid=8, timeout=5.0)
    runtime.launch(kernel, caps, args=..., sync=False)  # a launch sequence ...
    runtime.sync(timeout=5.0)                           # ... ends here: first fault raised
    runtime.gc_collect(); runtime.gc_stats()
"""

from .cpu.kernel import Kernel, compile
from .errors import (
    CapabilityFault,
    CapqrError,
    CompileError,
    DeviceStuck,
    KernelTimeout,
    VerifyError,
)
from .heap import gc_collect, gc_set_enabled, gc_set_threshold, gc_stats
from .launch import launch, pending, sync

__all__ = [
    "CapabilityFault", "CapqrError", "CompileError", "DeviceStuck", "KernelTimeout", "VerifyError",
    "Kernel", "compile", "launch", "gc_collect", "gc_stats", "gc_set_enabled",
    "gc_set_threshold", "pending", "pinned", "sync", "threads",
]


def threads() -> int:
    """Number of worker threads running kernel blocks ($CAPQR_THREADS, default: all cores)."""
    from .core import lib

    return int(lib.rt_core_threads())


def pinned() -> bool:
    """Whether each worker thread is pinned to its own CPU ($CAPQR_PIN, default: yes)."""
    from .core import PINNED

    return PINNED
