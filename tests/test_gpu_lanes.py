"""runtime/cuda/lanes.py against a second implementation of CUDA's stream rules (CPU only).

The schedule's forks, event records, waits and join go to a model of two streams: each
stream runs its operations in order; a record completes an event's token when the
stream reaches it; a wait blocks its stream until the token it took when enqueued has
completed (a later record of the same event does not move it, as cuStreamWaitEvent
promises).  The model runs the queues in random interleavings and checks the promise
of launch_many(lanes=...): every launch runs after the one before it on its lane and
after its ``after`` launches, transitively; and once the launch stream has drained, so
has lane 1 (sync, deadlines and the stuck check wait on the launch stream alone).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from capqr.kernels import gpu as g
from capqr.runtime.cuda import driver as drv
from capqr.runtime.cuda import lanes


class Streams:
    """Two FIFO streams and events, as the driver calls of lanes.py see them."""

    def __init__(self) -> None:
        self.q: dict[object, list[tuple]] = {None: [], "lane": []}
        self.latest: dict[str, int] = {}   # event -> its last record's token
        self.done: set[int] = set()        # completed tokens
        self.tokens = 0
        self.created = 0

    # the driver functions LaneSchedule calls
    def lane_stream(self, d: object) -> str:
        return "lane"

    def lane_record(self, d: SimpleNamespace, stream: object) -> str:
        if d.lane_events:
            e = d.lane_events.pop()
        else:
            self.created += 1
            e = f"event{self.created}"
        self.tokens += 1
        self.latest[e] = self.tokens
        self.q[stream].append(("record", self.tokens))
        return e

    def lane_wait(self, stream: object, event: str) -> None:
        self.q[stream].append(("wait", self.latest[event]))

    def launch(self, stream: object, i: int) -> None:
        self.q[stream].append(("launch", i))

    def run(self, rng: random.Random) -> list[int]:
        """Run both queues to the end in a random interleaving; the launches in the
        order they ran.  AssertionError if the streams deadlock."""
        ran = []
        while self.q[None] or self.q["lane"]:
            ready = [s for s, ops in self.q.items()
                     if ops and (ops[0][0] != "wait" or ops[0][1] in self.done)]
            assert ready, f"deadlock: {self.q}"
            s = rng.choice(ready)
            kind, x = self.q[s].pop(0)
            if kind == "record":
                self.done.add(x)
            elif kind == "launch":
                ran.append(x)
            if s is None and not self.q[None]:
                assert not self.q["lane"], "the launch stream drained before lane 1"
        return ran


def _enqueue(monkeypatch, order: list[tuple[int, tuple[int, ...]]]) -> Streams:
    """What launch_many does around its launches, on the model, after a launch -1 that
    an earlier batch left on the launch stream."""
    st = Streams()
    st.launch(None, -1)
    for name in ("lane_stream", "lane_record", "lane_wait"):
        monkeypatch.setattr(drv, name, getattr(st, name))
    monkeypatch.setattr(drv, "isolated", lambda: False)
    dev = SimpleNamespace(lane_events=[])
    sched = lanes.LaneSchedule(dev, order)
    sched.fork()
    for i in range(len(order)):
        st.launch(sched.stream(i), i)
        sched.launched(i)
    sched.finish()
    assert len(set(dev.lane_events)) == len(dev.lane_events) == st.created  # all back
    return st


def _before(order: list[tuple[int, tuple[int, ...]]]) -> list[int]:
    out = []
    for ps in lanes.predecessors(order):
        bits = 0
        for j in ps:
            bits |= out[j] | (1 << j)
        out.append(bits)
    return out


@pytest.mark.parametrize("batch,n,tall_rows", [(2, 4096, "auto"), (40, 352, None), (1, 100, None),
                                               (3, 64, None)])
def test_lanes_keep_the_plan_order(monkeypatch, batch: int, n: int, tall_rows) -> None:
    """The look-ahead plan's lanes through LaneSchedule: in 20 random interleavings of
    the two streams every launch runs after everything the plan orders before it, and
    after what the launch stream held before the batch."""
    plan = g.launch_plan(batch, n, tall_rows, whole=False, per_matrix=False, lookahead=True)
    order = lanes.check_lanes([(s.lane, s.after) for s in plan], len(plan))
    before = _before(order)
    for seed in range(20):
        ran = _enqueue(monkeypatch, order).run(random.Random(seed))
        assert sorted(ran) == list(range(-1, len(plan)))
        at = {i: k for k, i in enumerate(ran)}
        assert at[-1] == 0  # lane 1 forks after what the launch stream held
        for i, bits in enumerate(before):
            for j in range(i):
                if bits >> j & 1:
                    assert at[j] < at[i], (seed, j, plan[j], i, plan[i])


def test_lanes_overlap_what_nothing_orders(monkeypatch) -> None:
    """Two launches that nothing orders run in either order in some interleaving (the
    model is not a single queue in disguise), and one lane alone needs no event."""
    order = [(0, ()), (1, ()), (0, (1,))]
    seen = set()
    for seed in range(40):
        ran = _enqueue(monkeypatch, order).run(random.Random(seed))
        assert ran.index(-1) < ran.index(1) < ran.index(2)
        seen.add(ran.index(0) < ran.index(1))
    assert seen == {True, False}
    st = _enqueue(monkeypatch, [(0, ())] * 3)
    assert st.created == 0 and st.q["lane"] == []


def test_check_lanes_refuses_bad_entries() -> None:
    assert lanes.check_lanes(None, 2) == [(0, ()), (0, ())]
    assert lanes.check_lanes([(0, []), (1, [0])], 2) == [(0, ()), (1, (0,))]
    for bad, what in [([(2, ())], "lane must be 0 or 1"), ([(True, ())], "lane must be"),
                      ([(0, (0,))], "only for launches before it"),
                      ([(0, (1,)), (1, ())], "only for launches before it"),
                      ([(0,)], "must be \\(lane, after\\)"), ([(0, 5)], "must be")]:
        with pytest.raises(ValueError, match=what):
            lanes.check_lanes(bad, len(bad))
    with pytest.raises(ValueError, match="2 entries for 3 launches"):
        lanes.check_lanes([(0, ()), (0, ())], 3)
