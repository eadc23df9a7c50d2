"""The GPU QR's trailing update on the tensor cores (kernels/gpu/update_mma.c, mma_update).

CPU: the plan swaps the one-panel updates of at least MMA_MIN_ROWS rows for the
tensor-core kernels with the same grid, arguments and buffers; the source is
generated and passes the CUDA verifier.  Emulated lane (tests/emulate_cuda.py, the
same generated CUDA under a CPU model of the device and its tensor cores): the
plan with the tensor-core update passes kernels.check on random and stress inputs,
agrees with the numpy model of the update's algebra, gives checked equal to raw bit
for bit, and an update launch past the matrix faults on A.  GPU (``-m gpu``): the
same through kernels.gpu.qr on the device, contest shapes included.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from capqr import kernels
from capqr.kernels import gpu as g
from test_gpu_qr import CONTEST_SHAPES, STRESS, _stress, model_qr, needs_gpu

gpu = pytest.mark.gpu
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")

#: launch kind -> (source, kernel) of what the small emulated plans run (with reg=False:
#: gpu_qr_panel_small, as the panels; the register panels are emulated in
#: tests/test_gpu_emulated.py, with the same T in the same work buffer)
KINDS = {"panel_small": (g.PANEL_SMALL_SOURCE, "gpu_qr_panel_small"),
         "update_z": (g.UPDATE_SOURCE, "gpu_qr_update_z"),
         "update_apply": (g.UPDATE_SOURCE, "gpu_qr_update_apply"),
         "update_mma_z": (g.UPDATE_MMA_SOURCE, "gpu_qr_update_mma_z"),
         "update_mma_apply": (g.UPDATE_MMA_SOURCE, "gpu_qr_update_mma_apply")}
MMA_KINDS = ("update_mma_z", "update_mma_apply")


# ---------------------------------------------------------------------------
# CPU: plan and source
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("two_panel", [False, True])
@pytest.mark.parametrize("batch,n", CONTEST_SHAPES + [(2, 64), (3, 96), (1, 160), (1, 300)])
def test_plan_swaps_big_updates_for_the_tensor_core_kernels(batch: int, n: int,
                                                            two_panel: bool) -> None:
    # the blocked plan (per_matrix=False: also for the batches gpu_qr_matrix would take)
    simt = g.launch_plan(batch, n, None, two_panel=two_panel, whole=False, mma_update=False,
                         per_matrix=False)
    mma = g.launch_plan(batch, n, None, two_panel=two_panel, whole=False, mma_update=True,
                        per_matrix=False)
    assert len(simt) == len(mma)
    for s, m in zip(simt, mma, strict=True):
        assert (s.grid, s.block, s.args, s.group, s.slot) == (m.grid, m.block, m.args,
                                                              m.group, m.slot)
        big = s.kernel.startswith("update_") and n - s.args[1] >= g.MMA_MIN_ROWS
        want = s.kernel.replace("update_", "update_mma_") if big else s.kernel
        assert m.kernel == want
    assert not g.MMA_UPDATE  # off by default until measured on a device
    assert [s.kernel for s in g.launch_plan(batch, n, None, two_panel=two_panel,
                                            whole=False, per_matrix=False)] == [
        s.kernel for s in simt]


def test_tensor_core_update_uses_the_simt_updates_buffers() -> None:
    ws = g.Workspace(*"work work2 scratch gram steps vt".split())
    for kind in MMA_KINDS:
        simt = kind.replace("_mma", "")
        assert (ws.caps(g.Launch(kind, 1, g.UPDATE_BLOCK, ()), "A", "tau")
                == ws.caps(g.Launch(simt, 1, g.UPDATE_BLOCK, ()), "A", "tau"))
    # V (NB floats per row, n rows per matrix, at b * NB * n) fits the V^T buffer
    assert g.vt_size(3, 100) >= 3 * g.NB * 100
    assert f"cap_offset_f32(VT, b * {g.NB} * n)" in g.UPDATE_MMA_SOURCE


def test_update_mma_source_is_generated() -> None:
    from capqr.kernels.gpu import gen_update_mma

    assert gen_update_mma.source() == g.UPDATE_MMA_SOURCE, (
        "run python -m capqr.kernels.gpu.gen_update_mma")


def test_update_mma_source_verifies_and_instruments() -> None:
    from capqr.runtime.cuda import translate

    # the three MMA call sites, once each in the raw build; the checked build also has
    # the unchecked copy of gpu_qr_update_mma_z's row loop (its cover guard, one block vote)
    sites = {False: (2, 1), True: (3, 1)}
    for checked in (True, False):
        cs = translate(g.UPDATE_MMA_SOURCE, checked=checked)
        assert set(cs.kernels) == {"gpu_qr_update_mma_z", "gpu_qr_update_mma_apply"}
        assert all(sig.block_dim == g.UPDATE_BLOCK for sig in cs.kernels.values())
        assert (cs.text.count("rt_mma<1, 1>"), cs.text.count("rt_mma<1, 0>")) == sites[checked]
        assert cs.text.count("rt_block_all(__rtg") == int(checked)
    assert g._kernel_spec("update_mma_apply") == (
        g.UPDATE_MMA_SOURCE, "gpu_qr_update_mma_apply", g.UPDATE_MMA_OPTIONS)


# ---------------------------------------------------------------------------
# emulated lane
# ---------------------------------------------------------------------------
def _build(tmp_path_factory, kinds: dict, checked: bool) -> dict:
    from emulate_cuda import build_many  # tests/ is on sys.path

    d = tmp_path_factory.mktemp("emu")
    built = build_many([s for s, _ in kinds.values()], checked=checked, workdir=d)
    return {kind: built[src][name] for kind, (src, name) in kinds.items()}


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> dict:
    return _build(tmp_path_factory, KINDS, True)


@pytest.fixture
def every_update_mma(monkeypatch) -> None:
    """Every one-panel update on the tensor cores, however few its rows."""
    monkeypatch.setattr(g, "MMA_MIN_ROWS", 1)


def _qr(emulated: dict, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, set[str]]:
    """The plan with mma_update on (and reg=False: the panels by gpu_qr_panel_small),
    through the emulated kernels -> (H, tau, kinds run)."""
    batch, n, _ = a.shape
    A = a.copy()
    tau = np.zeros((batch, n), np.float32)
    ws = g.Workspace.alloc(batch, n, alloc=lambda size, dtype, name: np.zeros(size, dtype))
    plan = g.launch_plan(batch, n, None, whole=False, mma_update=True, reg=False)
    for step in plan:
        fault = emulated[step.kernel].launch(ws.caps(step, A, tau) + list(step.args),
                                             step.grid, step.block)
        assert fault is None, (step, fault)
    return A, tau, {s.kernel for s in plan}


@needs_gxx
@pytest.mark.parametrize("batch,n", [(2, 64), (3, 96), (1, 160)])
def test_emulated_mma_update_passes_the_checker(emulated, every_update_mma, batch: int,
                                                n: int) -> None:
    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    H, tau, kinds = _qr(emulated, a)
    assert set(MMA_KINDS) <= kinds and "update_z" not in kinds
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    Hm, taum = model_qr(a)  # the SIMT kernels' model: the same algebra
    np.testing.assert_allclose(tau, taum, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(H, Hm, rtol=2e-2, atol=2e-3 * float(np.abs(a).max()))


@needs_gxx
def test_emulated_mma_and_simt_updates_mix(emulated) -> None:
    """At the default MMA_MIN_ROWS a 160 x 160 matrix takes the tensor cores for its first
    updates and the SIMT kernels below: both in one plan, through the same buffers."""
    a = np.random.default_rng(4).standard_normal((1, 160, 160)).astype(np.float32)
    H, tau, kinds = _qr(emulated, a)
    assert set(MMA_KINDS) <= kinds and "update_z" in kinds
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)


@needs_gxx
@pytest.mark.parametrize("kind", STRESS)
def test_emulated_mma_stress_inputs(emulated, every_update_mma, kind: str) -> None:
    """tests/test_gpu_qr.py's stress inputs, 80 x 80 (a last chunk of 16 rows)."""
    a = _stress(kind, 80, np.random.default_rng(11))[None]
    H, tau, _ = _qr(emulated, a)
    rep = kernels.check(a, H, tau)
    assert rep.ok, (kind, str(rep))


@needs_gxx
def test_emulated_mma_checked_equals_raw(tmp_path_factory, emulated, every_update_mma) -> None:
    """The checks leave the tensor cores' arithmetic alone: the raw build, the same bits."""
    raw = _build(tmp_path_factory, {k: KINDS[k] for k in ("panel_small",) + MMA_KINDS}, False)
    a = np.random.default_rng(3).standard_normal((2, 96, 96)).astype(np.float32)
    H, tau, _ = _qr(emulated, a)
    Hr, taur, _ = _qr(raw, a)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32))
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))


def _update_case(batch: int, n: int, k0: int, seed: int) -> tuple:
    """A batch whose panel at k0 holds random reflectors and a T with garbage below its
    diagonal, the update's plan arguments, and the float64 result C - V T^T V^T C."""
    (step,) = [s for s in g.launch_plan(batch, n, None, whole=False, mma_update=True)
               if s.kernel == "update_mma_z" and s.args[1] == k0]
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((batch, n, n)).astype(np.float32)
    T = rng.standard_normal((batch, g.NB, g.NB)).astype(np.float32)
    want = A.astype(np.float64)
    for b in range(batch):
        V = np.tril(A[b, k0:, k0:k0 + g.NB].astype(np.float64), -1)
        V[np.arange(g.NB), np.arange(g.NB)] = 1.0
        C = want[b, k0:, k0 + g.NB:]
        C -= V @ (np.triu(T[b]).astype(np.float64).T @ (V.T @ C))
    return step, A, T, want


@needs_gxx
@pytest.mark.parametrize("batch,n,k0", [(2, 112, 32), (1, 200, 0)])
def test_emulated_mma_update_is_fp32_accurate(emulated, every_update_mma, batch: int, n: int,
                                              k0: int) -> None:
    """One update (Z launch, apply launch) against float64: errors at fp32 level of the
    terms' magnitudes (tf32 products would be off by ~1e-3 of them); T's lower triangle
    is not read; columns of the panel and rows above k0 are left alone."""
    step, A, T, want = _update_case(batch, n, k0, seed=n)
    a0 = A.copy()
    ws = g.Workspace.alloc(batch, n, alloc=lambda size, dtype, name: np.zeros(size, dtype))
    ws.work[:] = T.ravel()
    for kind in MMA_KINDS:
        s = g.Launch(kind, step.grid, step.block, step.args)
        assert emulated[kind].launch(ws.caps(s, A, None) + list(s.args), s.grid, s.block) is None
    _assert_update_accurate(A, a0, T, want, k0)


def _assert_update_accurate(got: np.ndarray, a0: np.ndarray, T: np.ndarray,
                            want: np.ndarray, k0: int) -> None:
    """Each updated element within fp32 rounding of the magnitudes of its terms
    (|V| |T|^T |V|^T |C| + |C|); the rest of the matrix unchanged."""
    n = a0.shape[-1]
    for b in range(a0.shape[0]):
        V = np.tril(a0[b, k0:, k0:k0 + g.NB], -1) + np.eye(n - k0, g.NB)
        C = a0[b, k0:, k0 + g.NB:]
        scale = np.abs(V) @ (np.abs(np.triu(T[b])).T @ (np.abs(V).T @ np.abs(C))) + np.abs(C)
        err = np.abs(got[b, k0:, k0 + g.NB:] - want[b, k0:, k0 + g.NB:]) / scale
        assert err.max() < 2e-6, err.max()  # ~6e-8 on the emulated lane
    np.testing.assert_array_equal(got[:, :, :k0 + g.NB], a0[:, :, :k0 + g.NB])
    np.testing.assert_array_equal(got[:, :k0], a0[:, :k0])


@needs_gxx
def test_emulated_mma_z_ignores_stale_shared_rows(emulated) -> None:
    """A last chunk of fewer than CHUNK rows: the rows of shared memory past it hold what
    an earlier launch left there (here infinities; on a GPU, anything), and V's zero rows
    must not meet them (0 * inf is NaN).  The emulated lane keeps each block's shared
    arrays between launches, as a GPU may."""
    n = g.CHUNK
    poison = np.full((1, n, n), np.inf, np.float32)
    z = np.zeros(g.scratch_size(1, n), np.float32)
    vt = np.zeros(g.vt_size(1, n), np.float32)
    k = emulated["update_mma_z"]
    assert k.launch([poison, z, vt, n, 0, 32, n, 1, 1, n, 32], 1, g.UPDATE_BLOCK) is None
    m = n - 16  # one chunk of 48 rows, 16 trailing columns
    a = np.random.default_rng(6).standard_normal((1, m, m)).astype(np.float32)
    assert k.launch([a, z, vt, m, 0, 32, m, 1, 1, g.CHUNK, 32], 1, g.UPDATE_BLOCK) is None
    V = np.tril(a[0, :, :32].astype(np.float64), -1) + np.eye(m, 32)
    got = z[:g.ZP_SIZE].reshape(g.NB, g.STRIP)[:, :m - 32]
    np.testing.assert_allclose(got, V.T @ a[0, :, 32:], rtol=1e-5, atol=1e-5)


@needs_gxx
@pytest.mark.parametrize("kind", MMA_KINDS)
def test_emulated_mma_update_launch_past_the_matrix_faults(emulated, kind: str) -> None:
    """A tensor-core update told the matrix is larger than the buffer faults on A (an
    out-of-bounds tile copy), before any MMA."""
    n = 64
    A = np.zeros((1, n, n), np.float32)
    z = np.zeros(g.scratch_size(1, 2 * n), np.float32)
    vt = np.zeros(g.vt_size(1, 2 * n), np.float32)
    work = np.zeros(g.work_size(1), np.float32)
    caps = [A, z, vt] if kind.endswith("_z") else [A, work, z, vt]
    fault = emulated[kind].launch(caps + [2 * n, 0, 32, 2 * n, 3, 1, 128, 32], 3, 128)
    assert fault is not None and fault["kind"] == 1 and fault["slot"] == 0  # OOB on A


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------
def _check_both(a: np.ndarray) -> None:
    """mma_update on (the blocked plan, per_matrix=False, for every batch): checked equals
    raw bit for bit and kernels.check passes."""
    H, tau = g.qr(a, checked=True, whole=False, mma_update=True, per_matrix=False)
    Hr, taur = g.qr(a, checked=False, whole=False, mma_update=True, per_matrix=False)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32)), "checked != raw output"
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))
    rep = kernels.check(a, H, tau)
    print(f"\n{a.shape}: worst {rep.worst()}")
    assert rep.ok, str(rep)


@gpu
@needs_gpu
@pytest.mark.parametrize("batch,n,k0", [(2, 112, 32), (1, 200, 0)])
def test_mma_update_is_fp32_accurate_on_the_device(every_update_mma, batch: int, n: int,
                                                   k0: int) -> None:
    """test_emulated_mma_update_is_fp32_accurate on the tensor cores themselves."""
    from capqr.runtime import cuda

    step, A, T, want = _update_case(batch, n, k0, seed=n)
    dA = cuda.to_device(A, name="A")
    ws = g.Workspace.alloc(batch, n, prefix="")
    ws.work.copy_from(T.ravel())
    ks = g.blocked_kernels(True)
    try:
        for kind in MMA_KINDS:
            s = g.Launch(kind, step.grid, step.block, step.args)
            cuda.launch(ks[kind], ws.caps(s, dA, None), args=s.args, grid=s.grid, block=s.block)
        _assert_update_accurate(dA.numpy(), A, T, want, k0)
    finally:
        ws.free()
        dA.free()


@gpu
@needs_gpu
@pytest.mark.parametrize("batch,n", CONTEST_SHAPES)
def test_mma_update_contest_shape(batch: int, n: int) -> None:
    # as tests/test_gpu_qr.py: fewer matrices where the host checker would dominate
    batch = 1 if n >= 2048 else min(batch, 16)
    _check_both(np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32))


@gpu
@needs_gpu
@pytest.mark.parametrize("n", [5, 33, 64, 100, 161, 300])
def test_mma_update_odd_sizes(every_update_mma, n: int) -> None:
    _check_both(np.random.default_rng(n).standard_normal((3, n, n)).astype(np.float32))


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", STRESS)
def test_mma_update_stress(every_update_mma, kind: str) -> None:
    rng = np.random.default_rng(7)
    _check_both(np.stack([_stress(kind, 200, rng) for _ in range(2)]))


# ---------------------------------------------------------------------------
# the device script's Python parts (bench/gpu_mma_update_device.sh)
# ---------------------------------------------------------------------------
def test_gpu_bench_flags_set_the_switch(monkeypatch) -> None:
    from capqr.bench import gpu_bench

    monkeypatch.setattr(g, "MMA_UPDATE", False)
    monkeypatch.setattr(g, "MMA_MIN_ROWS", g.MMA_MIN_ROWS)
    gpu_bench._set_plan_options(gpu_bench.parse_args(["--mma-update", "on",
                                                    "--mma-min-rows", "64"]))
    assert (g.MMA_UPDATE, g.MMA_MIN_ROWS) == (True, 64)
    assert g.launch_plan(1, 64, None, whole=False)[1].kernel == "update_mma_z"
    gpu_bench._set_plan_options(gpu_bench.parse_args(["--mma-update", "off"]))
    assert (g.MMA_UPDATE, g.MMA_MIN_ROWS) == (False, 64)
    gpu_bench._set_plan_options(gpu_bench.parse_args([]))  # default: left as it is
    assert not g.MMA_UPDATE


def test_mma_update_report_compares_the_two_runs(tmp_path) -> None:
    import json

    from capqr.bench import gpu_compare

    def run(ms: float, upd: float, kind: str) -> dict:
        row = {"batch": 2, "n": 4096, "checked_ms": ms, "raw_ms": ms / 2, "check_ok": True,
               "checked_equals_raw": True, "mma_min_rows": 128,
               "profile_checked": {"update_gpu_ms": upd},
               "checked_registers": {kind: 96, "steps": 90}, "raw_registers": {kind: 80}}
        return {"device": "H100", "git": "abc", "shapes": [row, dict(row, n=2048, batch=8)]}

    paths = [tmp_path / "off.json", tmp_path / "on.json"]
    for p, r in zip(paths, (run(40.0, 20.0, "update_z"), run(32.0, 12.0, "update_mma_z")),
                    strict=True):
        p.write_text(json.dumps(r))
    text = gpu_compare.main([str(paths[0]), str(paths[1]), "--out", str(tmp_path / "t")])
    assert (tmp_path / "t").read_text() == text
    assert "(2,4096)" in text and "(8,2048)" in text and " 1.250x" in text
    assert "geomean off/on: checked 1.250x, raw 1.250x over 2 shapes" in text
    assert "update_mma_z checked 96" in text and "steps checked 90" in text
