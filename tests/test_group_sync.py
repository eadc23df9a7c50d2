"""rt_group_sync: blocks 0 .. group-1 of a CPU launch wait for each other.

Each test states what must hold and runs with a timeout, so a barrier that
waits for a block that will never come shows up as a KernelTimeout (a failed
assertion), not as a hung test run.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.verifier import verify
from readme_examples import run_readme_example

ROUNDS = """
KERNEL void rounds(cap_t part, cap_t out, int64_t nrounds)
{
    int64_t g = rt_grid_dim();
    int64_t me = rt_block_idx();
    double acc = 0.0;
    for (int64_t r = 0; r < nrounds; r++) {
        cap_store_f64(part, (r % 2) * g + me, (double)(me + 1) * (double)(r + 1));
        rt_group_sync();
        double s = 0.0;
        for (int64_t i = 0; i < g; i++)
            s += cap_load_f64(part, (r % 2) * g + i);
        acc += s;
    }
    cap_store_f64(out, me, acc);
}
"""

# Block 1 may stop early (fault, return or spin on a flag); block 0 meets the barrier.
PAIR = """
static void sync_n(int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        rt_group_sync();
}

KERNEL void pair(cap_t x, cap_t flag, int64_t what)
{
    if (rt_block_idx() == 0) {
        sync_n(3);
        cap_store_f32(x, 0, 1.0f);
        return;
    }
    if (what == 0)
        cap_store_f32(x, 99, 1.0f);      /* out of bounds: x has 4 elements */
    if (what == 2)
        while (cap_load_i32(flag, 0) == 0)
            ;
    if (what == 3)
        rt_group_sync();                 /* block 1 outside a group of 1 */
    if (what >= 2)
        sync_n(3);
}
"""


def _workers() -> int:
    return runtime.threads()


@pytest.mark.parametrize("checked", [True, False])
def test_every_round_sees_every_block(checked: bool) -> None:
    k = runtime.compile(ROUNDS, "rounds", checked=checked)
    assert k.signature.group_sync
    g = _workers()
    part = capabilities.alloc((2 * g,), np.float64)
    out = capabilities.alloc((g,), np.float64)
    n = 2000
    runtime.launch(k, [part, out], args=(n,), grid=g, group=g, timeout=60)
    want = sum(range(1, g + 1)) * n * (n + 1) / 2
    assert np.array_equal(out.numpy(), np.full(g, want))


def test_in_a_launch_sequence() -> None:
    k = runtime.compile(ROUNDS, "rounds")
    g = _workers()
    part = capabilities.alloc((2 * g,), np.float64)
    out = capabilities.alloc((g,), np.float64)
    for _ in range(3):
        runtime.launch(k, [part, out], args=(10,), grid=g, group=g, sync=False)
    runtime.sync(timeout=60)
    assert np.array_equal(out.numpy(), np.full(g, sum(range(1, g + 1)) * 55.0))


def test_group_is_checked_before_anything_runs() -> None:
    k = runtime.compile(ROUNDS, "rounds")
    part = capabilities.alloc((64,), np.float64)
    out = capabilities.alloc((32,), np.float64)
    caps = [part, out]
    with pytest.raises(ValueError, match="launch it with group=N"):
        runtime.launch(k, caps, args=(1,), grid=1)
    with pytest.raises(ValueError, match="workers"):
        runtime.launch(k, caps, args=(1,), grid=32, group=_workers() + 1)
    with pytest.raises(ValueError, match="1 .. grid"):
        runtime.launch(k, caps, args=(1,), grid=1, group=2)
    with pytest.raises(ValueError, match="1 .. grid"):
        runtime.launch(k, caps, args=(1,), grid=1, group=0)
    with pytest.raises(ValueError, match="1 .. grid"):
        runtime.launch(k, caps, args=(1,), grid=1, group=True)
    runtime.launch(k, caps, args=(1,), grid=1, group=np.int64(1))  # any integer type
    plain = runtime.compile("KERNEL void p(cap_t x)\n{\n    cap_store_f64(x, 0, 1.0);\n}\n",
                            "p")
    assert not plain.signature.group_sync
    with pytest.raises(ValueError, match="does not"):
        runtime.launch(plain, [part], grid=1, group=1)
    # only the np.int64 launch ran: one block, one round, its sum 1
    assert out.numpy()[0] == 1.0 and not out.numpy()[1:].any()


def _pair(what: int, group: int = 2, timeout: float = 20) -> tuple[np.ndarray, BaseException]:
    k = runtime.compile(PAIR, "pair")
    x = capabilities.alloc((4,), np.float32, name="x")
    flag = capabilities.alloc((1,), np.int32, name="flag")
    with pytest.raises((runtime.CapabilityFault, runtime.KernelTimeout)) as e:
        runtime.launch(k, [x, flag], args=(what,), grid=2, group=group, timeout=timeout)
    return x.numpy(), e.value


@pytest.mark.skipif(runtime.threads() < 2, reason="needs two workers")
def test_a_fault_stops_the_blocks_waiting_at_the_barrier() -> None:
    t0 = time.monotonic()
    _, err = _pair(0)
    assert isinstance(err, runtime.CapabilityFault), err
    assert (err.reason, err.block, err.buffer, err.index) == ("out-of-bounds", 1, "x", 99)
    assert time.monotonic() - t0 < 10


@pytest.mark.skipif(runtime.threads() < 2, reason="needs two workers")
def test_a_block_that_returned_is_not_waited_for() -> None:
    k = runtime.compile(PAIR, "pair")
    x = capabilities.alloc((4,), np.float32, name="x")
    flag = capabilities.alloc((1,), np.int32, name="flag")
    # what = 1: block 1 returns at once; block 0's three barriers must not wait for it
    runtime.launch(k, [x, flag], args=(1,), grid=2, group=2, timeout=20)
    assert x.numpy()[0] == 1.0


@pytest.mark.skipif(runtime.threads() < 2, reason="needs two workers")
def test_a_deadline_stops_blocks_waiting_at_the_barrier() -> None:
    t0 = time.monotonic()
    x, err = _pair(2, timeout=0.5)  # block 1 spins on a flag nobody sets
    assert isinstance(err, runtime.KernelTimeout), err
    assert time.monotonic() - t0 < 10
    assert x[0] == 0.0  # block 0 never got past its barrier


def test_a_block_outside_the_group_faults() -> None:
    _, err = _pair(3, group=1)
    assert isinstance(err, runtime.CapabilityFault), err
    assert (err.reason, err.block, err.index) == ("group", 1, 1)
    line = next(i for i, t in enumerate(PAIR.split("\n"), 1) if "outside a group" in t)
    assert err.line == line


@pytest.mark.skipif(runtime.threads() < 2, reason="needs two workers")
def test_the_collector_runs_while_blocks_wait() -> None:
    """Block 0 waits at the barrier and block 1 spins on a flag: a full collection
    (soft handshakes with both) completes meanwhile; then the flag frees them."""
    k = runtime.compile(PAIR, "pair")
    x = capabilities.alloc((4,), np.float32, name="x")
    flag = capabilities.alloc((1,), np.int32, name="flag")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            runtime.launch(k, [x, flag], args=(2,), grid=2, group=2, timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)
    before = runtime.gc_stats()["cycles"]
    done = threading.Event()
    threading.Thread(target=lambda: (runtime.gc_collect(), done.set()), daemon=True).start()
    assert done.wait(20), "a collection did not finish while blocks waited at the barrier"
    assert runtime.gc_stats()["cycles"] > before
    assert t.is_alive()  # still waiting: the flag is not set yet
    flag.numpy()[0] = 1
    t.join(30)
    assert not t.is_alive() and not errors, errors
    assert x.numpy()[0] == 1.0


def test_the_same_source_verifies_for_the_gpu_lane() -> None:
    """One front end: the GPU lane takes the same kernel (a cooperative launch there,
    tests/test_gpu_group.py)."""
    assert verify(parse(ROUNDS), target="cuda").kernels["rounds"].group_sync
    assert verify(parse(ROUNDS), target="cpu").kernels["rounds"].group_sync


def test_readme_example_runs() -> None:
    """The README's "Block groups" example, run as written."""
    run_readme_example("Block groups")
