"""Two lanes in one launch sequence: launches that may overlap on the GPU.

``launch_many(launches, lanes=...)`` and ``record_graph(launches, lanes=...)``
take, per launch, ``(lane, after)``: lane 0 is the launch stream, lane 1 a second
stream of the highest priority (driver.lane_stream), so a short launch on the
critical path (a QR panel) gets the SMs that a long one (a trailing update) frees.
A launch waits for the launches before it on its own lane and for those listed in
``after`` (indices of earlier launches), and for nothing else: two launches that
neither orders may run at the same time, so they must not touch the same memory
(the caller's promise, as for any two kernels on two streams).

It stays one sequence: one device record, launch indices in list order, one
``sync`` for both lanes.  Lane 1 starts after everything enqueued before the batch
(a fork from the launch stream when the batch begins, after the record's reset),
and the launch stream waits for lane 1's last launch at the end of the batch (a
join), so waiting for the launch stream, which ``sync``, a deadline and the
stuck-kernel check do, waits for both.
The isolated lane has one stream: there every launch runs in list order, which the
rule above allows (``after`` names earlier launches only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import driver as drv

LANES = (0, 1)


def check_lanes(lanes: Sequence[Any] | None, count: int) -> list[tuple[int, tuple[int, ...]]]:
    """``lanes`` as a list of ``(lane, after)`` with ``after`` a tuple of ints (None: every
    launch on lane 0, in order); ValueError for a lane outside LANES, a length other than
    ``count`` or an ``after`` that names a launch not before its own."""
    if lanes is None:
        return [(0, ())] * count
    out = []
    for i, entry in enumerate(lanes):
        try:
            lane, after = entry
            after = tuple(int(j) for j in after)
        except (TypeError, ValueError):
            raise ValueError(f"lanes[{i}] must be (lane, after) with after a sequence of "
                             f"launch indices, got {entry!r}") from None
        if lane not in LANES or isinstance(lane, bool):
            raise ValueError(f"lanes[{i}]: lane must be 0 or 1, got {lane!r}")
        if any(not 0 <= j < i for j in after):
            raise ValueError(f"lanes[{i}]: after names launches {after}; a launch waits "
                             f"only for launches before it (0 .. {i - 1})")
        out.append((lane, after))
    if len(out) != count:
        raise ValueError(f"lanes has {len(out)} entries for {count} launches")
    return out


def predecessors(lanes: Sequence[tuple[int, tuple[int, ...]]]) -> list[tuple[int, ...]]:
    """Per launch, the launches it waits for directly: the one before it on its lane and
    its ``after`` (a CUDA graph's dependencies)."""
    last: dict[int, int] = {}
    out = []
    for i, (lane, after) in enumerate(lanes):
        deps = dict.fromkeys(([last[lane]] if lane in last else []) + list(after))
        out.append(tuple(deps))
        last[lane] = i
    return out


class LaneSchedule:
    """Enqueues the fork, waits and join of one batch around its launches, where it
    uses lane 1 (``one``; the caller holds the sequence lock): ``fork()`` first,
    ``stream(i)`` before launch i, ``launched(i)`` after it, ``finish()`` at the end,
    also after an error (the launches enqueued stay enqueued and ordered before the
    join)."""

    def __init__(self, dev: Any, lanes: list[tuple[int, tuple[int, ...]]]):
        self.dev = dev
        self.lanes = lanes
        self.one = not drv.isolated() and any(lane == 1 for lane, _ in lanes)
        # per launch another lane waits for: how many of its waiters are still to come
        self.waiters: dict[int, int] = {}
        for lane, after in lanes if self.one else ():
            for j in after:
                if lanes[j][0] != lane:
                    self.waiters[j] = self.waiters.get(j, 0) + 1
        self.events: dict[int, Any] = {}

    def _stream(self, lane: int) -> Any:
        return drv.lane_stream(self.dev) if lane == 1 else None

    def _follow(self, waiting: int, recorded_on: int) -> None:
        """Lane ``waiting`` waits for what lane ``recorded_on`` holds now."""
        e = drv.lane_record(self.dev, self._stream(recorded_on))
        drv.lane_wait(self._stream(waiting), e)
        self.dev.lane_events.append(e)

    def fork(self) -> None:
        """Lane 1 after what the launch stream holds now (the caller reset the record
        first): before the batch's first launch."""
        if self.one:
            self._follow(1, 0)

    def stream(self, i: int) -> Any:
        """The stream of launch i (None: the launch stream), after enqueueing its waits."""
        if not self.one:
            return None
        lane, after = self.lanes[i]
        s = self._stream(lane)
        for j in after:
            if self.lanes[j][0] != lane:
                drv.lane_wait(s, self.events[j])
                self.waiters[j] -= 1
                if not self.waiters[j]:
                    self.dev.lane_events.append(self.events.pop(j))
        return s

    def launched(self, i: int) -> None:
        """Launch i is enqueued: record the event its waiters on the other lane take."""
        if i in self.waiters:
            self.events[i] = drv.lane_record(self.dev, self._stream(self.lanes[i][0]))

    def finish(self) -> None:
        """The join: the launch stream waits for lane 1; every event goes back."""
        if not self.one:
            return
        self._follow(0, 1)
        self.dev.lane_events.extend(self.events.values())
        self.events = {}
