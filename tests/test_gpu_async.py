"""Launch sequences on the GPU (run on a CUDA machine; skipped cleanly where there is none).

A fault in the middle of a sequence that crosses two modules stops every later
launch (a canary the next kernel would write stays zero) and ``runtime.sync()``
reports the first fault exactly; a deadline cancels the running kernel and the
queued ones; 1000 enqueued launches give the right result after one sync.
The host side of the protocol is also tested without a GPU
(tests/test_launch_sequence.py, fake driver).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from capqr import runtime
from capqr.runtime import cuda
from capqr.runtime.errors import CapabilityFault, KernelTimeout

_OK, _WHY = cuda.available()

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")]

# Module A
PUT_SRC = """
KERNEL void put(cap_t x, int64_t i, float v)
{
    if (rt_block_idx() == 0 && rt_thread_idx() == 0)
        cap_store_f32(x, i, v);
}
"""
# Module B: every thread stores its own element; one planted thread goes one past the end.
PLANT_SRC = """
KERNEL void plant(cap_t dst, int64_t bad_block, int64_t bad_thread)
{
    int64_t b = rt_block_idx();
    int64_t t = rt_thread_idx();
    int64_t i = b * rt_block_dim() + t;
    if (b == bad_block && t == bad_thread)
        i = cap_len_f32(dst);
    cap_store_f32(dst, i, 1.0f);
}
"""
PLANT_LINE = 9
SPIN_SRC = """
KERNEL void spin(cap_t flag)
{
    int64_t k = 0;
    while (cap_load_i64(flag, 0) == 0) {
        k = k + 1;
    }
    cap_store_i64(flag, 1, k);
}
"""
ADD_SRC = """
KERNEL void add(cap_t x, int64_t n, float v)
{
    int64_t i = rt_block_idx() * rt_block_dim() + rt_thread_idx();
    if (i < n)
        cap_store_f32(x, i, cap_load_f32(x, i) + v);
}
"""


@pytest.fixture(autouse=True)
def _no_pending_sequence():
    assert runtime.pending() == 0
    yield
    try:
        runtime.sync(timeout=30)
    finally:
        assert runtime.pending() == 0


def _holds(cap) -> int:
    from capqr.runtime.core import lib

    return int(lib.gc_find_id(cap.id).holds)


def test_fault_mid_sequence_across_modules_stops_the_rest() -> None:
    put = runtime.compile(PUT_SRC, "put", target="cuda")
    plant = runtime.compile(PLANT_SRC, "plant", target="cuda")
    grid, block = 4, 64
    a = cuda.alloc_device(4, np.float32, name="a")
    dst = cuda.alloc_device(grid * block, np.float32, name="dst")
    canary = cuda.alloc_device(4, np.float32, name="canary")
    runtime.launch(put, [a], args=(0, 1.0), grid=1, block=32, sync=False)
    runtime.launch(plant, [dst], args=(2, 5), grid=grid, block=block, sync=False)
    runtime.launch(put, [canary], args=(0, 7.0), grid=1, block=32, sync=False)
    runtime.launch(plant, [canary], args=(0, 0), grid=1, block=4, sync=False)  # would fault too
    assert runtime.pending() == 4 and _holds(canary) == 2
    with pytest.raises(CapabilityFault) as e:
        runtime.sync(timeout=30)
    f = e.value
    assert (f.reason, f.kernel, f.buffer, f.index, f.access, f.block, f.thread, f.line,
            f.launch_index) == ("out-of-bounds", "plant", "dst", grid * block, "store", 2, 5,
                                PLANT_LINE, 1)
    assert a.numpy()[0] == 1.0                              # launch 0 ran
    np.testing.assert_array_equal(canary.numpy(), 0.0)      # launches 2 and 3 did not
    assert _holds(a) == _holds(dst) == _holds(canary) == 0
    # The next sequence starts with a clean record.
    runtime.launch(put, [canary], args=(1, 3.0), grid=1, block=32, sync=False)
    runtime.sync(timeout=30)
    assert canary.numpy()[1] == 3.0


def test_sync_launch_after_a_faulted_sequence_raises_it_first() -> None:
    put = runtime.compile(PUT_SRC, "put", target="cuda")
    x = cuda.alloc_device(4, np.float32, name="x")
    canary = cuda.alloc_device(4, np.float32, name="canary")
    runtime.launch(put, [x], args=(4, 1.0), grid=1, block=32, sync=False)
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(put, [canary], args=(0, 1.0), grid=1, block=32)
    assert (e.value.buffer, e.value.index, e.value.launch_index) == ("x", 4, 0)
    assert canary.numpy()[0] == 0.0
    runtime.launch(put, [canary], args=(0, 1.0), grid=1, block=32)
    assert canary.numpy()[0] == 1.0


@pytest.mark.timeout(120)
def test_timeout_in_a_sequence_cancels_the_rest() -> None:
    put = runtime.compile(PUT_SRC, "put", target="cuda")
    spin = runtime.compile(SPIN_SRC, "spin", target="cuda")
    flag = cuda.alloc_device(2, np.int64, name="flag")
    canary = cuda.alloc_device(4, np.float32, name="canary")
    runtime.launch(put, [canary], args=(0, 1.0), grid=1, block=32, sync=False)
    runtime.launch(spin, [flag], grid=2, block=32, sync=False)
    runtime.launch(put, [canary], args=(1, 1.0), grid=1, block=32, sync=False)
    t0 = time.monotonic()
    with pytest.raises(KernelTimeout) as e:
        runtime.sync(timeout=0.5)
    assert e.value.kernel == "spin"
    assert time.monotonic() - t0 < 10
    np.testing.assert_array_equal(canary.numpy(), [1.0, 0.0, 0.0, 0.0])
    assert _holds(flag) == _holds(canary) == 0
    runtime.launch(put, [canary], args=(2, 1.0), grid=1, block=32, sync=False)
    runtime.sync(timeout=30)
    assert canary.numpy()[2] == 1.0


def test_thousand_async_launches_then_sync() -> None:
    add_a = runtime.compile(ADD_SRC, "add", target="cuda")
    add_b = runtime.compile(ADD_SRC.replace("add(", "add2("), "add2", target="cuda")
    n = 1000
    x = cuda.alloc_device(n, np.float32, name="x")
    # Synchronous baseline of the per-launch cost, for the printed comparison.
    t0 = time.perf_counter()
    for _ in range(100):
        runtime.launch(add_a, [x], args=(n, 0.0), grid=8, block=128)
    per_sync = (time.perf_counter() - t0) / 100
    t0 = time.perf_counter()
    for k in range(1000):
        runtime.launch(add_a if k % 2 else add_b, [x], args=(n, 1.0 + (k % 2)), grid=8,
                       block=128, sync=False)
    runtime.sync(timeout=60)
    per_async = (time.perf_counter() - t0) / 1000
    np.testing.assert_array_equal(x.numpy(), np.full(n, 1500.0, np.float32))
    assert _holds(x) == 0
    print(f"\nper launch: synchronous {per_sync * 1e6:.1f} us, in a sequence "
          f"{per_async * 1e6:.1f} us (host wall time, 1000 launches + one sync)")


def test_time_launch_still_works_and_syncs_first() -> None:
    add = runtime.compile(ADD_SRC, "add", target="cuda")
    put = runtime.compile(PUT_SRC, "put", target="cuda")
    x = cuda.alloc_device(256, np.float32, name="x")
    runtime.launch(put, [x], args=(9999, 1.0), grid=1, block=32, sync=False)
    with pytest.raises(CapabilityFault):  # the pending fault is not lost
        cuda.time_launch(add, [x], args=(256, 1.0), grid=2, block=128, repeat=3)
    ms = cuda.time_launch(add, [x], args=(256, 1.0), grid=2, block=128, repeat=3)
    assert len(ms) == 3 and all(m > 0 for m in ms)
    np.testing.assert_array_equal(x.numpy(), np.full(256, 4.0, np.float32))  # 1 warmup + 3
