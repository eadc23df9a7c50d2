"""Smoke test of the benchmark harness: ``python -m capqr.bench --quick`` runs and writes
its outputs.

Benchmarks are never assertions: this only checks that the harness runs, writes
JSON/markdown/PNGs with the expected keys and finite numbers, so it cannot rot.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """``python -m capqr.bench --quick`` with no --out, from a scratch directory: its results go
    to ./bench-results there, and the checkout's tracked files stay as they were."""
    cwd = tmp_path_factory.mktemp("bench")
    env = {k: v for k, v in os.environ.items() if k != "CAPQR_BENCH_OUT"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    before = _git_status()
    # ~20 s with the kernel cache warm; ~110 s on 2 cores when every kernel of every
    # mode compiles first (an empty $CAPQR_CACHE, as on a fresh machine)
    proc = subprocess.run([sys.executable, "-m", "capqr.bench", "--quick"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert _git_status() == before
    out = cwd / "bench-results"
    files = list(out.glob("*-quick.json"))
    assert len(files) == 1, list(cwd.rglob("*"))
    return json.loads(files[0].read_text()), out


def test_quick_writes_outputs(quick_run: tuple[dict, Path]) -> None:
    res, out = quick_run
    assert res["quick"] is True
    for key in ("meta", "overhead", "peers", "targets", "elapsed_s"):
        assert key in res, key
    assert (out / "latest.md").read_text().count("| target |") == 1
    assert (out / "overhead.png").stat().st_size > 0
    assert (out / "qr_speed.png").stat().st_size > 0


def test_quick_metadata(quick_run: tuple[dict, Path]) -> None:
    meta = quick_run[0]["meta"]
    for key in ("host", "date", "cpu_model", "threads", "blas", "compiler", "git",
                "source_digest", "concurrent_load"):
        assert key in meta, key
    assert meta["threads"]["capqr_workers"] >= 1
    assert "-O3" in meta["compiler"]["kernel_cflags"]


def test_quick_overhead_numbers(quick_run: tuple[dict, Path]) -> None:
    ov = quick_run[0]["overhead"]
    rows = ov["rows"]
    assert {r["family"] for r in rows} >= {"micro", "qr"}
    assert {r["kernel"] for r in rows if r["family"] == "micro"} == {"axpy", "gemm", "stencil"}
    for r in rows:
        for mode in ("checked", "raw", "raw_poll"):
            assert _finite(r[mode]["median_s"]) and r[mode]["median_s"] > 0
        assert _finite(r["ratio"]) and _finite(r["poll_ratio"])
    s = ov["summary"]["all"]
    assert _finite(s["geomean"]) and _finite(s["worst"]) and s["n"] == len(rows)
    col = ov["collector"]
    assert _finite(col["ratio"]) and col["running"]["repeats"] >= 1


def test_quick_peer_numbers(quick_run: tuple[dict, Path]) -> None:
    pe = quick_run[0]["peers"]
    assert _finite(pe["sgemm"]["gflops"]) and pe["sgemm"]["gflops"] > 0
    impls = {r["impl"] for r in pe["rows"]}
    assert {"scipy", "torch", "numpy"} <= impls
    assert any(i.startswith("capqr:") for i in impls)
    for r in pe["rows"]:
        assert "error" not in r, r
        if "skipped" in r:
            # only a peer whose package is really absent may be skipped (torch outside the
            # test extra); test_quick_torch_peer measures it where it is installed
            assert importlib.util.find_spec(r["impl"]) is None, r
            continue
        assert _finite(r["gflops"]) and r["gflops"] > 0 and _finite(r["frac_sgemm"])
    shapes = {r["shape"] for r in pe["rows"]}
    assert {"n=64", "n=128", "(20,32)"} <= shapes


def test_quick_torch_peer(quick_run: tuple[dict, Path]) -> None:
    pytest.importorskip("torch", reason="torch is not installed (it is in the test extra)")
    rows = [r for r in quick_run[0]["peers"]["rows"] if r["impl"] == "torch"]
    assert rows
    for r in rows:
        assert "skipped" not in r and "error" not in r, r
        assert _finite(r["gflops"]) and r["gflops"] > 0


def test_quick_targets_reported(quick_run: tuple[dict, Path]) -> None:
    ts = quick_run[0]["targets"]
    assert len(ts) >= 6
    for t in ts:
        assert t["status"].startswith(("met", "not met", "no data", "unclear"))
        assert t["goal"] and t["value"]


def test_qr_runner_matches_kernels_qr() -> None:
    """The overhead runner launches the kernel itself: it must compute what kernels.qr does."""
    from capqr import kernels
    from capqr.bench.qr import QrRunner, available

    a3 = np.random.default_rng(3).standard_normal((3, 40, 40), dtype=np.float32)
    assert set(available()) == set(kernels.variants()) >= {"unblocked", "blocked", "f16"}
    for name, v in available().items():
        for mode in ("checked", "raw"):
            r = QrRunner(v, a3, mode)
            r.reset()
            r.run()
            h, tau = r.result()
            h_ref, tau_ref = kernels.qr(a3, variant=name, checked=mode == "checked")
            np.testing.assert_array_equal(h, h_ref)
            np.testing.assert_array_equal(tau, tau_ref)


def test_small_runner_matches_kernels_qr() -> None:
    """The overhead case of the small path launches qr_small itself: it must compute
    what kernels.qr does on a small batch."""
    from capqr import kernels
    from capqr.bench.qr import SmallRunner

    a3 = np.random.default_rng(4).standard_normal((5, 32, 32), dtype=np.float32)
    for mode in ("checked", "raw"):
        r = SmallRunner(a3, mode)
        r.reset()
        r.run()
        h, tau = r.result()
        h_ref, tau_ref = kernels.qr(a3, checked=mode == "checked")
        np.testing.assert_array_equal(h, h_ref)
        np.testing.assert_array_equal(tau, tau_ref)


def test_path_runner_matches_kernels_qr() -> None:
    """The overhead cases of whole launch paths run kernels.parallel.run in every build
    mode: each must compute what kernels.qr does (the raw builds too: same arithmetic)."""
    from capqr import kernels
    from capqr.bench.case import MODES
    from capqr.bench.qr import PATH_SHAPES, PathRunner, path_name
    from capqr.kernels.parallel import PATHS

    (label, m, n), = PATH_SHAPES["quick"]
    assert path_name(m, n) in set(PATHS) - {"small"}
    a = np.random.default_rng(5).standard_normal((m, n), dtype=np.float32)
    h_ref, tau_ref = kernels.qr(a)
    for mode in MODES:
        r = PathRunner(a, mode)
        r.reset()
        r.run()
        h, tau = r.result()
        np.testing.assert_array_equal(h, h_ref, err_msg=f"{label} {mode}")
        np.testing.assert_array_equal(tau, tau_ref, err_msg=f"{label} {mode}")


def test_interleaved_rotates_order() -> None:
    from capqr.bench.timing import interleaved

    order: list[str] = []

    class R:
        def __init__(self, name: str) -> None:
            self.name = name

        def reset(self) -> None:
            pass

        def run(self) -> None:
            order.append(self.name)

    s = interleaved({"a": R("a"), "b": R("b"), "c": R("c")}, repeats=3, warmup=0)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(len(v.times) == 3 for v in s.values())


def test_report_regenerates_from_json(quick_run: tuple[dict, Path], tmp_path: Path) -> None:
    """latest.md and the plots can be rebuilt from a saved JSON (python -m capqr.bench.report)."""
    from capqr.bench import report

    _, out = quick_run
    src = next(out.glob("*-quick.json"))
    report.main([str(src), str(tmp_path)])
    assert "### Targets" in (tmp_path / "latest.md").read_text()
    assert (tmp_path / "overhead.png").exists() and (tmp_path / "qr_speed.png").exists()


def test_gpu_section_skips_with_reason_without_gpu(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture,
                                                   tmp_path: Path) -> None:
    from capqr.bench import __main__ as bench_main
    from capqr.runtime import cuda

    monkeypatch.setattr(cuda, "available", lambda: (False, "no device in this test"))
    assert bench_main._gpu_bench(True, tmp_path) == []
    assert "skipped, no usable GPU (no device in this test)" in capsys.readouterr().out


def test_gpu_section_runs_gpu_bench_when_a_gpu_is_usable(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """With a GPU, ``python -m capqr.bench`` runs bench/gpu_bench.py and reports its fresh
    result."""
    from capqr.bench import __main__ as bench_main
    from capqr.bench import gpu_bench, report
    from capqr.runtime import cuda

    calls: list[list[str]] = []

    def fake_main(argv: list[str]) -> Path:
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        row = {"batch": 20, "n": 32, "checked_ms": 2.0, "raw_ms": 1.0, "overhead": 2.0}
        out.write_text(json.dumps({"device": "FakeGPU", "date": "d", "shapes": [row],
                                   "geomean_overhead": 2.0}))
        return out

    monkeypatch.setattr(cuda, "available", lambda: (True, ""))
    monkeypatch.setattr(gpu_bench, "main", fake_main)
    got = bench_main._gpu_bench(True, tmp_path)
    assert calls and calls[0][:len(bench_main.GPU_QUICK_ARGS)] == bench_main.GPU_QUICK_ARGS
    assert got[0]["device"] == "FakeGPU" and got[0]["_rerun"] is True
    text = "\n".join(report._gpu_md(got))
    assert "FakeGPU" in text and "measured in this run" in text and "2.000x" in text


def test_source_digest_names_the_commit(tmp_path: Path) -> None:
    """A results file's source digest matches the commit whose sources it ran on, and
    only that: the working tree's digest equals the commit's while nothing under the
    digested folders changed, and differs after one byte of a kernel changes."""
    from capqr.bench.machine import source_digest, source_digest_at

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "kernels" / "gpu").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "kernels" / "gpu" / "k.c").write_text("KERNEL void k(cap_t a) { }\n")
    (tmp_path / "runtime" / "x.py").write_text("X = 1\n")
    (tmp_path / "README.md").write_text("not a source\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    first = source_digest(tmp_path)
    assert first == source_digest_at("HEAD", tmp_path)
    (tmp_path / "README.md").write_text("prose does not count\n")
    assert source_digest(tmp_path) == first
    (tmp_path / "kernels" / "gpu" / "k.c").write_text("KERNEL void k(cap_t b) { }\n")
    assert source_digest(tmp_path) != first


def test_clock_ceiling_measures_a_ratio() -> None:
    """bench.qr_parallel.clock_ceiling: one block alone vs one per worker (subprocesses
    with CAPQR_THREADS 1 and 2), a time ratio, not an error."""
    from capqr.bench.qr_parallel import clock_ceiling

    r = clock_ceiling(2, quick=True)
    assert "error" not in r, r
    assert r["one_block_s"] > 0 and r["all_blocks_s"] > 0 and 0.2 < r["ceiling"] < 2.0


def test_tile_ceiling_measures_a_ratio() -> None:
    """bench.qr_parallel.tile_ceiling: one 64-column tile update alone vs one per worker
    (the trailing update's own ceiling), a time ratio and a rate, not an error."""
    from capqr.bench.qr_parallel import tile_ceiling

    for offset in (0, 16):
        r = tile_ceiling(2, quick=True, offset=offset)
        assert "error" not in r, r
        assert r["rows"] == 384 and r["offset_bytes"] == offset
        assert r["one_block_gflops"] > 0.1 and 0.2 < r["ceiling"] < 2.0


#: Every command line of the benchmarks and tools: ``python -m <module> [subcommand] --help``.
HELP_COMMANDS = [
    [f"capqr.{m}"] for m in ("bench", "bench.report", "bench.gc_bench", "bench.peers",
                             "bench.gpu_bench", "bench.qr_parallel", "bench.overhead",
                             "bench.gpu_mma", "bench.gpu_compare", "bench.gpu_precompile",
                             "bench.gpu_steps",
                             "bench.cpu_peers",
                             "bench.machine", "demo", "kernels.search")
] + [["capqr"], ["capqr", "warmup"], ["capqr.kernels.search", "report"],
     ["capqr.kernels.search", "submit"]]
_SECTIONS = ("options:", "optional arguments:", "positional arguments:")


def undocumented(help_text: str) -> list[str]:
    """The arguments an argparse ``--help`` text lists without a help string."""
    lines = help_text.splitlines()
    bad, section = [], ""
    for i, line in enumerate(lines):
        if line and not line[0].isspace():
            section = line.strip()
            continue
        if section not in _SECTIONS or not re.match(r"^  \S", line):
            continue
        if re.match(r"^  \S.*?\s{2,}\S", line):
            continue  # help text on the same line
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if re.match(r"^ {4,}\S", nxt) and not re.match(r"^  \S", nxt):
            continue  # help text on the next line (a long option spelling)
        bad.append(line.split()[0].rstrip(","))
    return bad


def test_undocumented_finds_options_without_help() -> None:
    text = ("usage: x [-h] [--a A] [--bee-long-name BEE]\n\noptions:\n"
            "  -h, --help            show this help message and exit\n"
            "  --a A\n"
            "  --bee-long-name BEE_LONG_NAME\n"
            "                        documented on the next line\n"
            "  --c                   documented\n")
    assert undocumented(text) == ["--a"]


@pytest.mark.parametrize("cmd", HELP_COMMANDS, ids=" ".join)
def test_help_documents_every_option(cmd: list[str]) -> None:
    """``--help`` exits 0 at once (nothing runs) and every option has a help text."""
    proc = subprocess.run([sys.executable, "-m", *cmd, "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:500]
    assert undocumented(proc.stdout) == [], proc.stdout


def test_quick_run_changes_no_tracked_file(quick_run: tuple[dict, Path]) -> None:
    """The fixture compared ``git status --porcelain`` before and after the run; the
    results are where the default says."""
    res, out = quick_run
    assert out.name == "bench-results" and (out / "latest.md").exists()
    assert res["meta"]["machine"]["cpu_count"] == os.cpu_count()


def test_update_docs_writes_only_between_markers(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from capqr.bench import report

    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text(f"# B\n\nprose\n{report.BEGIN}\nold table\n{report.END}\ntail\n")
    monkeypatch.setattr(report, "DOCS_PAGE", page)
    monkeypatch.setattr(report, "DOCS_PLOTS", tmp_path / "plots")
    (tmp_path / "plots").mkdir()
    res = {"quick": False, "meta": {"host": "h", "date": "d"}, "elapsed_s": 1.0}
    paths = report.write(res, tmp_path / "out", update_docs=True)
    text = page.read_text()
    assert paths["docs"] == page and "old table" not in text
    assert text.startswith("# B\n\nprose\n") and text.endswith(f"{report.END}\ntail\n")
    assert "### Targets" in text
    report.write(res, tmp_path / "out2")
    assert page.read_text() == text  # without update_docs the page is left alone


def test_docs_page_has_the_markers() -> None:
    from capqr.bench import report

    text = report.DOCS_PAGE.read_text()
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    assert report.BEGIN not in (REPO / "README.md").read_text()


def test_progress_bar_shows_no_time_estimate() -> None:
    from capqr.bench.__main__ import BAR_FORMAT

    assert "remaining" not in BAR_FORMAT and "rate" not in BAR_FORMAT


def test_machine_label() -> None:
    from capqr.bench.machine import host, label

    assert label(16, "Intel(R) Xeon(R) Platinum 8480+", "NVIDIA H100 80GB HBM3") == "h100-16cpu"
    assert label(2, "AMD EPYC", None) == "epyc-2cpu"
    assert label(64, "AMD EPYC 9654 96-Core Processor", None) == "9654-64cpu"
    h = host()
    assert h["cpu_count"] == os.cpu_count() and h["label"].endswith(f"-{os.cpu_count()}cpu")


# -- GPU peers: the pure parts (the measurements need a GPU) --------------------------------

def _gpu_row(batch: int, n: int, checked: float, **peers: float | str) -> dict:
    ps = {k.replace("_", "."): ({"ms": v} if isinstance(v, float) else {"skipped": v})
          for k, v in peers.items()}
    ps = {("cublasSgeqrfBatched" if k.startswith("cublas") else k): v for k, v in ps.items()}
    row = {"batch": batch, "n": n, "checked_ms": checked, "peers": ps}
    from capqr.bench.gpu_peers import speedups

    row.update(speedups(row))
    return row


def test_gpu_speedups_and_geomeans() -> None:
    from capqr.bench.gpu_peers import geomeans, table

    rows = [_gpu_row(20, 32, 0.1, torch_geqrf=1.0, cublas=0.2),
            _gpu_row(640, 512, 10.0, torch_geqrf=1000.0, cublas=500.0),
            _gpu_row(8, 2048, 20.0, torch_geqrf=80.0, cublas="skipped: too slow")]
    assert rows[0]["best_peer"] == "cublasSgeqrfBatched"
    assert rows[0]["speedup_vs_best_peer"] == pytest.approx(2.0)
    assert rows[0]["speedup_vs_torch"] == pytest.approx(10.0)
    assert rows[2]["best_peer"] == "torch.geqrf" and rows[2]["speedup_vs_best_peer"] == 4.0
    g = geomeans(rows)
    assert g["geomean_speedup_vs_torch"] == pytest.approx((10 * 100 * 4) ** (1 / 3))
    assert g["geomean_speedup_vs_best_peer"] == pytest.approx((2 * 50 * 4) ** (1 / 3))
    assert g["shapes_speedup_vs_best_peer"] == 3
    text = table(rows)
    assert "(8,2048) cublasSgeqrfBatched: skipped: too slow" in text
    assert "vs the best peer 7.37x over 3 shapes" in text


def test_gpu_speedups_without_peers() -> None:
    from capqr.bench.gpu_peers import geomeans, speedups

    row = {"batch": 2, "n": 4096, "checked_ms": 5.0, "peers": {"torch.geqrf": {"error": "x"}}}
    assert speedups(row) == {}
    assert geomeans([row])["geomean_speedup_vs_torch"] is None


def test_gpu_slow_peer_budget() -> None:
    from capqr.bench.gpu_peers import known_too_slow, timed_runs

    assert known_too_slow("cublasSgeqrfBatched", 8, 2048, 5.0).startswith("skipped:")
    assert "did not finish" in known_too_slow("cublasSgeqrfBatched", 2, 4096, 5.0)
    assert known_too_slow("cublasSgeqrfBatched", 20, 32, 5.0) is None
    assert known_too_slow("torch.geqrf", 8, 2048, 5.0) is None
    calls = iter([9000.0, 1.0])
    r = timed_runs(lambda: next(calls), repeat=5, budget_s=5.0)  # first run over budget
    assert r == {"ms": 9000.0, "samples_ms": [9000.0], "single_run": True}
    times = iter([2000.0, 3.0, 1.0, 2.0])  # 2 s warm-up: one more run fits 5 s
    r = timed_runs(lambda: next(times), repeat=5, budget_s=5.0)
    assert r["samples_ms"] == [3.0] and not r["single_run"]
    r = timed_runs(lambda: 1.0, repeat=5, budget_s=5.0)
    assert len(r["samples_ms"]) == 5


def test_gpu_bench_skips_without_gpu(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture) -> None:
    from capqr.bench import gpu_bench
    from capqr.runtime import cuda

    monkeypatch.setattr(cuda, "available", lambda: (False, "no device in this test"))
    assert gpu_bench.main(["--shapes", "20x32"]) is None
    assert "skipped: no usable GPU (no device in this test)" in capsys.readouterr().out


def test_gpu_bench_check_matrices_option() -> None:
    """--check-matrices N verifies the first N matrices of a batch (at least one, at most
    the batch); without it every matrix is checked."""
    from capqr.bench import gpu_bench

    assert gpu_bench.parse_args([]).check_matrices is None
    assert gpu_bench.parse_args(["--check-matrices", "8"]).check_matrices == 8
    assert [gpu_bench.checked_count(640, c) for c in (None, 8, 0, 10**6)] == [640, 8, 1, 640]
    assert gpu_bench.checked_count(2, 8) == 2


# -- CPU peers --------------------------------------------------------------------------------

def test_cpu_peers_speedups_and_table() -> None:
    from capqr.bench import cpu_peers

    def row(label: str, c: float, s: float | None, t: float) -> dict:
        r = {"shape": label, "loadavg_start": [1.0], "loadavg_end": [1.5],
             "capqr": {"median_s": c, "gflops": 1.0, "repeats": 3, "check": {"passed": True}},
             "scipy": {"median_s": s} if s else {"unsupported": "ValueError: no"},
             "torch": {"median_s": t}}
        r.update(cpu_peers.speedups(r))
        return r

    rows = [row("n=256", 1.0, 2.0, 4.0), row("65536x64", 2.0, None, 1.0)]
    assert rows[0]["best_peer"] == "scipy" and rows[0]["speedup_vs_best_peer"] == 2.0
    assert rows[1]["best_peer"] == "torch" and rows[1]["speedup_vs_best_peer"] == 0.5
    s = cpu_peers.summary(rows)
    assert s["geomean_vs_scipy"] == 2.0 and s["geomean_vs_torch"] == pytest.approx(2 ** 0.5)
    assert s["geomean_vs_best_peer"] == 1.0
    res = {"rows": rows + [{"shape": "(2,4096)", "skipped": "time budget"}], "summary": s,
           "threads": 2, "elapsed_s": 3.0, "budget_s": 50.0,
           "meta": {"machine": {"label": "x-2cpu"}, "cpu_model": "X", "loadavg_start": [1],
                    "loadavg_end": [2], "threads": {"cpu_count": 2, "capqr_workers": 2,
                                                    "torch": 2}}}
    text = cpu_peers.table(res)
    assert "(2,4096)  skipped: time budget" in text
    assert "scipy at 65536x64: unsupported" in text and "vs best peer 1.00x" in text


def test_cpu_peers_budget_and_shapes() -> None:
    from capqr.bench import cpu_peers

    assert [s[0] for s in cpu_peers.select(None, True)] == [
        s[0] for s in cpu_peers.ALL_SHAPES if s[0] in cpu_peers.QUICK_LABELS]
    assert len(cpu_peers.select(None, False)) == 14
    with pytest.raises(SystemExit):
        cpu_peers.select(["n=3"], False)
    b = cpu_peers.Budget(100.0, quick=False)
    b.learn({"flops": 1e9, "capqr": {"median_s": 0.1}, "scipy": {"median_s": 0.2},
             "torch": {"skipped": "x"}})
    assert b.s_per_flop == pytest.approx(0.3e-9)
    assert b.fits(1e11) and not b.fits(1e12)  # 2 rounds of 30 s fit, of 300 s do not
    assert b.repeats(1.0, 10) == cpu_peers.MAX_REPEATS and b.repeats(60.0, 1) == 1


def test_cpu_peers_measures_all_three() -> None:
    """One small shape through the real implementations, the tall one included."""
    from capqr.bench import cpu_peers

    row = cpu_peers.measure(("8192x256", 1, 1024, 64), lambda _: 1, 0.0)
    for k in cpu_peers.IMPLS:
        if k == "torch" and importlib.util.find_spec("torch") is None:
            continue
        assert row[k]["median_s"] > 0, row
    assert row["capqr"]["check"]["passed"]
    assert row["best_peer"] in ("scipy", "torch") and row["speedup_vs_best_peer"] > 0


def test_prebuild_builds_each_key_and_mode_once() -> None:
    """overhead.prebuild compiles once per (build_key, mode), on several threads; cases
    without a build are left to their make; a build's error reaches the caller."""
    import threading

    from capqr.bench.case import MODES, Case
    from capqr.bench.overhead import prebuild

    calls: list[tuple[str, str]] = []
    lock = threading.Lock()

    def build(key: str, mode: str) -> None:
        with lock:
            calls.append((key, mode))

    def case(key: str, size: str, with_build: bool = True) -> Case:
        return Case("qr", "k", size, lambda mode: None,
                    build=(lambda mode, key=key: build(key, mode)) if with_build else None,
                    build_key=key)

    cases = [case("a", "n=1"), case("a", "n=2"), case("b", "n=1"), case("c", "n=1", False)]
    assert prebuild(cases, jobs=2) == 2 * len(MODES)
    assert sorted(calls) == sorted((k, m) for k in "ab" for m in MODES)

    def failing(mode: str) -> None:
        raise RuntimeError(f"no compiler for {mode}")

    with pytest.raises(RuntimeError, match="no compiler"):
        prebuild([Case("qr", "k", "n=1", lambda mode: None, build=failing)])
