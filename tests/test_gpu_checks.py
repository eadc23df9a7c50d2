"""The GPU QR kernels check at the grain of tiles and panels, not per element.

runtime/cuda/census.py counts, in the CUDA the checked build compiles, the
checks a kernel's fast path (every versioning guard holding) runs inside loops:
accesses that test their own index and range guards evaluated once per
iteration of an enclosing loop.  No GPU needed.
"""

from __future__ import annotations

import pytest
from capqr.kernels import gpu as g
from capqr.kernels.gpu import gen_whole
from capqr.runtime.cuda.census import loop_checks

#: Every GPU QR kernel: (source, entry point) by launch kind, whole<cap> per class.
KERNELS = {kind: g._kernel_spec(kind)[:2] for kind in (
    "panel", "panel_small", "steps", "update_z", "update_apply", "update2_z", "update2_apply")}
KERNELS.update({f"whole{cap}": (gen_whole.source(cap, threads), "gpu_qr_whole")
                for cap, threads in gen_whole.CLASSES})


def test_census_sees_per_element_checks() -> None:
    """The census counts what it should: an index no guard covers (i * i) is checked
    per element, and a loop around a barrier guards its inner loop per iteration."""
    src = """
KERNEL void k(cap_t x, int64_t n)
{
    float smem_s[64];
    int64_t t = rt_thread_idx();
    for (int64_t i = 0; i < n; i++)
        cap_store_f32(x, i * i, 1.0f);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = t; i < n; i += 64)
            cap_store_f32(x, j * n + i, 2.0f);
        rt_sync_threads();
        smem_s[t] = 0.0f;
    }
}
"""
    got = loop_checks(src)["k"]
    assert [what for what, _line in got.checks] == ["rt_store_f32", "rt_lidx"]
    assert [line for _what, line in got.checks] == [7, 12]
    assert len(got.guards) == 1 and "rt_range_ok" in got.guards[0][0]
    assert got.per_element == 3


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_gpu_qr_hot_loops_have_no_per_element_checks(kind: str) -> None:
    source, name = KERNELS[kind]
    got = loop_checks(source)[name]
    assert got.per_element == 0, f"{kind}: checks {got.checks}, guards {got.guards}"
