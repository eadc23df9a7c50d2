"""GPU lane tests (run on a CUDA machine; skipped cleanly where there is none).

Covers: a planted out-of-bounds store in one thread of one block is refused and
reported with that block/thread while neighbouring device buffers stay
bit-identical; barriers after a fault do not deadlock; local/shared-array,
read-only, freed and no-bounds faults; timeouts; checked and raw QR outputs are
identical; the QR residuals pass the contest thresholds on every contest shape
and on stress inputs; device buffers are collector objects (free() or dropping
the last handle while a launch runs leaves the payload to that launch; churn
of device allocations keeps device memory bounded).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from capqr import runtime
from capqr.runtime import cuda
from capqr.runtime.errors import CapabilityFault, KernelTimeout

# Importing the lane never touches the driver; only "no libcuda / no device"
# (CudaUnavailable, reported by available()) skips, a broken import fails.
_OK, _WHY = cuda.available()

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")]


PLANT = """
KERNEL void plant(cap_t out, int64_t bad_block, int64_t bad_thread)
{
    int64_t b = rt_block_idx();
    int64_t t = rt_thread_idx();
    int64_t T = rt_block_dim();
    int64_t i = b * T + t;
    if (b == bad_block && t == bad_thread)
        i = cap_len_f32(out);
    cap_store_f32(out, i, 1.0f);
    rt_sync_threads();
    for (int64_t r = 0; r < 4; r++) {
        cap_store_f32(out, b * T + t, 2.0f + (float)r);
        rt_sync_threads();
    }
}
"""
PLANT_LINE = 10  # the cap_store_f32 that faults (line of PLANT, 1-based)


def _sha(cap) -> str:
    return hashlib.sha256(cap.numpy().tobytes()).hexdigest()


def test_planted_oob_store_caught_neighbours_intact() -> None:
    rng = np.random.default_rng(1)
    grid, block = 8, 128
    k = cuda.compile(PLANT, "plant")
    before = [cuda.to_device(rng.standard_normal(grid * block).astype(np.float32),
                             name=f"nb{i}") for i in range(3)]
    out = cuda.alloc_device(grid * block, np.float32, name="out")
    after = [cuda.to_device(rng.standard_normal(grid * block).astype(np.float32),
                            name=f"na{i}") for i in range(3)]
    sums = [_sha(c) for c in before + after]
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, [out], args=(3, 17), grid=grid, block=block, timeout=20)
    f = ei.value
    assert (f.block, f.thread, f.index) == (3, 17, grid * block)
    assert (f.reason, f.access, f.buffer, f.line) == ("out-of-bounds", "store", "out", PLANT_LINE)
    assert [_sha(c) for c in before + after] == sums
    o = out.numpy().reshape(grid, block)
    # Other blocks ran to the end; the faulting block left at its next barrier.
    assert np.all(np.delete(o, 3, axis=0) == 5.0)
    assert np.all(np.delete(o[3], 17) == 1.0) and o[3, 17] == 0.0


def test_fault_in_loop_with_barriers_does_not_deadlock() -> None:
    src = """
KERNEL void loopy(cap_t x, int64_t n)
{
    float smem_acc[256];
    int64_t t = rt_thread_idx();
    for (int64_t it = 0; it < 1000; it++) {
        smem_acc[t] = (float)it;
        rt_sync_threads();
        int64_t i = t + it * 0;
        if (it == 500 && t == 5 && rt_block_idx() == 1)
            i = n + 100;
        cap_store_f32(x, i, smem_acc[(t + 1) % rt_block_dim()]);
        rt_sync_threads();
    }
}
"""
    k = cuda.compile(src, "loopy")
    x = cuda.alloc_device(256, np.float32, name="x")
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, [x], args=(256,), grid=4, block=256, timeout=20)
    assert (ei.value.block, ei.value.thread, ei.value.index) == (1, 5, 356)


def test_shared_array_index_checked() -> None:
    src = """
KERNEL void sm(cap_t x, int64_t j)
{
    float smem_buf[64];
    int64_t t = rt_thread_idx();
    smem_buf[t] = 1.0f;
    rt_sync_threads();
    cap_store_f32(x, t, smem_buf[(t * j) % 1000]);
}
"""
    k = cuda.compile(src, "sm")
    x = cuda.alloc_device(64, np.float32, name="x")
    cuda.launch(k, [x], args=(1,), grid=1, block=64)
    assert np.all(x.numpy() == 1.0)
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, [x], args=(3,), grid=1, block=64)
    assert ei.value.reason == "local-array" and ei.value.buffer == "smem_buf"
    assert ei.value.index >= 64 and ei.value.line == 8


COPY = """
KERNEL void copy(cap_t dst, cap_t src, int64_t n)
{
    for (int64_t i = rt_block_idx() * rt_block_dim() + rt_thread_idx(); i < n;
         i += rt_grid_dim() * rt_block_dim())
        cap_store_f32(dst, i, cap_load_f32(src, i) * 2.0f);
}
"""


def test_copy_read_only_and_freed() -> None:
    k = cuda.compile(COPY, "copy")
    a = np.arange(1000, dtype=np.float32)
    src = cuda.to_device(a, perms="r", name="src")
    dst = cuda.alloc_device(1000, np.float32, name="dst")
    cuda.launch(k, [dst, src], args=(1000,), grid=4, block=128)
    np.testing.assert_array_equal(dst.numpy(), 2 * a)
    with pytest.raises(CapabilityFault) as ei:  # store through a read-only cap
        cuda.launch(k, [src, dst], args=(1000,), grid=4, block=128)
    assert ei.value.reason == "read-only" and ei.value.buffer == "src"
    src.free()
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, [dst, src], args=(1000,), grid=4, block=128)
    assert ei.value.reason == "freed" and ei.value.buffer == "src"
    assert ei.value.access == "launch"  # refused before the launch, as on the CPU


def test_cap_from_int_has_no_bounds() -> None:
    src = """
KERNEL void forge(cap_t x)
{
    cap_t y = cap_from_int(cap_to_int(x));
    cap_store_f32(y, 0, 1.0f);
}
"""
    k = cuda.compile(src, "forge")
    x = cuda.alloc_device(16, np.float32, name="x")
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, [x], grid=1, block=32)
    assert ei.value.reason == "no-bounds"
    assert np.all(x.numpy() == 0)


@pytest.mark.timeout(120)
def test_timeout_cancels_runaway_kernel() -> None:
    src = """
KERNEL void spin(cap_t x)
{
    float s = 0.0f;
    while (s >= 0.0f)
        s = s + cap_load_f32(x, 0);
    cap_store_f32(x, 1, s);
}
"""
    k = cuda.compile(src, "spin")
    x = cuda.alloc_device(4, np.float32, name="x")
    with pytest.raises(KernelTimeout):
        cuda.launch(k, [x], grid=2, block=32, timeout=0.5)
    # the context is still usable afterwards
    k2 = cuda.compile(COPY, "copy")
    y = cuda.alloc_device(4, np.float32, name="y")
    cuda.launch(k2, [y, x], args=(4,), grid=1, block=32)


def test_f16_and_i64_accessors_and_torch_wrap() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    src = """
KERNEL void conv(cap_t h, cap_t q, cap_t out, int64_t n)
{
    int64_t i = rt_block_idx() * rt_block_dim() + rt_thread_idx();
    if (i < n)
        cap_store_f32(out, i, cap_load_f16(h, i) + (float)cap_load_i64(q, i));
}
"""
    k = cuda.compile(src, "conv")
    h = torch.arange(100, device="cuda", dtype=torch.float16) / 4
    q = torch.arange(100, device="cuda", dtype=torch.int64) * 10
    out = torch.zeros(100, device="cuda", dtype=torch.float32)
    caps = [cuda.wrap_device(h, "r", "h"), cuda.wrap_device(q, "r", "q"),
            cuda.wrap_device(out, "rw", "out")]
    cuda.launch(k, caps, args=(100,), grid=1, block=128)
    torch.testing.assert_close(out, h.float() + q.float())
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, caps, args=(101,), grid=1, block=128)
    assert (ei.value.buffer, ei.value.thread) == ("h", 100)


# The batched QR kernels are tested in tests/test_gpu_qr.py.
def test_hoisted_loop_still_faults_at_exact_element() -> None:
    """A counted loop runs unchecked only when its whole index range was proven in
    bounds; otherwise the checked copy runs and faults at the first bad element."""
    src = """
KERNEL void rowcopy(cap_t dst, cap_t src, int64_t n, int64_t stride)
{
    int64_t t = rt_thread_idx();
    for (int64_t i = 0; i < n; i++)
        cap_store_f32(dst, t * stride + i, cap_load_f32(src, t * stride + i) + 1.0f);
}
"""
    k = cuda.compile(src, "rowcopy")
    assert "rt_range_ok" in k.cuda.text  # the loop was versioned
    src_c = cuda.to_device(np.arange(32 * 16, dtype=np.float32), perms="r", name="src")
    dst = cuda.alloc_device(32 * 16, np.float32, name="dst")
    cuda.launch(k, [dst, src_c], args=(16, 16), grid=1, block=32)
    np.testing.assert_array_equal(dst.numpy(), np.arange(32 * 16, dtype=np.float32) + 1)
    with pytest.raises(CapabilityFault) as ei:  # thread 31 runs past the end at i = 16
        cuda.launch(k, [dst, src_c], args=(17, 16), grid=1, block=32)
    f = ei.value
    assert (f.thread, f.index, f.access, f.buffer) == (31, 32 * 16, "load", "src")


def test_public_api_routes_to_the_gpu_lane() -> None:
    """capabilities.alloc(device="cuda") / runtime.compile(target="cuda") / runtime.launch."""
    from capqr import capabilities, runtime

    src = """
KERNEL void inc(cap_t x, int64_t n)
{
    int64_t i = rt_block_idx() * rt_block_dim() + rt_thread_idx();
    if (i <= n)
        cap_store_f32(x, i, cap_load_f32(x, i) + 1.0f);
}
"""
    k = runtime.compile(src, "inc", target="cuda")
    x = capabilities.alloc(1000, np.float32, name="x", device="cuda")
    runtime.launch(k, [x], args=(999,), grid=8, block=128)
    assert np.array_equal(x.numpy(), np.ones(1000, np.float32))
    with pytest.raises(runtime.CapabilityFault) as e:  # i == n == 1000: one past the end
        runtime.launch(k, [x], args=(1000,), grid=8, block=128)
    assert e.value.index == 1000 and e.value.block == 7 and e.value.thread == 1000 - 7 * 128
    assert e.value.access in ("load", "store") and e.value.buffer == "x"
    before = x.numpy()
    runtime.launch(k, x, args=(999,), grid=8, block=128)  # a single cap, as on the CPU
    assert np.array_equal(x.numpy(), before + 1)


# ---------------------------------------------------------------------------
# device buffers are collector objects
# ---------------------------------------------------------------------------
HOLD = """
KERNEL void hold(cap_t flag, cap_t buf, cap_t res, cap_t out, int64_t limit)
{
    int64_t it = 0;
    while (cap_load_i32(flag, 0) == 0 && it < limit) {
        it = it + 1;
        cap_store_i64(out, 0, it);
    }
    int64_t i = rt_thread_idx();
    cap_store_f32(res, i, cap_load_f32(buf, i) + 1.0f);
}
"""
HOLD_SECONDS = 3.0  # how long the kernel spins if it never sees the flag


def _set_flag(flag) -> None:
    """Write flag[0] = 1 through the side stream while the launch stream is busy."""
    from capqr.runtime.cuda import driver as drv

    one = drv.ffi().new("int *", 1)
    drv.check(drv.lib().cuMemcpyHtoDAsync_v2(flag.ptr, one, 4, drv.device().side_stream),
              "cuMemcpyHtoDAsync")
    drv.check(drv.lib().cuStreamSynchronize(drv.device().side_stream), "cuStreamSynchronize")


def _read_i64(cap) -> int:
    """cap[0] (int64) read through the side stream while the launch stream is busy."""
    from capqr.runtime.cuda import driver as drv

    v = drv.ffi().new("long long *")
    drv.check(drv.lib().cuMemcpyDtoHAsync_v2(v, cap.ptr, 8, drv.device().side_stream),
              "cuMemcpyDtoHAsync")
    drv.check(drv.lib().cuStreamSynchronize(drv.device().side_stream), "cuStreamSynchronize")
    return int(v[0])


def _settle() -> None:
    """Release every queued payload now, so no cuMemFree (which waits for running
    kernels) happens while the test's kernel is in flight."""
    import gc as pygc

    pygc.collect()
    for _ in range(3):
        runtime.gc_collect()


def _spin_limit(k, flag, buf, res, out) -> int:
    """Loop count that keeps HOLD busy for about HOLD_SECONDS without the flag."""
    import time

    cuda.launch(k, [flag, buf, res, out], args=(1,), grid=1, block=32)  # warm up
    n = 1 << 20
    t0 = time.perf_counter()
    cuda.launch(k, [flag, buf, res, out], args=(n,), grid=1, block=32)
    per = max((time.perf_counter() - t0) / n, 1e-10)
    return min(int(HOLD_SECONDS / per), 1 << 40)


def _hold_scenario(drop_handle: bool) -> None:
    import threading
    import time
    import weakref

    from capqr.runtime.core import lib
    from capqr.runtime.cuda import memory

    k = cuda.compile(HOLD, "hold")
    flag = cuda.alloc_device(1, np.int32, name="flag")
    buf = cuda.to_device(np.full(32, 41.0, np.float32), name="buf")
    res = cuda.alloc_device(32, np.float32, name="res")
    out = cuda.alloc_device(1, np.int64, name="out")
    limit = _spin_limit(k, flag, buf, res, out)
    _settle()
    caps = [flag, buf, res, out]
    bid = buf.id
    errors: list[BaseException] = []

    def run() -> None:
        try:
            cuda.launch(k, caps, args=(limit,), grid=1, block=32, timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    out.copy_from(np.zeros(1, np.int64))  # _spin_limit's runs left their count there
    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    # The kernel counts its spins in out[0]: once it runs, its bounds snapshot is taken
    # (a free() between the launch's hold and its snapshot is a legitimate "freed"
    # fault of that launch, not the case this test is about).
    while _read_i64(out) == 0:
        assert time.monotonic() < deadline and t.is_alive(), errors
        time.sleep(1e-3)
    assert lib.gc_find_id(bid).holds > 0  # the running launch holds buf
    if drop_handle:
        gone = weakref.ref(buf)
        caps[1] = None
        del buf
        while gone() is not None:  # the launch keeps the held object, not the handle
            assert time.monotonic() < deadline, "a launch kept the Python handle alive"
            time.sleep(1e-3)
    else:
        buf.free()
        with pytest.raises(CapabilityFault) as e:
            buf.free()
        assert e.value.reason == "freed"
    _settle()
    pending, lid = memory.payload_pending(bid), lib.gc_is_live_id(bid)
    in_flight = t.is_alive()
    _set_flag(flag)
    t.join(60)
    assert not t.is_alive() and not errors, errors
    assert in_flight, "the kernel ended before the free/drop: raise HOLD_SECONDS"
    assert pending and lid, "payload released while a launch held it"
    assert np.all(res.numpy() == 42.0)  # the in-flight kernel read the live payload
    _settle()
    assert not memory.payload_pending(bid)
    if drop_handle:
        assert not lib.gc_is_live_id(bid)
    else:
        with pytest.raises(CapabilityFault) as e:  # the next launch is refused
            cuda.launch(k, [flag, buf, res, out], args=(1,), grid=1, block=32)
        assert (e.value.reason, e.value.buffer) == ("freed", "buf")


def test_free_while_a_launch_runs() -> None:
    _hold_scenario(drop_handle=False)


def test_drop_last_handle_while_a_launch_runs() -> None:
    _hold_scenario(drop_handle=True)


def test_device_churn_keeps_memory_bounded() -> None:
    from capqr.runtime.cuda import driver as drv

    def free_bytes() -> int:
        f = drv.ffi()
        fr, tot = f.new("size_t *"), f.new("size_t *")
        drv.check(drv.lib().cuMemGetInfo_v2(fr, tot), "cuMemGetInfo")
        return int(fr[0])

    mib = 1 << 20
    _settle()
    before = free_bytes()
    lowest = before
    for i in range(2000):  # 2000 x 8 MiB = 15.6 GiB allocated, each dropped at once
        cuda.alloc_device(2 * mib, np.float32, name=f"churn{i}")
        if i % 50 == 0:
            lowest = min(lowest, free_bytes())
    _settle()
    after = free_bytes()
    assert before - lowest <= 512 * mib, f"device memory grew by {(before - lowest) / mib} MiB"
    assert before - after <= 64 * mib, f"{(before - after) / mib} MiB not returned"
