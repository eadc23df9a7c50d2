"""The launch fast path (runtime/launch.py, runtime/csrc/launch.c) keeps every check.

Per-signature plans, the int64 shortcut, the fault record copied only after a
fault and the launcher's short spin before sleeping must not change what a
launch accepts, refuses or reports.  Timing targets live in bench/micro.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import CapabilityFault, KernelTimeout

SRC = """
KERNEL void poke(cap_t a, cap_t b, int64_t i, double v)
{
    cap_store_f32(b, i, (float)v + cap_load_f32(a, 0));
}

KERNEL void spin(cap_t a, int64_t n)
{
    int64_t k = 0;
    while (k < n)
        k = k + 1 - cap_load_i64(a, 0);
}
"""


@pytest.fixture(scope="module")
def poke():
    return runtime.compile(SRC, "poke")


def _holds(cap) -> int:
    return int(cap._arg_obj().holds)


def test_repeated_launches_agree_and_release_their_holds(poke) -> None:
    a = capabilities.alloc((1,), np.float32)
    b = capabilities.alloc((8,), np.float32)
    a.numpy()[0] = 0.5
    for k in range(200):
        runtime.launch(poke, [a, b], args=(k % 8, float(k)))
        assert b.numpy()[k % 8] == np.float32(k + 0.5)
    runtime.launch(poke, (c for c in (a, b)), args=iter((np.int64(3), 1)))  # any iterables
    assert b.numpy()[3] == np.float32(1.5)
    assert _holds(a) == 0 and _holds(b) == 0


@pytest.mark.parametrize("args, exc", [
    ((1,), TypeError),                     # count
    ((1.0, 2.0), TypeError),               # float for int64_t: never truncated
    ((True, 2.0), TypeError),              # bool refused
    ((2**63, 2.0), OverflowError),
    ((1, "x"), TypeError),
])
def test_scalar_arguments_are_still_validated(poke, args, exc) -> None:
    a = capabilities.alloc((1,), np.float32)
    b = capabilities.alloc((8,), np.float32)
    with pytest.raises(exc):
        runtime.launch(poke, [a, b], args=args)
    assert _holds(a) == 0 and _holds(b) == 0


def test_caps_and_grid_are_still_validated(poke) -> None:
    a = capabilities.alloc((1,), np.float32)
    b = capabilities.alloc((8,), np.float32)
    with pytest.raises(TypeError):
        runtime.launch(poke, [a], args=(0, 1.0))
    with pytest.raises(TypeError):
        runtime.launch(poke, [a, np.zeros(8, np.float32)], args=(0, 1.0))
    assert _holds(a) == 0  # the hold taken for the first cap is given back
    for grid in (True, 1.0):
        with pytest.raises(TypeError):
            runtime.launch(poke, [a, b], args=(0, 1.0), grid=grid)
    for grid in (0, -1):
        with pytest.raises(ValueError):
            runtime.launch(poke, [a, b], args=(0, 1.0), grid=grid)
    with pytest.raises(ValueError):
        runtime.launch(poke, [a, b], args=(0, 1.0), timeout=0)
    b.free()
    with pytest.raises(CapabilityFault):
        runtime.launch(poke, [a, b], args=(0, 1.0))
    assert _holds(a) == 0


def test_faults_stay_exact_between_fast_launches(poke) -> None:
    a = capabilities.alloc((1,), np.float32)
    b = capabilities.alloc((8,), np.float32, name="target")
    for k in range(50):
        runtime.launch(poke, [a, b], args=(k % 8, 1.0), grid=2)
        with pytest.raises(CapabilityFault) as e:
            runtime.launch(poke, [a, b], args=(8 + k, 1.0), grid=2)
        assert (e.value.reason, e.value.index, e.value.buffer, e.value.access, e.value.line) == (
            "out-of-bounds", 8 + k, "target", "store", 4)
        assert e.value.block in (0, 1)
    assert _holds(a) == 0 and _holds(b) == 0


def test_timeouts_stay_exact() -> None:
    k = runtime.compile(SRC, "spin")
    a = capabilities.alloc((1,), np.int64)
    runtime.launch(k, [a], args=(1000,), grid=2)  # a[0] = 0: ends
    a.numpy()[0] = 1  # never advances
    with pytest.raises(KernelTimeout):
        runtime.launch(k, [a], args=(10,), grid=2, timeout=0.2)
    a.numpy()[0] = 0
    runtime.launch(k, [a], args=(10,), grid=2, timeout=5)
