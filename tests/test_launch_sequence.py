"""Launch sequences: ``runtime.launch(..., sync=False)`` then ``runtime.sync()``.

Part 1 runs the CPU lane, whose sequences have the GPU's observable semantics:
a fault in the middle stops the rest, ``sync()`` raises the first fault
exactly, a ``sync=True`` launch raises a pending fault first, nothing stays
held.  The oracle is the buffers themselves (canary values a skipped launch
would have written), not the runtime's counters.

Part 2 runs the GPU lane's host side on a fake driver that plays the device:
it executes the queued launches in stream order at the sync, honours the
sticky record the way the device prelude does (a launch whose record says
"faulted" or "cancelled" exits at entry) and writes fault records through the
hidden parameters the lane passes.  It checks what the host owns: one
synchronisation per sequence, the launch index -> kernel/buffer mapping of
the reported fault, holds kept until the sync, cancellation through the shared
cancel flag (a kernel that ignores it: tests/test_gpu_reset.py).  The device
half of the protocol is checked on a GPU by tests/test_gpu_async.py.
"""

from __future__ import annotations

import functools
import gc as pygc
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import CapabilityFault, KernelTimeout, cuda
from capqr.runtime.cuda import driver as real_drv
from capqr.runtime.cuda import memory, sequence
from readme_examples import run_readme_example

PUT_SRC = """
KERNEL void put(cap_t x, int64_t i, float v)
{
    cap_store_f32(x, i, v);
}
"""
PUT_LINE = 4
# A second module: a sequence crosses kernels of different sources.
COPY_SRC = """
KERNEL void copy(cap_t dst, cap_t src, int64_t i)
{
    float v = cap_load_f32(src, i);
    cap_store_f32(dst, i, v);
}
"""
COPY_LINE = 4


@pytest.fixture(autouse=True)
def _no_pending_sequence():
    """Each test starts and ends without a pending sequence on either lane."""
    assert runtime.pending() == 0
    yield
    try:
        runtime.sync()
    finally:
        assert runtime.pending() == 0


def _holds(cap: Any) -> int:
    """Collector holds on the buffer's header (launches that root it)."""
    from capqr.runtime.core import lib

    return int(lib.gc_find_id(cap.id).holds)


# ---------------------------------------------------------------------------
# Part 1: the CPU lane


@pytest.fixture(scope="module")
def kernels() -> SimpleNamespace:
    return SimpleNamespace(put=runtime.compile(PUT_SRC, "put"),
                           copy=runtime.compile(COPY_SRC, "copy"))


def test_fault_in_the_middle_stops_the_rest_and_sync_reports_the_first(kernels) -> None:
    put, copy = kernels.put, kernels.copy
    x = capabilities.wrap(np.zeros(4, np.float32), name="x")
    src = capabilities.wrap(np.arange(4, dtype=np.float32), perms="r", name="src")
    canary = capabilities.wrap(np.zeros(4, np.float32), name="canary")
    runtime.launch(put, [x], args=(0, 1.0), sync=False)             # 0: runs
    runtime.launch(copy, [x, src], args=(1,), sync=False)           # 1: runs (other module)
    runtime.launch(copy, [x, src], args=(6,), sync=False)           # 2: faults: src[6]
    runtime.launch(put, [src], args=(0, 5.0), sync=False)           # 3: would fault read-only
    runtime.launch(put, [canary], args=(2, 7.0), sync=False)        # 4: would write the canary
    assert runtime.pending() == 5
    with pytest.raises(CapabilityFault) as e:
        runtime.sync()
    f = e.value
    assert (f.reason, f.kernel, f.buffer, f.index, f.access, f.block, f.line, f.launch_index) == (
        "out-of-bounds", "copy", "src", 6, "load", 0, COPY_LINE, 2)
    assert "launch 2 of the sequence" in str(f)
    np.testing.assert_array_equal(x.numpy(), [1, 1, 0, 0])   # launches 0 and 1 ran
    np.testing.assert_array_equal(canary.numpy(), 0)          # launch 4 did not
    np.testing.assert_array_equal(src.numpy(), [0, 1, 2, 3])
    assert runtime.pending() == 0
    assert _holds(x) == _holds(src) == _holds(canary) == 0
    runtime.sync()  # the fault was reported once: the next sync has nothing to raise


def test_sequence_without_fault_runs_everything(kernels) -> None:
    x = capabilities.wrap(np.zeros(64, np.float32), name="x")
    for i in range(64):
        runtime.launch(kernels.put, [x], args=(i, float(i)), sync=False)
    assert runtime.pending() == 64
    runtime.sync()
    np.testing.assert_array_equal(x.numpy(), np.arange(64, dtype=np.float32))
    assert runtime.pending() == 0 and _holds(x) == 0


def test_sync_launch_raises_the_pending_fault_first(kernels) -> None:
    """A sync=True launch ends a pending sequence: its fault is raised and the
    new launch does not run; the launch after that runs normally."""
    x = capabilities.wrap(np.zeros(4, np.float32), name="x")
    canary = capabilities.wrap(np.zeros(4, np.float32), name="canary")
    runtime.launch(kernels.put, [x], args=(-1, 1.0), sync=False)
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(kernels.put, [canary], args=(0, 9.0))
    assert (e.value.buffer, e.value.index, e.value.launch_index) == ("x", -1, 0)
    np.testing.assert_array_equal(canary.numpy(), 0)
    assert runtime.pending() == 0
    runtime.launch(kernels.put, [canary], args=(0, 9.0))
    assert canary.numpy()[0] == 9.0


def test_a_sync_launch_fault_is_not_a_sequence_fault(kernels) -> None:
    x = capabilities.wrap(np.zeros(4, np.float32), name="x")
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(kernels.put, [x], args=(4, 1.0))
    assert e.value.launch_index is None and "sequence" not in str(e.value)
    assert runtime.pending() == 0


def test_argument_errors_raise_at_the_call_even_with_a_fault_pending(kernels) -> None:
    x = capabilities.wrap(np.zeros(4, np.float32), name="x")
    gone = capabilities.wrap(np.zeros(4, np.float32), name="gone")
    gone.free()
    runtime.launch(kernels.put, [x], args=(8, 1.0), sync=False)  # faults: pending
    with pytest.raises(TypeError):
        runtime.launch(kernels.put, [x], args=(1,), sync=False)
    with pytest.raises(TypeError):
        runtime.launch(kernels.put, [x], args=(1.5, 1.0), sync=False)
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(kernels.put, [gone], args=(0, 1.0), sync=False)
    assert (e.value.reason, e.value.access) == ("freed", "launch")
    with pytest.raises(ValueError, match="runtime.sync"):
        runtime.launch(kernels.put, [x], args=(0, 1.0), sync=False, timeout=1.0)
    with pytest.raises(ValueError):
        runtime.sync(timeout=0)
    assert _holds(x) == 0
    with pytest.raises(CapabilityFault) as e:
        runtime.sync()
    assert (e.value.index, e.value.launch_index) == (8, 0)


def test_grid_zero_is_refused_and_not_a_launch_of_the_sequence(kernels) -> None:
    x = capabilities.wrap(np.zeros(4, np.float32), name="x")
    with pytest.raises(ValueError, match="grid"):
        runtime.launch(kernels.put, [x], args=(9, 1.0), grid=0, sync=False)
    assert runtime.pending() == 0
    runtime.launch(kernels.put, [x], args=(5, 1.0), sync=False)
    assert runtime.pending() == 1
    with pytest.raises(CapabilityFault) as e:
        runtime.sync()
    assert (e.value.index, e.value.launch_index) == (5, 0)


def test_sync_without_pending_launches_is_a_no_op() -> None:
    runtime.sync()
    runtime.sync(timeout=1.0)
    assert runtime.pending() == 0


def test_readme_launch_sequence_example_runs() -> None:
    """The README's "Launch sequences" example, run as written."""
    run_readme_example("Launch sequences")


# ---------------------------------------------------------------------------
# Part 2: the GPU lane's host side on a fake device

RECORD = "rt_gpu_fault"


class FakeDevice:
    """The driver entry points the lane calls, playing a GPU with one stream.

    Launches queue up at cuLaunchKernel and execute, in order, when the host
    synchronises or queries the stream.  ``behaviour[function](launch)``
    decides what a launch does: None (runs and ends), a dict of fault fields
    (it records them as the device prelude's rt_record would), "spin" (runs
    until the record's cancel flag is set, then records a timeout) or
    "stuck" (ignores the cancel flag until ``unstick()``).
    """

    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}   # address -> bytes (allocated, not freed)
        self.freed: list[int] = []
        self._next = 0x7F00_0000_0000
        self.queue: list[SimpleNamespace] = []
        self.ran: list[tuple[str, int]] = []      # (function, launch index) that executed
        self.exited_at_entry: list[tuple[str, int]] = []
        self.behaviour: dict[str, Any] = {}
        self.params: dict[str, list[str]] = {}    # function -> kinds of its user parameters
        self.calls: dict[str, int] = {}
        self.stuck = True
        self.dev = SimpleNamespace(max_threads=1024, side_stream="side", arch="sm_90",
                                   seq_record=0, sm_count=4, attribute=lambda attr: 1,
                                   max_smem_optin=232448)
        self.per_sm = 2  # blocks of any kernel resident per SM (cuOccupancy...)
        self.shared: list[int] = []  # each launch's dynamic shared memory (bytes)
        self.graphs: dict[Any, list[SimpleNamespace]] = {}  # CUgraph -> its nodes
        self.execs: dict[Any, list[SimpleNamespace]] = {}   # CUgraphExec -> its nodes

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    # -- the driver module's functions (the fixture puts these in its place) --------
    def lib(self) -> FakeDevice:
        return self

    def device(self) -> Any:
        return self.dev

    def check(self, rc: int, call: str) -> None:
        if rc:
            raise real_drv.CudaError(call, rc, "FAKE", "fake driver error")

    # -- memory ------------------------------------------------------------------
    def _find(self, address: int) -> tuple[bytearray, int]:
        for base, buf in self.mem.items():
            if base <= address < base + max(len(buf), 1):
                return buf, address - base
        raise AssertionError(f"access to unallocated device address 0x{address:x}")

    def record(self) -> Any:
        return sequence.record_ffi().from_buffer(f"{RECORD} *", self.mem[self.dev.seq_record])

    def cuMemAlloc_v2(self, p: Any, n: int) -> int:
        p[0] = self._next
        self.mem[self._next] = bytearray(n)
        self._next += (n + 0xFFFF) & ~0xFFFF
        return 0

    def cuMemFree_v2(self, address: int) -> int:
        assert address in self.mem, f"cuMemFree of 0x{address:x}: not allocated"
        del self.mem[address]
        self.freed.append(address)
        return 0

    def cuMemsetD8_v2(self, address: int, value: int, n: int) -> int:
        """Ordered on the launch stream, as on the device: runs after the queued kernels."""
        if address == self.dev.seq_record:
            self._count("memset record")
        self._find(address)
        self.queue.append(SimpleNamespace(memset=(address, value, n)))
        return 0

    def cuMemcpyDtoH_v2(self, dst: Any, src: int, n: int) -> int:
        self._count("dtoh")
        assert not self.queue, "the host read device memory before the stream drained"
        buf, off = self._find(src)
        real_drv.ffi().memmove(dst, bytes(buf[off:off + n]), n)
        return 0

    def cuMemcpyHtoD_v2(self, dst: int, src: Any, n: int) -> int:
        """A synchronous copy on the legacy stream: after the launch stream's work."""
        self._count("htod")
        assert self._step(), "a synchronous copy behind a kernel that never ends"
        buf, off = self._find(dst)
        buf[off:off + n] = real_drv.ffi().buffer(real_drv.ffi().cast("char *", src), n)[:]
        return 0

    def cuMemcpyHtoDAsync_v2(self, dst: int, src: Any, n: int, stream: Any) -> int:
        assert stream == "side", "the cancel flag must bypass the busy launch stream"
        buf, off = self._find(dst)
        buf[off:off + n] = real_drv.ffi().buffer(real_drv.ffi().cast("char *", src), n)[:]
        return 0

    # -- launches and the stream -------------------------------------------------
    def _parse(self, fn: Any, gx: int, params: Any) -> SimpleNamespace:
        """A launch as the device sees it: the values of its parameters, copied now."""
        f = real_drv.ffi()
        kinds = self.params[fn]
        n = len(kinds)
        hidden = (int(f.cast("unsigned long long *", params[n])[0]),
                  int(f.cast("int *", params[n + 1])[0]))
        caps = [int(f.cast("unsigned long long *", params[i])[0])  # rt_cap.p
                for i, kind in enumerate(kinds) if kind == "cap"]
        return SimpleNamespace(fn=fn, record=hidden[0], index=hidden[1], caps=caps, grid=gx,
                               started=False)

    def cuLaunchKernel(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                       shared: int, stream: Any, params: Any, extra: Any) -> int:
        self._count("launch")
        self.queue.append(self._parse(fn, gx, params))
        self.shared.append(shared)
        return 0

    # -- graphs: a chain of kernel nodes, each holding its launch as parsed when added -----
    def cuGraphCreate(self, g: Any, flags: int) -> int:
        self._count("graph create")
        g[0] = real_drv.ffi().cast("CUgraph", 0x6000 + 16 * self.calls["graph create"])
        self.graphs[g[0]] = []
        return 0

    def cuGraphAddKernelNode_v2(self, node: Any, graph: Any, deps: Any, ndeps: int,
                                p: Any) -> int:
        nodes = self.graphs[graph]
        assert ndeps == (1 if nodes else 0), "each node depends on the one before"
        assert not nodes or deps[0] == nodes[-1].handle, "each node depends on the one before"
        launch = self._parse(p.func, p.gridDimX, p.kernelParams)
        self._count("graph node")
        launch.handle = real_drv.ffi().cast("CUgraphNode", 0x10_0000 + self.calls["graph node"])
        launch.cooperative = False
        nodes.append(launch)
        node[0] = launch.handle
        return 0

    def cuGraphKernelNodeSetAttribute(self, node: Any, attr: int, value: Any) -> int:
        assert attr == real_drv.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        (launch,) = [n for ns in self.graphs.values() for n in ns if n.handle == node]
        assert launch.grid <= self.per_sm * self.dev.sm_count, "a cooperative grid that cannot fit"
        launch.cooperative = bool(value.cooperative)
        return 0

    def cuGraphInstantiateWithFlags(self, e: Any, graph: Any, flags: int) -> int:
        e[0] = graph
        self.execs[graph] = list(self.graphs[graph])
        return 0

    def cuGraphLaunch(self, e: Any, stream: Any) -> int:
        assert stream == real_drv.ffi().NULL, "graphs go to the launch stream"
        self._count("graph launch")
        self.queue.extend(SimpleNamespace(**{**vars(n), "started": False})
                          for n in self.execs[e])
        return 0

    def cuGraphExecDestroy(self, e: Any) -> int:
        del self.execs[e]
        return 0

    def cuGraphDestroy(self, graph: Any) -> int:
        del self.graphs[graph]
        return 0

    def cuLaunchCooperativeKernel(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int,
                                  bz: int, shared: int, stream: Any, params: Any) -> int:
        self._count("cooperative launch")
        assert gx <= self.per_sm * self.dev.sm_count, "a cooperative grid that cannot fit"
        return self.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, params, None)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, v: Any, fn: Any, block: int,
                                                    shared: int) -> int:
        v[0] = self.per_sm
        return 0

    def _step(self) -> bool:
        """Run the queue as far as it goes; True when it drained."""
        while self.queue:
            launch = self.queue[0]
            if hasattr(launch, "memset"):
                address, value, n = launch.memset
                buf, off = self._find(address)
                buf[off:off + n] = bytes([value]) * n
                self.queue.pop(0)
                continue
            assert launch.record == self.dev.seq_record, "a kernel got another record"
            for p in launch.caps:  # every payload a queued kernel uses is still allocated
                self._find(p)
            rec = self.record()
            if not launch.started and (rec.flag or rec.cancel):  # the prologue: exit at entry
                self.exited_at_entry.append((launch.fn, launch.index))
                self.queue.pop(0)
                continue
            launch.started = True
            what = self.behaviour.get(launch.fn)
            if what in ("spin", "stuck"):
                if what == "stuck" and self.stuck:
                    return False
                if what == "spin" and not rec.cancel:
                    return False
                what = {"kind": abi_code("TIMEOUT"), "slot": -1}
            elif callable(what):
                what = what(launch)
            self.ran.append((launch.fn, launch.index))
            if what:
                rec.flag = 1
                rec.launch = launch.index
                rec.access = 0
                for k, v in what.items():
                    setattr(rec, k, v)
            self.queue.pop(0)
        return True

    def cuStreamSynchronize(self, stream: Any) -> int:
        if stream == "side":
            return 0
        self._count("synchronize")
        assert self._step(), "cuStreamSynchronize on a kernel that never ends"
        return 0

    def cuStreamQuery(self, stream: Any) -> int:
        self._count("query")
        return 0 if self._step() else real_drv.CUDA_ERROR_NOT_READY


def abi_code(name: str) -> int:
    from capqr.capabilities import abi

    return abi.FAULT_CODE[name]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    yield from installed(monkeypatch, FakeDevice())


def installed(monkeypatch: pytest.MonkeyPatch, d: Any) -> Any:
    """Serve the lane's driver calls from the fake ``d`` for one test (a fixture's body):
    afterwards the sequence is drained and no device payload may be left."""
    for entry in ("lib", "device", "check"):  # every module of the lane calls these
        monkeypatch.setattr(real_drv, entry, getattr(d, entry))
    monkeypatch.setattr(sequence, "CANCEL_GRACE", 0.2)
    yield d
    d.stuck = False
    cuda.sync()
    assert not sequence.current.stuck and not sequence.current.held
    pygc.collect()
    for _ in range(6):
        runtime.gc_collect()
        if not memory.device_payloads_owned():
            break
    assert set(d.mem) <= {d.dev.seq_record}, "device payloads leaked"


def _fake_kernel(fake: FakeDevice, src: str, name: str, behaviour: Any = None,
                 checked: bool = True) -> cuda.CudaKernel:
    cs = cuda.translate(src, checked=checked)
    fn = f"{name}@{len(fake.params)}"  # one function handle per "module"
    fake.params[fn] = [kind for _, kind in cs.kernels[name].params]
    fake.behaviour[fn] = behaviour
    return cuda.CudaKernel(name, src, checked, cs, cs.kernels[name], None, fn, 0,
                           dynamic_smem=cs.dynamic_smem.get(name, 0))


def _oob(slot: int, index: int, line: int, block: int = 0, thread: int = 0,
         access: int = 2) -> dict:
    return {"kind": abi_code("OOB"), "slot": slot, "index": index, "line": line,
            "block": block, "thread": thread, "access": access}


def test_fake_one_sync_per_sequence(fake: FakeDevice) -> None:
    """1000 launches, one record reset, no host synchronisation until sync()."""
    k = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(4, np.float32, name="x")
    for i in range(1000):
        runtime.launch(k, [x], args=(i % 4, 1.0), grid=2, block=32, sync=False)
    assert fake.calls.get("launch") == 1000 and len(fake.queue) == 1000 + 3  # + 3 memsets
    assert fake.calls.get("synchronize", 0) == fake.calls.get("query", 0) == 0
    assert fake.calls.get("dtoh", 0) == 0
    assert fake.calls["memset record"] == 1  # reset once, when the sequence started
    assert _holds(x) == 1000 and cuda.pending() == 1000
    runtime.sync()
    assert [i for _, i in fake.ran] == list(range(1000))
    assert fake.calls["synchronize"] == 1 and fake.calls["dtoh"] == 1
    assert _holds(x) == 0 and cuda.pending() == 0


def test_fake_fault_in_the_middle_across_modules(fake: FakeDevice) -> None:
    """Three launches of two modules: the second faults, the third exits at entry,
    and sync names the second launch's kernel and buffer (its own argument names)."""
    put = _fake_kernel(fake, PUT_SRC, "put")
    copy = _fake_kernel(fake, COPY_SRC, "copy", lambda launch: _oob(1, 6, COPY_LINE, 3, 17, 1))
    a = cuda.alloc_device(4, np.float32, name="a")
    b = cuda.alloc_device(4, np.float32, name="b")
    canary = cuda.alloc_device(4, np.float32, name="canary")
    runtime.launch(put, [a], args=(0, 1.0), sync=False)
    runtime.launch(copy, [a, b], args=(6,), grid=4, sync=False)
    runtime.launch(put, [canary], args=(0, 1.0), sync=False)
    assert (_holds(a), _holds(b), _holds(canary)) == (2, 1, 1)
    sync_raises_the_copy_fault(fake, put, copy, [a, b, canary])


def sync_raises_the_copy_fault(fake: FakeDevice, put: Any, copy: Any, bufs: list) -> None:
    """After put, a faulting copy (b[6], block 3, thread 17) and put: sync raises the copy's
    fault as launch 1, the third launch exits at entry, and nothing stays held."""
    with pytest.raises(CapabilityFault) as e:
        runtime.sync()
    f = e.value
    assert (f.reason, f.kernel, f.buffer, f.index, f.access, f.block, f.thread, f.line,
            f.launch_index) == ("out-of-bounds", "copy", "b", 6, "load", 3, 17, COPY_LINE, 1)
    assert fake.ran == [(put.function, 0), (copy.function, 1)]
    assert fake.exited_at_entry == [(put.function, 2)]
    assert [_holds(c) for c in bufs] == [0] * len(bufs)


def test_fake_launch_many_is_the_same_sequence(fake: FakeDevice) -> None:
    """launch_many: the launches of one call join the pending sequence in order
    (launch indices continue it), a fault in the middle stops the rest and sync
    reports it exactly; each distinct buffer is held once for the batch."""
    put = _fake_kernel(fake, PUT_SRC, "put")
    copy = _fake_kernel(fake, COPY_SRC, "copy", lambda launch: _oob(1, 6, COPY_LINE, 3, 17, 1))
    a = cuda.alloc_device(4, np.float32, name="a")
    b = cuda.alloc_device(4, np.float32, name="b")
    canary = cuda.alloc_device(4, np.float32, name="canary")
    runtime.launch(put, [a], args=(0, 1.0), sync=False)  # a sequence already pending
    cuda.launch_many([(put, [a], (1, 2.0), 1, 32), (copy, [a, b], (6,), 4, 32),
                      (put, canary, (0, 1.0), 1, 32)])
    assert cuda.pending() == 4
    assert (_holds(a), _holds(b), _holds(canary)) == (2, 1, 1)
    with pytest.raises(CapabilityFault) as e:
        runtime.sync()
    f = e.value
    assert (f.reason, f.kernel, f.buffer, f.index, f.block, f.thread, f.launch_index) == (
        "out-of-bounds", "copy", "b", 6, 3, 17, 2)
    assert fake.ran == [(put.function, 0), (put.function, 1), (copy.function, 2)]
    assert fake.exited_at_entry == [(put.function, 3)]
    assert (_holds(a), _holds(b), _holds(canary)) == (0, 0, 0)


def test_fake_launch_many_argument_errors(fake: FakeDevice) -> None:
    """An argument error raises at its launch: the launches before it stay in the
    sequence (and keep their holds until sync); a batch that enqueues nothing
    holds nothing; a freed buffer refuses the whole batch before any launch."""
    put = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(4, np.float32, name="x")
    with pytest.raises(TypeError, match="int64_t"):
        cuda.launch_many([(put, [x], (0, 1.0), 1, 32), (put, [x], (1.5, 1.0), 1, 32)])
    assert cuda.pending() == 1 and _holds(x) == 1
    runtime.sync()
    assert _holds(x) == 0
    with pytest.raises(TypeError, match="int64_t"):
        cuda.launch_many([(put, [x], ("0", 1.0), 1, 32)])
    for grid in (-1, 0):
        with pytest.raises(ValueError, match="grid"):
            cuda.launch_many([(put, [x], (0, 1.0), grid, 32)])
    assert cuda.pending() == 0 and _holds(x) == 0
    y = cuda.alloc_device(4, np.float32, name="y")
    y.free()
    launched = fake.calls.get("launch", 0)
    with pytest.raises(CapabilityFault, match="freed"):
        cuda.launch_many([(put, [x], (0, 1.0), 1, 32), (put, [y], (0, 1.0), 1, 32)])
    assert cuda.pending() == 0 and _holds(x) == 0 and fake.calls.get("launch", 0) == launched


def test_fake_next_sequence_starts_clean(fake: FakeDevice) -> None:
    """The record is reset when the next sequence starts: its launches run."""
    bad = _fake_kernel(fake, PUT_SRC, "put", lambda launch: _oob(0, 9, PUT_LINE))
    good = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(4, np.float32, name="x")
    runtime.launch(bad, [x], args=(9, 1.0), sync=False)
    with pytest.raises(CapabilityFault):
        runtime.sync()
    runtime.launch(good, [x], args=(0, 1.0), sync=False)
    runtime.launch(good, [x], args=(1, 1.0), sync=False)
    runtime.sync()
    assert fake.ran[-2:] == [(good.function, 0), (good.function, 1)]


def test_fake_sync_launch_raises_the_pending_fault_first(fake: FakeDevice) -> None:
    bad = _fake_kernel(fake, PUT_SRC, "put", lambda launch: _oob(0, 9, PUT_LINE))
    good = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(4, np.float32, name="x")
    runtime.launch(bad, [x], args=(9, 1.0), sync=False)
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(good, [x], args=(0, 1.0))
    assert (e.value.index, e.value.launch_index) == (9, 0)
    assert fake.calls["launch"] == 1  # the synchronous launch was not issued
    runtime.launch(good, [x], args=(0, 1.0))  # and the one after it runs alone
    assert fake.ran[-1] == (good.function, 0) and _holds(x) == 0


def test_fake_free_and_drop_mid_sequence_keep_the_payload(fake: FakeDevice) -> None:
    """free() and dropping the last handle after enqueueing: the payload stays
    allocated (the fake asserts it at execution) until the sync released the holds."""
    k = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(4, np.float32, name="x")
    y = cuda.alloc_device(4, np.float32, name="y")
    px, py = x.ptr, y.ptr
    runtime.launch(k, [x], args=(0, 1.0), sync=False)
    runtime.launch(k, [y], args=(0, 1.0), sync=False)
    x.free()
    with pytest.raises(CapabilityFault) as e:  # a freed handle is refused at the call
        runtime.launch(k, [x], args=(0, 1.0), sync=False)
    assert e.value.reason == "freed"
    del y
    pygc.collect()
    for _ in range(3):
        runtime.gc_collect()
    assert px in fake.mem and py in fake.mem
    runtime.sync()  # executes both launches: the fake checks their payloads exist
    for _ in range(3):
        runtime.gc_collect()
    assert px not in fake.mem and py not in fake.mem


def test_fake_timeout_cancels_the_sequence(fake: FakeDevice) -> None:
    """sync(timeout) raises KernelTimeout naming the launch that was running; it
    stopped at a pollcheck and the launches after it exit at entry."""
    put = _fake_kernel(fake, PUT_SRC, "put")
    spin = _fake_kernel(fake, COPY_SRC, "copy", "spin")
    x = cuda.alloc_device(4, np.float32, name="x")
    runtime.launch(put, [x], args=(0, 1.0), sync=False)
    runtime.launch(spin, [x, x], args=(0,), sync=False)
    runtime.launch(put, [x], args=(1, 1.0), sync=False)
    with pytest.raises(KernelTimeout) as e:
        runtime.sync(timeout=0.1)
    assert (e.value.kernel, e.value.timeout) == ("copy", 0.1)
    assert fake.ran == [(put.function, 0), (spin.function, 1)]
    assert fake.exited_at_entry == [(put.function, 2)]
    assert _holds(x) == 0


def test_fake_raw_kernels_take_no_hidden_parameters(fake: FakeDevice) -> None:
    """Raw builds stay free of the sequence check: no hidden parameters, no entry check."""
    raw = _fake_kernel(fake, PUT_SRC, "put", checked=False)
    x = cuda.alloc_device(4, np.float32, name="x")
    slots = []

    def launch_kernel(fn: Any, *a: Any) -> int:
        slots.append(real_drv.ffi().sizeof(a[-2]) // real_drv.ffi().sizeof("void *"))
        return 0

    fake.cuLaunchKernel = launch_kernel
    runtime.launch(raw, [x], args=(0, 1.0), sync=False)
    runtime.sync()
    assert slots == [3]  # x, i, v
    assert "__rt_seq" not in raw.cuda.text and "RT_PROLOGUE(" not in raw.cuda.text.split(
        "kernel source follows")[1]
    assert "RT_PROLOGUE(__rt_seq, __rt_launch)" in cuda.translate(PUT_SRC).text


def test_fake_interrupt_while_waiting_cancels_and_keeps_the_holds(
        fake: FakeDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in sync(timeout): the sequence is cancelled as at a deadline, the
    interrupt propagates, and the buffers stay held until the stream is idle."""
    import time

    spin = _fake_kernel(fake, PUT_SRC, "put", "spin")
    after = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(4, np.float32, name="x")
    runtime.launch(spin, [x], args=(0, 1.0), sync=False)
    runtime.launch(after, [x], args=(1, 1.0), sync=False)

    def interrupted(_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sequence, "time", SimpleNamespace(monotonic=time.monotonic,
                                                       sleep=interrupted))
    with pytest.raises(KeyboardInterrupt):
        runtime.sync(timeout=30)
    monkeypatch.setattr(sequence, "time", time)
    assert fake.record().cancel == 1 and _holds(x) == 2 and cuda.pending() == 0
    runtime.sync()  # the spinning kernel saw the cancel; the next launch exited at entry
    assert fake.exited_at_entry == [(after.function, 1)] and _holds(x) == 0


GROUP_SRC = """
KERNEL void total(cap_t part, int64_t i)
{
    cap_store_f32(part, i, 1.0f);
    rt_group_sync();
}
"""


def test_fake_group_kernels_launch_cooperatively(fake: FakeDevice) -> None:
    """A kernel that calls rt_group_sync goes through cuLaunchCooperativeKernel, alone
    or in a launch_many batch (6-tuples), and takes part in the sequence as any launch;
    other kernels still go through cuLaunchKernel."""
    g = _fake_kernel(fake, GROUP_SRC, "total")
    put = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(8, np.float32, name="x")
    runtime.launch(g, [x], args=(0,), grid=8, block=64, group=8, sync=False)
    cuda.launch_many([(put, [x], (1, 1.0), 1, 32), (g, [x], (2,), 4, 64, 4)])
    assert fake.calls["cooperative launch"] == 2 and fake.calls["launch"] == 3
    runtime.sync()
    assert [f for f, _ in fake.ran] == [g.function, put.function, g.function]
    assert _holds(x) == 0


def test_fake_group_arguments_are_refused_before_anything_runs(fake: FakeDevice) -> None:
    g = _fake_kernel(fake, GROUP_SRC, "total")
    put = _fake_kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(8, np.float32, name="x")
    cases = [
        (lambda: runtime.launch(g, [x], args=(0,), grid=8, block=64), "group=8 "),
        (lambda: runtime.launch(g, [x], args=(0,), grid=8, block=64, group=4), "whole grid"),
        (lambda: runtime.launch(g, [x], args=(0,), grid=8, block=64, group=True),
         "group must be an int"),
        (lambda: runtime.launch(g, [x], args=(0,), grid=9, block=64, group=9),
         "at most 8 of them"),  # 4 SMs x 2 resident blocks
        (lambda: runtime.launch(put, [x], args=(0, 1.0), grid=1, block=32, group=1),
         "does not"),
        (lambda: cuda.launch_many([(g, [x], (0,), 8, 64)]), "group=8 "),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
        assert cuda.pending() == 0 and _holds(x) == 0
    with pytest.raises(TypeError, match="tuples"):
        cuda.launch_many([(g, [x], (0,), 8, 64, 8, "extra")])
    assert fake.calls.get("launch", 0) == 0 and cuda.pending() == 0


_translate_once = functools.cache(cuda.translate)


@pytest.mark.parametrize("batch,n,tall_rows,two_panel,whole,reg", [
    (3, 161, None, False, False, True), (3, 161, None, True, False, True),
    (1, 300, 64, True, True, True), (1, 96, "auto", False, None, True),
    (2, 40, "auto", False, True, True), (1, 176, None, False, True, True),
    (3, 161, None, True, False, False), (1, 300, None, False, False, False)])
def test_fake_gpu_qr_plan_launches_as_its_kernels_declare(fake: FakeDevice, monkeypatch,
                                                           batch: int, n: int, tall_rows,
                                                           two_panel: bool, whole,
                                                           reg: bool) -> None:
    """kernels.gpu.qr_launch on the fake device, with the real kernel sources: every
    launch of the plan (one or two panels per update, column steps where the grid
    fits, the panels in registers (reg=True) or by gpu_qr_panel_small / gpu_qr_panel
    (reg=False), or the one launch of gpu_qr_whole, with its dynamic shared memory past
    48 KB) passes the lane's argument, block-size and group checks against its
    kernel's signature, runs, and the sequence syncs once."""
    from capqr.kernels import gpu as g

    monkeypatch.setattr(cuda, "translate", _translate_once)  # the sources are the same
    wholes = [f"whole{cap}" for cap, _ in g.gen_whole.CLASSES]
    pregs = ["preg32", "preg64", "preg128", "preg256"]  # gpu_qr_panel_reg: what the plans reach
    ks = {kind: _fake_kernel(fake, src, name) for kind, (src, name, _) in
          ((k, g._kernel_spec(k)) for k in ["panel", "panel_small", "steps", "update_z",
                                            "update_apply", "update2_z", "update2_apply"]
           + pregs + (wholes if whole else []))}
    monkeypatch.setattr(g, "blocked_kernels", lambda checked=True: ks)
    A = cuda.alloc_device((batch, n, n), np.float32, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    ws = (g.Workspace.alloc(batch, n)
          if g.needs_workspace(batch, n, whole, per_matrix=False) else None)
    try:
        g.qr_launch(A, tau, ws, n, tall_rows=tall_rows, two_panel=two_panel, whole=whole,
                    reg=reg, per_matrix=False)
        plan = g.launch_plan(batch, n, tall_rows, ks["steps"].max_group(g.STEP_BLOCK),
                             two_panel, whole, reg=reg, per_matrix=False)
        assert [f.split("@")[0] for f, _ in fake.ran] == [
            g._kernel_spec(s.kernel)[1] for s in plan]
        kinds = {s.kernel for s in plan}
        if whole and n <= 232:  # one launch, one block per matrix
            assert [(s.kernel, s.grid, s.args) for s in plan] == [
                (f"whole{g.whole_class(n)[0]}", batch, (n, batch))]
            assert fake.shared == [ks[plan[0].kernel].dynamic_smem]
            assert (fake.shared[0] > 48 * 1024) == (n > 128) and ws is None
        else:
            assert ("update2_z" in kinds) == two_panel
            assert ("steps" in kinds) == (n == 300 and tall_rows is not None)
            gr = g.gen_panel_reg  # reg: the other panels in registers
            panels = [s for s in plan if s.kernel != "steps" and not s.kernel.startswith("update")]
            assert panels and [s.kernel for s in panels] == [
                f"preg{gr.capacity(*gr.find_class(n - s.args[1]))}" if reg else
                "panel_small" if n - s.args[1] <= g.SMALL_ROWS else "panel" for s in panels]
        assert fake.calls["synchronize"] == 1
    finally:
        if ws is not None:
            ws.free()
        A.free()
        tau.free()


def test_fake_gpu_qr_gives_lane_one_its_buffers(fake: FakeDevice, monkeypatch) -> None:
    """kernels.gpu.qr where the plan runs on two lanes (one matrix of 1024 columns
    without column steps: use_lookahead's rule) gives lane 1's updates buffers of their
    own.  qr() once sized its workspace for tall_rows="auto" (column steps, one lane)
    while the plan had none, and every such call raised "a look-ahead plan needs
    Workspace.alloc(..., lookahead=True)" (on an H100, test_gpu_qr.py's
    test_contest_shape[8-2048] and [2-4096], which factor one matrix with tall_rows=None).
    The launches are recorded, not run: the fake device has no second stream."""
    from capqr.kernels import gpu as g

    monkeypatch.setattr(cuda, "translate", _translate_once)
    pregs = ["preg32", "preg64", "preg128", "preg256"]
    ks = {kind: _fake_kernel(fake, src, name) for kind, (src, name, _) in
          ((k, g._kernel_spec(k)) for k in ["panel", "panel_small", "steps", "update_z",
                                            "update_apply"] + pregs)}
    monkeypatch.setattr(g, "blocked_kernels", lambda checked=True: ks)
    seen: list = []
    monkeypatch.setattr(cuda, "launch_many", lambda launches, lanes=None: seen.append(
        (launches, lanes)))
    monkeypatch.setattr(cuda, "sync", lambda timeout=None: fake._step())  # the memsets
    n = g.LOOKAHEAD_MIN_N
    assert g.use_lookahead(1, n, None)
    g.qr(np.zeros((1, n, n), np.float32), tall_rows=None)
    (launches, lanes), = seen
    assert lanes is not None and {lane for lane, _ in lanes} == {0, 1}
    update_bufs = {0: set(), 1: set()}  # the Z scratch and V^T of each lane's updates
    for (kern, caps, *_), (lane, _) in zip(launches, lanes, strict=True):
        if kern.name.startswith("gpu_qr_update"):
            assert all(c is not None for c in caps)
            update_bufs[lane] |= {id(c) for c in caps[-2:]}
    assert update_bufs[0] and update_bufs[1] and not update_bufs[0] & update_bufs[1]


def test_to_device_frees_its_buffer_when_the_copy_fails(fake: FakeDevice, monkeypatch) -> None:
    """cuda.to_device whose upload fails raises the driver's error and frees the buffer
    it made: the collector releases it while the caller still holds the traceback,
    whose frame holds the handle (before, the buffer lived as long as the traceback)."""
    monkeypatch.setattr(fake, "cuMemcpyHtoD_v2", lambda dst, src, n: 700)  # ILLEGAL_ADDRESS
    before = set(fake.mem)
    with pytest.raises(Exception, match="cuMemcpyHtoD") as err:
        cuda.to_device(np.ones(1024, np.float32), name="x")
    for _ in range(6):
        runtime.gc_collect()
        if set(fake.mem) == before:
            break
    assert set(fake.mem) == before, "the failed upload's buffer is still allocated"
    assert err.value is not None  # the traceback was alive all along
