"""Python face of the collector in gc/: statistics and control."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .core import ffi, lib

#: host-side drains of the collector's deferred releases (wrapped arrays,
#: device payloads): run from Python threads, never from the collector's
_RELEASE_HOOKS: list[Callable[[], Any]] = []


def add_release_hook(fn: Callable[[], Any]) -> None:
    """Run ``fn`` after every gc_collect() (it drains a release queue)."""
    if fn not in _RELEASE_HOOKS:
        _RELEASE_HOOKS.append(fn)


#: object id -> the Python object that owns a wrapped payload (a numpy array, a host or
#: CUDA tensor): referenced until the collector releases the object
_EXTERNAL: dict[int, Any] = {}
_DRAIN_BATCH = 256
_drain_buf = ffi.new("gc_release_rec[]", _DRAIN_BATCH)


def keep_external(obj_id: int, owner: Any) -> None:
    """Keep ``owner`` (the array or tensor whose memory object ``obj_id`` wraps)
    referenced until the collector releases the object."""
    _EXTERNAL[int(obj_id)] = owner


def drain_releases() -> int:
    """Drop the owners of wrapped objects the collector has released; returns how many."""
    n = 0
    while True:
        k = int(lib.gc_drain_external_releases(_drain_buf, _DRAIN_BATCH))
        for i in range(k):
            _EXTERNAL.pop(int(_drain_buf[i].id), None)
        n += k
        if k < _DRAIN_BATCH:
            return n


add_release_hook(drain_releases)

_FIELDS = ("cycles", "objects_live", "bytes_live", "objects_freed_total", "bytes_freed_total",
           "bytes_allocated_total", "objects_allocated_total", "handshakes",
           "handshake_p50_us", "handshake_p99_us", "handshake_max_us", "mark_seconds_total",
           "sweep_seconds_total", "threshold_bytes", "stw", "verify", "verify_failures",
           "running", "enabled")


def gc_collect() -> None:
    """Run one full collector cycle and wait for it (GIL released)."""
    lib.gc_collect()
    for fn in _RELEASE_HOOKS:
        fn()


def gc_stats() -> dict[str, Any]:
    """Collector counters: cycles, live/freed bytes, handshake latency p50/p99/max (us), ..."""
    st = ffi.new("gc_stats_t *")
    lib.gc_get_stats(st)
    out: dict[str, Any] = {}
    for f in _FIELDS:
        v = getattr(st, f)
        out[f] = float(v) if isinstance(v, float) else int(v)
    out["stw"] = bool(out["stw"])
    out["verify"] = bool(out["verify"])
    out["running"] = bool(out["running"])
    out["enabled"] = bool(out["enabled"])
    return out


def gc_set_enabled(enabled: bool) -> None:
    """Turn automatic (threshold-triggered) cycles on or off; gc_collect() still works."""
    lib.gc_set_enabled(1 if enabled else 0)


def gc_set_threshold(ratio: float = 1.25, floor_bytes: int = 1 << 20) -> None:
    """Pace the heap: with T = max(ratio * live, floor_bytes), a cycle starts at
    live + T/2 and allocating kernels wait for it past live + T (gc/pace.c)."""
    lib.gc_set_threshold(float(ratio), int(floor_bytes))
