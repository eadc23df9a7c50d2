"""rt_group_sync on the GPU lane: a grid barrier in a cooperative launch (GPU only;
skipped cleanly where there is no usable GPU), and rt_shfl_idx_T.

Each test has an independent oracle: the values every block reads after a barrier
are those all blocks wrote before it (a missing or early release shows as a wrong
sum), a kernel that hangs is caught by the sync's deadline, and a planted fault must
come back as exactly that access while the other blocks wait at the barrier.
The verifier and lowering rules run without a GPU in tests/test_gpu_group_rules.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from capqr import runtime
from capqr.runtime import cuda
from capqr.runtime.errors import CapabilityFault, KernelTimeout
from readme_examples import run_readme_example

_OK, _WHY = cuda.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")]

# Round r: every block adds r + 1 to its own slot, waits, then sums every slot.  After
# round r each slot holds (r + 1)(r + 2) / 2, so the sum is G (r + 1)(r + 2) / 2: a
# block that got past a barrier before all others arrived (or read a stale value)
# sees less.  Block b records the first round where its sum was wrong (or -1).
ROUNDS = """
KERNEL void rounds(cap_t slots, cap_t bad, int64_t nrounds, int64_t leave_odd)
{
    int64_t b = rt_block_idx();
    int64_t g = rt_grid_dim();
    int64_t t = rt_thread_idx();
    int64_t first_bad = -1;
    if (leave_odd != 0 && b % 2 == 1) {
        cap_store_i64(bad, b, -1);
        return;
    }
    int64_t live = leave_odd != 0 ? (g + 1) / 2 : g;
    for (int64_t r = 0; r < nrounds; r++) {
        if (t == 0)
            cap_store_i64(slots, b, cap_load_i64(slots, b) + r + 1);
        rt_group_sync();
        if (t == 0) {
            int64_t s = 0;
            for (int64_t i = 0; i < g; i++)
                s += cap_load_i64(slots, i);
            if (s != live * (r + 1) * (r + 2) / 2 && first_bad < 0)
                first_bad = r;
        }
        rt_group_sync();
    }
    if (t == 0)
        cap_store_i64(bad, b, first_bad);
}
"""

# Block `who` stores past the end of `out` in round `when`; the others are at the barrier.
FAULT = """
KERNEL void fault_in_group(cap_t out, int64_t who, int64_t when, int64_t nrounds)
{
    int64_t b = rt_block_idx();
    for (int64_t r = 0; r < nrounds; r++) {
        if (b == who && r == when && rt_thread_idx() == 5)
            cap_store_f32(out, cap_len_f32(out) + b, 1.0f);
        rt_group_sync();
    }
    if (rt_thread_idx() == 0)
        cap_store_f32(out, b, 2.0f);
}
"""

# Block 0 never reaches the barrier (a long loop with pollchecks); the others wait.
STUCK = """
KERNEL void stuck(cap_t out, int64_t spin)
{
    float x = 0.0f;
    if (rt_block_idx() == 0) {
        for (int64_t i = 0; i < spin; i++)
            x = x * 0.5f + 1.0f;
    }
    rt_group_sync();
    if (rt_thread_idx() == 0)
        cap_store_f32(out, rt_block_idx(), x);
}
"""

BROADCAST = """
KERNEL void bcast(cap_t out, int64_t src)
{
    int64_t t = rt_thread_idx();
    float v = (float)t;
    cap_store_f32(out, t, rt_shfl_idx_f32(v, src + t / 32));
}
"""


def _rounds(checked: bool, grid: int, nrounds: int, leave_odd: int = 0) -> np.ndarray:
    k = cuda.compile(ROUNDS, "rounds", checked=checked)
    slots = cuda.to_device(np.zeros(grid, np.int64), name="slots")
    bad = cuda.to_device(np.full(grid, 7, np.int64), name="bad")
    try:
        cuda.launch(k, [slots, bad], args=[nrounds, leave_odd], grid=grid, block=64,
                    group=grid, timeout=60)
        return bad.numpy()
    finally:
        slots.free()
        bad.free()


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "raw"])
def test_every_block_sees_every_write_of_the_round(checked: bool) -> None:
    k = cuda.compile(ROUNDS, "rounds", checked=checked)
    grid = min(k.max_group(64), 264)
    for _ in range(2):  # the second launch starts from the words the first left
        bad = _rounds(checked, grid, 200)
        assert (bad == -1).all(), f"blocks with a wrong sum: {np.nonzero(bad != -1)[0][:10]}"


def test_blocks_that_return_leave_the_group() -> None:
    bad = _rounds(True, 64, 50, leave_odd=1)
    assert (bad == -1).all(), bad


def test_group_arguments_are_checked_before_anything_runs() -> None:
    k = cuda.compile(ROUNDS, "rounds")
    slots = cuda.alloc_device(8, np.int64, name="slots")
    bad = cuda.alloc_device(8, np.int64, name="bad")
    try:
        with pytest.raises(ValueError, match="group=8 "):
            cuda.launch(k, [slots, bad], args=[1, 0], grid=8, block=64)
        with pytest.raises(ValueError, match="whole grid"):
            cuda.launch(k, [slots, bad], args=[1, 0], grid=8, block=64, group=4)
        with pytest.raises(ValueError, match="group must be an int"):
            cuda.launch(k, [slots, bad], args=[1, 0], grid=8, block=64, group=True)
        too_many = k.max_group(64) + 1
        with pytest.raises(ValueError, match="run at once"):
            cuda.launch(k, [slots, bad], args=[1, 0], grid=too_many, block=64, group=too_many)
        plain = cuda.compile(BROADCAST, "bcast")
        with pytest.raises(ValueError, match="does not"):
            cuda.launch(plain, [slots], args=[0], grid=1, block=32, group=1)
        assert cuda.pending() == 0
    finally:
        slots.free()
        bad.free()


def test_fault_while_the_others_wait_is_reported_exactly() -> None:
    k = cuda.compile(FAULT, "fault_in_group")
    grid = 48
    out = cuda.alloc_device(grid, np.float32, name="out")
    try:
        with pytest.raises(CapabilityFault) as ei:
            cuda.launch(k, out, args=[17, 3, 10], grid=grid, block=64, group=grid, timeout=60)
        f = ei.value
        assert (f.reason, f.buffer, f.block, f.thread, f.index, f.access) == (
            "out-of-bounds", "out", 17, 5, grid + 17, "store")
        assert f.line == 7
        # the barrier words were left mid-round by the fault: the next launch still works
        cuda.launch(k, out, args=[-1, 0, 10], grid=grid, block=64, group=grid, timeout=60)
        assert (out.numpy() == 2.0).all()
    finally:
        out.free()


@pytest.mark.timeout(120)
def test_deadline_cancels_blocks_waiting_at_the_barrier() -> None:
    k = cuda.compile(STUCK, "stuck")
    out = cuda.alloc_device(16, np.float32, name="out")
    try:
        with pytest.raises(KernelTimeout):
            cuda.launch(k, out, args=[1 << 62], grid=16, block=32, group=16, timeout=0.5)
        cuda.launch(k, out, args=[3], grid=16, block=32, group=16, timeout=60)
        np.testing.assert_array_equal(out.numpy(), [1.75] + [0.0] * 15)
    finally:
        out.free()


def test_group_launch_in_a_sequence_after_a_fault_does_not_run() -> None:
    k = cuda.compile(FAULT, "fault_in_group")
    out = cuda.to_device(np.zeros(8, np.float32), name="out")
    try:
        cuda.launch_many([(k, [out], [2, 0, 1], 8, 32, 8), (k, [out], [-1, 0, 1], 8, 32, 8)])
        with pytest.raises(CapabilityFault) as ei:
            runtime.sync(timeout=60)
        assert ei.value.launch_index == 0 and ei.value.block == 2
        # block 2 never arrived, so no block passed the barrier; launch 1 never ran
        assert (out.numpy() == 0.0).all()
    finally:
        out.free()


@pytest.mark.parametrize("block", [64, 40])
def test_shfl_idx_broadcasts_a_lane(block: int) -> None:
    k = cuda.compile(BROADCAST, "bcast")
    out = cuda.alloc_device(block, np.float32, name="out")
    try:
        cuda.launch(k, out, args=[3], grid=1, block=block)
        got = out.numpy()
    finally:
        out.free()
    t = np.arange(block)
    src = (3 + t // 32) % 32
    owner = (t // 32) * 32 + src
    want = np.where(owner < block, owner, t).astype(np.float32)  # missing lane: own value
    np.testing.assert_array_equal(got, want)


def test_readme_gpu_example_runs() -> None:
    """The README's "Block groups" GPU example (its second code block), run as written."""
    run_readme_example("Block groups", 1)
