"""capqr's GPU lane: capability-checked CUDA kernels through the driver API and NVRTC.

Public face (routed to by ``capabilities.alloc(..., device="cuda")``,
``capabilities.wrap(torch_cuda_tensor)``, ``runtime.compile(..., target="cuda")``
and ``runtime.launch``):

* :func:`alloc_device`, :func:`to_device`, :func:`wrap_device` -> :class:`DeviceCapability`
* :func:`compile` -> :class:`CudaKernel`; :func:`launch` (``sync=False`` enqueues),
  :func:`launch_many` (enqueues a list at a lower host cost per launch);
  :func:`sync` (waits for the sequence, raises its first fault); :func:`time_launch`
* :func:`record_graph` -> :class:`LaunchGraph`: a launch sequence recorded once as a CUDA
  graph, enqueued by one ``LaunchGraph.launch()`` (``graphs``)
* :func:`available` -> (bool, reason) — False on machines without a GPU.
* :func:`isolate` (or ``CAPQR_CUDA_ISOLATE=1``): run the driver in a device process
  the lane restarts to end a kernel that ignores its cancel (``remote``).

Importing this package never touches the driver; the first call that needs
it loads ``libcuda`` and raises :class:`CudaUnavailable` when there is none.

Modules by job: ``memory`` (device capabilities, their holds and deferred
release), ``kernel`` (the lane's target of runtime/pipeline.py: CUDA lowering,
NVRTC build), ``params`` (a launch's parameter block), ``launches`` (launch
rules, enqueueing), ``sequence`` (the sequence's device record, waiting,
``sync``), ``graphs`` (recorded sequences), ``timing``; ``lower``, ``nvrtc``,
``driver`` and ``remote`` (the isolated lane's device process) below them.
"""

from __future__ import annotations

from .driver import CudaError, CudaUnavailable, available, isolate
from .graphs import LaunchGraph
from .graphs import record as record_graph
from .kernel import CudaKernel, compile, translate
from .launches import launch, launch_many
from .lower import CudaSource, instrument
from .memory import DeviceCapability, alloc_device, to_device, wrap_device
from .sequence import pending, sync
from .timing import time_launch

__all__ = [
    "CudaError",
    "CudaKernel",
    "CudaSource",
    "CudaUnavailable",
    "DeviceCapability",
    "LaunchGraph",
    "alloc_device",
    "available",
    "compile",
    "instrument",
    "isolate",
    "launch",
    "launch_many",
    "pending",
    "record_graph",
    "sync",
    "time_launch",
    "to_device",
    "translate",
    "wrap_device",
]
