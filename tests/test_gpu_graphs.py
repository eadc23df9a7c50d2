"""A launch sequence recorded as a CUDA graph (runtime/cuda/graphs.py) and replayed.

Part 1 runs the lane's host side on the fake device of tests/test_launch_sequence.py,
which keeps each graph node's launch as the driver copies it at cuGraphAddKernelNode
and queues the nodes at cuGraphLaunch: a replay is the same sequence as the launches
(indices, record, holds, the fault and its launch index), nothing runs at record, a
buffer freed since the record is refused before anything is queued, and a context
reset records the graph again.  Part 2 runs kernels.gpu.qr_launch with graphs on a
real GPU (skipped without one): bitwise the launch sequence's results, and a checked
fault inside a graph is reported as the sequence reports it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from capqr import runtime
from capqr.runtime import CapabilityFault, cuda
from capqr.runtime.cuda import driver as real_drv
from test_launch_sequence import (
    COPY_LINE,
    COPY_SRC,
    GROUP_SRC,
    PUT_SRC,
    FakeDevice,
    _holds,
    _oob,
    installed,
    sync_raises_the_copy_fault,
)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    yield from installed(monkeypatch, FakeDevice())


def _kernel(fake: FakeDevice, src: str, name: str, behaviour: Any = None) -> cuda.CudaKernel:
    """A kernel of the fake device whose function handle is a pointer, as the driver's
    (a graph node stores it in CUDA_KERNEL_NODE_PARAMS)."""
    cs = cuda.translate(src, checked=True)
    fn = real_drv.ffi().cast("CUfunction", 0x9000 + 16 * len(fake.params))
    fake.params[fn] = [kind for _, kind in cs.kernels[name].params]
    fake.behaviour[fn] = behaviour
    return cuda.CudaKernel(name, src, True, cs, cs.kernels[name], None, fn, 0)


def test_fake_graph_replays_the_sequence(fake: FakeDevice) -> None:
    """Nothing runs at record; each replay is one cuGraphLaunch after one reset of the
    record, runs the launches as indices 0 .. n-1, holds each buffer once until the
    sync, and can be replayed again."""
    put = _kernel(fake, PUT_SRC, "put")
    copy = _kernel(fake, COPY_SRC, "copy")
    a = cuda.alloc_device(4, np.float32, name="a")
    b = cuda.alloc_device(4, np.float32, name="b")
    graph = cuda.record_graph([(put, [a], (0, 1.0), 2, 32), (copy, [b, a], (1,), 1, 32),
                               (put, a, (2, 3.0), 1, 32)])
    assert len(graph) == 3 and fake.calls.get("launch", 0) == 0
    assert not [q for q in fake.queue if not hasattr(q, "memset")]  # only alloc's zeroing
    assert cuda.pending() == 0 and (_holds(a), _holds(b)) == (0, 0)
    for replay in (1, 2):
        graph.launch()
        assert cuda.pending() == 3 and (_holds(a), _holds(b)) == (1, 1)
        assert fake.calls["graph launch"] == replay and fake.calls["memset record"] == replay
        runtime.sync()
        assert fake.ran[-3:] == [(put.function, 0), (copy.function, 1), (put.function, 2)]
        assert (_holds(a), _holds(b)) == (0, 0) and cuda.pending() == 0
    assert fake.calls.get("launch", 0) == 0 and fake.calls["graph create"] == 1
    graph.close()
    graph.close()  # idempotent
    assert not fake.graphs and not fake.execs and not graph.caps
    with pytest.raises(ValueError, match="closed"):
        graph.launch()
    assert cuda.pending() == 0 and (_holds(a), _holds(b)) == (0, 0)


def test_fake_graph_fault_is_the_sequences(fake: FakeDevice) -> None:
    """The second node faults: sync names its kernel, buffer and launch index, and the
    third exits at entry, as in a launched sequence."""
    put = _kernel(fake, PUT_SRC, "put")
    copy = _kernel(fake, COPY_SRC, "copy", lambda launch: _oob(1, 6, COPY_LINE, 3, 17, 1))
    a = cuda.alloc_device(4, np.float32, name="a")
    b = cuda.alloc_device(4, np.float32, name="b")
    canary = cuda.alloc_device(4, np.float32, name="canary")
    graph = cuda.record_graph([(put, [a], (0, 1.0), 1, 32), (copy, [a, b], (6,), 4, 32),
                               (put, [canary], (0, 1.0), 1, 32)])
    graph.launch()
    sync_raises_the_copy_fault(fake, put, copy, [a, b, canary])
    graph.close()


def test_fake_graph_refuses_a_buffer_freed_since_the_record(fake: FakeDevice) -> None:
    """The nodes hold the bounds of the record: a replay after a free() would run on
    memory given back, so it raises before anything is queued or held."""
    put = _kernel(fake, PUT_SRC, "put")
    a = cuda.alloc_device(4, np.float32, name="a")
    b = cuda.alloc_device(4, np.float32, name="b")
    graph = cuda.record_graph([(put, [a], (0, 1.0), 1, 32), (put, [b], (0, 1.0), 1, 32)])
    b.free()
    with pytest.raises(CapabilityFault) as e:
        graph.launch()
    assert e.value.reason == "freed" and e.value.buffer == "b"
    assert not [q for q in fake.queue if not hasattr(q, "memset")]
    assert cuda.pending() == 0 and _holds(a) == 0 and fake.calls.get("graph launch", 0) == 0
    graph.close()


def test_fake_graph_syncs_a_pending_sequence_first(fake: FakeDevice) -> None:
    """The graph's launches are indices 0 .. n-1 of their own sequence: a pending one is
    synced first, and its fault raised there, before the graph is enqueued."""
    put = _kernel(fake, PUT_SRC, "put")
    copy = _kernel(fake, COPY_SRC, "copy", lambda launch: _oob(1, 6, COPY_LINE, 0, 0, 1))
    a = cuda.alloc_device(4, np.float32, name="a")
    graph = cuda.record_graph([(put, [a], (0, 1.0), 1, 32)])
    runtime.launch(copy, [a, a], args=(6,), grid=1, block=32, sync=False)
    with pytest.raises(CapabilityFault) as e:
        graph.launch()
    assert e.value.kernel == "copy" and fake.calls.get("graph launch", 0) == 0
    assert cuda.pending() == 0 and _holds(a) == 0
    runtime.launch(put, [a], args=(1, 1.0), grid=1, block=32, sync=False)
    graph.launch()  # the pending put ran first
    assert fake.ran[-1] == (put.function, 0) and cuda.pending() == 1
    runtime.sync()
    assert fake.ran[-1] == (put.function, 0) and fake.calls["graph launch"] == 1
    graph.close()


def test_fake_graph_arguments_are_checked_at_record(fake: FakeDevice) -> None:
    """A wrong argument count, a group that is not the whole grid, or a freed buffer is
    refused by record_graph as launch refuses it, and no graph is created."""
    put = _kernel(fake, PUT_SRC, "put")
    total = _kernel(fake, GROUP_SRC, "total")
    x = cuda.alloc_device(8, np.float32, name="x")
    freed = cuda.alloc_device(8, np.float32, name="freed")
    freed.free()
    with pytest.raises(TypeError):
        cuda.record_graph([(put, [x], (0,), 1, 32)])
    with pytest.raises(ValueError, match="whole grid"):
        cuda.record_graph([(total, [x], (0,), 8, 64, 4)])
    with pytest.raises(CapabilityFault):
        cuda.record_graph([(put, [freed], (0, 1.0), 1, 32)])
    with pytest.raises(TypeError, match="tuples"):
        cuda.record_graph([(put, [x], (0, 1.0), 1)])
    with pytest.raises(ValueError, match="grid must be at least 1"):
        cuda.record_graph([(put, [x], (0, 1.0), 0, 32)])
    with pytest.raises(ValueError, match="no launch"):
        cuda.record_graph([])
    assert fake.calls.get("graph create", 0) == 0 and _holds(x) == 0


def test_fake_graph_group_nodes_are_cooperative(fake: FakeDevice) -> None:
    """A kernel that calls rt_group_sync becomes a cooperative node; the others do not."""
    put = _kernel(fake, PUT_SRC, "put")
    total = _kernel(fake, GROUP_SRC, "total")
    x = cuda.alloc_device(8, np.float32, name="x")
    graph = cuda.record_graph([(put, [x], (1, 1.0), 1, 32), (total, [x], (2,), 4, 64, 4)])
    (nodes,) = fake.execs.values()
    assert [n.cooperative for n in nodes] == [False, True]
    graph.launch()
    runtime.sync()
    assert fake.ran == [(put.function, 0), (total.function, 1)]
    graph.close()


def test_fake_graph_after_a_context_reset_is_refused(
        fake: FakeDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reset of the context takes its graphs and every buffer allocated before it: a
    replay is refused as a launch of a lost buffer is, before any driver call, and
    close() leaves the dead handles alone."""
    put = _kernel(fake, PUT_SRC, "put")
    x = cuda.alloc_device(4, np.float32, name="x")
    graph = cuda.record_graph([(put, [x], (0, 1.0), 1, 32)])
    graph.launch()
    runtime.sync()
    before = real_drv._epoch
    monkeypatch.setattr(real_drv, "_epoch", [real_drv.context_epoch() + 1])
    with pytest.raises(CapabilityFault) as e:
        graph.launch()
    assert e.value.reason == "lost" and fake.calls["graph launch"] == 1
    assert cuda.pending() == 0
    graph.close()
    assert fake.graphs and fake.execs  # the reset context's: not destroyed through it
    fake.graphs.clear()
    fake.execs.clear()
    monkeypatch.setattr(real_drv, "_epoch", before)  # x is this context's again: freed


def test_fake_gpu_qr_with_graphs_replays_the_plan(fake: FakeDevice, monkeypatch) -> None:
    """kernels.gpu.qr_launch(graphs=...): the first call records the plan (the same kernels
    in the same order as launch_many), later calls on the same buffers replay it, and
    other buffers get a graph of their own."""
    from capqr.kernels import gpu as g

    kinds = ["panel", "panel_small", "steps", "update_z", "update_apply", "preg32"]
    ks = {kind: _kernel(fake, *g._kernel_spec(kind)[:2]) for kind in kinds}
    monkeypatch.setattr(g, "blocked_kernels", lambda checked=True: ks)
    fake.per_sm = 8  # the column steps' cooperative grid fits
    batch, n = 2, 300
    A = cuda.alloc_device((batch, n, n), np.float32, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    tau2 = cuda.alloc_device((batch, n), np.float32, name="tau2")
    ws = g.Workspace.alloc(batch, n)
    graphs: dict = {}
    try:
        g.qr_launch(A, tau, ws, n, reg=False, per_matrix=False)
        eager = list(fake.ran)
        for _ in range(2):
            g.qr_launch(A, tau, ws, n, reg=False, per_matrix=False, graphs=graphs)
            assert fake.ran[-len(eager):] == eager
        assert len(graphs) == 1 and fake.calls["graph launch"] == 2
        steps = [i for i, (f, _) in enumerate(eager) if f == ks["steps"].function]
        (nodes,) = fake.execs.values()
        assert steps and [i for i, n in enumerate(nodes) if n.cooperative] == steps
        g.qr_launch(A, tau2, ws, n, reg=False, per_matrix=False, graphs=graphs)
        assert len(graphs) == 2 and fake.ran[-len(eager):] == eager
    finally:
        for gr in graphs.values():
            gr.close()
        graphs.clear()
        ws.free()
        for c in (A, tau, tau2):
            c.free()


# ---------------------------------------------------------------------------
# Part 2: a real GPU
# ---------------------------------------------------------------------------
def _gpu() -> None:
    ok, why = cuda.available()
    if not ok:
        pytest.skip(f"no GPU: {why}")


@pytest.mark.gpu
@pytest.mark.parametrize("batch,n", [(20, 32), (3, 176), (2, 520)])
def test_gpu_qr_graph_gives_the_sequences_bits(batch: int, n: int) -> None:
    """The graph of a plan (one block per matrix panels, updates, and for (2,520) the
    cooperative column steps) gives bitwise the launched sequence's H and tau, checked
    and raw, on every replay."""
    _gpu()
    from capqr.kernels import gpu as g

    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    A0 = cuda.to_device(a, perms="r", name="A0")
    A = cuda.alloc_device(a.shape, np.float32, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    ws = g.Workspace.alloc(batch, n)
    graphs: dict = {}

    def run(checked: bool, use: bool) -> tuple[np.ndarray, np.ndarray]:
        real_drv.check(real_drv.lib().cuMemcpyDtoD_v2(A.ptr, A0.ptr, A.nbytes), "copy")
        g.qr_launch(A, tau, ws, n, checked=checked, graphs=graphs if use else None)
        return A.numpy(), tau.numpy()

    try:
        for checked in (True, False):
            want = run(checked, False)
            for _ in range(2):
                got = run(checked, True)
                assert all(np.array_equal(x.view(np.uint32), y.view(np.uint32))
                           for x, y in zip(want, got, strict=True))
        assert len(graphs) == 2
    finally:
        for gr in graphs.values():
            gr.close()
        ws.free()
        for c in (A0, A, tau):
            c.free()


@pytest.mark.gpu
def test_gpu_graph_fault_names_the_launch() -> None:
    """A checked out-of-bounds store in the second node of a graph: sync raises it with the
    kernel, buffer, index and launch index, the third node exits at entry (its canary
    stays), and a replay after the fault runs again from a clean record."""
    _gpu()
    put = cuda.compile(PUT_SRC, "put")
    x = cuda.to_device(np.zeros(4, np.float32), name="x")
    canary = cuda.to_device(np.zeros(4, np.float32), name="canary")
    graph = cuda.record_graph([(put, [x], (0, 1.0), 1, 32), (put, [x], (9, 2.0), 1, 32),
                               (put, [canary], (0, 5.0), 1, 32)])
    try:
        for _ in range(2):
            graph.launch()
            with pytest.raises(CapabilityFault) as e:
                cuda.sync()
            f = e.value
            assert (f.reason, f.kernel, f.buffer, f.index, f.launch_index) == (
                "out-of-bounds", "put", "x", 9, 1)
            assert x.numpy()[0] == 1.0 and canary.numpy()[0] == 0.0
    finally:
        graph.close()
        x.free()
        canary.free()
