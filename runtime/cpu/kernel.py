"""runtime.compile and the CPU lane's target of runtime/pipeline.py (C lowering, cffi build)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from .. import core, pipeline, records
from ..build import CAP_INCLUDE, build_module, cache_dir, compiler_id, kernel_cc_command
from ..compiler.verifier import KernelSig, VerifiedSource
from .lower import MODES, Instrumented, instrument

#: Flags for checked and raw builds alike, so the overhead comparison is fair.
#: -fwrapv: index arithmetic wraps instead of being undefined, so the
#: optimiser can never reason a bounds check away.  -ffp-contract=off: gcc
#: would fuse a*b+c differently in the checked loop copies and in the raw
#: build; kernels that want FMA call fma()/fmaf() and get it everywhere.
#: -fno-tree-loop-distribute-patterns: gcc would turn the tile update's row copies
#: (kernels/src/tile.c, 32 to 64 floats) into `rep movsq`, a third of the update's
#: time on the 2-core Xeon VM; as vector loops the update ran 1.15-1.4x faster.
#: -g0: no debug info (Python's CFLAGS bring -g).  The geqrf family's checked cold
#: build, front end included, took 7.8 / 6.8 s with it and 5.3 / 4.9 s without (2-core
#: VM, two rounds); faults name their source line through the runtime's records, not
#: DWARF.
BASE_CFLAGS = ["-O3", "-g0", "-std=gnu11", "-fwrapv", "-fno-strict-aliasing",
               "-ffp-contract=off", "-fno-tree-loop-distribute-patterns", "-march=native",
               "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
               "-Wno-array-bounds"]


def cflags() -> list[str]:
    """Compiler flags for kernels ($CAPQR_CFLAGS replaces -march=native etc. if set)."""
    extra = os.environ.get("CAPQR_CFLAGS")
    if extra is None:
        return list(BASE_CFLAGS)
    return [f for f in BASE_CFLAGS if not f.startswith("-march")] + extra.split()


#: Include directories of a kernel's translation unit (cap.h; nothing else).
INCLUDE_DIRS = [str(CAP_INCLUDE)]


def cc_command() -> list[str]:
    """The compiler command (no input, no output) of a kernel's own translation unit."""
    return kernel_cc_command(INCLUDE_DIRS, cflags())


@dataclass
class Kernel:
    """A compiled kernel: call it through ``runtime.launch``."""

    name: str
    source: str
    mode: str
    signature: KernelSig
    c_source: str
    key: str
    _entry: Any = field(repr=False, default=None)
    _module: Any = field(repr=False, default=None)

    def __repr__(self) -> str:
        # One line: the generated C is self.c_source, the dialect source self.source.
        return (f"<capqr.runtime.Kernel {self.signature.text()} target=cpu mode={self.mode} "
                f"key={self.key[:16]}>")

    @property
    def checked(self) -> bool:
        return self.mode == "checked"

    @property
    def entry_address(self) -> int:
        return self._entry

    def launch(self, caps: Any, *, args: tuple = (), grid: int = 1,
               timeout: float | None = None, group: int | None = None) -> None:
        """Shorthand for runtime.launch(self, ...)."""
        from ..launch import launch

        launch(self, caps, args=args, grid=grid, timeout=timeout, group=group)


@dataclass(frozen=True)
class CpuTarget:
    """The CPU lane's half of runtime/pipeline.py: C lowering, one entry per module,
    built by cffi and the C compiler (``flags``) into a module kept under the key."""

    mode: str
    hoist: bool
    flags: tuple[str, ...]
    lane: ClassVar[str] = "cpu"
    lowers_one_entry: ClassVar[bool] = True
    keeps_kernels: ClassVar[bool] = True

    def key_parts(self) -> tuple[str, ...]:
        return self.mode, str(self.hoist), " ".join(self.flags), compiler_id()

    def record_path(self, key: str) -> Path:
        return cache_dir() / f"_capqr_k_{key[:20]}.json"

    def lower(self, verified: VerifiedSource, entry: str | None) -> Instrumented:
        assert entry is not None, "a CPU module exports one entry point"
        return instrument(verified, entry, self.mode, hoist=self.hoist)

    def to_record(self, lowered: Instrumented) -> dict[str, Any]:
        return {"signature": records.signature_json(lowered.signature),
                "c_source": lowered.c_source}

    def from_record(self, rec: dict[str, Any]) -> Instrumented:
        return Instrumented(rec["c_source"], records.signature_from_json(rec["signature"]),
                            self.mode)

    def build(self, key: str, source: str, entry: str, lowered: Instrumented) -> Kernel:
        # the kernel is its own translation unit: cffi's glue (Python.h) only declares
        # the entry
        entry_decl = "void capqr_entry(void *b, const void *a);"
        mod = build_module(
            f"_capqr_k_{key[:20]}",
            entry_decl,
            entry_decl + "\n",
            kernel_source=lowered.c_source,
            include_dirs=INCLUDE_DIRS,
            extra_compile_args=list(self.flags),
            libraries=["m"],
            what=f"kernel {entry!r}",
        )
        address = int(mod.ffi.cast("uintptr_t", mod.ffi.addressof(mod.lib, "capqr_entry")))
        return Kernel(entry, source, self.mode, lowered.signature, lowered.c_source, key,
                      address, mod)


def compile(source: str, name: str | None = None, *, checked: bool = True,
            mode: str | None = None, target: str = "cpu", hoist: bool = True) -> Any:
    """Verify, instrument and compile ``name`` from ``source``.

    ``checked=False`` builds the same source with raw pointers (benchmark
    baseline only).  ``mode`` ("checked", "raw", "raw_poll") overrides
    ``checked``; ``hoist=False`` turns loop versioning off.  Both lanes honour
    both options ("raw_poll" is CPU only and refused for ``target="cuda"``).
    Results are cached in memory and on disk by content hash ($CAPQR_CACHE).
    """
    if target not in ("cpu", "cuda"):
        raise ValueError(f"target must be 'cpu' or 'cuda', not {target!r}")
    mode = mode or ("checked" if checked else "raw")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if target == "cuda":
        from .. import cuda

        if mode == "raw_poll":
            raise ValueError("mode 'raw_poll' exists only for target 'cpu' (the GPU lane's "
                             "pollcheck is amortised and cannot be measured apart)")
        return cuda.compile(source, name, checked=mode == "checked", hoist=hoist)
    return pipeline.compile(source, name, _target(mode, hoist, tuple(cflags())))


#: compile() runs on every kernels.qr call: its target is made once per set of options
_target = lru_cache(maxsize=16)(CpuTarget)


_ = core  # the core must be loaded before kernels run
