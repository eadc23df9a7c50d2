"""The GPU lane's generated CUDA, run on the CPU (tests/emulate_cuda.py).

The device tests (``-m gpu``) need a GPU; these run the same translation - the
checked build, with its loop versioning and checks - under a CPU model of
blocks, threads, warps and barriers, in CI:
- the GPU QR launch plans (one and two panels per update) end to end:
  kernels.check passes, the result agrees with the numpy model of the kernels,
  checked equals raw bit for bit, a planted out-of-range launch faults at the
  exact index; gpu_qr_steps runs its blocks at once (its grid barrier) and its
  shuffles through the emulated warps;
- a loop with a shuffle, versioned under a warp vote, with lanes whose guards
  differ;
- the bounds fuzz of tests/test_fuzz_bounds.py and the fault cases of
  tests/test_conformance.py against the GPU lane's checks.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kernels
import kernels.gpu as g

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")

KINDS = {"steps": (g.PANEL_STEPS_SOURCE, "gpu_qr_steps"),
         "panel": (g.PANEL_SOURCE, "gpu_qr_panel"),
         "panel_small": (g.PANEL_SMALL_SOURCE, "gpu_qr_panel_small"),
         "update_z": (g.UPDATE_SOURCE, "gpu_qr_update_z"),
         "update_apply": (g.UPDATE_SOURCE, "gpu_qr_update_apply"),
         "update2_z": (g.UPDATE_SOURCE, "gpu_qr_update2_z"),
         "update2_apply": (g.UPDATE_SOURCE, "gpu_qr_update2_apply")}


def _build(tmp_path_factory, checked: bool) -> dict:
    from emulate_cuda import build  # tests/ is on sys.path

    d = tmp_path_factory.mktemp("emu")
    built = {src: build(src, checked=checked, workdir=d)
             for src in {s for s, _ in KINDS.values()}}
    return {kind: built[src][name] for kind, (src, name) in KINDS.items()}


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> dict:
    return _build(tmp_path_factory, True)


@pytest.fixture(scope="module")
def emulated_raw(tmp_path_factory) -> dict:
    return _build(tmp_path_factory, False)


def _qr(emulated: dict, a: np.ndarray, two_panel: bool,
        tall_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    batch, n, _ = a.shape
    A = a.copy()
    tau = np.zeros((batch, n), np.float32)
    ws = g.Workspace.alloc(batch, n, alloc=lambda size, dtype, name: np.zeros(size, dtype))
    for step in g.launch_plan(batch, n, tall_rows, two_panel=two_panel):
        caps = ws.caps(step, A, tau)
        fault = emulated[step.kernel].launch(caps + list(step.args), step.grid, step.block)
        assert fault is None, (step, fault)
    return A, tau


@pytest.mark.parametrize("two_panel", [False, True])
@pytest.mark.parametrize("batch,n", [(2, 40), (1, 96), (1, 161), (1, 300)])
def test_emulated_gpu_qr_passes_the_checker(emulated, batch: int, n: int,
                                            two_panel: bool) -> None:
    from test_gpu_qr import model_qr

    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    H, tau = _qr(emulated, a, two_panel)
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    Hm, taum = model_qr(a, None, two_panel)
    np.testing.assert_allclose(tau, taum, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(H, Hm, rtol=2e-2, atol=2e-3 * float(np.abs(a).max()))


@pytest.mark.parametrize("two_panel", [False, True])
def test_emulated_stress_inputs(emulated, two_panel: bool) -> None:
    """tests/test_gpu_qr.py's stress inputs (graded, near rank deficient, zero and
    duplicate columns, huge, tiny), 80 x 80 (a pair of panels with a trailing update)."""
    from test_gpu_qr import STRESS, _stress

    rng = np.random.default_rng(11)
    for kind in STRESS:
        a = _stress(kind, 80, rng)[None]
        H, tau = _qr(emulated, a, two_panel)
        rep = kernels.check(a, H, tau)
        assert rep.ok, (kind, str(rep))

def test_emulated_update_launch_past_the_matrix_faults(emulated) -> None:
    """An update told the matrix is larger than the buffer faults on A, at the first
    element past it, like the device (the checks are the device's own code)."""
    n = 64
    A = np.zeros((1, n, n), np.float32)
    z = np.zeros(g.scratch_size(1, 2 * n), np.float32)
    vt = np.zeros(g.vt_size(1, 2 * n), np.float32)
    fault = emulated["update_z"].launch([A, z, vt, 2 * n, 0, 32, 2 * n, 3, 1, 128], 3, 128)
    assert fault is not None and fault["kind"] == 1 and fault["slot"] == 0  # OOB on A


@pytest.mark.parametrize("two_panel", [False, True])
def test_emulated_checked_equals_raw(emulated, emulated_raw, two_panel: bool) -> None:
    """The instrumentation (checks, versioned loop copies) leaves the arithmetic alone:
    the raw build gives the same bits."""
    raw = emulated_raw
    a = np.random.default_rng(3).standard_normal((2, 161, 161)).astype(np.float32)
    H, tau = _qr(emulated, a, two_panel)
    Hr, taur = _qr(raw, a, two_panel)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32))
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))


@pytest.mark.parametrize("two_panel", [False, True])
def test_emulated_column_steps_pass_the_checker(emulated, two_panel: bool) -> None:
    """Panels over row blocks (gpu_qr_steps: grid barrier, shuffles) as one
    cooperative launch, its blocks running at once; agrees with the numpy model."""
    from test_gpu_qr import model_qr

    a = np.random.default_rng(5).standard_normal((2, 100, 100)).astype(np.float32)
    H, tau = _qr(emulated, a, two_panel, tall_rows=64)
    assert any(s.kernel == "steps" for s in g.launch_plan(2, 100, 64))
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    Hm, taum = model_qr(a, 64, two_panel)
    np.testing.assert_allclose(tau, taum, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("far", [0, 10_000])
def test_emulated_warp_voted_loop(tmp_path_factory, far: int) -> None:
    """tests/test_hoist.py WARP_LOOP (the device test is in tests/test_gpu_builtins.py):
    lane 7's guard fails, the warp votes for the checked copy, every shuffle meets;
    a planted value makes lane 7 fault at its exact index."""
    from emulate_cuda import build
    from test_gpu_builtins import _rot_oracle
    from test_hoist import WARP_LOOP

    k = build(WARP_LOOP, checked=True, workdir=tmp_path_factory.mktemp("emu"))["rot"]
    n = 16
    x = np.random.default_rng(far).standard_normal(n * 32).astype(np.float32)
    out = np.zeros(32, np.float32)
    assert k.launch([x, out, n, far], 1, 32) is None
    np.testing.assert_allclose(out, _rot_oracle(x, n), rtol=1e-6, atol=1e-6)
    if far:
        x[3 * 32 + 7] = 1e31
        fault = k.launch([x, out, n, far], 1, 32)
        assert fault is not None and fault["kind"] == 1 and fault["thread"] == 7
        assert fault["index"] == 3 * 32 + 7 + far


def test_readme_emulation_example_runs() -> None:
    from readme_examples import run_readme_example

    run_readme_example("GPU lane (runtime/cuda)", 1)


# ---------------------------------------------------------------------------
# the GPU lane's checks under the bounds fuzz of tests/test_fuzz_bounds.py
EMU_DTYPES = ("f32", "f64", "i32", "i64")  # f16 converts through PTX asm: not emulated


@pytest.fixture(scope="module")
def fuzz_kernels(tmp_path_factory) -> dict:
    from emulate_cuda import build
    from test_fuzz_bounds import LOAD_SRC, SENTINEL, STORE_SRC

    d = tmp_path_factory.mktemp("emu")
    out = {}
    for t in EMU_DTYPES:
        v = repr(SENTINEL[t]) + ("LL" if t == "i64" else "")
        out[t] = (build(STORE_SRC.format(t=t, v=v), workdir=d)[f"fz_store_{t}"],
                  build(LOAD_SRC.format(t=t), workdir=d)[f"fz_load_{t}"])
    return out


def _fuzz_cases():
    from test_fuzz_bounds import cases

    return cases().filter(lambda c: c[0] in EMU_DTYPES)


def test_emulated_gpu_store_and_load_land_iff_in_bounds(fuzz_kernels) -> None:
    """On the GPU lane's generated code: a store lands and a load reads iff the index
    is in bounds; otherwise the fault record holds the out-of-bounds kind and the exact
    index, and no byte of the buffer or its neighbours changed (canaries)."""
    from hypothesis import HealthCheck, given, settings
    from test_fuzz_bounds import GUARD, SENTINEL, canary, wrap64

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_fuzz_cases())
    def run(case) -> None:
        t, n, org, i, stride, off, seed = case
        store, load = fuzz_kernels[t]
        idx = wrap64(i * stride + off)
        pos = org + idx
        big = canary(t, n, seed)
        orig = big.copy()
        fault = store.launch([big[GUARD:GUARD + n], org, i, stride, off], 1, 1)
        want = orig.copy()
        if 0 <= pos < n:
            assert fault is None
            want[GUARD + pos] = SENTINEL[t]
        else:
            assert fault is not None and (fault["kind"], fault["index"]) == (1, idx)
        assert big.tobytes() == want.tobytes()
        out = np.zeros(1, big.dtype)
        big = orig.copy()
        fault = load.launch([big[GUARD:GUARD + n], out, org, i, stride, off], 1, 1)
        if 0 <= pos < n:
            assert fault is None and out.tobytes() == orig[GUARD + pos:GUARD + pos + 1].tobytes()
        else:
            assert fault is not None and (fault["kind"], fault["index"]) == (1, idx)
            assert not out.any()
        assert big.tobytes() == orig.tobytes()

    run()


# ---------------------------------------------------------------------------
# the conformance table's fault cases on the GPU lane's generated code
def _conformance_cases():
    from test_conformance import FAULT_CASES

    return FAULT_CASES


@pytest.mark.parametrize("case", _conformance_cases(), ids=lambda c: c.ident)
def test_emulated_gpu_faults_match_the_conformance_table(tmp_path_factory, case) -> None:
    """tests/test_conformance.py's fault cases (run on the CPU lane in CI, on the GPU
    lane on a device), on the GPU lowering: the record names the same fault kind,
    access, line and index, the buffer (slot 0 is x; -1 a cap made from an integer),
    and the refused access touched nothing: neighbours and x intact."""
    from emulate_cuda import build

    from capabilities import abi

    k = build(case.src, workdir=tmp_path_factory.mktemp("emu"))["k"]
    big = np.concatenate([np.full(64, 3.0), np.zeros(case.n), np.full(64, 5.0)]
                         ).astype(np.float32)
    x = big[64:64 + case.n]
    fault = k.launch([(x, case.perms), case.n], 1, 1)
    assert fault is not None
    assert abi.FAULT_REASON[fault["kind"]] == case.reason
    assert abi.ACCESS[fault["access"]] == case.access and fault["line"] == case.line
    if case.index is not None:
        assert fault["index"] == case.index
    if case.buffer == "x":
        assert fault["slot"] == 0
    elif case.buffer == "<int-derived>":
        assert fault["slot"] == -1
    assert (big[:64] == 3.0).all() and (big[64 + case.n:] == 5.0).all()
    if not case.ident.startswith("hoisted"):
        assert (x == 0.0).all()
