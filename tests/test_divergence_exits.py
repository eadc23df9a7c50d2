"""Early exits inside loops (runtime/compiler/divergence.py): a thread that leaves a loop
(return, break, continue) under thread-dependent control is not at the next
iteration's collective, so everything the loop runs after such an exit, in this
iteration or the next, is under divergent control.  Before, only break and
continue re-walked the loop as divergent: a return inside a loop did not.
"""

from __future__ import annotations

import pytest
from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.verifier import verify
from capqr.runtime.errors import VerifyError

# Lane 0 returns from the helper while lanes 1-31 go round and wait in the shuffle
# for it: a deadlock on the GPU.
HELPER_RETURN_IN_LOOP = """\
static double h(double v)
{
    int64_t t = rt_thread_idx();
    for (int64_t k = 0; k < 4; k++) {
        v = v + rt_shfl_xor_f64(v, 1);
        if (t == 0)
            return v;
    }
    return v;
}
KERNEL void kern(cap_t x)
{
    cap_store_f64(x, rt_thread_idx(), h(1.0));
}
"""

# Thread 0 leaves the kernel while the others wait at the next grid barrier.
GROUP_RETURN_IN_LOOP = """\
KERNEL void g(cap_t x, int64_t n)
{
    for (int64_t k = 0; k < n; k++) {
        rt_group_sync();
        if (rt_thread_idx() == 0)
            return;
    }
    cap_store_f32(x, rt_block_idx(), 1.0f);
}
"""

WHILE_RETURN = """\
KERNEL void w(cap_t x, int64_t n)
{
    int64_t k = 0;
    float s = 1.0f;
    while (k < n) {
        s = rt_warp_sum_f32(s);
        if (rt_lane_idx() > 3)
            return;
        k++;
    }
    cap_store_f32(x, rt_thread_idx(), s);
}
"""

DO_RETURN = """\
KERNEL void d(cap_t x, int64_t n)
{
    int64_t k = 0;
    do {
        rt_sync_threads();
        if (rt_thread_idx() < 7)
            return;
        k++;
    } while (k < n);
    cap_store_f32(x, rt_thread_idx(), 1.0f);
}
"""

# A return in an inner loop ends the outer loop's iteration for that thread too.
NESTED_RETURN = """\
KERNEL void m(cap_t x, int64_t n)
{
    float s = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        s = rt_shfl_xor_f32(s, 2);
        for (int64_t j = 0; j < 2; j++) {
            if (rt_thread_idx() == j)
                return;
        }
    }
    cap_store_f32(x, rt_thread_idx(), s);
}
"""


@pytest.mark.parametrize("src,line,call", [
    (HELPER_RETURN_IN_LOOP, 5, "rt_shfl_xor_f64"),
    (GROUP_RETURN_IN_LOOP, 4, "rt_group_sync"),
    (WHILE_RETURN, 6, "rt_warp_sum_f32"),
    (DO_RETURN, 5, "rt_sync_threads"),
    (NESTED_RETURN, 5, "rt_shfl_xor_f32"),
], ids=["helper", "group-kernel", "while", "do-while", "nested-loop"])
def test_collective_after_a_divergent_return_in_a_loop_is_refused(src: str, line: int,
                                                                  call: str) -> None:
    with pytest.raises(VerifyError) as info:
        verify(parse(src), target="cuda")
    err = info.value
    assert err.line == line, str(err)
    assert err.construct == f"call to '{call}' under thread-dependent control flow", str(err)


# What stays accepted: the exit is uniform, or no collective runs after it.
ACCEPTED = [
    ("uniform-return", """\
static double h(double v, int64_t n)
{
    for (int64_t k = 0; k < 4; k++) {
        v = v + rt_shfl_xor_f64(v, 1);
        if (k == n)
            return v;
    }
    return v;
}
KERNEL void kern(cap_t x, int64_t n)
{
    cap_store_f64(x, rt_thread_idx(), h(1.0, n));
}
"""),
    ("return-after-the-loop", """\
KERNEL void kern(cap_t x, int64_t n)
{
    float s = 1.0f;
    for (int64_t k = 0; k < n; k++)
        s = rt_shfl_xor_f32(s, 1);
    if (rt_thread_idx() == 0)
        return;
    cap_store_f32(x, rt_thread_idx(), s);
}
"""),
    ("divergent-return-no-collective", """\
KERNEL void kern(cap_t x, int64_t n)
{
    float s = rt_warp_sum_f32(1.0f);
    for (int64_t k = 0; k < n; k++) {
        if (rt_thread_idx() == k)
            return;
        cap_store_f32(x, k, s);
    }
}
"""),
]


@pytest.mark.parametrize("src", [s for _, s in ACCEPTED], ids=[i for i, _ in ACCEPTED])
def test_uniform_or_trailing_exits_are_accepted(src: str) -> None:
    verify(parse(src), target="cuda")
