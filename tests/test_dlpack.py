"""Zero-copy exchange with numpy, torch and any DLPack producer or consumer.

capabilities.wrap takes any ``__dlpack__`` object; a capability exports
``__array_interface__``, ``__dlpack__`` (and, on the GPU, ``__cuda_array_interface__``),
each without a copy, and the exported memory outlives free() of the capability.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import cuda

torch = pytest.importorskip("torch")

SCALE = """
KERNEL void scale(cap_t x, int64_t n, double a)
{
    for (int64_t i = rt_block_idx(); i < n; i += rt_grid_dim())
        cap_store_f32(x, i, (float)(a * cap_load_f32(x, i)));
}
"""


class Producer:
    """A DLPack producer that is neither numpy nor torch (as cupy or jax would be)."""

    def __init__(self, arr: np.ndarray):
        self.arr = arr

    def __dlpack__(self, **kw):
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_wrap_takes_any_dlpack_producer_without_a_copy() -> None:
    backing = np.arange(6, dtype=np.float32)
    cap = capabilities.wrap(Producer(backing), name="p")
    k = runtime.compile(SCALE, "scale")
    runtime.launch(k, [cap], args=(6, 2.0))
    np.testing.assert_array_equal(backing, 2 * np.arange(6, dtype=np.float32))
    with pytest.raises(runtime.CapabilityFault):  # still checked: one past the end
        runtime.launch(k, [cap], args=(7, 2.0))


def test_wrap_refuses_dlpack_memory_of_another_device() -> None:
    class Elsewhere(Producer):
        def __dlpack_device__(self):
            return (4, 0)  # kDLOpenCL

    with pytest.raises(TypeError, match="device type 4"):
        capabilities.wrap(Elsewhere(np.zeros(3, np.float32)))


@pytest.mark.parametrize("export", ["torch.from_dlpack", "np.from_dlpack", "np.asarray"])
def test_capability_exports_without_a_copy(export: str) -> None:
    cap = capabilities.alloc(5, np.float32, name="e")
    view = {"torch.from_dlpack": torch.from_dlpack, "np.from_dlpack": np.from_dlpack,
            "np.asarray": np.asarray}[export](cap)
    view[2] = 7.0
    assert cap.numpy()[2] == 7.0
    runtime.launch(runtime.compile(SCALE, "scale"), [cap], args=(5, 3.0))
    assert float(view[2]) == 21.0
    address = view.data_ptr() if export.startswith("torch") else view.ctypes.data
    assert address == int(cap)


_AFTER_FREE = """
import gc, sys, numpy as np, torch
from capqr import capabilities, runtime
cap = capabilities.alloc(1 << 16, np.float32, name="big")
x = torch.from_dlpack(cap) if sys.argv[1] == "torch" else np.asarray(cap)
cap.free()
runtime.gc_collect(); gc.collect()
fresh = [capabilities.alloc(1 << 16, np.float32) for _ in range(8)]
x[:] = 2.0              # must still be the exported memory, no fresh buffer's
assert not any(f.numpy().any() for f in fresh), "a fresh buffer got the export's memory"
print(float(x.sum()))
"""


@pytest.mark.parametrize("export", ["torch", "numpy"])
def test_exported_memory_outlives_free(export: str) -> None:
    """free() revokes the capability, but an exported tensor or array keeps the memory:
    the collector does not reuse it while the export lives (in a subprocess, so a
    regression shows as a failed check or a crash, not a corrupted test run)."""
    p = subprocess.run([sys.executable, "-c", _AFTER_FREE, export], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == [str(2.0 * (1 << 16))]


def test_read_only_capability_exports_read_only() -> None:
    cap = capabilities.wrap(np.arange(4, dtype=np.float32), perms="r")
    a = np.asarray(cap)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1.0


# Importing the lane never touches the driver: only "no libcuda / no device" skips.
_GPU_OK, _GPU_WHY = cuda.available()


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU_OK, reason=f"no usable GPU: {_GPU_WHY}")
def test_device_capability_exchanges_with_torch_without_a_copy() -> None:
    """On the GPU: torch.from_dlpack and __cuda_array_interface__ of a device capability
    share its memory, and wrap takes a CUDA tensor through DLPack."""
    d = cuda.alloc_device((4,), np.float32, name="d")
    t = torch.from_dlpack(d)
    t[1] = 3.0
    np.testing.assert_array_equal(d.numpy(), [0, 3, 0, 0])
    assert t.data_ptr() == d.ptr == torch.as_tensor(d, device="cuda").data_ptr()
    u = torch.arange(5, dtype=torch.float32, device="cuda")
    c = capabilities.wrap(u, name="u")
    assert float(torch.as_tensor(c, device="cuda").sum()) == 10.0
