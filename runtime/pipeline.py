"""The compile-and-cache pipeline of both lanes.

    source -> parse -> verify(target) -> entry point -> lower -> record -> build -> kernel

Parsing, verification (``verify(target=...)``: the dialect, and the GPU's
uniformity rules for ``"cuda"``) and the choice of the entry point are the
same for every lane.  What differs is a :class:`Target`, which the lane hands
in (this module imports no lane): the options that enter the cache key, the
lowering (``runtime/<lane>/lower.py``, which runs the analyses it needs: loop
versioning, ranges, instrumentation), the shape of the lowering's record,
and the build (cffi and gcc on the CPU, NVRTC and the driver on the GPU).

The front end's result (the entry's name and the lowering) is a pure
function of the cache key, which hashes the source, the target's options and
every module of the front end and of the lane (:func:`records.toolchain_version`),
so it is kept on disk under that key (runtime/records.py): a process that
meets a key built before skips parse, verify and lowering.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from . import records
from .build import content_hash
from .compiler.parse import parse
from .compiler.verifier import VerifiedSource, select_kernel, verify


class Target(Protocol):
    """A lane's half of the pipeline.  Hashable (a frozen dataclass of its options):
    lowerings are kept per source and target."""

    #: "cpu" or "cuda": the verifier's target and the lane's directory under runtime/
    lane: str
    #: True: a lowering holds one entry point (a CPU module exports one); False: every
    #: kernel of the source (one CUDA module holds them all), lowered once for all
    lowers_one_entry: bool
    #: True: compile() returns the kernel it built before for the same key
    keeps_kernels: bool

    def key_parts(self) -> tuple[str, ...]:
        """The options that enter the cache key (besides source, name and toolchain)."""
        ...

    def record_path(self, key: str) -> Path:
        """Where the front end's record of ``key`` is kept."""
        ...

    def lower(self, verified: VerifiedSource, entry: str | None) -> Any:
        """The lowering of ``verified`` (``entry``: None unless ``lowers_one_entry``)."""
        ...

    def to_record(self, lowered: Any) -> dict[str, Any]:
        """The lowering as JSON values."""
        ...

    def from_record(self, rec: dict[str, Any]) -> Any:
        """The lowering back from :meth:`to_record`'s values; KeyError, TypeError,
        ValueError or AttributeError for a record of another shape."""
        ...

    def build(self, key: str, source: str, entry: str, lowered: Any, **options: Any) -> Any:
        """The kernel of ``entry`` (``options``: the build's own, outside the cache key)."""
        ...


def cache_key(source: str, name: str | None, target: Target) -> str:
    """The key of the front end's record and of the lane's build."""
    return content_hash(source, str(name), *target.key_parts(),
                        records.toolchain_version(target.lane))


@lru_cache(maxsize=32)
def verified(source: str, lane: str) -> VerifiedSource:
    """``source`` parsed and verified for ``lane`` (VerifyError if it is unsafe), once per
    process: a source holds several entry points, built in several modes."""
    return verify(parse(source), target=lane)


@lru_cache(maxsize=32)
def lowered(source: str, target: Target, entry: str | None = None) -> Any:
    """``target``'s lowering of ``source`` (``entry``: the entry point, for a target that
    lowers one; else None), once per process: the lowerings only read the verified source."""
    return target.lower(verified(source, target.lane), entry)


def front_end(source: str, name: str | None, target: Target) -> tuple[str, Any]:
    """The entry point's name and its lowering: from the record kept under the cache key
    when a process has built it before, else from parse, verify and the target's
    lowering (VerifyError for an unsafe source or an unknown name), then recorded."""
    return _front_end(cache_key(source, name, target), source, name, target)


def _front_end(key: str, source: str, name: str | None, target: Target) -> tuple[str, Any]:
    path = target.record_path(key)
    rec = records.read(path, key)
    if rec is not None and isinstance(rec.get("name"), str):
        try:
            return rec["name"], target.from_record(rec)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # a record of another shape: lowered again and rewritten below
    entry = select_kernel(verified(source, target.lane), name)
    lowering = lowered(source, target, entry if target.lowers_one_entry else None)
    records.write(path, key, {"name": entry, **target.to_record(lowering)})
    return entry, lowering


_kept: dict[tuple[str, str], Any] = {}  # (lane, key) -> kernel, for targets that keep them
_kept_lock = threading.Lock()


def compile(source: str, name: str | None, target: Target, **build_options: Any) -> Any:
    """The kernel ``name`` of ``source`` for ``target``: front end (or its record), then the
    target's build, which keeps its own output under the same key."""
    key = cache_key(source, name, target)
    if target.keeps_kernels:
        with _kept_lock:
            hit = _kept.get((target.lane, key))
        if hit is not None:
            return hit
    entry, lowering = _front_end(key, source, name, target)
    kernel = target.build(key, source, entry, lowering, **build_options)
    if target.keeps_kernels:
        with _kept_lock:
            kernel = _kept.setdefault((target.lane, key), kernel)
    return kernel
