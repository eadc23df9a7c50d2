"""Python face of the collector in gc/: statistics and control."""

from __future__ import annotations

from typing import Any

from .core import ffi, lib

_FIELDS = ("cycles", "objects_live", "bytes_live", "objects_freed_total", "bytes_freed_total",
           "bytes_allocated_total", "objects_allocated_total", "handshakes",
           "handshake_p50_us", "handshake_p99_us", "handshake_max_us", "mark_seconds_total",
           "sweep_seconds_total", "threshold_bytes", "stw", "verify", "verify_failures",
           "running", "enabled")


def gc_collect() -> None:
    """Run one full collector cycle and wait for it (GIL released)."""
    lib.gc_collect()


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


def gc_set_threshold(ratio: float = 1.5, floor_bytes: int = 1 << 20) -> None:
    """Start a cycle when the heap grows past max(ratio * live, floor_bytes)."""
    lib.gc_set_threshold(float(ratio), int(floor_bytes))
