"""Device buffers are collector objects (no GPU needed: the driver is a fake).

The GPU lane's driver module is replaced by a small recording fake: cuMemAlloc
hands out fake addresses, cuMemFree records them, and a launch can be parked
at a chosen point (while building its arguments, or while the kernel "runs")
so a free() or a dropped handle lands deterministically in the middle of it.
The oracle is the fake's own ledger of live addresses, not the collector's
counters: a payload freed while a launch can still use it shows up as an
address missing from the ledger at launch time.
"""

from __future__ import annotations

import gc as pygc
import threading
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from capqr import runtime
from capqr.runtime import cuda
from capqr.runtime.core import lib
from capqr.runtime.cuda import driver as real_drv
from capqr.runtime.cuda import memory

_real_ffi = real_drv.ffi  # the fake's ffi() stands in for it, and hands it out

SRC = """
KERNEL void touch(cap_t x, int64_t n)
{
    int64_t i = rt_block_idx() * rt_block_dim() + rt_thread_idx();
    if (i < n)
        cap_store_f32(x, i, 1.0f);
}
"""
MIB = 1 << 20
FAKE_RECORD = 0x10_0000  # the launch-sequence record's address (not a payload)


class FakeDriver:
    """What the lane calls on runtime.cuda.driver, recording device memory."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}     # address -> bytes, allocated and not freed
        self.freed: list[int] = []         # cuMemFree'd addresses, in order
        self.launched_with: list[bool] = []  # per launch: were all argument payloads live?
        self._next = 0x7F00_0000_0000
        self._params: list[int] = []
        self.park_in: str | None = None    # "args" (argument packing) or "kernel" (running)
        self.parked = threading.Event()
        self.resume = threading.Event()
        self.launch_thread: int | None = None

    # -- the driver module's functions (the fixture puts these in its place) ------
    def lib(self) -> FakeDriver:
        return self

    def ffi(self) -> Any:
        self._park("args")
        return _real_ffi()

    def device(self) -> Any:
        return SimpleNamespace(max_threads=1024, side_stream=None, arch="sm_90",
                               seq_record=FAKE_RECORD)

    def check(self, rc: int, call: str) -> None:
        if rc:
            raise real_drv.CudaError(call, rc, "FAKE", "fake driver error")

    def _park(self, where: str) -> None:
        if self.park_in == where and threading.get_ident() == self.launch_thread:
            self.park_in = None
            self.parked.set()
            assert self.resume.wait(30), "test never resumed the launch"

    # -- driver entry points ---------------------------------------------------
    def cuMemAlloc_v2(self, p: Any, n: int) -> int:
        p[0] = self._next
        self.live[self._next] = n
        self._next += (n + 0xFFFF) & ~0xFFFF
        return 0

    def cuMemFree_v2(self, address: int) -> int:
        assert address in self.live, f"cuMemFree of 0x{address:x}: not allocated (double free?)"
        del self.live[address]
        self.freed.append(address)
        return 0

    def cuMemsetD8_v2(self, *_a: Any) -> int:
        return 0

    def cuMemcpyDtoH_v2(self, *_a: Any) -> int:
        return 0  # the fault record stays zeroed: no fault

    def cuLaunchKernel(self, *_a: Any) -> int:
        self.launched_with.append(all(a in self.live for a in self._params))
        return 0

    def cuStreamSynchronize(self, _s: Any) -> int:
        self._park("kernel")
        return 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    d = FakeDriver()
    for entry in ("lib", "ffi", "device", "check"):  # every module of the lane calls these
        monkeypatch.setattr(real_drv, entry, getattr(d, entry))
    yield d
    d.resume.set()
    pygc.collect()
    for _ in range(6):  # every handle is gone: the collector releases everything
        runtime.gc_collect()
        if not memory.device_payloads_owned():
            break
    assert memory.device_payloads_owned() == 0
    assert d.live == {}, "device payloads leaked"


def _kernel() -> cuda.CudaKernel:
    cs = cuda.translate(SRC)
    return cuda.CudaKernel("touch", SRC, True, cs, cs.kernels["touch"], None, None, 0)


def _launch_in_thread(fake: FakeDriver, k: cuda.CudaKernel, caps: list, addresses: list[int],
                      where: str) -> threading.Thread:
    """Start a launch of ``k`` on ``caps`` and return once it is parked at ``where``."""
    errors: list[BaseException] = []

    def run() -> None:
        fake.launch_thread = threading.get_ident()
        try:
            cuda.launch(k, caps, args=(4,), grid=1, block=32)
        except BaseException as e:  # noqa: BLE001 - reported by the joining test
            errors.append(e)

    fake._params = addresses
    fake.park_in = where
    t = threading.Thread(target=run)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    assert fake.parked.wait(30), f"launch never reached {where!r}: {errors}"
    return t


def _finish(fake: FakeDriver, t: threading.Thread) -> None:
    fake.resume.set()
    t.join(30)
    assert not t.is_alive()
    assert not t.errors, t.errors  # type: ignore[attr-defined]


def _collect(n: int = 3) -> None:
    for _ in range(n):
        runtime.gc_collect()


@pytest.mark.parametrize("where", ["args", "kernel"])
def test_free_during_a_launch_keeps_the_payload_until_it_ends(fake: FakeDriver,
                                                              where: str) -> None:
    """free() while a launch is packing its arguments or running: the payload the
    launch snapshotted stays allocated until the launch ended and a cycle swept."""
    k = _kernel()
    x = cuda.alloc_device(16, np.float32, name="x")
    addr = x.ptr
    t = _launch_in_thread(fake, k, [x], [addr], where)
    x.free()
    _collect()
    assert addr in fake.live, "payload released under a launch that holds it"
    _finish(fake, t)
    assert fake.launched_with == [True]  # the kernel started on live memory
    _collect()
    assert addr not in fake.live and fake.freed.count(addr) == 1
    with pytest.raises(runtime.CapabilityFault) as e:  # the next launch is refused
        cuda.launch(k, [x], args=(4,), grid=1, block=32)
    assert (e.value.reason, e.value.buffer, e.value.access) == ("freed", "x", "launch")


def test_dropping_the_last_handle_during_a_launch(fake: FakeDriver) -> None:
    k = _kernel()
    x = cuda.alloc_device(16, np.float32, name="x")
    addr, xid = x.ptr, x.id
    caps = [x]
    t = _launch_in_thread(fake, k, caps, [addr], "kernel")
    caps.clear()
    gone = weakref.ref(x)
    del x
    pygc.collect()
    assert gone() is None  # no Python reference is left: only the collector's hold
    _collect()
    assert addr in fake.live and lib.gc_is_live_id(xid)
    _finish(fake, t)
    _collect()
    assert addr not in fake.live and fake.freed.count(addr) == 1
    assert not lib.gc_is_live_id(xid)


def test_second_free_raises_and_attributes_stay_defined(fake: FakeDriver) -> None:
    x = cuda.alloc_device((2, 3), np.float64, name="x")
    x.free()
    with pytest.raises(runtime.CapabilityFault) as e:
        x.free()
    assert (e.value.reason, e.value.buffer) == ("freed", "x")
    _collect()  # the header may be reclaimed now: attributes must not read it
    assert (x.name, x.shape, x.nbytes, x.size, x.perms, x.device, x.freed) == (
        "x", (2, 3), 48, 6, "rw", "cuda", True)
    for use in (lambda: x.ptr, x.numpy, lambda: x.copy_from(np.zeros((2, 3)))):
        with pytest.raises(runtime.CapabilityFault) as e:
            use()
        assert e.value.reason == "freed"


def test_free_revokes_the_collector_header(fake: FakeDriver) -> None:
    """free() marks the collector's header freed with zero bounds, not only the
    Python handle: the collector, and anything else reading the header, sees it."""
    from capqr.capabilities import abi

    x = cuda.alloc_device(64, np.float32, name="x")
    obj = x._obj
    lib.gc_hold(obj)  # keeps the header alive once free() drops the handle's pin
    try:
        x.free()
        assert obj.flags & abi.OBJ_FLAG["FREED"]
        assert (obj.rlen, obj.wlen) == (0, 0)
    finally:
        lib.gc_unhold(obj)


def test_device_bytes_pace_the_collector(fake: FakeDriver) -> None:
    """Churn of dropped 8 MiB device buffers, no explicit collection: the
    collector's automatic cycles (triggered by device bytes) and the device
    allocator's debt keep the number of live payloads bounded."""
    runtime.gc_set_enabled(True)
    before = lib.gc_heap_occupancy()
    keep = cuda.alloc_device(2 * MIB, np.float32, name="keep")  # 8 MiB
    assert lib.gc_heap_occupancy() - before >= 8 * MIB  # the pacer sees device bytes
    peak = 0
    for i in range(500):
        cuda.alloc_device(2 * MIB, np.float32, name=f"c{i}")  # dropped at once
        peak = max(peak, len(fake.live))
    assert peak <= 12, f"{peak} live 8 MiB payloads during churn"
    assert len(fake.freed) >= 500 - 12
    keep.free()


def test_wrapped_tensor_reference_dropped_by_the_collector(fake: FakeDriver) -> None:
    """A wrapped CUDA tensor stays referenced while a launch holds it, then the
    collector drops the reference; its memory is never cuMemFree'd here."""

    class Tensor:  # what wrap_device reads of a torch CUDA tensor
        is_cuda = True
        dtype = "torch.float32"
        shape = (16,)

        def is_contiguous(self) -> bool:
            return True

        def data_ptr(self) -> int:
            return 0x5000_0000

    k = _kernel()
    tensor = Tensor()
    alive = weakref.ref(tensor)
    x = cuda.wrap_device(tensor, name="t")
    del tensor
    caps = [x]
    t = _launch_in_thread(fake, k, caps, [], "kernel")
    x.free()
    caps.clear()
    del x
    _collect()
    assert alive() is not None  # held by the running launch
    _finish(fake, t)
    _collect()
    assert alive() is None
    assert 0x5000_0000 not in fake.freed


def test_runtime_launch_takes_a_single_device_cap(fake: FakeDriver) -> None:
    k = _kernel()
    x = cuda.alloc_device(16, np.float32, name="x")
    fake._params = [x.ptr]
    runtime.launch(k, x, args=(4,), grid=1, block=32)
    assert fake.launched_with == [True]
