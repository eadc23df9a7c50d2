"""kernels.search: the loop completes and records faults safely, a killed worker
loses no record, the best variant passes the checker, and ``submit`` accepts a
correct kernel and rejects hostile and buggy ones.

Small shapes (64x48, batch 2) and -O1 kernel builds (CAPQR_CFLAGS) keep this
to well under a minute of compile time on two cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SHAPE = (64, 48)
BATCH = 2


@pytest.fixture(autouse=True)
def _fast_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Candidates are compiled in child processes: they inherit this.
    monkeypatch.setenv("CAPQR_CFLAGS", "-O1")


def _cfg(db: Path, **kw):
    from capqr.kernels.search import SearchConfig

    base = dict(m=SHAPE[0], n=SHAPE[1], batch=BATCH, budget=20, seed=3, db=str(db), workers=2,
                threads=1, finalists=3, reps=2, timeout=10.0,
                # Mostly risky edits: the test needs faulting mutants among ~20.
                bug_rate=0.8, struct_rate=0.1)
    base.update(kw)
    return SearchConfig(**base)


def test_search_small_run(tmp_path: Path) -> None:
    from capqr import kernels, runtime
    from capqr.kernels import mutate as mut
    from capqr.kernels.search import search
    from capqr.kernels.search.evaluate import STATUSES, _buffers, default_task
    from capqr.kernels.search.report import leaderboard, plot
    from capqr.kernels.search.store import Store

    db = tmp_path / "s.db"
    res = search(_cfg(db), quiet=True)
    with Store(db) as st:
        rows = st.results(res.run_id)
        # every candidate recorded once, with a known status and a reason if it failed
        assert sorted(r.iteration for r in rows) == list(range(20))
        assert all(r.status in STATUSES for r in rows)
        assert all(r.reason for r in rows if r.status != "ok")
        faults = [r for r in rows if r.status == "fault"]
        assert faults, "no fault-raising mutant among 20 candidates"
        assert all("CapabilityFault" in r.reason for r in faults)
        assert all(r.detail["reason"] in ("out-of-bounds", "read-only", "freed", "no-bounds",
                                          "local-array", "alloc", "type") for r in faults)
        assert st.runs()[-1]["finished"] is not None
        assert any(r.ood_status for r in rows), "finalists were not re-checked"
        text = leaderboard(st, res.run_id)
        assert "held-out re-check" in text
        png = plot(st, tmp_path / "p.png", res.run_id)
        assert png.stat().st_size > 1000

    # the best variant, rebuilt from its genome, passes the checker on new data
    assert res.best is not None
    src, entry = mut.render(res.best["genome"])
    kern = runtime.compile(src, entry)
    a = np.random.default_rng(99).standard_normal((BATCH, *SHAPE)).astype(np.float32)
    task = default_task(src, entry, m=SHAPE[0], n=SHAPE[1], batch=BATCH,
                        nb=res.best["genome"]["params"]["nb"])
    h, tau, caps, args = _buffers(kern, task, a)
    runtime.launch(kern, caps, args=args, grid=BATCH, timeout=10)
    assert kernels.check(a, h, tau).ok


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _count(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    try:
        c = sqlite3.connect(str(db), timeout=5)
        try:
            return int(c.execute("SELECT COUNT(*) FROM results").fetchone()[0])
        finally:
            c.close()
    except sqlite3.OperationalError:
        return 0


def _wait_count(proc: subprocess.Popen, db: Path, n: int, limit: float = 90) -> None:
    t0 = time.monotonic()
    while _count(db) < n:
        assert proc.poll() is None, f"search exited early: {proc.returncode}"
        assert time.monotonic() - t0 < limit, "search made no progress"
        time.sleep(0.2)


def _kill_one(proc: subprocess.Popen, which: str) -> int:
    """SIGKILL an evaluation child ('eval') or the dask worker running one ('worker')."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        for p in _descendants(proc.pid):
            try:
                if "kernels.search.evaluate" in " ".join(p.cmdline()):
                    victim = p if which == "eval" else p.parent()
                    os.kill(victim.pid, signal.SIGKILL)
                    return victim.pid
            except Exception:
                continue
        time.sleep(0.05)
    raise AssertionError("no evaluation in flight to kill")


def test_killed_workers_lose_no_record(tmp_path: Path) -> None:
    from capqr.kernels.search.store import Store

    db = tmp_path / "k.db"
    budget = 14
    cmd = [sys.executable, "-m", "capqr.kernels.search", "--shape", "64x48", "--batch", "2",
           "--budget", str(budget), "--db", str(db), "--seed", "5", "--finalists", "2",
           "--reps", "2", "--threads", "1", "--timeout", "10"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_count(proc, db, 3)
        with Store(db) as st:
            before = {r.id: (r.iteration, r.status, r.time_s) for r in st.results()}
        _kill_one(proc, "eval")          # an evaluation child: retried, or recorded as crash
        _wait_count(proc, db, len(before) + 2)
        _kill_one(proc, "worker")        # a whole dask worker process: its task is rescheduled
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    with Store(db) as st:
        rows = st.results()
        after = {r.id: (r.iteration, r.status, r.time_s) for r in rows}
        assert st.runs()[-1]["finished"] is not None
    assert all(after[k] == v for k, v in before.items()), "a stored record changed or vanished"
    # every candidate of the budget has exactly one record
    assert sorted(r.iteration for r in rows) == list(range(budget)), out[-3000:]


def _seed_source() -> str:
    from capqr.kernels import mutate as mut

    return mut.render(mut.seed_genomes()[0])[0]


def _submit_cli(path: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "capqr.kernels.search", "submit", str(path), "--shape", "64x48",
           "--batch", "2", "--no-baseline", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_submit_accepts_correct_kernel(tmp_path: Path) -> None:
    f = tmp_path / "good.c"
    f.write_text(_seed_source())
    r = _submit_cli(f, "--name", "geqrf_f32")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "VERDICT: PASS" in r.stdout
    assert "time: median" in r.stdout


HOSTILE = """
KERNEL void qr_fast(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n)
{
    long addr = cap_to_int(a);
    float *p = (float *)addr;
    for (int64_t i = 0; i < batch * m * n + 4096; i++)
        p[i] = 0.0f;
}
"""


def test_submit_rejects_hostile_kernel(tmp_path: Path) -> None:
    from capqr.kernels.search import submit

    v = submit(HOSTILE, m=SHAPE[0], n=SHAPE[1], batch=BATCH, baseline=False)
    assert not v.passed
    assert v.gate["status"] == "verify_error"
    assert "VerifyError" in v.gate["reason"]
    assert "VERDICT: FAIL" in str(v)


def test_submit_rejects_buggy_kernel(tmp_path: Path) -> None:
    # geqr2 with the row loops of the reflector update running one past the end
    from capqr.kernels import mutate as mut

    src = mut.render({"family": "geqr2", "params": {}, "edits": []})[0]
    bad = src.replace("for (int64_t i = rest; i < m; i++)", "for (int64_t i = rest; i <= m; i++)")
    assert bad != src
    f = tmp_path / "bad.c"
    f.write_text(bad)
    r = _submit_cli(f)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "VERDICT: FAIL" in r.stdout
    assert "fault" in r.stdout and "CapabilityFault" in r.stdout


@pytest.mark.parametrize("origin", ["T, nb * nb", "P, m * nb"])
def test_gate_rejects_blocks_sharing_workspace(origin: str) -> None:
    # geqrf with its scratch row (or T and the row) one element further on: block b's
    # last scratch element is block b + 1's first panel element.  With one worker the
    # blocks run one after the other and the result is right; with two they race
    # (the search once picked such a mutant as its best).  The gate must say so
    # on one worker, as the search runs it (with two the race may show first).
    from capqr.kernels import mutate as mut
    from capqr.kernels.search.evaluate import default_task, evaluate_isolated

    src, entry = mut.render({"family": "geqrf", "params": {"nb": 32}, "edits": []})
    bad = src.replace(f"cap_offset_f32({origin});", f"cap_offset_f32({origin} + 1);")
    assert bad != src
    shape = dict(m=SHAPE[0], n=SHAPE[1], batch=BATCH, reps=0, threads=1)
    good = evaluate_isolated(default_task(src, entry, **shape))
    assert good["status"] == "ok", good["reason"]
    res = evaluate_isolated(default_task(bad, entry, **shape))
    assert res["status"] == "check_failed", res
    assert "blocks share workspace" in res["reason"]


def test_gate_rejects_depending_on_a_neighbour_matrix() -> None:
    # geqr2 nudging each tau by 1e-7 times an element of the next matrix: the checker
    # passes, but a matrix's result depends on another one's data.
    from capqr.kernels import mutate as mut
    from capqr.kernels.search.evaluate import default_task, run_gate

    src, entry = mut.render({"family": "geqr2", "params": {}, "edits": []})
    line = "cap_store_f32(TAU, j, t);"
    assert line in src
    bad = src.replace(line, "cap_store_f32(TAU, j, t + 1e-7f * cap_load_f32(a, ((b + 1) % batch)"
                            " * m * n + j));")
    res = run_gate(default_task(bad, entry, m=SHAPE[0], n=SHAPE[1], batch=BATCH, reps=0))
    assert res["status"] == "check_failed", res
    assert "alone gives another result" in res["reason"], res["reason"]


def test_submit_rejects_wrong_signature() -> None:
    from capqr.kernels.search import submit

    src = "KERNEL void k(cap_t a, int64_t n)\n{\n    cap_store_f32(a, 0, 1.0f);\n}\n"
    v = submit(src, m=SHAPE[0], n=SHAPE[1], batch=BATCH, baseline=False, isolated=False)
    assert v.gate["status"] == "verify_error" and "signature" in v.gate["reason"]


def test_store_commits_each_result(tmp_path: Path) -> None:
    from capqr.kernels.search.store import Store

    db = tmp_path / "c.db"
    st = Store(db)
    run = st.new_run({"x": 1})
    cand = {"group": "g", "key": "k", "genome": {"family": "geqrf", "params": {}, "edits": []},
            "source": "s", "entry": "e"}
    st.put_result(run, 0, cand, {"status": "fault", "reason": "CapabilityFault: x",
                                 "detail": {"reason": "out-of-bounds"}})
    # visible to another connection at once (no commit pending), while the first stays open
    with Store(db) as other:
        rows = other.results(run)
        assert [r.status for r in rows] == ["fault"]
        assert rows[0].detail == {"reason": "out-of-bounds"}
    assert json.loads(json.dumps(rows[0].params))["family"] == "geqrf"
    st.close()


def test_mutations_render_and_group() -> None:
    import random

    from capqr.kernels import mutate as mut

    rng = random.Random(0)
    g = mut.seed_genomes()[0]
    groups = set()
    for _ in range(60):
        g = mut.mutate(g, rng, bug_rate=0.3, struct_rate=0.3)
        try:
            src, entry = mut.render(g)
        except mut.RenderError:
            continue
        assert f"KERNEL void {entry}" in src
        groups.add(mut.structure(g))
    assert len(groups) >= 3
    # tile parameters do not change the group; algorithmic edits do
    a = mut.normalize({"family": "geqrf", "params": {"nb": 8}, "edits": []})
    b = mut.normalize({"family": "geqrf", "params": {"nb": 64, "cw": 16}, "edits": []})
    c = mut.normalize({"family": "geqrf", "params": {}, "edits": [{"op": "nrm2_onepass"}]})
    assert mut.structure(a) == mut.structure(b) != mut.structure(c)
