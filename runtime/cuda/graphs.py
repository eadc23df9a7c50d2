"""A launch sequence recorded once and replayed as one CUDA graph launch.

A host-driven plan of hundreds of launches costs the host 20-55 us per launch to
enqueue (parameter packing, checks, cuLaunchKernel), which is on the critical path
wherever a kernel runs for less than that.  :func:`record` builds the sequence as
a CUDA graph, one kernel node after the other (cuGraphAddKernelNode: the driver
copies each node's parameters), and :meth:`LaunchGraph.launch` enqueues all of it
with one cuGraphLaunch.

What a launch promises stays as it is:

- the parameters are packed by the same ParamBlock as a launch's, so every
  checked kernel gets the sequence record and its index in the sequence (the
  graph's launches are indices 0 .. n-1: a replay first syncs a pending sequence);
- a replay clears the record, holds every buffer until the sync that covers it and
  registers each node as a launch of the sequence, so ``sync`` raises the first
  fault with its kernel, buffer and ``launch_index`` as for ``launch_many``;
- the bounds in the nodes are those of the buffers at :func:`record`; a buffer
  freed since is refused at the replay (the hold checks every buffer first), so a
  graph never runs on memory that was given back;
- a context reset (runtime/cuda/sequence.py) takes the graph with the context, and
  every buffer of the graph too: a replay after it is refused as a launch of those
  buffers is (CapabilityFault "lost").

Not on the isolated lane (its driver is in another process): :func:`record`
raises CudaUnavailable there, and callers launch the sequence instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import driver as drv
from .kernel import CudaKernel
from .lanes import check_lanes, predecessors
from .launches import check_block, check_cooperative, distinct_caps, launch_entries
from .memory import DeviceCapability, drain_all, hold_all, unhold_all
from .params import ParamBlock
from .sequence import current, device_record, reset_record, sync_locked

#: (kernel, caps, args, grid, block, group): launch_many's entries
Entry = tuple[CudaKernel, Sequence[DeviceCapability], Sequence[Any], int, int, Any]


class LaunchGraph:
    """A recorded launch sequence (:func:`record`); :meth:`launch` enqueues it."""

    def __init__(self, entries: list[Entry],
                 lanes: list[tuple[int, tuple[int, ...]]] | None = None):
        self.entries = entries
        #: per node, the nodes it depends on (lanes.predecessors: a chain without lanes)
        self.deps = predecessors(lanes or [(0, ())] * len(entries))
        self.caps = distinct_caps(entries)
        self.names: list[tuple[CudaKernel, list[str]]] = []
        self._graph: Any = None
        self._exec: Any = None
        self._epoch = -1
        with current.lock:
            held = hold_all(self.caps)  # the bounds packed below are of live buffers
            try:
                self._build()
            finally:
                unhold_all(held)

    def __len__(self) -> int:
        return len(self.entries)

    def _build(self) -> None:
        """Record the nodes in the current context (the caller holds the buffers).  Every
        launch's arguments are checked and packed before the graph is created."""
        L, f = drv.lib(), drv.ffi()
        dev = drv.device()
        record = dev.seq_record or device_record(dev)
        epoch = drv.context_epoch()
        nodes = []
        for index, (kernel, caps, args, grid, block, group) in enumerate(self.entries):
            check_block(kernel, block, dev)
            cooperative = check_cooperative(kernel, group, grid, block)
            params = ParamBlock(kernel)  # the driver copies the values at AddKernelNode
            names = params.pack(caps, args, record, index)
            nodes.append((kernel, names, params, cooperative, grid, block))
        graph = f.new("CUgraph *")
        drv.check(L.cuGraphCreate(graph, 0), "cuGraphCreate")
        try:
            node = f.new("CUgraphNode *")
            made = []
            for index, (kernel, _, params, cooperative, grid, block) in enumerate(nodes):
                prev = f.new("CUgraphNode[]", [made[j] for j in self.deps[index]] or 1)
                p = f.new("CUDA_KERNEL_NODE_PARAMS_v2 *")
                p.func = kernel.live_function()
                p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
                p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
                p.sharedMemBytes = kernel.dynamic_smem
                p.kernelParams = params.params
                drv.check(L.cuGraphAddKernelNode_v2(node, graph[0], prev,
                                                    len(self.deps[index]), p),
                          "cuGraphAddKernelNode")
                if cooperative:
                    value = f.new("CUlaunchAttributeValue *")
                    value.cooperative = 1
                    drv.check(L.cuGraphKernelNodeSetAttribute(
                        node[0], drv.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, value),
                        "cuGraphKernelNodeSetAttribute")
                made.append(node[0])
            exec_ = f.new("CUgraphExec *")
            drv.check(L.cuGraphInstantiateWithFlags(exec_, graph[0], 0),
                      "cuGraphInstantiateWithFlags")
        except BaseException:
            L.cuGraphDestroy(graph[0])
            raise
        self._graph, self._exec, self._epoch = graph[0], exec_[0], epoch
        self.names = [(kernel, names) for kernel, names, *_ in nodes]

    def launch(self) -> None:
        """Enqueue the graph as launches 0 .. n-1 of a new sequence (a pending sequence
        is synced first, raising its fault); ``runtime.cuda.sync`` waits for it.
        ValueError after :meth:`close`."""
        if self._exec is None:
            raise ValueError("this LaunchGraph was closed: record_graph() a new one")
        with current.lock:
            drain_all()
            sync_locked(None)
            # refuses a buffer freed since record(), or lost with a reset of the context
            # (which took the graph with it: every buffer of the graph is older)
            held = hold_all(self.caps)
            try:
                dev = drv.device()
                reset_record(dev.seq_record)
                drv.check(drv.lib().cuGraphLaunch(self._exec, drv.ffi().NULL), "cuGraphLaunch")
            except BaseException:
                unhold_all(held)
                raise
            current.launches.extend(self.names)
            current.held.extend(held)

    def close(self) -> None:
        """Destroy the graph and drop its buffers (the driver frees a graph still running
        once it ends; a graph of a context that was reset went with it).  Idempotent."""
        if self._exec is not None and self._epoch == drv.context_epoch():
            L = drv.lib()
            L.cuGraphExecDestroy(self._exec)
            L.cuGraphDestroy(self._graph)
        self._graph = self._exec = None
        self.entries, self.caps = [], []  # the buffers are the collector's again


def record(launches: Sequence[tuple[Any, ...]],
           lanes: Sequence[tuple[int, Sequence[int]]] | None = None) -> LaunchGraph:
    """A :class:`LaunchGraph` of ``(kernel, caps, args, grid, block)`` or ``(..., block,
    group)`` launches, as :func:`runtime.cuda.launch_many` takes them.  Every argument
    is checked as a launch checks it (counts, types, grid, block, a freed buffer);
    nothing runs until :meth:`LaunchGraph.launch`.  CudaUnavailable on the isolated
    lane.  ``lanes`` as for launch_many: each node depends on the node before it on its
    lane and on its ``after`` (the graph has no stream priorities)."""
    if drv.isolated():
        raise drv.CudaUnavailable("CUDA graphs are not available on the isolated lane (its "
                                  "driver runs in a device process): launch the sequence")
    entries = [(kernel, caps, tuple(args), int(grid), int(block), group)
               for kernel, caps, args, grid, block, group in launch_entries(launches,
                                                                           "record_graph")]
    if not entries:
        raise ValueError("record_graph: no launch to record")
    return LaunchGraph(entries, check_lanes(lanes, len(entries)))
