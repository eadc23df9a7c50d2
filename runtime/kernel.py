"""runtime.compile: parse -> verify -> instrument -> cffi build (cached)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import core
from .build import CAP_INCLUDE, build_module, compiler_id, content_hash
from .errors import VerifyError
from .instrument import Instrumented, KernelSig, instrument
from .parse import parse

#: Flags for checked and raw builds alike, so the overhead comparison is fair.
#: -fwrapv: index arithmetic wraps instead of being undefined, so the
#: optimiser can never reason a bounds check away.  -ffp-contract=off: gcc
#: would fuse a*b+c differently in the checked loop copies and in the raw
#: build; kernels that want FMA call fma()/fmaf() and get it everywhere.
BASE_CFLAGS = ["-O3", "-std=gnu11", "-fwrapv", "-fno-strict-aliasing", "-ffp-contract=off",
               "-march=native",
               "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
               "-Wno-array-bounds"]


def cflags() -> list[str]:
    """Compiler flags for kernels ($CAPQR_CFLAGS replaces -march=native etc. if set)."""
    extra = os.environ.get("CAPQR_CFLAGS")
    if extra is None:
        return list(BASE_CFLAGS)
    return [f for f in BASE_CFLAGS if not f.startswith("-march")] + extra.split()


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

    @property
    def checked(self) -> bool:
        return self.mode == "checked"

    @property
    def entry_address(self) -> int:
        return self._entry

    def launch(self, caps: Any, *, args: tuple = (), grid: int = 1,
               timeout: float | None = None) -> None:
        """Shorthand for runtime.launch(self, ...)."""
        from .launch import launch

        launch(self, caps, args=args, grid=grid, timeout=timeout)


_compiled: dict[str, Kernel] = {}
_lock = threading.Lock()


def compile(source: str, name: str | None = None, *, checked: bool = True,
            mode: str | None = None, target: str = "cpu", hoist: bool = True) -> Any:
    """Verify, instrument and compile ``name`` from ``source``.

    ``checked=False`` builds the same source with raw pointers (benchmark
    baseline only).  ``mode`` ("checked", "raw", "raw_poll") overrides
    ``checked``.  Results are cached in memory and on disk by content hash.
    """
    if target == "cuda":
        from . import cuda

        return cuda.compile(source, name, checked=checked)
    if target != "cpu":
        raise ValueError(f"target must be 'cpu' or 'cuda', not {target!r}")
    mode = mode or ("checked" if checked else "raw")
    flags = cflags()
    key = content_hash(source, str(name), mode, str(hoist), " ".join(flags), compiler_id(),
                       _toolchain_version())
    with _lock:
        if key in _compiled:
            return _compiled[key]
    parsed = parse(source)
    from .verifier import verify

    verified = verify(parsed)
    if name is None:
        if len(parsed.kernels) != 1:
            raise VerifyError(None, "kernel name", f"source defines kernels {parsed.kernels}; "
                              "pass name= to pick one")
        name = parsed.kernels[0]
    if name not in parsed.kernels:
        raise VerifyError(None, f"kernel {name!r}",
                          f"no KERNEL function of that name (found {parsed.kernels})")
    _check_stack_budget(verified, name)
    inst: Instrumented = instrument(verified, name, mode, hoist=hoist)
    mod = build_module(
        f"_capqr_k_{key[:20]}",
        "void capqr_entry(void *b, const void *a);",
        inst.c_source,
        include_dirs=[str(CAP_INCLUDE)],
        extra_compile_args=flags,
        libraries=["m"],
    )
    entry = int(mod.ffi.cast("uintptr_t", mod.ffi.addressof(mod.lib, "capqr_entry")))
    k = Kernel(name, source, mode, inst.signature, inst.c_source, key, entry, mod)
    with _lock:
        _compiled[key] = k
    return k


#: Local arrays along any call chain must fit well inside a worker's 16 MiB
#: stack: a stack overflow would kill the host process, not fault.
STACK_BUDGET = 8 << 20


def _check_stack_budget(verified: Any, kernel: str) -> None:
    """Reject a kernel whose local arrays could overflow a worker stack."""
    own = {f: sum(8 * _prod(d) for d in arrays.values())
           for f, arrays in verified.local_arrays.items()}
    memo: dict[str, int] = {}

    def deepest(f: str) -> int:  # the call graph is acyclic (no recursion)
        if f not in memo:
            memo[f] = own.get(f, 0) + max(
                (deepest(g) for g in verified.call_graph.get(f, ())), default=0)
        return memo[f]

    for f in [kernel]:
        if deepest(f) > STACK_BUDGET:
            raise VerifyError(verified.parsed.funcs[f].decl.coord.line, "local arrays",
                              f"kernel {f!r} and its callees need about {deepest(f) >> 10} "
                              f"KiB of local arrays; the limit is {STACK_BUDGET >> 10} KiB "
                              "(use a buffer from capabilities.alloc or cap_alloc_*)")


def _prod(dims: Any) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


@lru_cache(maxsize=1)
def _toolchain_version() -> str:
    """Hash of cap.h and the instrumenter's own code, so changing either invalidates
    caches.  Read once per process: compile() is called on every kernels.qr call."""
    here = Path(__file__).resolve().parent
    return content_hash((CAP_INCLUDE / "cap.h").read_text(),
                        (CAP_INCLUDE / "cap_abi.h").read_text(),
                        *[(here / f).read_text() for f in
                          ("instrument.py", "hoist.py", "verifier.py", "parse.py")])


_ = core  # the core must be loaded before kernels run
