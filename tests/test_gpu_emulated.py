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
from capqr import kernels
from capqr.kernels import gpu as g

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")

KINDS = {"steps": (g.PANEL_STEPS_SOURCE, "gpu_qr_steps"),
         "panel": (g.PANEL_SOURCE, "gpu_qr_panel"),
         "panel_small": (g.PANEL_SMALL_SOURCE, "gpu_qr_panel_small"),
         "update_z": (g.UPDATE_SOURCE, "gpu_qr_update_z"),
         "update_apply": (g.UPDATE_SOURCE, "gpu_qr_update_apply"),
         "update2_z": (g.UPDATE_SOURCE, "gpu_qr_update2_z"),
         "update2_apply": (g.UPDATE_SOURCE, "gpu_qr_update2_apply")}
#: gpu_qr_panel_reg, one source per class: the classes the plans below reach (panels of
#: at most 256 rows).  The larger classes differ in their sizes only (8 or 16 warps);
#: the code of 64 rows per thread (a shuffled column p) runs in gpu_qr_matrix's
#: SMALL_TWO_COLUMNS class below.
PREG_KINDS = tuple(f"preg{g.gen_panel_reg.capacity(*c)}" for c in g.gen_panel_reg.CLASSES
                   if g.gen_panel_reg.capacity(*c) <= 256)
KINDS.update({kind: g._kernel_spec(kind)[:2] for kind in PREG_KINDS})


def _build(tmp_path_factory, checked: bool) -> dict:
    from emulate_cuda import build_many  # tests/ is on sys.path

    d = tmp_path_factory.mktemp("emu")
    built = build_many([s for s, _ in KINDS.values()], checked=checked, workdir=d)
    return {kind: built[src][name] for kind, (src, name) in KINDS.items()}


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> dict:
    return _build(tmp_path_factory, True)


@pytest.fixture(scope="module")
def emulated_raw(tmp_path_factory) -> dict:
    return _build(tmp_path_factory, False)


def _qr(emulated: dict, a: np.ndarray, two_panel: bool, tall_rows: int | None = None,
        reg: bool = True, lookahead: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """kernels.gpu's blocked plan for ``a`` (``reg`` True: the register panels; False:
    gpu_qr_panel_small and gpu_qr_panel), run on the emulated lane in list order."""
    batch, n, _ = a.shape
    A = a.copy()
    tau = np.zeros((batch, n), np.float32)
    ws = g.Workspace.alloc(batch, n, alloc=lambda size, dtype, name: np.zeros(size, dtype),
                           lookahead=lookahead)
    for step in g.launch_plan(batch, n, tall_rows, two_panel=two_panel, whole=False,
                              reg=reg, per_matrix=False, lookahead=lookahead):
        caps = ws.caps(step, A, tau)
        fault = emulated[step.kernel].launch(caps + list(step.args), step.grid, step.block)
        assert fault is None, (step, fault)
    return A, tau


@pytest.mark.parametrize("batch,n,two_panel,reg", [
    *((b, n, tp, True) for b, n in [(2, 40), (1, 96), (1, 161)] for tp in (False, True)),
    (1, 161, True, False), (1, 300, False, False)])  # gpu_qr_panel_small, gpu_qr_panel
def test_emulated_gpu_qr_passes_the_checker(emulated, batch: int, n: int, two_panel: bool,
                                            reg: bool) -> None:
    """The plans with the register panels (reg=True: gpu_qr_panel_reg, classes 32 to
    512 here) and with reg=False (gpu_qr_panel_small; 300 rows: gpu_qr_panel): kernels.check
    passes and the result agrees with the numpy model of the kernels."""
    from test_gpu_qr import model_qr

    kinds = {s.kernel for s in g.launch_plan(batch, n, None, two_panel=two_panel,
                                             whole=False, reg=reg, per_matrix=False)}
    assert any(k.startswith("preg") for k in kinds) == reg
    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    H, tau = _qr(emulated, a, two_panel, reg=reg)
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    Hm, taum = model_qr(a, None, two_panel)
    np.testing.assert_allclose(tau, taum, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(H, Hm, rtol=2e-2, atol=2e-3 * float(np.abs(a).max()))


@pytest.mark.parametrize("two_panel", [False])
def test_emulated_stress_inputs(emulated, two_panel: bool) -> None:
    """tests/test_gpu_qr.py's stress inputs (graded, near rank deficient, zero and
    duplicate columns, huge, tiny), 80 x 80 (a pair of panels with a trailing update),
    through the register panels."""
    from test_gpu_qr import STRESS, _stress

    rng = np.random.default_rng(11)
    for kind in STRESS:
        a = _stress(kind, 80, rng)[None]
        H, tau = _qr(emulated, a, two_panel, reg=True)
        rep = kernels.check(a, H, tau)
        assert rep.ok, (kind, str(rep))

def test_emulated_update_launch_past_the_matrix_faults(emulated) -> None:
    """An update told the matrix is larger than the buffer faults on A, at the first
    element past it, like the device (the checks are the device's own code)."""
    n = 64
    A = np.zeros((1, n, n), np.float32)
    z = np.zeros(g.scratch_size(1, 2 * n), np.float32)
    vt = np.zeros(g.vt_size(1, 2 * n), np.float32)
    fault = emulated["update_z"].launch([A, z, vt, 2 * n, 0, 32, 2 * n, 3, 1, 128, 32], 3, 128)
    assert fault is not None and fault["kind"] == 1 and fault["slot"] == 0  # OOB on A


@pytest.mark.parametrize("two_panel,reg", [(False, True), (True, False)])
def test_emulated_checked_equals_raw(emulated, emulated_raw, two_panel: bool,
                                     reg: bool) -> None:
    """The instrumentation (checks, versioned loop copies) leaves the arithmetic alone:
    the raw build gives the same bits.  Each kernel once: the register panels (classes
    32 to 256) with one panel per update; gpu_qr_panel_small with pairs of panels."""
    raw = emulated_raw
    a = np.random.default_rng(3).standard_normal((1, 161, 161)).astype(np.float32)
    H, tau = _qr(emulated, a, two_panel, reg=reg)
    Hr, taur = _qr(raw, a, two_panel, reg=reg)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32))
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))


@pytest.mark.parametrize("two_panel", [False, True])
def test_emulated_column_steps_pass_the_checker(emulated, two_panel: bool) -> None:
    """Panels over row blocks (gpu_qr_steps: grid barrier, shuffles) as one
    cooperative launch, its blocks running at once; agrees with the numpy model."""
    from test_gpu_qr import model_qr

    a = np.random.default_rng(5).standard_normal((2, 100, 100)).astype(np.float32)
    H, tau = _qr(emulated, a, two_panel, tall_rows=64)
    assert any(s.kernel == "steps" for s in g.launch_plan(2, 100, 64, whole=False))
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    Hm, taum = model_qr(a, 64, two_panel)
    np.testing.assert_allclose(tau, taum, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("batch,n,tall_rows,reg", [(1, 161, None, True), (2, 100, 64, False)])
def test_emulated_lookahead_passes_the_checker(emulated, emulated_raw, batch: int, n: int,
                                               tall_rows: int | None, reg: bool) -> None:
    """The look-ahead plan (each update split into the next panel's columns and the rest,
    T alternating between work and work2, lane 1's own scratch and V^T), in list order:
    kernels.check passes, it agrees with the numpy model of that plan, and checked
    equals raw bit for bit.  (That no two launches the lanes leave unordered touch the
    same memory is tests/test_gpu_qr.py's test_lookahead_plan_orders_every_conflict.)"""
    from test_gpu_qr import model_qr

    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    H, tau = _qr(emulated, a, False, tall_rows, reg=reg, lookahead=True)
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    Hm, taum = model_qr(a, tall_rows, False, lookahead=True)
    np.testing.assert_allclose(tau, taum, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(H, Hm, rtol=2e-2, atol=2e-3 * float(np.abs(a).max()))
    Hr, taur = _qr(emulated_raw, a, False, tall_rows, reg=reg, lookahead=True)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32))
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))


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
    from emulate_cuda import build_many
    from test_fuzz_bounds import LOAD_SRC, SENTINEL, STORE_SRC

    d = tmp_path_factory.mktemp("emu")
    srcs = {t: (STORE_SRC.format(t=t, v=repr(SENTINEL[t]) + ("LL" if t == "i64" else "")),
                LOAD_SRC.format(t=t)) for t in EMU_DTYPES}
    built = build_many([s for pair in srcs.values() for s in pair], workdir=d)
    return {t: (built[store][f"fz_store_{t}"], built[load][f"fz_load_{t}"])
            for t, (store, load) in srcs.items()}


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
    from capqr.capabilities import abi
    from emulate_cuda import build

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


# ---- tensor-core MMA: tests/test_gpu_builtins.py's kernels and cases ---------------
# The prelude's checks of rt_warp_mma_* (lanes agreeing by match/reduce, tile ranges,
# the alignment contract, the exact fault) run as generated; the tensor cores'
# arithmetic is emulate_cuda's model of it.

@pytest.fixture(scope="module")
def mma_kernels(tmp_path_factory) -> dict:
    from emulate_cuda import build_many
    from test_gpu_builtins import MMA_AT_SRC, MMA_F32_SRC, MMA_SRC

    d = tmp_path_factory.mktemp("emu_mma")
    named = (("mma", MMA_SRC), ("mma32", MMA_F32_SRC), ("mma_at", MMA_AT_SRC))
    built = {checked: build_many([src for _, src in named], checked=checked, workdir=d)
             for checked in (True, False)}
    return {(name, checked): built[checked][src][name]
            for name, src in named for checked in (True, False)}


def _mma_emulated(mma_kernels: dict, name: str, args: tuple, seed: int | None,
                  checked: bool = True, block: int = 64) -> tuple[list, dict | None]:
    """One block of ``block`` threads on test_gpu_builtins.mma_hosts: (a, b, c as
    given, c afterwards), and the fault record."""
    from test_gpu_builtins import mma_hosts

    n_ab, n_c = (512, 1024) if name == "mma" else (2048, 512)
    a, b, c = mma_hosts(n_ab, n_c, seed)
    c_in = c.copy()
    fault = mma_kernels[name, checked].launch([(a, "r"), (b, "r"), c, *args], 1, block)
    return [a, b, c_in, c], fault


def _mma_fault_fields(mma_kernels: dict, name: str, fault: dict) -> tuple:
    """(reason, buffer, index, line) of an emulated fault, as the GPU lane names them."""
    e = mma_kernels[name, True].capability_fault(fault)
    return e.reason, e.buffer, e.index, e.line


def _tiles():
    from test_gpu_builtins import MMA_TILES

    return MMA_TILES


@pytest.mark.parametrize("c_off,ldc,a_off,lda,b_off,ldb", _tiles())
def test_emulated_mma_tf32_tiles(mma_kernels, c_off, ldc, a_off, lda, b_off, ldb) -> None:
    """Each warp adds tf32(A) tf32(B) to its own tile and nothing else changes; the raw
    build gives the same bits."""
    from test_gpu_builtins import mma_tf32_want

    args = (c_off, ldc, a_off, lda, b_off, ldb, -1)
    (a, b, c, got), fault = _mma_emulated(mma_kernels, "mma", args, 7)
    assert fault is None, fault
    want = mma_tf32_want(a, b, c, c_off, ldc, a_off, lda, b_off, ldb)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    touched = np.zeros(1024, bool)
    for w in range(2):
        touched[c_off + 512 * w + np.arange(16)[:, None] * ldc + np.arange(16)] = True
    assert np.array_equal(got[~touched], c[~touched])
    assert np.array_equal(_mma_emulated(mma_kernels, "mma", args, 7, checked=False)[0][3], got)


def _cases(table: str, ids: str) -> list:
    import test_gpu_builtins as t

    return [pytest.param(*case, id=i) for case, i in zip(getattr(t, table), getattr(t, ids),
                                                          strict=True)]


@pytest.mark.parametrize("args,buffer,index", _cases("MMA_RANGE_FAULTS", "MMA_RANGE_IDS"))
def test_emulated_mma_out_of_range_tile_faults_exactly(mma_kernels, args, buffer, index) -> None:
    from test_gpu_builtins import MMA_LINE

    (_, _, c, got), fault = _mma_emulated(mma_kernels, "mma", args, None)
    assert fault is not None
    assert _mma_fault_fields(mma_kernels, "mma", fault) == ("local-array", buffer, index,
                                                            MMA_LINE)
    assert np.array_equal(got, c)  # the block stopped before any store


@pytest.mark.parametrize("args,block,position",
                         _cases("MMA_CONTRACT_FAULTS", "MMA_CONTRACT_IDS"))
def test_emulated_mma_contract_faults_name_the_argument(mma_kernels, args, block,
                                                        position) -> None:
    from test_gpu_builtins import MMA_LINE

    (_, _, c, got), fault = _mma_emulated(mma_kernels, "mma", args, None, block=block)
    assert fault is not None
    assert _mma_fault_fields(mma_kernels, "mma", fault) == ("argument", None, position,
                                                            MMA_LINE)
    assert np.array_equal(got, c)


def _f32_shapes():
    from test_gpu_builtins import MMA_AT_SHAPES, MMA_F32_SHAPES

    return [("mma32", *s) for s in MMA_F32_SHAPES] + [("mma_at", *s) for s in MMA_AT_SHAPES]


@pytest.mark.parametrize("name,lda,ldb,k", _f32_shapes())
def test_emulated_mma_f32_is_fp32_accurate(mma_kernels, name, lda, ldb, k) -> None:
    """The split products give fp32-level error (A given transposed for mma_at), far
    below a tf32-only product's; raw equals checked."""
    from test_gpu_builtins import mma_f32_error

    args = (lda, ldb, k, -1)
    (a, b, c, got), fault = _mma_emulated(mma_kernels, name, args, 11)
    assert fault is None, fault
    err, tf32_err = mma_f32_error(a, b, c, got, lda, ldb, k, a_t=name == "mma_at")
    assert err < 2e-6, err
    assert tf32_err > 20 * err
    assert np.array_equal(_mma_emulated(mma_kernels, name, args, 11, checked=False)[0][3], got)


@pytest.mark.parametrize("args,reason,buffer,index",
                         _cases("MMA_F32_FAULTS", "MMA_F32_FAULT_IDS"))
def test_emulated_mma_f32_faults(mma_kernels, args, reason, buffer, index) -> None:
    from test_gpu_builtins import MMA_F32_LINE

    (_, _, c, got), fault = _mma_emulated(mma_kernels, "mma32", args, None)
    assert fault is not None
    assert _mma_fault_fields(mma_kernels, "mma32", fault) == (reason, buffer, index,
                                                              MMA_F32_LINE)
    assert np.array_equal(got, c)


# ---------------------------------------------------------------------------
# gpu_qr_whole: one launch per problem, the whole matrix in shared memory
class BuiltOnFirstUse(dict):
    """(class, checked) -> the emulated kernel ``entry`` of ``source(class)``, built on
    first use."""

    def __init__(self, workdir: object, source: object, entry: str) -> None:
        super().__init__()
        self.workdir, self.source, self.entry = workdir, source, entry

    def __missing__(self, key: tuple[object, bool]) -> object:
        from emulate_cuda import build

        cls, checked = key
        k = self[key] = build(self.source(cls), checked=checked,
                              workdir=self.workdir)[self.entry]
        return k


@pytest.fixture(scope="module")
def whole_kernels(tmp_path_factory) -> dict:
    """(capacity, checked) -> the emulated gpu_qr_whole of that class."""
    return BuiltOnFirstUse(tmp_path_factory.mktemp("emu_whole"),
                           lambda cap: g.gen_whole.source(cap, dict(g.gen_whole.CLASSES)[cap]),
                           "gpu_qr_whole")


def _whole(whole_kernels: dict, a: np.ndarray, checked: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """kernels.gpu's one-launch plan for ``a``, run on the emulated lane."""
    batch, n, _ = a.shape
    (step,) = g.launch_plan(batch, n, whole=True)
    assert step.kernel == f"whole{g.whole_class(n)[0]}" and step.grid == batch
    A, tau = a.copy(), np.zeros((batch, n), np.float32)
    fault = whole_kernels[int(step.kernel[5:]), checked].launch([A, tau, *step.args],
                                                                step.grid, step.block)
    assert fault is None, fault
    return A, tau


@pytest.mark.parametrize("batch,n", [(3, 1), (2, 2), (2, 31), (3, 32), (2, 33), (1, 176)])
def test_emulated_whole_qr_passes_the_checker(whole_kernels, batch: int, n: int) -> None:
    """One launch, one block per matrix (176: 226 KB of shared memory, past CUDA's 48 KB
    static limit, so the arrays live in the dynamic buffer): kernels.check passes and
    the result is LAPACK's compact form, as the blocked plan's."""
    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    H, tau = _whole(whole_kernels, a)
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    for b in range(batch):
        h_ref, tau_ref = np.linalg.qr(a[b].astype(np.float64), mode="raw")  # h is H^T
        np.testing.assert_allclose(H[b], h_ref.T, atol=2e-4 * max(1, n // 32), rtol=2e-3)
        np.testing.assert_allclose(tau[b], tau_ref, atol=2e-5 * max(1, n // 32), rtol=1e-4)


def test_emulated_whole_stress_inputs(whole_kernels) -> None:
    """tests/test_gpu_qr.py's stress inputs (graded, near rank deficient, zero and
    duplicate columns, a zero matrix, huge, tiny), 40 x 40."""
    from test_gpu_qr import STRESS, _stress

    rng = np.random.default_rng(12)
    a = np.stack([_stress(kind, 40, rng) for kind in STRESS])
    H, tau = _whole(whole_kernels, a)
    for b, kind in enumerate(STRESS):
        rep = kernels.check(a[b:b + 1], H[b:b + 1], tau[b:b + 1])
        assert rep.ok, (kind, str(rep))


@pytest.mark.parametrize("batch,n", [(2, 33), (1, 130)])  # 130: the dynamic buffer
def test_emulated_whole_checked_equals_raw(whole_kernels, batch: int, n: int) -> None:
    a = np.random.default_rng(4).standard_normal((batch, n, n)).astype(np.float32)
    H, tau = _whole(whole_kernels, a)
    Hr, taur = _whole(whole_kernels, a, checked=False)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32))
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))


def test_emulated_whole_wrong_n_faults(whole_kernels) -> None:
    """A launch told n larger than the buffers faults on A (the tile load, before any
    store); an n past the class's capacity faults on its shared matrix, smem_a."""
    a = np.random.default_rng(6).standard_normal((1, 32, 32)).astype(np.float32)
    k = whole_kernels[64, True]
    A, tau = a.copy(), np.zeros((1, 32), np.float32)
    err = k.capability_fault(k.launch([A, tau, 40, 1], 1, 256))
    assert (err.reason, err.buffer, err.access) == ("out-of-bounds", "A", "load")
    assert np.array_equal(A, a)  # a refused tile copies nothing
    k32 = whole_kernels[32, True]
    big = np.zeros((1, 33, 33), np.float32)
    err = k32.capability_fault(k32.launch([big, np.zeros(33, np.float32), 33, 1], 1, 256))
    assert (err.reason, err.buffer) == ("local-array", "smem_a")


def test_dynamic_shared_memory_lowering() -> None:
    """Shared arrays past 48 KB become offsets into the launch's dynamic buffer (the
    lane passes CudaSource.dynamic_smem bytes); smaller sets stay static; a kernel with
    a dynamic buffer cannot be called as a helper (no KERNEL can: the verifier refuses it;
    its arrays and the caller's would share the buffer's start)."""
    from capqr.runtime.cuda import translate
    from capqr.runtime.errors import VerifyError

    gw = g.gen_whole
    for cap, threads in gw.CLASSES:
        cs = translate(gw.source(cap, threads))
        dyn = gw.shared_bytes(cap, threads) > 48 * 1024 - 256
        assert cs.dynamic_smem == ({"gpu_qr_whole": gw.shared_bytes(cap, threads)} if dyn
                                   else {})
        assert ("__rt_dsmem" in cs.text) == dyn
    src = """
KERNEL void big(cap_t x)
{
    float smem_a[100][129];
    smem_a[rt_thread_idx()][1] = 1.0f;
    rt_sync_threads();
    cap_store_f32(x, 0, smem_a[0][1]);
}
KERNEL void caller(cap_t x)
{
    big(x);
}
"""
    with pytest.raises(VerifyError, match="call to KERNEL"):
        translate(src)
    cs = translate(src.split("KERNEL void caller")[0])
    assert cs.dynamic_smem == {"big": 100 * 129 * 4}
    assert "float (*capqr_u_smem_a)[129] = (float (*)[129]) (__rt_dsmem + 0);" in cs.text


# ---------------------------------------------------------------------------
# gpu_qr_matrix: one launch, one block per matrix, panel after panel
#: A class of the generator's that no plan uses: 64 threads, so matrices of more than
#: 96 rows reach its second trailing column per thread, and 64 panel rows per thread, so the
#: panel takes column p by shuffle (the largest classes' paths, cheap to emulate).
SMALL_TWO_COLUMNS = (128, 2, 64, 2)


@pytest.fixture(scope="module")
def matrix_kernels(tmp_path_factory) -> dict:
    """(class, checked) -> the emulated gpu_qr_matrix of that class."""
    return BuiltOnFirstUse(tmp_path_factory.mktemp("emu_matrix"), g.gen_matrix.source,
                           "gpu_qr_matrix")


def _matrix(matrix_kernels: dict, a: np.ndarray, cls: tuple[int, ...] | None = None,
            checked: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """gpu_qr_matrix of ``cls`` (None: the class the plan picks for n) on ``a``."""
    batch, n, _ = a.shape
    if cls is None:
        (step,) = g.launch_plan(max(batch, g.PER_MATRIX_MIN_BATCH), n, per_matrix=True)
        cls = g.gen_matrix.by_capacity(int(step.kernel[6:]))
        assert step.block == g.gen_matrix.threads(cls)
    A, tau = a.copy(), np.zeros((batch, n), np.float32)
    fault = matrix_kernels[cls, checked].launch([A, tau, n, batch], batch,
                                                g.gen_matrix.threads(cls))
    assert fault is None, fault
    return A, tau


def _lapack_close(a: np.ndarray, H: np.ndarray, tau: np.ndarray) -> None:
    """kernels.check passes and H, tau are LAPACK's compact form (float64 reference)."""
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)
    n = a.shape[-1]
    for b in range(a.shape[0]):
        h_ref, tau_ref = np.linalg.qr(a[b].astype(np.float64), mode="raw")  # h is H^T
        np.testing.assert_allclose(H[b], h_ref.T, atol=2e-4 * max(1, n // 32), rtol=2e-3)
        np.testing.assert_allclose(tau[b], tau_ref, atol=2e-5 * max(1, n // 32), rtol=1e-4)


@pytest.mark.parametrize("batch,n", [(2, 33), (2, 40), (1, 100)])
def test_emulated_matrix_qr_passes_the_checker(matrix_kernels, batch: int, n: int) -> None:
    """One block per matrix, the classes the plan picks (64, 128; 256 and up differ in
    their sizes only, or as SMALL_TWO_COLUMNS below): a ragged last panel, a single
    full trailing panel, and several panels with updates."""
    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    _lapack_close(a, *_matrix(matrix_kernels, a))


@pytest.mark.parametrize("batch,n", [(1, 97)])
def test_emulated_matrix_two_columns_per_thread(matrix_kernels, batch: int, n: int) -> None:
    """Two trailing columns per thread (the 512 and 1024 classes' update) and the
    panel's shuffled column, through a small class of the same generator."""
    a = np.random.default_rng(n + 1).standard_normal((batch, n, n)).astype(np.float32)
    _lapack_close(a, *_matrix(matrix_kernels, a, SMALL_TWO_COLUMNS))


def test_emulated_matrix_stress_inputs(matrix_kernels) -> None:
    """tests/test_gpu_qr.py's stress inputs, 64 x 64 (two panels and an update)."""
    from test_gpu_qr import STRESS, _stress

    rng = np.random.default_rng(14)
    a = np.stack([_stress(kind, 64, rng) for kind in STRESS])
    H, tau = _matrix(matrix_kernels, a)
    for b, kind in enumerate(STRESS):
        rep = kernels.check(a[b:b + 1], H[b:b + 1], tau[b:b + 1])
        assert rep.ok, (kind, str(rep))


def test_emulated_matrix_checked_equals_raw(matrix_kernels) -> None:
    a = np.random.default_rng(8).standard_normal((2, 70, 70)).astype(np.float32)
    H, tau = _matrix(matrix_kernels, a)
    Hr, taur = _matrix(matrix_kernels, a, checked=False)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32))
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))


def test_emulated_matrix_short_buffer_faults(matrix_kernels) -> None:
    """A launch told a larger n than its buffers hold faults on A before it writes
    anything past them, naming the buffer."""
    a = np.random.default_rng(9).standard_normal((1, 40, 40)).astype(np.float32)
    cls = g.gen_matrix.find_class(48)
    k = matrix_kernels[cls, True]
    A, tau = a.copy(), np.zeros(48, np.float32)
    err = k.capability_fault(k.launch([A, tau, 48, 1], 1, g.gen_matrix.threads(cls)))
    assert (err.reason, err.buffer) == ("out-of-bounds", "A")
