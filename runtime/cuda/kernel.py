"""GPU kernels: the CUDA lane's target of runtime/pipeline.py, and what a kernel is.

:func:`compile` runs the one pipeline (parse, verify for target "cuda", lower
to CUDA C: runtime/cuda/lower.py; the record under the cache key) with
:class:`CudaTarget`, whose build compiles the module's CUDA C with NVRTC
(nvrtc.py, cubins cached by content hash) and loads it through the driver.
One lowering holds every kernel of a source, so the kernels of one source
(update.c holds four) share it.  :func:`translate` stops before NVRTC: no GPU
needed.  A kernel keeps its cubin: after a reset of the context
(driver.reset_context) its next launch loads the module again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .. import pipeline, records
from ..compiler.verifier import KernelSig, VerifiedSource
from . import driver as drv
from . import nvrtc
from .lower import CudaSource, entry_symbol, instrument


@dataclass
class CudaKernel:
    """A compiled entry point: module, function, launch metadata."""

    name: str
    source: str
    checked: bool
    cuda: CudaSource
    info: KernelSig
    module: Any
    function: Any
    cubin_bytes: int
    param_block: Any = field(default=None, repr=False, compare=False)  # see params.ParamBlock
    resident: dict = field(default_factory=dict, repr=False, compare=False)  # see max_group
    dynamic_smem: int = 0  # bytes every launch adds to shared_bytes (its smem_ arrays)
    image: bytes = field(default=b"", repr=False, compare=False)  # the cubin ``module`` holds
    #: the context epoch ``module`` was loaded in (driver.context_epoch)
    epoch: int = field(default_factory=drv.context_epoch, compare=False)

    def live_function(self) -> Any:
        """The entry point's handle in the current context: after a reset of the context
        its module died with it, so it is loaded again from ``image`` first (an old
        handle is never used: the new context may have handed out its value again)."""
        if self.epoch != drv.context_epoch():
            self.epoch, self.module, self.function = load(self.name, self.image, self.cuda,
                                                          self.dynamic_smem)
        return self.function

    def __repr__(self) -> str:
        # One line: the generated CUDA is self.cuda.text, the dialect source self.source.
        return (f"<capqr.runtime.cuda.CudaKernel {self.info.text()} target=cuda "
                f"mode={'checked' if self.checked else 'raw'} cubin={self.cubin_bytes} B>")

    def registers(self) -> int:
        """Registers per thread of the compiled kernel."""
        f = drv.ffi()
        v = f.new("int *")
        drv.check(drv.lib().cuFuncGetAttribute(v, drv.CU_FUNC_ATTRIBUTE_NUM_REGS,
                                               self.live_function()), "cuFuncGetAttribute")
        return v[0]

    def max_group(self, block: int, shared_bytes: int = 0) -> int:
        """Blocks of ``block`` threads that the device runs at once (the largest grid of
        a cooperative launch; 0 where the device makes none)."""
        key = (block, shared_bytes)
        if key not in self.resident:
            dev = drv.device()
            if not dev.attribute(drv.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH):
                self.resident[key] = 0
            else:
                v = drv.ffi().new("int *")
                drv.check(drv.lib().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    v, self.live_function(), int(block), int(shared_bytes) + self.dynamic_smem),
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor")
                self.resident[key] = v[0] * dev.sm_count
        return self.resident[key]



@dataclass(frozen=True)
class CudaTarget:
    """The CUDA lane's half of runtime/pipeline.py: one lowering for every kernel of a
    source, built by NVRTC into a module loaded through the driver."""

    checked: bool = True
    hoist: bool = True
    lane: ClassVar[str] = "cuda"
    lowers_one_entry: ClassVar[bool] = False
    keeps_kernels: ClassVar[bool] = False  # each compile loads its own module

    def key_parts(self) -> tuple[str, ...]:
        return str(self.checked), str(self.hoist)

    def record_path(self, key: str) -> Path:
        return nvrtc.cache_dir() / f"_capqr_cu_{key[:20]}.json"

    def lower(self, verified: VerifiedSource, entry: str | None) -> CudaSource:
        return instrument(verified, checked=self.checked, hoist=self.hoist)

    def to_record(self, lowered: CudaSource) -> dict[str, Any]:
        return {"text": lowered.text, "checked": lowered.checked,
                "local_arrays": lowered.local_arrays, "dynamic_smem": lowered.dynamic_smem,
                "kernels": {k: records.signature_json(v) for k, v in lowered.kernels.items()}}

    def from_record(self, rec: dict[str, Any]) -> CudaSource:
        kernels = {k: records.signature_from_json(v) for k, v in rec["kernels"].items()}
        return CudaSource(rec["text"], kernels, list(rec["local_arrays"]), bool(rec["checked"]),
                          {k: int(v) for k, v in rec["dynamic_smem"].items()})

    def build(self, key: str, source: str, entry: str, lowered: CudaSource, *,
              options: Sequence[str] = ()) -> CudaKernel:
        dev = drv.device()
        cubin = nvrtc.compile_cubin(lowered.text, arch=dev.arch,
                                    options=tuple(options) + ("-lineinfo",),
                                    entries=entry_lines(lowered))
        dynamic = lowered.dynamic_smem.get(entry, 0)
        epoch, module, function = load(entry, cubin, lowered, dynamic)
        return CudaKernel(entry, source, self.checked, lowered, lowered.kernels[entry], module,
                          function, len(cubin), dynamic_smem=dynamic, image=cubin, epoch=epoch)


def entry_lines(lowered: CudaSource) -> dict[str, tuple[str, int]]:
    """Entry symbol -> (kernel, the line of its KERNEL definition): where a diagnostic
    that names the function rather than a line belongs (nvrtc.cuda_compile_error)."""
    return {entry_symbol(k): (k, sig.line) for k, sig in lowered.kernels.items()}


def load(entry: str, image: bytes, lowered: CudaSource, dynamic: int) -> tuple[int, Any, Any]:
    """Load ``image`` in the current context: (its context epoch, module, the handle of
    ``entry``).  A refusal raises CompileError on kernel lines, the loader's log with it."""
    epoch = drv.context_epoch()  # before loading: a reset after it makes the module stale
    dev = drv.device()
    try:
        module = drv.load_module(image)
    except drv.ModuleLoadError as e:
        raise nvrtc.cuda_compile_error(f"the cubin of {entry!r} ({e})", e.log,
                                       entry_lines(lowered)) from None
    fn = drv.ffi().new("CUfunction *")
    drv.check(drv.lib().cuModuleGetFunction(fn, module, entry_symbol(entry).encode()),
              "cuModuleGetFunction")
    if dynamic:
        opt_in_dynamic_smem(entry, fn[0], dynamic, dev)
    return epoch, module, fn[0]


def compile(source: str, name: str | None = None, *, checked: bool = True, hoist: bool = True,
            options: Sequence[str] = ()) -> CudaKernel:
    """Verify, instrument and compile dialect source; return entry point ``name``.

    ``checked=False`` builds the same source with raw pointers (overhead baseline);
    ``hoist=False`` disables loop versioning; ``options``: NVRTC's own.
    """
    return pipeline.compile(source, name, CudaTarget(checked, hoist), options=tuple(options))


def translate(source: str, *, checked: bool = True, hoist: bool = True) -> CudaSource:
    """Parse, verify for target "cuda" and lower to CUDA C; no GPU needed."""
    return pipeline.lowered(source, CudaTarget(checked, hoist))


def opt_in_dynamic_smem(name: str, function: Any, nbytes: int, dev: Any) -> None:
    """Let ``function`` launch with ``nbytes`` of dynamic shared memory (its smem_ arrays
    beyond CUDA's 48 KB static limit, runtime/cuda/lower.py dynamic_shared);
    ValueError when that and its static shared data exceed the device's opt-in limit."""
    L, f = drv.lib(), drv.ffi()
    v = f.new("int *")
    drv.check(L.cuFuncGetAttribute(v, drv.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
              "cuFuncGetAttribute")
    if nbytes + v[0] > dev.max_smem_optin:
        raise ValueError(f"kernel {name!r} needs {nbytes} bytes of shared arrays (+{v[0]} "
                         f"static) and the device allows at most {dev.max_smem_optin} per block")
    drv.check(L.cuFuncSetAttribute(function, drv.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   int(nbytes)), "cuFuncSetAttribute")
