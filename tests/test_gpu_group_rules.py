"""rt_group_sync and rt_shfl_idx_T for target "cuda", without a GPU: what the verifier
admits and refuses, and what the lowering emits (the device behaviour is in
tests/test_gpu_group.py)."""

from __future__ import annotations

import pytest
from capqr.runtime.compiler.astutil import readable
from capqr.runtime.cuda import translate
from capqr.runtime.errors import VerifyError

GROUP = """
KERNEL void k(cap_t out, int64_t n)
{
    if (rt_block_idx() >= n)
        return;
    rt_group_sync();
    cap_store_f32(out, rt_block_idx(), 1.0f);
}
KERNEL void plain(cap_t out)
{
    cap_store_f32(out, rt_thread_idx(), rt_shfl_idx_f32(1.0f, 3));
}
"""


@pytest.mark.parametrize("checked", [True, False])
def test_group_kernels_leave_the_group_on_return(checked: bool) -> None:
    cs = translate(GROUP, checked=checked)
    assert cs.kernels["k"].group_sync and not cs.kernels["plain"].group_sync
    text = readable(cs.text)
    k_wrapper = text[text.index('extern "C" __global__ void k('):]
    k_wrapper = k_wrapper[:k_wrapper.index("}\n") + 2]
    args = "__rt_pc, out, n" if checked else "out, n"  # checked: the pollcheck counter
    assert f"__rtk_k({args});\n  rt_group_leave();" in k_wrapper
    plain = text[text.index('extern "C" __global__ void plain('):]
    assert "rt_group_leave" not in plain[:plain.index("}\n")]


@pytest.mark.parametrize("cond", ["rt_thread_idx() < 5", "rt_lane_idx() == 0"])
def test_group_sync_under_thread_dependent_control_is_refused(cond: str) -> None:
    src = f"""
KERNEL void k(cap_t out)
{{
    if ({cond})
        rt_group_sync();
}}
"""
    with pytest.raises(VerifyError, match="thread-dependent control flow") as ei:
        translate(src)
    assert ei.value.line == 5


def test_group_sync_after_a_thread_dependent_return_is_refused() -> None:
    src = """
KERNEL void k(cap_t out)
{
    if (rt_thread_idx() > 7)
        return;
    rt_group_sync();
}
"""
    with pytest.raises(VerifyError, match="rt_group_sync"):
        translate(src)


def test_shfl_idx_takes_two_numbers() -> None:
    src = """
KERNEL void k(cap_t out)
{
    cap_store_f32(out, 0, rt_shfl_idx_f32(1.0f));
}
"""
    with pytest.raises(VerifyError, match="takes 2 argument"):
        translate(src)
    src = """
KERNEL void k(cap_t out)
{
    cap_store_f32(out, 0, rt_shfl_idx_f32(1.0f, out));
}
"""
    with pytest.raises(VerifyError, match="passes a cap_t"):
        translate(src)
