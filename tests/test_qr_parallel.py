"""The parallel QR variant (kernels/src/qrt.c driven by kernels/parallel.py).

Its two paths (one block per matrix, and host-driven panel steps with one
block per (matrix, column tile)) must pass the checker, agree bitwise with
each other whatever the tile width, grid or worker count, and stop with an
exact CapabilityFault when a tile kernel goes out of bounds.  The group
steps (qrt_gstep: the look-ahead panel on a group of blocks) must pass the
checker and agree bitwise whatever the group size.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import capqr
import numpy as np
import pytest
from capqr import capabilities, kernels, runtime
from capqr.kernels import check, parallel, qr, sources

ROOT = Path(__file__).resolve().parents[1]
#: Where this process imported capqr from (its parent folder): the subprocesses must
#: import the same copy, which the checkout's root (itself the package) is not.
IMPORT_ROOT = str(Path(capqr.__file__).parent.parent)


def _output_on_a_pool(script: str, threads: str) -> str:
    """The stripped stdout of ``script`` run by a Python of its own on a pool of ``threads``
    workers (CAPQR_THREADS, read once per process); the test fails if it exits non-zero."""
    env = dict(os.environ, CAPQR_THREADS=threads, PYTHONPATH=IMPORT_ROOT)
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


def _rand(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _run(a3: np.ndarray, steps: bool, nb: int = 64, tw: int = 64, grid: int | None = None,
         checked: bool = True) -> tuple[np.ndarray, np.ndarray]:
    h = np.array(a3, order="C", copy=True)
    tau = np.zeros((a3.shape[0], min(a3.shape[1:])), a3.dtype)
    dt = "float64" if a3.dtype == np.float64 else "float32"
    parallel.run(h, tau, dt, nb, tw, checked, grid, None, steps=steps)
    return h, tau


def test_listed_and_default():
    assert "parallel" in kernels.variants()
    A = _rand((2, 70, 70), seed=1)
    H1, t1 = qr(A)
    H2, t2 = qr(A, "parallel")
    assert H1.tobytes() == H2.tobytes() and t1.tobytes() == t2.tobytes()
    with pytest.raises(ValueError, match="nb=65"):
        qr(A, "parallel", nb=65)


@pytest.mark.parametrize("steps", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (33, 20), (20, 33), (3, 45, 31),
                                   (2, 31, 45), (1, 300, 200), (1, 200, 300), (2, 257, 257),
                                   (20, 32, 32), (3, 176, 176)])
def test_shapes_pass_the_checker(shape, steps):
    A = _rand(shape, seed=sum(shape))
    a3 = A if A.ndim == 3 else A[None]
    H, tau = _run(a3, steps, nb=32)
    rep = check(a3, H, tau)
    assert rep.ok, str(rep)


def test_float64():
    A = _rand((2, 150, 140), np.float64, seed=3)
    H, tau = _run(A, True, nb=16)
    assert H.dtype == np.float64
    rep = check(A, H, tau)
    assert rep.ok and rep.worst()["resid"] < 30, str(rep)


@pytest.mark.parametrize("shape,nb", [((2, 257, 257), 64), ((1, 300, 190), 32),
                                      ((1, 190, 300), 16), ((3, 96, 96), 7)])
def test_bitwise_equal_across_paths_tiles_and_grids(shape, nb):
    """A column's update does not depend on the tile it is in or the block that runs it."""
    a3 = _rand(shape, seed=7)
    ref = _run(a3, steps=False, nb=nb)
    for steps, tw, grid in [(False, 64, 1), (True, 64, None), (True, 17, 3), (True, 1, 2),
                            (True, 40, 1)]:
        h, t = _run(a3, steps=steps, nb=nb, tw=tw, grid=grid)
        assert h.tobytes() == ref[0].tobytes() and t.tobytes() == ref[1].tobytes(), \
            (steps, tw, grid)


def test_tile_source_is_the_generators_output():
    """kernels/src/tile.c is written by kernels/gen_tile.py; an edit of one alone drifts."""
    from capqr.kernels import gen_tile

    assert gen_tile.path().read_text() == gen_tile.source()
    assert gen_tile.main(["--check"]) == 0
    # float64 takes its blocks of doubles (32 columns, twice across a wide tile) from the
    # generator, not from tile.c
    assert "for (int64_t lb = 0; lb < 2; lb++)" in sources.source("qrt", "float64")
    assert "for (int64_t lb" not in sources.source("qrt", "float32")


@pytest.mark.parametrize("dtype,n,seed", [(np.float32, 256, 3), (np.float64, 200, 4)])
def test_both_register_blocks_give_the_same_columns(dtype, n, seed):
    """A 32-wide tile takes the narrow block, a 64-wide one the wide block (float64: a
    4 x 32 block of doubles, once or twice across the tile): the columns they share
    come out bitwise the same (the tile update's own oracle is the test above; this
    pins the two shapes against each other on a matrix whose tiles are all full)."""
    a3 = _rand((1, n, n), dtype=dtype, seed=seed)
    wide = _run(a3, steps=True, nb=64, tw=64, grid=2)
    narrow = _run(a3, steps=True, nb=64, tw=32, grid=2)
    assert wide[0].tobytes() == narrow[0].tobytes() and wide[1].tobytes() == narrow[1].tobytes()
    assert check(a3, *wide).ok


def test_checked_equals_raw_bitwise():
    a3 = _rand((2, 130, 120), seed=11)
    for steps in (False, True):
        h1, t1 = _run(a3, steps, nb=32, checked=True)
        h2, t2 = _run(a3, steps, nb=32, checked=False)
        assert h1.tobytes() == h2.tobytes() and t1.tobytes() == t2.tobytes()


_HASH_SCRIPT = """
import hashlib, sys
import numpy as np
from capqr.kernels import parallel
a = np.random.default_rng(5).standard_normal((1, 200, 200)).astype(np.float32)
t = np.zeros((1, 200), np.float32)
parallel.run(a, t, "float32", 32, 24, True, None, None, steps=True)
print(hashlib.sha256(a.tobytes() + t.tobytes()).hexdigest())
"""


@pytest.mark.parametrize("steps,group,dtype", [(True, None, np.float32), (True, 2, np.float32),
                                               (False, None, np.float32),
                                               (True, None, np.float64)])
def test_rows_longer_than_the_matrix(steps, group, dtype):
    """parallel.run on rows of ld > n elements (kernels.qr pads to whole cache lines):
    the first n columns get bitwise what the unpadded run gives, and the padding is
    never touched (a sentinel stays)."""
    batch, m, n = (1 if group else 2), 150, 137
    a3 = _rand((batch, m, n), dtype, seed=15)
    dt = "float64" if dtype == np.float64 else "float32"
    want, wtau = np.array(a3), np.zeros((batch, n), dtype)
    parallel.run(want, wtau, dt, 32, 48, True, None, None, steps=steps, group=group)
    ld = parallel.padded_ld(n, np.dtype(dtype).itemsize)
    assert ld > n and ld * np.dtype(dtype).itemsize % 64 == 0
    h = np.full((batch, m, ld), 7.0, dtype)
    h[:, :, :n] = a3
    tau = np.zeros((batch, n), dtype)
    parallel.run(h, tau, dt, 32, 48, True, None, None, steps=steps, group=group, n=n)
    assert h[:, :, :n].tobytes() == want.tobytes() and tau.tobytes() == wtau.tobytes()
    assert (h[:, :, n:] == 7.0).all()
    with pytest.raises(ValueError, match="do not fit"):
        parallel.run(h, tau, dt, 32, 48, True, None, None, n=ld + 1)


def test_kernels_qr_pads_rows_only_for_steps(monkeypatch):
    """kernels.qr factors a single matrix spread over the workers in rows padded to
    whole lines and returns it compacted (C-contiguous, aligned): bitwise what it
    returns unpadded."""
    import importlib

    qr_mod = importlib.import_module("capqr.kernels.qr")
    monkeypatch.setattr(runtime, "pinned", lambda: True)  # coop's thresholds for pinned pools
    assert parallel.working_ld(1, 700, 700, 32, 4, 2) == 704   # the steps in one launch
    assert parallel.working_ld(1, 240, 240, 32, 4, 2) == 240   # below COOP_MIN_N: one block
    assert parallel.working_ld(1, 300, 300, 32, 4, 2) == 304   # the steps in one launch
    assert parallel.working_ld(1, 400, 400, 32, 4, 2) == 400   # the steps in one launch
    assert parallel.working_ld(1, 401, 401, 32, 4, 2) == 416
    assert parallel.working_ld(1, 300, 300, 32, 4, 3) == 304   # steps
    assert parallel.working_ld(1, 300, 300, 32, 4, 1) == 300   # one worker
    assert parallel.working_ld(4, 300, 300, 32, 4, 2) == 300   # a block per matrix
    monkeypatch.setattr(parallel, "STEPS_MIN_N", ())   # steps at any size, so rows get padded
    for n in (129, 200):
        assert parallel.working_ld(1, n, n, 32, 4, runtime.threads()) > n
        a = _rand((n, n), seed=n)
        H, tau = qr(a)
        assert H.flags.c_contiguous and H.ctypes.data % 64 == 0 and H.shape == (n, n)
        monkeypatch.setattr(qr_mod, "PAD_ROWS", False)
        H0, tau0 = qr(a)
        monkeypatch.setattr(qr_mod, "PAD_ROWS", True)
        assert H.tobytes() == H0.tobytes() and tau.tobytes() == tau0.tobytes()


def test_unpadding_moves_every_matrix_of_a_batch():
    """kernels.qr's compaction of padded rows (overlapping source and target in one
    buffer) keeps every element of every matrix, in order."""
    import importlib

    qr_mod = importlib.import_module("capqr.kernels.qr")
    for batch, m, n, ld in ((3, 5, 7, 16), (2, 40, 17, 32), (1, 1, 1, 16)):
        want = _rand((batch, m, n), seed=ld)
        h = qr_mod.aligned_empty((batch, m, ld), np.float32)
        h[...] = -1.0
        h[:, :, :n] = want
        out = qr_mod._unpadded(h, n)
        assert out.flags.c_contiguous and out.ctypes.data == h.ctypes.data
        assert out.tobytes() == want.tobytes()


def test_same_result_for_any_worker_count():
    """Also with 16 workers, whose steps balance their tiles down to 16 columns."""
    a = np.random.default_rng(5).standard_normal((1, 200, 200)).astype(np.float32)
    t = np.zeros((1, 200), np.float32)
    parallel.run(a, t, "float32", 32, 24, True, None, None, steps=True)
    want = hashlib.sha256(a.tobytes() + t.tobytes()).hexdigest()
    for threads in ("1", "3", "16"):
        assert _output_on_a_pool(_HASH_SCRIPT, threads) == want, f"CAPQR_THREADS={threads}"


def test_workspace_slots_are_whole_lines():
    """Each slot (steps) or block region (one block per matrix) is a whole number of
    16 elements, so every slot starts on a line as the workspace does; the steps on
    m = 150 (slots of 5974 elements before rounding) fault if the kernel's offsets
    (qrt.c slot_elems) round further than work_elems sizes the workspace."""
    for m, nb in ((150, 32), (137, 17), (33, 64)):
        assert parallel.work_elems(1, m, nb, True, 1) % 32 == 0
        assert parallel.work_elems(1, m, nb, False, 3) % 48 == 0
    a3 = _rand((2, 150, 150), seed=16)
    H, tau = _run(a3, steps=True, nb=32)
    assert check(a3, H, tau).ok


def test_step_tile_width():
    """The narrowest width (a multiple of 8, at least TW_MIN) that keeps the rounds of
    tiles the workers need at the full width."""
    # n = 4096, step 0: 3968 trailing columns, 62 tiles of 64 = 6 rounds of 12
    # workers, 72 tiles of 56 as well
    assert parallel.step_tile_width(1, 4096, 4096, 64, 0, 64, 12) == 56
    assert parallel.step_tile_width(1, 4096, 4096, 64, 3840, 64, 12) == parallel.TW_MIN
    assert parallel.step_tile_width(1, 4096, 4096, 64, 0, 64, 1) == 64   # one worker
    assert parallel.step_tile_width(1, 4096, 4096, 64, -1, 64, 12) == 64  # no tiles
    assert parallel.step_tile_width(8, 2048, 2048, 64, 0, 64, 8) == 64    # whole rounds
    assert parallel.step_tile_width(1, 200, 200, 32, 0, 12, 16) == 12     # never wider


_GROUP_HASH_SCRIPT = """
import hashlib
import numpy as np
from capqr.kernels import parallel
a = np.random.default_rng(6).standard_normal((1, 1100, 300)).astype(np.float32)
t = np.zeros((1, 300), np.float32)
parallel.run(a, t, "float32", 32, 64, True, None, None)
print(hashlib.sha256(a.tobytes() + t.tobytes()).hexdigest())
"""


def test_group_steps_same_result_for_8_and_16_workers():
    """The group look-ahead steps with 4 and 12 tile blocks (tiles balanced to different
    widths): bitwise the same."""
    out = {threads: _output_on_a_pool(_GROUP_HASH_SCRIPT, threads) for threads in ("8", "16")}
    assert out["8"] == out["16"] and len(out["8"]) == 64


# The store-back tile of larfb_tile's step 3 is one column too wide: inside the
# matrix that lands in the next row (silent, as any in-bounds bug is), but the last
# row of the last matrix's last tile goes one element past the buffer.
_STORE_BACK = "cap_tile_store_f32(A, (r0 + t0) * ld + c0, ld, kc, cw, cp, 0, 64);"
_PLANTED = _STORE_BACK.replace("kc, cw, cp", "kc, cw + 1, cp")


def _mutate(monkeypatch, old: str, new: str) -> None:
    real = sources.source

    def mutated(family: str, dtype: str = "float32") -> str:
        text = real(family, dtype)
        if family in ("qrt", "qrt_group") and old in text:  # qrt_group holds qrt.c too
            assert text.count(old) == 1
            text = text.replace(old, new)
        return text

    assert real("qrt_group").count(old) == 1, "the planted bug's target text is missing"
    parallel._kernels.cache_clear()
    monkeypatch.setattr(sources, "source", mutated)


@pytest.fixture
def restore_kernels():
    yield
    parallel._kernels.cache_clear()


@pytest.fixture
def planted(monkeypatch, restore_kernels):
    _mutate(monkeypatch, _STORE_BACK, _PLANTED)


def test_planted_tile_overflow_is_caught(planted):
    """Steps with 48-wide tiles: the extra column stays inside the local tile and
    the one store past the matrix buffer is refused."""
    batch, m, n = 2, 150, 150
    a3 = _rand((batch, m, n), seed=2)
    with pytest.raises(runtime.CapabilityFault) as ei:
        _run(a3, steps=True, nb=32, tw=48)
    f = ei.value
    assert f.reason == "out-of-bounds" and f.access == "store"
    assert f.buffer == "qr.a"
    # relative to the last matrix's origin: row m - 1, column n (one past the end)
    assert f.index == m * n
    assert f.kernel == "qrt_step_f32"
    assert sources.locate("qrt", f.line)[0] == "tile.c"


def test_planted_overflow_of_a_full_tile_is_caught_in_the_local_array(planted):
    """One block per matrix, 64-wide tiles: a tile reads its local array flat, so the
    extra column of rows 0..62 is the next row's first element, and the first read
    outside cp is row 63's, flat index 64 * 64 (the tile is refused as a whole)."""
    a3 = _rand((2, 150, 150), seed=2)
    with pytest.raises(runtime.CapabilityFault) as ei:
        _run(a3, steps=False, nb=32)
    f = ei.value
    assert f.reason == "local-array" and f.buffer == "cp" and f.index == 64 * 64
    assert f.kernel == "qrt_f32"
    assert sources.locate("qrt", f.line)[0] == "tile.c"


# ---------------------------------------------------------------------------
# the panel factorisation (panel_qr in qrt.c) on inputs that take its side paths


@pytest.mark.parametrize("shape,nb", [((1, 130, 130), 64), ((2, 70, 200), 64), ((1, 1000, 40), 64),
                                      ((3, 67, 67), 64), ((1, 9, 9), 64), ((2, 65, 1), 64)])
def test_panel_shapes_pass_the_checker(shape, nb):
    """Panels of 64 with a short last panel, tall and wide, n < nb, one column."""
    a3 = _rand(shape, seed=sum(shape))
    for steps in (False, True):
        H, tau = _run(a3, steps, nb=nb)
        rep = check(a3, H, tau)
        assert rep.ok, (steps, str(rep))


def test_panel_tiny_and_zero_columns():
    """Tiny columns take xLARFG's rescaling loop; columns already zero below the
    diagonal give tau = 0 (H = I) and leave the matrix as it is."""
    a3 = _rand((3, 150, 120), seed=4)
    a3[0] *= np.float32(1e-36)          # beta below safmin: rescaled, like LAPACK
    a3[1][:, 5] = 0.0                  # a zero column inside the first panel
    a3[2] = np.triu(a3[2])             # every column zero below its diagonal
    for steps in (False, True):
        H, tau = _run(a3, steps, nb=32)
        rep = check(a3, H, tau)
        assert rep.ok, (steps, str(rep))
        assert tau[1, 5] == 0.0
        assert not tau[2].any() and H[2].tobytes() == a3[2].tobytes()
        assert np.abs(np.diag(H[0])).min() > 0  # not flushed to zero


# A store one column past the panel in the look-ahead item's copy back to A:
# for every panel but the last it lands inside the matrix (silent, as any
# in-bounds bug is); the last panel's last row writes one element past the
# buffer.  That panel is factored late in the step sequence.
_COPY_BACK = ("                for (int64_t p = 0; p < jbn; p++)\n"
              "                    cap_store_f32(A, (j + t) * ld + jn + p,")
_COPY_BACK_PLANTED = _COPY_BACK.replace("p < jbn", "p <= jbn")


def test_planted_fault_in_a_late_step_is_reported_exactly(monkeypatch, restore_kernels):
    _mutate(monkeypatch, _COPY_BACK, _COPY_BACK_PLANTED)
    batch, m, n = 2, 150, 150
    a3 = _rand((batch, m, n), seed=9)
    trace: list = []
    with pytest.raises(runtime.CapabilityFault) as ei:
        h = np.array(a3)
        parallel.run(h, np.zeros((batch, n), np.float32), "float32", 32, 64, True, None, None,
                     steps=True, trace=trace)
    f = ei.value
    assert f.reason == "out-of-bounds" and f.access == "store" and f.buffer == "qr.a"
    assert f.index == m * n  # row m - 1, column n of the last matrix
    assert f.kernel == "qrt_step_f32"
    assert sources.locate("qrt", f.line)[0] == "qrt.c"
    # panels 0, 32, ..., 128: the last one is factored in step j = 96; the
    # launches before it completed and none ran after it
    assert [j for j, _, _ in trace] == [-1, 0, 32, 64]


# Every item of step j = 64 spins until tau[0] holds a value it never holds.
_ITEMS = "    int64_t items = batch * (npan + ntiles);\n"
_SPIN = _ITEMS + ("    while (j == 64 && cap_load_f32(tau, 0) != 12345.0f)\n"
                  "        items = items + 1;\n")


def test_timeout_in_the_middle_of_the_sequence(monkeypatch, restore_kernels):
    _mutate(monkeypatch, _ITEMS, _SPIN)
    a3 = _rand((1, 200, 200), seed=10)
    trace: list = []
    with pytest.raises(runtime.KernelTimeout) as ei:
        parallel.run(np.array(a3), np.zeros((1, 200), np.float32), "float32", 32, 64, True,
                     None, 1.0, steps=True, trace=trace)
    assert ei.value.kernel == "qrt_step_f32" and ei.value.timeout == 1.0
    assert [j for j, _, _ in trace] == [-1, 0, 32]
    monkeypatch.undo()
    parallel._kernels.cache_clear()
    H, tau = qr(a3[0])  # the pool is still usable
    assert check(a3[0], H, tau).ok


class _SteppingClock:
    """time.monotonic advancing 10 s per call; perf_counter real."""

    def __init__(self):
        self.now = 0.0
        self.perf_counter = __import__("time").perf_counter

    def monotonic(self) -> float:
        self.now += 10.0
        return self.now


def test_no_launch_starts_after_the_sequence_deadline(monkeypatch):
    """Each launch finishes well inside its share, but the clock says the
    deadline passed before the third: it is not started."""
    monkeypatch.setattr(parallel, "time", _SteppingClock())
    a3 = _rand((1, 200, 200), seed=12)
    trace: list = []
    with pytest.raises(runtime.KernelTimeout) as ei:
        parallel.run(np.array(a3), np.zeros((1, 200), np.float32), "float32", 32, 64, True,
                     None, 25.0, steps=True, trace=trace)
    assert ei.value.kernel == "qrt_step_f32" and ei.value.timeout == 25.0
    assert [j for j, _, _ in trace] == [-1, 0]


# The group look-ahead panel (qrt_gstep: rt_group_sync between the panel's blocks)


@pytest.mark.parametrize("shape", [(130, 130), (300, 200), (200, 300), (257, 129), (70, 70),
                                   (1000, 150)])
def test_group_panel_passes_the_checker_and_ignores_the_group_size(shape):
    """Its result passes the checker, is close to the per-matrix kernel's, and is
    bitwise the same for every group size (the chunk sums are added in chunk
    order, whoever formed them)."""
    a3 = _rand((1, *shape), seed=sum(shape))
    out = {}
    for g in sorted({1, min(2, runtime.threads())}):
        h, tau = np.array(a3), np.zeros((1, min(shape)), np.float32)
        parallel.run(h, tau, "float32", 64, 64, True, None, None, steps=True, group=g)
        rep = check(a3, h, tau)
        assert rep.ok, (g, str(rep))
        out[g] = h.tobytes() + tau.tobytes()
    assert len(set(out.values())) == 1
    H1, t1 = _run(a3, False)
    assert np.allclose(h, H1, rtol=1e-3, atol=1e-3 * np.abs(H1).max())


def test_group_panel_side_paths():
    """Tiny values (squares summed in double: no rescaling needed), a zero column
    (tau = 0, H = I) and a triangular matrix (nothing to do)."""
    for a, what in ((_rand((1, 150, 120), seed=4) * np.float32(1e-36), "tiny"),
                    (_rand((1, 150, 120), seed=5) * np.float32(1e30), "huge"),
                    (np.triu(_rand((1, 150, 120), seed=6)), "triangular")):
        h, tau = np.array(a), np.zeros((1, 120), np.float32)
        parallel.run(h, tau, "float32", 32, 64, True, None, None, steps=True, group=1)
        assert check(a, h, tau).ok, what
        if what == "triangular":
            assert not tau.any() and h.tobytes() == a.tobytes()
        else:
            assert np.abs(np.diag(h[0])).min() > 0, what


def test_group_panel_fault_while_the_group_waits(monkeypatch, restore_kernels):
    """tau of the group's panel written 8 columns too far on: block 0 stores tau
    past its end at column 14 of the last panel while the rest of the group waits
    at the next barrier.  An exact CapabilityFault, and the waiting blocks stop."""
    old = "cap_offset_f32(tau, jn), Tn, nb,\n"
    _mutate(monkeypatch, old, old.replace("jn)", "jn + 8)"))
    m = n = 150
    a3 = _rand((1, m, n), seed=13)
    trace: list = []
    with pytest.raises(runtime.CapabilityFault) as ei:
        parallel.run(np.array(a3), np.zeros((1, n), np.float32), "float32", 32, 64, True,
                     None, 60.0, steps=True, group=min(2, runtime.threads()), trace=trace)
    f = ei.value
    assert (f.reason, f.access, f.buffer, f.kernel, f.block) == (
        "out-of-bounds", "store", "qr.tau", "qrt_gstep_f32", 0)
    assert f.index == 14  # column 14 of panel 128, from tau + 128 + 8: tau[150], past the end
    assert sources.locate("qrt_group", f.line)[0] == "qrt_group.c"
    assert [j for j, _, _ in trace] == [-1, 0, 32, 64]  # the step that factors panel 128


def test_group_panel_default_and_refusals():
    assert parallel.default_group(1, 1024, "float32", 16) == parallel.GROUP
    assert parallel.default_group(1, 1024, "float32", 2) == 0   # no worker left for the tiles
    assert parallel.default_group(1, 1024, "float64", 16) == 0  # squares could overflow double
    assert parallel.default_group(2, 1024, "float32", 16) == 0
    assert parallel.default_group(1, 512, "float32", 16) == 0   # not measured below 1024 rows
    a3 = _rand((2, 100, 100))
    with pytest.raises(ValueError, match="single matrix"):
        parallel.run(np.array(a3), np.zeros((2, 100), np.float32), "float32", 32, 64, True,
                     None, None, steps=True, group=2)
    with pytest.raises(ValueError, match="do not combine"):
        parallel.run(np.array(a3[:1]), np.zeros((1, 100), np.float32), "float32", 32, 64, True,
                     3, None, steps=True, group=1)


def test_group_step_kernel_with_fewer_tile_blocks():
    """qrt_gstep called directly with one tile block (grid = G + 1) covers every
    tile by striding: the same result as with one block per tile."""
    from capqr import capabilities

    m = n = 200
    nb, tw, G = 32, 32, 1
    a3 = _rand((1, m, n), seed=14)
    want, wtau = np.array(a3), np.zeros((1, n), np.float32)
    parallel.run(want, wtau, "float32", nb, tw, True, None, None, steps=True, group=G)
    k = parallel.group_kernel_for("float32", True)
    h, tau = np.array(a3), np.zeros((1, n), np.float32)
    caps = [capabilities.wrap(h), capabilities.wrap(tau),
            capabilities.alloc((parallel.work_elems(1, m, nb, True, 1),), np.float32),
            capabilities.alloc((parallel.group_work_elems(m),), np.float64)]
    for j in [-1, *range(0, n, nb)]:
        runtime.launch(k, caps, args=(m, n, nb, j, tw, G, n), grid=G + 1, group=G)
    assert h.tobytes() == want.tobytes() and tau.tobytes() == wtau.tobytes()


_TALL_SCRIPT = """
import numpy as np
from capqr import kernels
a = np.random.default_rng(3).standard_normal((2048, 64)).astype(np.float32)
h, tau = kernels.qr(a)
rep = kernels.check(a, h, tau)
print(rep.ok)
"""


def test_tall_single_matrix_on_a_large_pool():
    """A single tall float32 matrix too narrow for the steps (two panels or fewer) on a
    pool large enough for the group panel factors as one block: the automatic group
    choice follows the steps decision (it picked the group panel and refused it)."""
    assert _output_on_a_pool(_TALL_SCRIPT, "8") == "True"


@pytest.mark.parametrize("batch,m,n,dtype", [
    (1, 4096, 64, "float32"), (3, 32, 32, "float32"), (1, 64, 64, "float32"),
    (1, 1024, 1024, "float32"), (1, 1024, 1024, "float64"), (4, 512, 96, "float32"),
])
def test_default_path_names_the_kernel_run_launches(monkeypatch, batch, m, n, dtype):
    """parallel.default_path (which the benches report) is the decision run() acts
    on: the kernels run launches are the named path's, on this process's pool."""
    expect = {"tall": "qrt_tall", "small": "qr_small", "one block": "qrt",
              "steps": "qrt_step", "group steps": "qrt_gstep", "coop steps": "qrt_coop"}
    path = parallel.default_path(batch, m, n, dtype, runtime.threads())
    names: set[str] = set()
    launch = runtime.launch

    def recording(k, *a, **kw):
        names.add(k.name.rsplit("_", 1)[0])
        return launch(k, *a, **kw)

    monkeypatch.setattr(runtime, "launch", recording)
    h = np.array(_rand((batch, m, n), np.float64 if dtype == "float64" else np.float32))
    tau = np.zeros((batch, min(m, n)), h.dtype)
    parallel.run(h, tau, dtype, None, 64, True, None, None)
    assert names == {expect[path]}, (path, names)
    # path_kernels (what the benches build ahead) holds what run launched
    assert names <= {k.name.rsplit("_", 1)[0] for k in parallel.path_kernels(path, dtype, True)}


#: default_path's decisions: (batch, m, n, dtype, workers, path).
_DEFAULT_PATHS = [
    # 2 pinned workers: one launch for one matrix from the work of 256 x 256 (qrt_coop),
    # and for 8192 x 256 too (the tall path only from 64 times as tall there)
    (1, 512, 512, "float32", 2, "coop steps"),
    (1, 256, 256, "float32", 2, "coop steps"),
    (1, 240, 240, "float32", 2, "one block"),
    (1, 1000, 300, "float64", 2, "coop steps"),
    (1, 32, 32, "float32", 2, "small"),
    (1, 8192, 256, "float32", 2, "coop steps"),
    (1, 65536, 64, "float32", 2, "tall"),
    (2, 256, 256, "float32", 2, "one block"),
    # 16 pinned workers: one launch for one matrix from the work of 256 x 256
    (1, 1024, 1024, "float32", 16, "coop steps"),
    (1, 1024, 1024, "float64", 16, "coop steps"),
    (1, 256, 256, "float32", 16, "coop steps"),
    (1, 240, 240, "float32", 16, "steps"),
    (1, 128, 128, "float32", 16, "one block"),
    (1, 65536, 64, "float32", 16, "tall"),
    (16, 1024, 1024, "float32", 16, "one block"),
    (1, 20, 32, "float32", 16, "small"),
    (1, 4096, 4096, "float32", 16, "coop steps"),
]
#: The same decisions for workers left unpinned ($CAPQR_PIN=0): coop from 384 x 384 on 2
#: and 1536 x 1536 on 16, group steps below it for a large float32 matrix.
_DEFAULT_PATHS_UNPINNED = [
    (1, 512, 512, "float32", 2, "coop steps"),
    (1, 256, 256, "float32", 2, "one block"),
    (1, 1024, 1024, "float32", 16, "group steps"),
    (1, 1024, 1024, "float64", 16, "steps"),
    (1, 1400, 1400, "float32", 16, "group steps"),
    (1, 1536, 1536, "float32", 16, "coop steps"),
    (1, 4096, 4096, "float32", 16, "coop steps"),
]


@pytest.mark.parametrize("batch,m,n,dtype,workers,path", _DEFAULT_PATHS)
def test_default_path_table(batch, m, n, dtype, workers, path):
    assert parallel.default_path(batch, m, n, dtype, workers, pinned=True) == path


@pytest.mark.parametrize("batch,m,n,dtype,workers,path", _DEFAULT_PATHS_UNPINNED)
def test_default_path_table_unpinned(batch, m, n, dtype, workers, path):
    assert parallel.default_path(batch, m, n, dtype, workers, pinned=False) == path


def test_default_path_follows_this_process_pinning(monkeypatch):
    """Without ``pinned`` the decision is this process's pool's: runtime.pinned()."""
    for pinned, path in ((True, "coop steps"), (False, "group steps")):
        monkeypatch.setattr(runtime, "pinned", lambda p=pinned: p)
        assert parallel.default_path(1, 1024, 1024, "float32", 16) == path


def test_path_kernels_refuses_an_unknown_path():
    with pytest.raises(ValueError, match="unknown path"):
        parallel.path_kernels("diagonal", "float32", True)


_NB_SCRIPT = """
import numpy as np
from capqr.kernels import parallel
a = np.random.default_rng(7).standard_normal((1, 1100, 600)).astype(np.float32)
t = np.zeros((1, 600), np.float32)
trace = []
parallel.run(a, t, "float32", None, 64, True, None, None, steps=True, trace=trace)
print(sorted({j for j, _, _ in trace if j >= 0})[1])
"""


def test_one_matrix_on_a_large_pool_takes_narrow_panels():
    """One matrix of 513 to 1024 columns driven by steps (forced here: coop takes it
    by default, with the same default_nb) on a pool of at least STEPS_NB32_WORKERS
    takes 32-column panels, where the panel is the critical path
    (16 workers of the H100 host: n = 1024 in 9.6-12.3 ms against 12.9-16.4 by
    64-column panels, median, 8 pairs); one block per matrix and small pools keep 64.
    parallel.run's own choice, on 16 workers, is what the subprocess prints."""
    assert parallel.default_nb(1100, 600, batch=1, threads=2) == 64
    assert parallel.default_nb(1100, 600, batch=60, threads=16) == 64
    assert parallel.default_nb(2048, 2048, batch=1, threads=16) == 64
    assert parallel.default_nb(400, 400, batch=1, threads=16) == 32
    assert parallel.default_nb(1024, 1024, batch=1, threads=16) == 32
    assert _output_on_a_pool(_NB_SCRIPT, "16") == "32"


# ---------------------------------------------------------------------------
# the steps in one launch (qrt_coop in qrt_group.c)


@pytest.mark.parametrize("shape,nb,dtype", [
    ((1, 257, 257), 32, np.float32), ((1, 300, 190), 64, np.float32),
    ((1, 190, 300), 32, np.float32), ((1, 64, 64), 32, np.float32),
    ((2, 150, 130), 32, np.float32), ((1, 200, 200), 32, np.float64)])
def test_coop_is_bitwise_the_steps(shape, nb, dtype):
    """Every item of qrt_coop is qrt_step's, in one launch on a group of every worker:
    the result is bitwise one block's (which is the steps'), a batch matrix by matrix."""
    a3 = _rand(shape, dtype, seed=sum(shape))
    dt = np.dtype(dtype).name
    ref_h, ref_t = a3.copy(), np.zeros((shape[0], min(shape[1:])), dtype)
    parallel.run(ref_h, ref_t, dt, nb, 64, True, None, None, steps=False)
    h, t = a3.copy(), np.zeros_like(ref_t)
    trace: list = []
    parallel.run(h, t, dt, nb, 64, True, None, None, coop=True, trace=trace)
    assert h.tobytes() == ref_h.tobytes() and t.tobytes() == ref_t.tobytes()
    assert [b for b, _blocks, _s in trace] == list(range(shape[0]))  # a launch per matrix
    assert check(a3, h, t).ok


@pytest.mark.parametrize("tmin", [8, 16, 40])
@pytest.mark.parametrize("m,n", [(300, 300), (260, 330)])
def test_coop_narrowed_tiles_are_bitwise_the_steps(tmin, m, n):
    """qrt_coop with tiles narrowed down to tmin where that evens out a step's last
    round (the widths change from step to step): a tile's result does not depend on
    its width, so the result is still bitwise one block's."""
    nb = 32
    a = _rand((1, m, n), seed=m + tmin)
    ref_h, ref_t = a.copy(), np.zeros((1, min(m, n)), np.float32)
    parallel.run(ref_h, ref_t, "float32", nb, 64, True, None, None, steps=False)
    h, t = a[0].copy(), np.zeros(min(m, n), np.float32)
    work = capabilities.alloc((parallel.work_elems(1, m, nb, True, 1),), np.float32,
                              name="qr.work")
    blocks = runtime.threads()
    runtime.launch(parallel.coop_kernel_for("float32", True),
                   [capabilities.wrap(h), capabilities.wrap(t), work],
                   args=(m, n, nb, 64, tmin, 3, n), grid=blocks, group=blocks, timeout=60)
    work.free()
    assert h.tobytes() == ref_h[0].tobytes() and t.tobytes() == ref_t[0].tobytes()


_COOP_POOL_SCRIPT = """
import numpy as np
from capqr.kernels import parallel
a = np.random.default_rng(7).standard_normal((1, 400, 400)).astype(np.float32)
ref_h, ref_t = a.copy(), np.zeros((1, 400), np.float32)
parallel.run(ref_h, ref_t, "float32", 32, 64, True, None, None, steps=False)
h, t = a.copy(), np.zeros_like(ref_t)
trace = []
parallel.run(h, t, "float32", 32, 64, True, None, None, coop=True, trace=trace)
assert h.tobytes() == ref_h.tobytes() and t.tobytes() == ref_t.tobytes()
print(trace[0][1], parallel.coop_tile_min(trace[0][1]))
"""


def test_coop_on_a_large_pool_leaves_a_core_and_narrows_tiles():
    """On a pool of 8 the group is 7 blocks (one core left to the launching thread and
    the OS, as the tall path's), its tiles narrow to TW_MIN, and the result is bitwise
    one block's."""
    assert _output_on_a_pool(_COOP_POOL_SCRIPT, "8") == f"7 {parallel.TW_MIN}"
    assert parallel.group_workers(16) == 15 and parallel.group_workers(2) == 2
    assert parallel.coop_tile_min(2) == parallel.COOP_TW


def test_coop_refuses_other_forced_paths():
    h, t = _rand((1, 100, 100)), np.zeros((1, 100), np.float32)
    for kw in ({"steps": True}, {"grid": 2}, {"group": 2}):
        with pytest.raises(ValueError, match="coop="):
            parallel.run(h, t, "float32", 32, 64, True, **{"grid": None, "timeout": None, **kw},
                         coop=True)
    with pytest.raises(ValueError, match="coop"):  # not silently the tall path
        parallel.run(h, t, "float32", 32, 64, True, None, None, tall=True, coop=True)


def test_coop_fault_stops_the_whole_group():
    """A workspace one slot short: the look-ahead panel of block 0 writes past it while
    the other blocks of the group wait at rt_group_sync (or fault on it themselves).
    The launch must end with the fault, not hang at the barrier."""
    m = n = 160
    nb = 32
    k = parallel.coop_kernel_for("float32", True)
    h = _rand((m, n))
    tau = np.zeros(n, np.float32)
    work = capabilities.alloc((parallel.work_elems(1, m, nb, True, 1) // 2,), np.float32,
                              name="qr.work")
    blocks = runtime.threads()
    with pytest.raises(runtime.CapabilityFault) as ei:
        runtime.launch(k, [capabilities.wrap(h), capabilities.wrap(tau), work],
                       args=(m, n, nb, 64, 64, 3, n), grid=blocks, group=blocks, timeout=60)
    assert ei.value.buffer == "qr.work" and ei.value.kernel == "qrt_coop_f32"
    # the pool is usable afterwards
    h2, t2 = _rand((1, m, n)), np.zeros((1, n), np.float32)
    parallel.run(h2, t2, "float32", nb, 64, True, None, None, coop=True)
    assert check(_rand((1, m, n)), h2, t2).ok


def test_coop_only_where_measured():
    assert parallel.default_path(2, 2048, 2048, "float32", 16) != "coop steps"  # batch 1 only
    assert parallel.default_path(1, 4096, 4096, "float32", 32) != "coop steps"  # unmeasured
    assert parallel.coop_min_n(1) is None
    assert parallel.coop_min_n(3, pinned=True) == 256
    assert parallel.coop_min_n(3, pinned=False) == 1536
    assert parallel.coop_min_n(2, pinned=True) == 256
    assert parallel.coop_min_n(2, pinned=False) == 384
