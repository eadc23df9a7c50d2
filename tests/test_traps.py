"""Hardware traps a kernel could use to kill the host are turned into faults."""

from __future__ import annotations

import numpy as np
import pytest
from capqr import capabilities, runtime

SRC = """
KERNEL void divide(cap_t out, int64_t a, int64_t b)
{
    int32_t r = 7;
    r %= (int32_t)b;
    cap_store_i64(out, 0, a / b);
    cap_store_i64(out, 1, a % b);
    cap_store_i64(out, 2, r);
    cap_store_i64(out, 3, (int64_t)(1.0 / (double)b));
}

KERNEL void huge_stack(cap_t out)
{
    double w[1048576];
    double v[1048576];
    w[0] = 1.0;
    v[0] = 2.0;
    cap_store_f64(out, 0, w[0] + v[0]);
}
"""


@pytest.fixture(scope="module")
def divide():
    return runtime.compile(SRC, "divide")


def test_integer_division_matches_c(divide) -> None:
    out = capabilities.alloc(4, np.int64)
    runtime.launch(divide, [out], args=(-7, 2))
    assert out.numpy()[:3].tolist() == [-3, -1, 1]  # C truncates toward zero


@pytest.mark.parametrize("b", [0])
def test_division_by_zero_faults_instead_of_sigfpe(divide, b) -> None:
    out = capabilities.alloc(4, np.int64, name="out")
    out.numpy()[:] = 99
    with pytest.raises(runtime.CapabilityFault) as e:
        runtime.launch(divide, [out], args=(7, b), grid=3)
    assert e.value.reason == "division-by-zero" and e.value.line == 5
    assert out.numpy().tolist() == [99, 99, 99, 99]  # nothing after the fault ran


def test_int64_min_div_minus_one_wraps(divide) -> None:
    out = capabilities.alloc(4, np.int64)
    runtime.launch(divide, [out], args=(-(2**63), -1))
    assert out.numpy()[:3].tolist() == [-(2**63), 0, 0]


def test_local_arrays_beyond_the_stack_budget_are_rejected() -> None:
    with pytest.raises(runtime.VerifyError) as e:
        runtime.compile(SRC, "huge_stack")
    assert e.value.construct == "local arrays" and e.value.line == 12
