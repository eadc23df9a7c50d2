"""What the child processes of the hung-kernel tests share (tests/test_gpu_isolation.py on
a stand-in libcuda, tests/test_gpu_reset.py on a GPU): how one use of the lane ended."""

from __future__ import annotations

from collections.abc import Callable

from capqr.runtime import CapabilityFault, DeviceStuck
from capqr.runtime.cuda import CudaError


def attempt(fn: Callable[[], object]) -> str:
    """"ran", "fault:<reason>" (a refused buffer), "DeviceStuck", or "CudaError: <its
    message>" (a driver call or the device process failed)."""
    try:
        fn()
        return "ran"
    except CapabilityFault as e:
        return "fault:" + e.reason
    except DeviceStuck:
        return "DeviceStuck"
    except CudaError as e:
        return f"CudaError: {e}"
