"""The GPU QR kernels check at the grain of tiles and panels, not per element.

runtime/cuda/census.py counts, in the CUDA the checked build compiles, the
checks a kernel's fast path (every versioning guard holding) runs inside loops:
accesses that test their own index and range guards evaluated once per
iteration of an enclosing loop.  No GPU needed.
"""

from __future__ import annotations

import re
import shutil

import pytest
from capqr.kernels import gpu as g
from capqr.kernels.gpu import gen_whole
from capqr.runtime.cuda.census import loop_checks

#: Every GPU QR kernel: (source, entry point) by launch kind, whole<cap> per class.
KERNELS = {kind: g._kernel_spec(kind)[:2] for kind in g.LAUNCH_KINDS}


def test_census_sees_per_element_checks() -> None:
    """The census counts what it should: an index no guard covers (i * i) is checked
    per element; a loop around a barrier whose indices no interval bounds (k comes
    from memory) gets no cover guard, so its inner loop's guard runs per iteration,
    and so do its checked accesses."""
    src = """
KERNEL void census(cap_t x, cap_t ks, int64_t n)
{
    float smem_s[64];
    int64_t t = rt_thread_idx();
    for (int64_t i = 0; i < n; i++)
        cap_store_f32(x, i * i, 1.0f);
    for (int64_t j = 0; j < n; j++) {
        int64_t k = cap_load_i64(ks, j);
        for (int64_t i = t; i < n; i += 64)
            cap_store_f32(x, j * n + i + k, 2.0f);
        rt_sync_threads();
        smem_s[k] = 0.0f;
    }
}
"""
    got = loop_checks(src)["census"]
    assert got.checks == [("rt_store_f32", 7), ("rt_load_i64", 9), ("rt_local_idx", 13)]
    assert len(got.guards) == 1 and "rt_range_ok" in got.guards[0][0]
    assert got.per_element == 4


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_gpu_qr_hot_loops_have_no_per_element_checks(kind: str) -> None:
    source, name = KERNELS[kind]
    got = loop_checks(source)[name]
    assert got.per_element == 0, f"{kind}: checks {got.checks}, guards {got.guards}"


#: Counts each cover guard (runtime/compiler/hoist/: one interval check before a loop that
#: waits at a barrier, computed by a function of its own) as the emulated threads
#: evaluate it, and the ones that fail.
_COVER_COUNTER = r"""
#include <atomic>
static std::atomic<long long> rt_emu_covers[2];
extern "C" long long capqr_emu_covers(int failed) { return rt_emu_covers[failed].load(); }
static int rt_emu_cover(int ok) { rt_emu_covers[0]++; if (!ok) rt_emu_covers[1]++; return ok; }
"""
_COVER = re.compile(r"(__noinline__ int __rtg\w+\([^)]*\)\n\{.*?\n  return )(.*?);\n\}", re.S)


def _count_covers(text: str) -> str:
    text, found = _COVER.subn(r"\1rt_emu_cover(\2);\n}", text)
    assert found, "no cover guard in the generated CUDA"
    return _COVER_COUNTER + text


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_cover_guards_hold_on_the_qr_plans(tmp_path_factory) -> None:
    """The static census is what runs: on the emulated lane, every cover guard of the
    panel (register panels, and with reg=False gpu_qr_panel_small and gpu_qr_panel),
    column-step and update kernels holds (their fast copies run) for the launch plans
    of one and two panels per update, short and tall panels, a batch and a ragged
    last panel; the results still pass kernels.check."""
    import emulate_cuda
    import numpy as np
    from capqr import kernels
    from test_gpu_emulated import KINDS, _qr

    d = tmp_path_factory.mktemp("emu_covers")
    built = emulate_cuda.build_many([s for s, _ in KINDS.values()], workdir=d,
                                    edit=_count_covers)
    emulate_cuda._ffi.cdef("long long capqr_emu_covers(int failed);", override=True)
    emulated = {kind: built[src][name] for kind, (src, name) in KINDS.items()}
    kinds = set()
    for batch, n, tall_rows, two_panel, reg in ((2, 40, None, False, True),
                                                (1, 300, None, True, False),
                                                (1, 200, None, False, True),
                                                (2, 100, 64, True, False)):
        a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
        H, tau = _qr(emulated, a, two_panel, tall_rows, reg=reg)
        assert kernels.check(a, H, tau).ok
        kinds |= {s.kernel for s in g.launch_plan(batch, n, tall_rows, two_panel=two_panel,
                                                  whole=False, reg=reg, per_matrix=False)}
    assert kinds == set(KINDS)
    for lib in {id(k.lib): k.lib for k in emulated.values()}.values():
        assert lib.capqr_emu_covers(0) > 0 and lib.capqr_emu_covers(1) == 0


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
@pytest.mark.parametrize("cap,threads", gen_whole.CLASSES[:3])
def test_cover_guards_hold_on_gpu_qr_whole(tmp_path_factory, cap: int, threads: int) -> None:
    """gpu_qr_whole (one block per matrix): its column loop's cover holds on the
    emulated lane for a batch at the class's largest size and one below it, and
    the result passes kernels.check."""
    import emulate_cuda
    import numpy as np
    from capqr import kernels

    k = emulate_cuda.build(gen_whole.source(cap, threads), workdir=tmp_path_factory.mktemp("emu"),
                           edit=_count_covers)["gpu_qr_whole"]
    emulate_cuda._ffi.cdef("long long capqr_emu_covers(int failed);", override=True)
    for n in (cap, cap - 7):
        a = np.random.default_rng(n).standard_normal((2, n, n)).astype(np.float32)
        H, tau = a.copy(), np.zeros((2, n), np.float32)
        assert k.launch([H, tau, n, 2], 2, threads) is None
        assert kernels.check(a, H, tau).ok
    assert k.lib.capqr_emu_covers(0) > 0 and k.lib.capqr_emu_covers(1) == 0
