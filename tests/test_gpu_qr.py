"""Blocked GPU QR (kernels/gpu): host plan and algebra on the CPU, kernels on the device.

CPU half: :func:`kernels.gpu.launch_plan` covers every column exactly once in
order, and a numpy model of the two kernels (same formulas, same order of the
steps, run through the same plan) yields a QR that passes kernels.check, so
the plan and the compact-WY algebra (T formation, masking of V) are right
before any device time is spent.  The kernels' dialect sources must pass the
CUDA verifier and instrumenter here too.

GPU half (``-m gpu``; skipped where runtime.cuda.available() says no):
contest shapes and stress inputs through kernels.check, checked == raw bit
for bit, the kernels.qr dispatch for device inputs, and a planted
out-of-bounds panel launch that faults with the launch's kernel name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from capqr import kernels
from capqr.kernels import gpu as g

try:
    from capqr.runtime import cuda

    _OK, _WHY = cuda.available()
except Exception as e:  # noqa: BLE001 - no cffi/libcuda/device: all mean "skip here"
    _OK, _WHY = False, f"GPU lane unavailable: {e}"

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")

CONTEST_SHAPES = [(20, 32), (40, 176), (40, 352), (640, 512), (60, 1024), (8, 2048), (2, 4096)]


# ---------------------------------------------------------------------------
# numpy model of the kernels (one matrix; float32 storage, as on the device)
# ---------------------------------------------------------------------------
def model_panel(M: np.ndarray, tau: np.ndarray, n: int, k0: int, nb: int) -> np.ndarray:
    """gpu_qr_panel on one matrix (in place); returns the 32 x 32 T."""
    y = np.zeros((32, 32), np.float32)
    taus = np.zeros(32, np.float32)
    for j in range(nb):
        kj = k0 + j
        cols = slice(k0, k0 + nb)
        x = M[kj + 1:, kj].astype(np.float64)
        tot = x @ M[kj + 1:, cols].astype(np.float64)          # per lane c
        alpha = float(M[kj, kj])
        xn2 = tot[j]
        tk, beta, scale = 0.0, alpha, 0.0
        if xn2 > 0:
            beta = -np.copysign(np.sqrt(alpha * alpha + xn2), alpha)
            tk = (beta - alpha) / beta
            scale = 1.0 / (alpha - beta)
        d = M[kj, cols].astype(np.float64) + tot * scale
        w = (tk * d).astype(np.float32)
        y[:j, j] = d[:j].astype(np.float32)
        v = M[kj + 1:, kj] * np.float32(scale)
        for c in range(j + 1, nb):
            M[kj + 1:, k0 + c] = (M[kj + 1:, k0 + c] - v * w[c]).astype(np.float32)
            M[kj, k0 + c] = M[kj, k0 + c] - w[c]
        M[kj + 1:, kj] = v
        M[kj, kj] = np.float32(beta)
        tau[kj] = np.float32(tk)
        taus[j] = np.float32(tk)
    return _t_from(taus, y, nb)


def _v(M: np.ndarray, k0: int, nb: int) -> np.ndarray:
    """V (unit lower trapezoidal, rows k0..) of the panel at k0 as the kernels read it."""
    V = np.zeros((M.shape[0] - k0, 32), np.float32)
    for q in range(nb):
        V[q, q] = 1.0
        V[q + 1:, q] = M[k0 + q + 1:, k0 + q]
    return V


def _t_from(taus: np.ndarray, G: np.ndarray, nb: int, size: int = 32) -> np.ndarray:
    T = np.zeros((size, size), np.float32)
    for j in range(nb):
        T[j, j] = taus[j]
        for i in range(j):
            T[i, j] = -taus[j] * np.float32(T[i, i:j] @ G[i:j, j])
    return T


def model_steps(M: np.ndarray, tau: np.ndarray, n: int, k0: int, nb: int, batch: int,
                nrb: int) -> np.ndarray:
    """gpu_qr_steps on one matrix (in place), block by block: between two grid
    barriers each row block adds the parts of the sums that the previous column left in
    the double buffer (indexed by column parity) and updates only its rows.  Returns
    the 32 x 32 T that block 0 forms at the end from the y columns and tau."""
    R = g.STEP_ROWS
    Pv = np.zeros((2, 32))
    Pp = np.zeros((2, nrb, 32))
    Y = np.zeros((32, 32), np.float32)
    cols = slice(k0, k0 + nb)
    for rbi in range(nrb):                                # column 0's sums
        lo, hi = max(k0 + rbi * R, k0 + 1), min(k0 + (rbi + 1) * R, n)
        x = M[lo:hi, k0].astype(np.float64)
        Pp[0, rbi, :nb] = x @ M[lo:hi, cols].astype(np.float64)
    Pv[0, :nb] = M[k0, cols]
    for j in range(nb):                                   # column j, then a barrier
        kj, par, nxt = k0 + j, j % 2, 1 - j % 2
        s, pv = Pp[par].sum(axis=0), Pv[par].copy()
        alpha, xn2 = pv[j], s[j]
        tk, beta, scale = 0.0, alpha, 0.0
        if xn2 > 0:
            beta = -np.copysign(np.sqrt(alpha * alpha + xn2), alpha)
            tk = (beta - alpha) / beta
            scale = 1.0 / (alpha - beta)
        w = np.zeros(32, np.float32)
        w[j + 1:nb] = (tk * (pv[j + 1:nb] + s[j + 1:nb] * scale)).astype(np.float32)
        for rbi in range(nrb):
            lo, hi = max(k0 + rbi * R, kj), min(k0 + (rbi + 1) * R, n)
            if lo >= hi:
                continue
            x = M[lo:hi, kj].copy()
            below = np.arange(lo, hi) > kj
            v = x * np.float32(scale)
            for c in range(j + 1, nb):
                a = M[lo:hi, k0 + c]
                M[lo:hi, k0 + c] = np.where(below, (a - v * w[c]).astype(np.float32), a - w[c])
            M[lo:hi, kj] = np.where(below, v, np.float32(beta))
            if j + 1 < nb:
                x1 = np.where(np.arange(lo, hi) > kj + 1, M[lo:hi, kj + 1], 0).astype(np.float64)
                Pp[nxt, rbi, :nb] = x1 @ M[lo:hi, cols].astype(np.float64)
        if j + 1 < nb:
            Pv[nxt, :nb] = M[kj + 1, cols]
        Y[:j, j] = (pv[:j] + s[:j] * scale).astype(np.float32)
        tau[kj] = np.float32(tk)
    return _t_from(tau[k0:k0 + nb], Y, nb)


def model_update(M: np.ndarray, T: np.ndarray, n: int, k0: int, nb: int, ce: int,
                 c0: int) -> None:
    """gpu_qr_update on one matrix, all strips at once (in place): columns c0 .. ce-1."""
    V = _v(M, k0, nb)
    C = M[k0:, c0:ce]
    Z = V.T @ C
    W = (T.T @ Z).astype(np.float32)
    M[k0:, c0:ce] = (C - V @ W).astype(np.float32)


def model_update2(M: np.ndarray, T1: np.ndarray, T2: np.ndarray, n: int, k0: int, nb: int,
                  ce: int) -> None:
    """gpu_qr_update2 on one matrix (in place): both panels' reflectors at once,
    W1 = T1^T Z1, W2 = T2^T (Z2 - G^T W1) with G = V1^T V2, C -= V1 W1 + V2 W2."""
    V1 = _v(M, k0, 32)
    V2 = np.zeros_like(V1)
    V2[32:] = _v(M, k0 + 32, nb - 32)
    C = M[k0:, k0 + nb:ce]
    Z1, Z2, G = V1.T @ C, V2.T @ C, V1.T @ V2
    W1 = (T1.T @ Z1).astype(np.float32)
    W2 = (T2.T @ (Z2 - G.T @ W1).astype(np.float32)).astype(np.float32)
    M[k0:, k0 + nb:ce] = (C - V1 @ W1 - V2 @ W2).astype(np.float32)


def model_qr(a: np.ndarray, tall_rows: int | None = None, two_panel: bool | None = None,
             lookahead: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Run the blocked launch plan (panel by panel, in list order) through the numpy
    model."""
    batch, n, _ = a.shape
    H = a.astype(np.float32).copy()
    tau = np.zeros((batch, n), np.float32)
    T = np.zeros((2, batch, 32, 32), np.float32)  # work, work2
    for step in g.launch_plan(batch, n, tall_rows=tall_rows, two_panel=two_panel,
                              whole=False, per_matrix=False, lookahead=lookahead):
        for b in range(batch):
            if step.kernel in ("panel", "panel_small") or step.kernel.startswith("preg"):
                T[step.slot, b] = model_panel(H[b], tau[b], *step.args)
            elif step.kernel == "steps":
                T[step.slot, b] = model_steps(H[b], tau[b], *step.args)
            elif step.kernel == "update_apply":
                model_update(H[b], T[step.slot, b], *step.args[:4], step.args[7])
            elif step.kernel == "update2_apply":
                model_update2(H[b], T[0, b], T[1, b], *step.args[:4])
    return H, tau


# ---------------------------------------------------------------------------
# CPU tests
# ---------------------------------------------------------------------------
def _is_panel(kind: str) -> bool:
    """Whether a launch kind factors one panel (not an update, nor a one-launch plan)."""
    return kind.startswith(("panel", "preg")) or kind == "steps"


def test_plan_option_defaults() -> None:
    """The defaults an H100 run set (kernels/gpu/__init__.py, docs/gpu.md): the register
    panel only for panels of at most REG_ROWS rows, where it won (the contest's
    (20,32)), and no per-matrix launch, which lost on every shape; the other tests
    name the options they test."""
    assert g.REG_ROWS == 32 and g.PER_MATRIX is False
    # the look-ahead where it won twice on an H100, (60,1024), and nowhere else here
    assert g.LOOKAHEAD is None
    assert [(b, n) for b, n in CONTEST_SHAPES if any(s.lane for s in g.launch_plan(b, n))] == [
        (60, 1024)]
    assert any(s.lane for s in g.launch_plan(64, 2048))
    assert not any(s.lane for s in g.launch_plan(65, 1024) + g.launch_plan(60, 1023)
                   + g.launch_plan(8, 4096) + g.launch_plan(60, 1024, tall_rows=256))
    for b, n in CONTEST_SHAPES:
        plan = g.launch_plan(b, n)
        assert not any(s.kernel.startswith("matrix") for s in plan)
        for s in plan:
            if _is_panel(s.kernel) and s.kernel != "steps":
                rows = n - s.args[1]
                assert s.kernel.startswith("preg") == (rows <= g.REG_ROWS), (b, n, s)
    assert [s.kernel for s in g.launch_plan(20, 32)] == ["preg32"]
    assert g.launch_plan(20, 32, reg=False)[0].kernel == "panel_small"
    assert g.launch_plan(40, 176, reg=True)[0].kernel == "preg256"


@pytest.mark.parametrize("choice,kind", [("on", "preg256"), ("off", "panel_small"),
                                         ("default", "panel_small")])
def test_bench_panel_reg_option_sets_the_plan(monkeypatch, choice: str, kind: str) -> None:
    """bench.gpu_bench --panel-reg on sends every panel of up to REG_MAX_ROWS rows to the
    register panel (what gpu_reg_device.sh's reg part measures), off none."""
    import argparse

    from capqr.bench.gpu_bench import _set_plan_options

    monkeypatch.setattr(g, "REG_ROWS", g.REG_ROWS)
    monkeypatch.setattr(g, "PER_MATRIX", g.PER_MATRIX)
    monkeypatch.setattr(g, "MMA_UPDATE", g.MMA_UPDATE)
    _set_plan_options(argparse.Namespace(mma_update="default", mma_min_rows=None,
                                         panel_reg=choice, per_matrix="default",
                                         lookahead="default"))
    assert g.launch_plan(40, 176)[0].kernel == kind
    assert (g.launch_plan(20, 32)[0].kernel == "preg32") == (choice != "off")


@pytest.mark.parametrize("choice", ["on", "off"])
def test_bench_lookahead_option_sets_the_plan(monkeypatch, choice: str) -> None:
    """bench.gpu_bench --lookahead on: the plan's panels on lane 1 (what
    gpu_lookahead_device.sh's new part measures); off: one lane."""
    import argparse

    from capqr.bench.gpu_bench import _set_plan_options

    monkeypatch.setattr(g, "LOOKAHEAD", g.LOOKAHEAD)
    _set_plan_options(argparse.Namespace(mma_update="default", mma_min_rows=None,
                                         panel_reg="default", per_matrix="default",
                                         lookahead=choice))
    assert any(s.lane == 1 for s in g.launch_plan(2, 4096)) == (choice == "on")


@pytest.mark.parametrize("reg", [True, False])
@pytest.mark.parametrize("two_panel", [False, True])
@pytest.mark.parametrize("batch,n", CONTEST_SHAPES + [(3, 1), (2, 33), (1, 100), (1, 161)])
def test_plan_covers_each_column_once(batch: int, n: int, two_panel: bool, reg: bool) -> None:
    """Every column in one panel launch, in order; the updates cover the trailing
    columns; each panel goes to its kernel: with reg=True panels of at most
    REG_MAX_ROWS rows to gpu_qr_panel_reg of the smallest class holding them, with
    reg=False (and above REG_MAX_ROWS) to gpu_qr_panel_small / gpu_qr_panel."""
    plan = g.launch_plan(batch, n, tall_rows=None, two_panel=two_panel, whole=False, reg=reg,
                         per_matrix=False, lookahead=False)
    panels = [s for s in plan if _is_panel(s.kernel)]
    cols = [c for s in panels for c in range(s.args[1], s.args[1] + s.args[2])]
    assert cols == list(range(n))
    kinds = [s.kernel for s in plan]
    for i, k in enumerate(kinds):  # each Z launch is followed by its apply launch
        for kind in ("update", "update2"):
            nxt = kinds[i + 1] if i + 1 < len(kinds) else ""
            assert (k == kind + "_z") == (nxt == kind + "_apply")
    for s in plan:
        assert s.block % 32 == 0 and 32 <= s.block <= 1024
        if s.kernel.startswith("update"):
            _, k0, nb, ce, strips, nrb, rb, *start = s.args
            # the one-panel kernels take their first column: the one after the panel
            assert start == ([] if s.kernel.startswith("update2") else [k0 + nb])
            assert (s.lane, s.after) == (0, ())  # one lane without the look-ahead
            # a pair's first update reaches only the second panel; the others, the end
            assert ce == (k0 + 2 * g.NB if s.kernel.startswith("update_") and two_panel
                          and n - k0 > 2 * g.NB else n)
            assert nb == (2 * g.NB if s.kernel.startswith("update2") else min(g.NB, n - k0))
            assert s.grid == batch * strips * nrb and rb % g.CHUNK == 0
            assert strips * g.STRIP >= ce - k0 - nb > (strips - 1) * g.STRIP
            assert nrb * rb >= n - k0 > (nrb - 1) * rb  # row blocks cover the rows, none empty
        else:
            assert s.grid == batch and 1 <= s.args[2] <= g.NB
            rows = n - s.args[1]
            if reg and rows <= g.REG_MAX_ROWS:
                cls = g.gen_panel_reg.find_class(rows)
                assert (s.kernel, s.block) == (f"preg{g.gen_panel_reg.capacity(*cls)}",
                                               g.gen_panel_reg.threads(*cls))
                src, name, _ = g._kernel_spec(s.kernel)
                assert name == "gpu_qr_panel_reg" and s.args == (n, s.args[1], s.args[2])
                assert f"rt_require_block_dim({s.block});" in src  # one block size
                continue
            assert (s.kernel, s.block) == (
                ("panel_small", g.SMALL_BLOCK) if rows <= g.SMALL_ROWS else
                ("panel", g.PANEL_BLOCK))
            src = {"panel": g.PANEL_SOURCE, "panel_small": g.PANEL_SMALL_SOURCE}[s.kernel]
            assert f"int64_t P = {s.block};" in src  # written for one block size
    if not reg:
        assert not any(s.kernel.startswith("preg") for s in plan)


def _footprint(step: g.Launch) -> list[tuple[str, str, tuple[int, int, int, int] | None]]:
    """What one launch reads ("r") and writes ("w"), from its kernel's contract (the
    comments of panel*.c, update.c): per buffer, the rows x columns of A it covers (every
    matrix alike), the columns of tau, or None for the whole buffer.  The buffers are
    named by Workspace.caps, so a launch's lane buffers are the plan's own choice."""
    ws = g.Workspace(*"work work2 scratch gram steps vt scratch1 vt1".split())
    caps = ws.caps(step, "A", "tau")
    n, k0, nb = step.args[:3]
    if _is_panel(step.kernel):
        out = [("A", "w", (k0, n, k0, k0 + nb)), ("tau", "w", (0, 1, k0, k0 + nb)),
               (caps[2], "w", None)]
        return out + ([(caps[3], "w", None)] if step.kernel == "steps" else [])
    ce, c0 = step.args[3], step.args[7]
    out = [("A", "r", (k0, n, k0, k0 + nb))]  # V
    if step.kernel == "update_z":
        _, z, v = caps
        return out + [("A", "r", (k0, n, c0, ce)), (z, "w", None), (v, "w", None)]
    assert step.kernel == "update_apply", step.kernel
    _, t, z, v = caps
    return out + [("A", "w", (k0, n, c0, ce)), (t, "r", None), (z, "r", None), (v, "r", None)]


def _overlap(a: tuple[int, int, int, int] | None, b: tuple[int, int, int, int] | None) -> bool:
    if a is None or b is None:
        return True
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


@pytest.mark.parametrize("tall_rows", ["auto", None])
@pytest.mark.parametrize("batch,n", CONTEST_SHAPES + [(1, 33), (3, 64), (1, 100), (2, 161)])
def test_lookahead_plan_orders_every_conflict(batch: int, n: int, tall_rows) -> None:
    """The look-ahead plan's two lanes (kernels/gpu launch_plan, runtime/cuda/lanes.py): any
    two launches that touch the same memory, one of them writing, are ordered (by their
    lane or by ``after``, transitively), so they cannot overlap on the GPU; and every
    update of a column comes before the panel that factors it, which the list order (the
    order of the isolated and emulated lanes) follows too."""
    from capqr.runtime.cuda.lanes import check_lanes, predecessors

    plan = g.launch_plan(batch, n, tall_rows, whole=False, per_matrix=False, lookahead=True)
    assert any(s.lane == 1 for s in plan) and any(s.lane == 0 for s in plan) == (n > 64)
    preds = predecessors(check_lanes([(s.lane, s.after) for s in plan], len(plan)))
    before = []  # bit j of before[i]: launch j happens before launch i
    for ps in preds:
        bits = 0
        for j in ps:
            bits |= before[j] | (1 << j)
        before.append(bits)
    feet = [_footprint(s) for s in plan]
    for i in range(len(plan)):
        for j in range(i):
            if before[i] >> j & 1:
                continue
            for bi, mi, ri in feet[i]:
                for bj, mj, rj in feet[j]:
                    assert not (bi == bj and "w" in (mi, mj) and _overlap(ri, rj)), (
                        f"launches {j} {plan[j]} and {i} {plan[i]} may overlap on {bi}")
    # each panel's reflectors reach each later column once, before that column's panel
    panels = [(i, s) for i, s in enumerate(plan) if _is_panel(s.kernel)]
    assert [c for _, s in panels for c in range(s.args[1], s.args[1] + s.args[2])] == list(
        range(n))
    for _, s in panels:
        k0, nb = s.args[1], s.args[2]
        ups = [(u, t) for u, t in enumerate(plan) if t.kernel == "update_apply"
               and t.args[1] == k0]
        assert sorted(c for _, t in ups for c in range(t.args[7], t.args[3])) == list(
            range(k0 + nb, n))
        for u, t in ups:
            for p, q in panels:
                if t.args[7] <= q.args[1] < t.args[3]:
                    assert u < p and before[p] >> u & 1, (t, q)


@pytest.mark.parametrize("batch,n", [(2, 4096), (8, 2048), (3, 130), (1, 65)])
def test_plan_column_steps(batch: int, n: int) -> None:
    """Panels taller than tall_rows: one cooperative launch over row blocks (the grid is
    its group), where the grid fits in max_group; one block per matrix otherwise."""
    plan = g.launch_plan(batch, n, tall_rows=64, whole=False)
    steps = [s for s in plan if s.kernel == "steps"]
    assert steps and all(s.args[1] < n - 64 for s in steps)
    for s in steps:
        n_, k0, nb, nbatch, nrb = s.args
        assert (n_, nbatch) == (n, batch) and nrb * g.STEP_ROWS >= n - k0 > (nrb - 1) * g.STEP_ROWS
        assert s.grid == s.group == batch * nrb <= g.STEPS_MAX_GROUP
        assert s.block == g.STEP_BLOCK
    assert all(s.group is None for s in plan if s.kernel != "steps")
    # the kernel is written for 256 threads of 8 rows each in blocks of 64 rows
    assert g.STEP_BLOCK // 32 * 8 == g.STEP_ROWS
    assert "rlo = k0 + rbi * 64;" in g.PANEL_STEPS_SOURCE
    need = max(2 * s.args[3] * 32 + 2 * s.args[3] * s.args[4] * 32 for s in steps)
    assert g.steps_size(batch, n) >= need
    # a grid that does not fit at once falls back to one block per matrix
    small = g.launch_plan(batch, n, tall_rows=64, max_group=batch * 2, whole=False)
    for s in small:
        rows = n - s.args[1]
        if _is_panel(s.kernel):
            nrb = -(-rows // g.STEP_ROWS)
            assert (s.kernel == "steps") == (rows > 64 and batch * nrb <= batch * 2)


def test_default_plan_uses_column_steps_for_small_batches() -> None:
    """Small batches factor the panels of more than STEPS_ROWS rows by column steps,
    with the register panels (reg=True; reg=False: gpu_qr_panel_small) below; the other
    batches one block per matrix throughout (with per_matrix=False, panel by panel)."""
    for batch, n in CONTEST_SHAPES:
        steps = batch <= g.STEPS_MAX_BATCH and n > g.STEPS_ROWS
        assert ("steps" in {s.kernel for s in g.launch_plan(batch, n)}) == steps
    for reg in (True, False):
        for batch, n in CONTEST_SHAPES:
            plan = g.launch_plan(batch, n, reg=reg, per_matrix=False)
            kinds = {s.kernel for s in plan}
            steps = batch <= g.STEPS_MAX_BATCH and n > g.STEPS_ROWS
            assert ("steps" in kinds) == steps and ("panel" not in kinds or not steps)
            for s in plan:
                if _is_panel(s.kernel):  # preg like panel: one block per matrix
                    rows = n - s.args[1]
                    assert (s.kernel == "steps") == (steps and rows > g.STEPS_ROWS)
                    assert s.kernel.startswith("preg") == (
                        reg and s.kernel != "steps" and rows <= g.REG_MAX_ROWS)


def test_plan_rejects_empty() -> None:
    with pytest.raises(ValueError):
        g.launch_plan(0, 4)


@pytest.mark.parametrize("two_panel", [False, True])
@pytest.mark.parametrize("tall_rows", [None, 40])
@pytest.mark.parametrize("batch,n", [(2, 32), (2, 40), (1, 96), (1, 130), (1, 200)])
def test_model_of_the_kernels_passes_the_checker(batch: int, n: int, tall_rows: int,
                                                 two_panel: bool) -> None:
    a = np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32)
    H, tau = model_qr(a, tall_rows, two_panel)
    rep = kernels.check(a, H, tau)
    assert rep.ok, str(rep)


def test_model_matches_lapack_compact_form() -> None:
    scipy_linalg = pytest.importorskip("scipy.linalg")
    a = np.random.default_rng(5).standard_normal((1, 70, 70)).astype(np.float32)
    H, tau = model_qr(a)
    (h_ref, tau_ref), _ = scipy_linalg.qr(a[0].astype(np.float64), mode="raw")
    np.testing.assert_allclose(H[0], h_ref, atol=3e-4, rtol=3e-3)
    np.testing.assert_allclose(tau[0], tau_ref, atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("name,src", [("gpu_qr_panel", g.PANEL_SOURCE),
                                      ("gpu_qr_panel_small", g.PANEL_SMALL_SOURCE),
                                      ("gpu_qr_steps", g.PANEL_STEPS_SOURCE),
                                      ("gpu_qr_update_z", g.UPDATE_SOURCE),
                                      ("gpu_qr_update_apply", g.UPDATE_SOURCE),
                                      ("gpu_qr_update2_z", g.UPDATE_SOURCE),
                                      ("gpu_qr_update2_apply", g.UPDATE_SOURCE)]
                         + [("gpu_qr_whole", g._kernel_spec(f"whole{cap}")[0])
                            for cap, _ in g.gen_whole.CLASSES]
                         + [("gpu_qr_panel_reg",
                             g._kernel_spec(f"preg{g.gen_panel_reg.capacity(*c)}")[0])
                            for c in g.gen_panel_reg.CLASSES])
def test_kernel_sources_verify_and_instrument(name: str, src: str) -> None:
    from capqr.runtime.cuda import translate

    for checked in (True, False):
        cs = translate(src, checked=checked)
        assert name in cs.kernels
    # the loops over rows are versioned: one range check per loop, unchecked accesses inside
    assert "rt_range_ok" in translate(src, checked=True).text


def test_update_source_is_generated() -> None:
    from capqr.kernels.gpu import gen_update

    assert gen_update.source() == g.UPDATE_SOURCE, "run python -m capqr.kernels.gpu.gen_update"


def test_plan_one_launch_where_the_matrix_fits(monkeypatch) -> None:
    """n x n matrices that fit one block's shared memory (n <= 232 on H100/H200) take one
    launch of gpu_qr_whole, one block per matrix, of the smallest class that holds them;
    whole=False, WHOLE off or a device with less shared memory: the blocked plan."""
    assert not g.WHOLE  # off by default: it lost to the blocked plan on an H100
    for n in (1, 2, 31, 32, 33, 64, 65, 176, 232):
        (step,) = g.launch_plan(7, n, whole=True)
        cap, threads = g.whole_class(n)
        assert (step.kernel, step.grid, step.block, step.args) == (f"whole{cap}", 7, threads,
                                                                   (n, 7))
        assert cap == min(c for c, _ in g.gen_whole.CLASSES if c >= n)
        assert g._kernel_spec(step.kernel)[1] == "gpu_qr_whole"
        assert not g.needs_workspace(7, n, whole=True)
    for kw in ({"whole": False}, {"whole": True, "smem": 100 * 1024}):
        assert len(g.launch_plan(7, 176, **kw)) > 1 and g.needs_workspace(7, 176, **kw)
    assert g.launch_plan(7, 100, whole=True, smem=100 * 1024)[0].kernel == "whole128"
    assert len(g.launch_plan(7, 233, whole=True)) > 1
    monkeypatch.setattr(g, "WHOLE", True)
    assert g.launch_plan(7, 32)[0].kernel == "whole32"
    monkeypatch.setattr(g, "WHOLE", False)
    assert g.launch_plan(7, 32, reg=True)[0].kernel == "preg32"  # the register panel
    assert g.launch_plan(7, 32, reg=False)[0].kernel == "panel_small"
    gw = g.gen_whole
    assert gw.shared_bytes(*gw.CLASSES[-1]) + 256 <= g.WHOLE_SMEM  # 227 KB on H100/H200
    for cap, threads in gw.CLASSES:
        assert gw.row_stride(cap) % 2 == 1 and threads % 32 == 0
        assert f"rt_require_block_dim({threads});" in gw.source(cap, threads)


def test_whole_source_is_generated() -> None:
    assert g.gen_whole.kernel_text(*g.gen_whole.CLASSES[-1]) == (
        Path(g.__file__).with_name("whole.c").read_text()), (
        "run python -m capqr.kernels.gpu.gen_whole")


def test_panel_reg_source_is_generated() -> None:
    assert g.gen_panel_reg.kernel_text(*g.gen_panel_reg.CLASSES[0]) == (
        Path(g.__file__).with_name("panel_reg.c").read_text()), (
        "run python -m capqr.kernels.gpu.gen_panel_reg")


def test_panel_reg_classes() -> None:
    """find_class picks the smallest class holding the panel (None past the largest,
    REG_MAX_ROWS); each class is one launch kind whose source is written for its own
    block size and compiled under its own register cap."""
    gr = g.gen_panel_reg
    caps = [gr.capacity(*c) for c in gr.CLASSES]
    assert caps == sorted(caps) and len(set(caps)) == len(caps)
    assert g.REG_MAX_ROWS == caps[-1] == 1024
    for m, cap in ((1, 32), (32, 32), (33, 64), (512, 512), (513, 1024), (1024, 1024)):
        assert gr.capacity(*gr.find_class(m)) == cap, m
    assert gr.find_class(1025) is None
    for c in gr.CLASSES:
        kind = f"preg{gr.capacity(*c)}"
        assert kind in g.LAUNCH_KINDS and gr.by_capacity(gr.capacity(*c)) == c
        src, name, options = g._kernel_spec(kind)
        assert (name, options) == ("gpu_qr_panel_reg", gr.options(*c))
        assert f"rt_require_block_dim({gr.threads(*c)});" in src
        assert f"int64_t W = {c[0]};" in src and f"a{c[1] - 1} = " in src
        assert f"a{c[1]} " not in src  # exactly its rows per thread
        assert gr.threads(*c) % 32 == 0 and gr.threads(*c) <= 1024


def test_matrix_source_is_generated() -> None:
    assert g.gen_matrix.kernel_text(g.gen_matrix.CLASSES[0]) == (
        Path(g.__file__).with_name("matrix.c").read_text()), (
        "run python -m capqr.kernels.gpu.gen_matrix")


def test_plan_one_launch_per_matrix() -> None:
    """A batch of at least PER_MATRIX_MIN_BATCH matrices of NB + 1 .. PER_MATRIX_MAX_N rows
    is one launch of gpu_qr_matrix, one block per matrix, of the smallest class that
    holds n, with no workspace; smaller batches, n <= NB (one panel), n past the
    largest class and per_matrix=False take the blocked plan; whole=True comes first."""
    gm = g.gen_matrix
    big = g.PER_MATRIX_MIN_BATCH
    assert g.PER_MATRIX_MAX_N == gm.CLASSES[-1][0] == 1024
    for n in (33, 64, 65, 176, 352, 512, 513, 1024):
        (step,) = g.launch_plan(big, n, per_matrix=True)
        cls = gm.find_class(n)
        assert cls[0] == min(c[0] for c in gm.CLASSES if c[0] >= n)
        assert (step.kernel, step.grid, step.block, step.args) == (
            f"matrix{cls[0]}", big, gm.threads(cls), (n, big))
        assert g._kernel_spec(step.kernel)[1] == "gpu_qr_matrix"
        assert not g.needs_workspace(big, n, per_matrix=True) and g.one_launch(step.kernel)
        assert g.needs_workspace(big, n, per_matrix=False)
        assert len(g.launch_plan(big, n, per_matrix=False)) > 1
        assert len(g.launch_plan(big - 1, n, per_matrix=True)) > 1
    assert g.launch_plan(big, 32, reg=True, per_matrix=True)[0].kernel == "preg32"
    assert len(g.launch_plan(big, 1025, per_matrix=True)) > 1
    assert g.launch_plan(big, 176, whole=True, per_matrix=True)[0].kernel.startswith("whole")
    ws = g.Workspace(*"work work2 scratch gram steps vt".split())
    assert ws.caps(g.Launch("matrix64", 1, 256, (40, 1)), "A", "tau") == ["A", "tau"]


def test_matrix_classes() -> None:
    """Each class's panel holds its capacity in rows and its update reaches every
    trailing column; its source is written for its block size."""
    gm = g.gen_matrix
    caps = [c[0] for c in gm.CLASSES]
    assert caps == sorted(caps)
    for c in gm.CLASSES:
        cap, warps, rows, cols = c
        assert warps * rows >= cap and gm.threads(c) * cols >= cap - g.NB
        src, name, options = g._kernel_spec(f"matrix{cap}")
        assert (name, options) == ("gpu_qr_matrix", gm.options(c))
        assert f"rt_require_block_dim({gm.threads(c)});" in src
        assert f"float smem_v[{cap * 32}];" in src and f"z{cols - 1}_31" in src
    assert gm.find_class(1025) is None and gm.find_class(1)[0] == caps[0]


def test_on_device_routes_only_device_inputs() -> None:
    assert not g.on_device(np.zeros((2, 2), np.float32))
    torch = pytest.importorskip("torch")
    assert not g.on_device(torch.zeros(2, 2))


# ---------------------------------------------------------------------------
# GPU tests
# ---------------------------------------------------------------------------
def _stress(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    a = rng.standard_normal((n, n))
    if kind == "graded_rows":
        a *= np.logspace(0, -12, n)[:, None]
    elif kind == "graded_cols":
        a *= np.logspace(0, -12, n)[None, :]
    elif kind == "near_rank_deficient":
        u, _, vt = np.linalg.svd(a)
        s = np.logspace(0, -9, n)
        s[n // 2:] = 1e-30
        a = (u * s) @ vt
    elif kind == "zero_column":
        a[:, 3] = 0.0
        a[:, n - 1] = 0.0
    elif kind == "zero_matrix":
        a[:] = 0.0
    elif kind == "duplicate_columns":
        a[:, 1] = a[:, 0]
        a[:, 2] = a[:, 0] * (1 + 1e-7)
    elif kind == "huge":
        a *= 1e25
    elif kind == "tiny":
        a *= 1e-25
    return a.astype(np.float32)


STRESS = ["graded_rows", "graded_cols", "near_rank_deficient", "zero_column", "zero_matrix",
          "duplicate_columns", "huge", "tiny"]


def _check_both(a: np.ndarray, tall_rows: int | None = None,
                two_panel: bool | None = None, whole: bool | None = None, *,
                reg: bool | None = None, per_matrix: bool | None = None,
                lookahead: bool | None = None) -> None:
    kw = {"tall_rows": tall_rows, "two_panel": two_panel, "whole": whole, "reg": reg,
          "per_matrix": per_matrix, "lookahead": lookahead}
    H, tau = g.qr(a, checked=True, **kw)
    Hr, taur = g.qr(a, checked=False, **kw)
    assert np.array_equal(H.view(np.uint32), Hr.view(np.uint32)), "checked != raw output"
    assert np.array_equal(tau.view(np.uint32), taur.view(np.uint32))
    rep = kernels.check(a, H, tau)
    print(f"\n{a.shape}: worst {rep.worst()}")
    assert rep.ok, str(rep)


@gpu
@needs_gpu
@pytest.mark.parametrize("batch,n", CONTEST_SHAPES)
def test_contest_shape(batch: int, n: int) -> None:
    # the checker's float64 LAPACK calls on the host dominate otherwise (the bench checks
    # every matrix of every contest shape)
    batch = 1 if n >= 2048 else min(batch, 16)
    _check_both(np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32))


@gpu
@needs_gpu
@pytest.mark.parametrize("batch,n", [(2, 300), (1, 1024), (3, 65), (2, 130)])
def test_column_steps_path(batch: int, n: int) -> None:
    _check_both(np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32),
                tall_rows=1 if n < 200 else 256, whole=False)


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", ["graded_rows", "near_rank_deficient", "zero_column", "huge",
                                  "tiny"])
def test_column_steps_stress(kind: str) -> None:
    rng = np.random.default_rng(8)
    _check_both(np.stack([_stress(kind, 200, rng) for _ in range(2)]), tall_rows=64,
                whole=False)


@gpu
@needs_gpu
@pytest.mark.parametrize("whole", [None, False])
@pytest.mark.parametrize("n", [1, 5, 33, 100, 161, 300])
def test_odd_sizes(n: int, whole: bool | None) -> None:
    _check_both(np.random.default_rng(n).standard_normal((3, n, n)).astype(np.float32),
                whole=whole)


@gpu
@needs_gpu
@pytest.mark.parametrize("n", [33, 64, 100, 161, 256, 300, 513, 1000])
def test_per_matrix_path(n: int) -> None:
    """One launch of gpu_qr_matrix for a batch of PER_MATRIX_MIN_BATCH matrices, every
    class (two trailing columns per thread from 512), ragged last panels."""
    batch = g.PER_MATRIX_MIN_BATCH
    assert g.launch_plan(batch, n, per_matrix=True)[0].kernel.startswith("matrix")
    _check_both(np.random.default_rng(n).standard_normal((batch, n, n)).astype(np.float32),
                per_matrix=True)


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", STRESS)
def test_per_matrix_stress(kind: str) -> None:
    rng = np.random.default_rng(15)
    batch = g.PER_MATRIX_MIN_BATCH
    assert g.launch_plan(batch, 96, per_matrix=True)[0].kernel == "matrix128"
    _check_both(np.stack([_stress(kind, 96, rng) for _ in range(batch)]), per_matrix=True)


@gpu
@needs_gpu
@pytest.mark.parametrize("reg", [True, False])
@pytest.mark.parametrize("whole", [None, False])
@pytest.mark.parametrize("kind", STRESS)
def test_stress(kind: str, whole: bool | None, reg: bool) -> None:
    """The stress inputs through the register panels (reg=True) and gpu_qr_panel_small."""
    rng = np.random.default_rng(7)
    _check_both(np.stack([_stress(kind, 96, rng) for _ in range(4)]), whole=whole, reg=reg)


@gpu
@needs_gpu
@pytest.mark.parametrize("reg", [True, False])
@pytest.mark.parametrize("batch,n,tall_rows", [(3, 96, None), (2, 161, None), (2, 300, None),
                                               (1, 1024, None), (2, 300, 64), (40, 352, "auto"),
                                               (2, 1024, "auto")])
def test_two_panel_updates(batch: int, n: int, tall_rows, reg: bool) -> None:
    """Pairs of panels with one trailing update (gpu_qr_update2_*), through every panel
    kind (the register panels with reg=True, gpu_qr_panel_small / gpu_qr_panel with
    reg=False; the blocked plan, per_matrix=False, also for (40, 352)), odd widths (161: a
    last pair of 32 + 1 columns) and row blocks."""
    a = np.random.default_rng(n + batch).standard_normal((batch, n, n)).astype(np.float32)
    _check_both(a, tall_rows=tall_rows, two_panel=True, whole=False, reg=reg, per_matrix=False)


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", ["graded_rows", "near_rank_deficient", "zero_column", "huge"])
def test_two_panel_stress(kind: str) -> None:
    rng = np.random.default_rng(9)
    _check_both(np.stack([_stress(kind, 200, rng) for _ in range(2)]), two_panel=True,
                whole=False)


@gpu
@needs_gpu
@pytest.mark.parametrize("batch,n,tall_rows", [(3, 96, None), (2, 161, None), (1, 1024, None),
                                               (40, 352, "auto"), (2, 1024, "auto"),
                                               (1, 2048, "auto")])
def test_lookahead(batch: int, n: int, tall_rows) -> None:
    """The look-ahead plan on two streams (panels on the high-priority one): checked
    equals raw, kernels.check passes, a second run gives the same bits (the lanes
    overlap only launches that share no memory), and a CUDA graph of it too."""
    from capqr.runtime import cuda

    a = np.random.default_rng(n + batch).standard_normal((batch, n, n)).astype(np.float32)
    _check_both(a, tall_rows=tall_rows, whole=False, per_matrix=False, lookahead=True)
    kw = {"tall_rows": tall_rows, "whole": False, "per_matrix": False, "lookahead": True}
    H1, tau1 = g.qr(a, **kw)
    H2, tau2 = g.qr(a, **kw)
    assert np.array_equal(H1.view(np.uint32), H2.view(np.uint32))
    A = cuda.to_device(a, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    ws = g.Workspace.alloc(batch, n, lookahead=True)
    graphs: dict = {}
    try:
        for _ in range(2):  # recorded, then replayed
            A.copy_from(a)
            g.qr_launch(A, tau, ws, n, graphs=graphs, **kw)
            assert np.array_equal(A.numpy().view(np.uint32), H1.view(np.uint32))
            assert np.array_equal(tau.numpy().view(np.uint32), tau1.view(np.uint32))
    finally:
        for gr in graphs.values():
            gr.close()
        ws.free()
        A.free()
        tau.free()


@gpu
@needs_gpu
def test_lookahead_fault_names_its_launch() -> None:
    """A tau 5 floats short under the look-ahead plan: the first panel (on lane 1) whose
    columns reach past it stores there, and the sequence's sync raises a CapabilityFault
    that names buffer tau and that launch, as without the look-ahead."""
    from capqr.runtime import cuda
    from capqr.runtime.errors import CapabilityFault

    batch, n = 2, 161
    A = cuda.to_device(np.random.default_rng(4).standard_normal((batch, n, n))
                       .astype(np.float32), name="A")
    tau = cuda.alloc_device(batch * n - 5, np.float32, name="tau")
    ws = g.Workspace.alloc(batch, n, lookahead=True)
    try:
        with pytest.raises(CapabilityFault) as e:
            g.qr_launch(A, tau, ws, n, whole=False, per_matrix=False, lookahead=True)
        plan = g.launch_plan(batch, n, whole=False, per_matrix=False, lookahead=True)
        first = next(i for i, s in enumerate(plan) if s.kernel.startswith(("panel", "preg"))
                     and s.args[1] + s.args[2] > n - 5)
        assert (e.value.buffer, e.value.launch_index) == ("tau", first)
        assert plan[first].lane == 1
    finally:
        ws.free()
        A.free()
        tau.free()


@gpu
@needs_gpu
def test_kernels_qr_dispatches_device_inputs() -> None:
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(1).standard_normal((3, 64, 64)).astype(np.float32)
    H, tau = kernels.qr(torch.from_numpy(a).cuda())
    assert H.is_cuda and tau.is_cuda and tuple(tau.shape) == (3, 64)
    assert kernels.check(a, H.cpu().numpy(), tau.cpu().numpy()).ok
    A = cuda.to_device(a, name="a")
    Hc, tc = kernels.qr(A)
    np.testing.assert_array_equal(Hc.numpy(), H.cpu().numpy())
    np.testing.assert_array_equal(A.numpy(), a)  # the input is not modified


@gpu
@needs_gpu
def test_panel_launch_past_the_matrix_faults() -> None:
    """A panel launch told n larger than the buffer is refused with its kernel's name."""
    from capqr.runtime.errors import CapabilityFault

    a = np.random.default_rng(2).standard_normal((1, 32, 32)).astype(np.float32)
    A = cuda.to_device(a, name="A")
    tau = cuda.alloc_device(32, np.float32, name="tau")
    ws = g.Workspace.alloc(1, 32, prefix="")
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(g.blocked_kernels(True)["steps"], [A, tau, ws.work, ws.steps],
                    args=(40, 0, 32, 1, 1), grid=1, block=g.STEP_BLOCK, group=1)
    assert ei.value.kernel == "gpu_qr_steps" and ei.value.buffer == "A"
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(g.blocked_kernels(True)["panel"], [A, tau, ws.work], args=(40, 0, 32),
                    grid=1, block=g.PANEL_BLOCK)
    assert ei.value.kernel == "gpu_qr_panel" and ei.value.buffer == "A"
    with pytest.raises(CapabilityFault) as ei:  # more row blocks than the sums buffer holds
        cuda.launch(g.blocked_kernels(True)["steps"], [A, tau, ws.work, ws.steps],
                    args=(32, 0, 32, 1, 64), grid=64, block=g.STEP_BLOCK, group=64)
    assert ei.value.kernel == "gpu_qr_steps" and ei.value.buffer == "steps"


@gpu
@needs_gpu
def test_matches_lapack_convention() -> None:
    """Same compact form as scipy.linalg.qr(mode='raw') (up to rounding)."""
    scipy_linalg = pytest.importorskip("scipy.linalg")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 48, 48)).astype(np.float32)
    H, tau = g.qr(a, checked=True)
    for b in range(2):
        (h_ref, tau_ref), _ = scipy_linalg.qr(a[b].astype(np.float64), mode="raw")
        np.testing.assert_allclose(H[b], h_ref, atol=2e-4, rtol=2e-3)
        np.testing.assert_allclose(tau[b], tau_ref, atol=2e-5, rtol=1e-4)


def test_kernels_compile_on_first_use(monkeypatch) -> None:
    """blocked_kernels compiles a launch kind when a plan first needs it (with its own
    source and options), once; a plan without pairs of panels never builds theirs."""
    from capqr.runtime import cuda as lane

    built = []
    monkeypatch.setattr(lane, "compile", lambda src, name, checked, options: built.append(
        (name, checked, tuple(options), src)) or name)
    ks = g._Compiled(checked=False)
    for step in g.launch_plan(2, 300, None, two_panel=False, reg=False):
        assert ks[step.kernel] == "gpu_qr_" + step.kernel
    assert sorted(n for n, *_ in built) == ["gpu_qr_panel", "gpu_qr_panel_small",
                                            "gpu_qr_update_apply", "gpu_qr_update_z"]
    assert ("gpu_qr_panel", False, g.PANEL_OPTIONS, g.PANEL_SOURCE) in built
    assert ks["update2_z"] == "gpu_qr_update2_z" and len(built) == 5
    assert ks["update2_z"] == "gpu_qr_update2_z" and len(built) == 5  # cached
    # the plan with the register panels (reg=True): one gpu_qr_panel_reg per class it
    # reaches, each with its class's source and register cap; the updates are already built
    gr = g.gen_panel_reg
    plan = g.launch_plan(2, 300, None, two_panel=False, reg=True)
    for step in plan:
        assert ks[step.kernel] == g._kernel_spec(step.kernel)[1]
    reg = sorted({s.kernel for s in plan if s.kernel.startswith("preg")},
                 key=lambda k: int(k[4:]))
    assert reg == ["preg32", "preg64", "preg128", "preg256", "preg512"]
    assert built[5:] == [("gpu_qr_panel_reg", False, gr.options(*gr.by_capacity(int(k[4:]))),
                          gr.source(*gr.by_capacity(int(k[4:])))) for k in reg[::-1]]
    assert ks["preg32"] == "gpu_qr_panel_reg" and len(built) == 10  # cached


#: gpu_qr_whole's shapes: every class (32, 64, 128, 232 rows), its edges, the contest's two.
WHOLE_SHAPES = [(3, 1), (2, 2), (2, 31), (20, 32), (2, 33), (3, 100), (2, 128), (2, 129),
                (40, 176), (2, 232)]


@gpu
@needs_gpu
@pytest.mark.parametrize("batch,n", WHOLE_SHAPES)
def test_whole_path(batch: int, n: int) -> None:
    """One launch per problem: the checker passes, checked equals raw bit for bit, and the
    result is the blocked plan's compact form up to rounding."""
    assert g.launch_plan(batch, n, whole=True, smem=g.device_smem())[0].kernel.startswith("whole")
    a = np.random.default_rng(n + 1).standard_normal((batch, n, n)).astype(np.float32)
    _check_both(a, whole=True)
    H, tau = g.qr(a, whole=True)
    Hb, taub = g.qr(a, whole=False)
    scale = max(1, n // 32)
    np.testing.assert_allclose(H, Hb, atol=2e-4 * scale, rtol=2e-3)
    np.testing.assert_allclose(tau, taub, atol=2e-5 * scale, rtol=1e-4)


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", STRESS)
def test_whole_stress(kind: str) -> None:
    rng = np.random.default_rng(13)
    _check_both(np.stack([_stress(kind, 200, rng) for _ in range(2)]), whole=True)


@gpu
@needs_gpu
def test_whole_launch_past_the_matrix_faults() -> None:
    """gpu_qr_whole told n larger than the buffers faults on A; an n past its class's
    capacity faults on the shared matrix; a dynamic buffer past the device's opt-in limit
    is refused before anything runs."""
    from capqr.runtime.cuda import driver as drv
    from capqr.runtime.cuda.kernel import opt_in_dynamic_smem
    from capqr.runtime.errors import CapabilityFault

    a = np.random.default_rng(2).standard_normal((1, 33, 33)).astype(np.float32)
    A = cuda.to_device(a, name="A")
    tau = cuda.alloc_device(33, np.float32, name="tau")
    ks = g.blocked_kernels(True)
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(ks["whole64"], [A, tau], args=(40, 1), grid=1, block=256)
    assert (ei.value.kernel, ei.value.buffer, ei.value.reason) == (
        "gpu_qr_whole", "A", "out-of-bounds")
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(ks["whole32"], [A, tau], args=(33, 1), grid=1, block=256)
    assert (ei.value.buffer, ei.value.reason) == ("smem_a", "local-array")
    np.testing.assert_array_equal(A.numpy(), a)  # refused tile loads: nothing stored
    k = ks["whole232"]
    assert k.dynamic_smem == g.gen_whole.shared_bytes(232, 1024)
    with pytest.raises(ValueError, match="allows at most"):
        opt_in_dynamic_smem(k.name, k.function, 1 << 20, drv.device())
