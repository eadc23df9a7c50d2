"""Smoke test of the benchmark harness: ``python -m bench --quick`` runs and writes its outputs.

Benchmarks are never assertions: this only checks that the harness runs, writes
JSON/markdown/PNGs with the expected keys and finite numbers, so it cannot rot.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    # ~20 s with the kernel cache warm; ~110 s on 2 cores when every kernel of every
    # mode compiles first (an empty $CAPQR_CACHE, as on a fresh machine)
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    files = list(out.glob("*-quick.json"))
    assert len(files) == 1, list(out.iterdir())
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
    import kernels
    from bench.qr import QrRunner, available

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


def test_interleaved_rotates_order() -> None:
    from bench.timing import interleaved

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
    """latest.md and the plots can be rebuilt from a saved JSON (python -m bench.report)."""
    from bench import report

    _, out = quick_run
    src = next(out.glob("*-quick.json"))
    report.main([str(src), str(tmp_path)])
    assert "### Targets" in (tmp_path / "latest.md").read_text()
    assert (tmp_path / "overhead.png").exists() and (tmp_path / "qr_speed.png").exists()


def test_gpu_section_skips_with_reason_without_gpu(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture,
                                                   tmp_path: Path) -> None:
    from bench import __main__ as bench_main
    from runtime import cuda

    monkeypatch.setattr(cuda, "available", lambda: (False, "no device in this test"))
    assert bench_main._gpu_bench(True, tmp_path) == []
    assert "skipped, no usable GPU (no device in this test)" in capsys.readouterr().out


def test_gpu_section_runs_gpu_bench_when_a_gpu_is_usable(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """With a GPU, ``python -m bench`` runs bench/gpu_bench.py and reports its fresh result."""
    from bench import __main__ as bench_main
    from bench import gpu_bench, report
    from runtime import cuda

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
    from bench.machine import source_digest, source_digest_at

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
    from bench.qr_parallel import clock_ceiling

    r = clock_ceiling(2, quick=True)
    assert "error" not in r, r
    assert r["one_block_s"] > 0 and r["all_blocks_s"] > 0 and 0.2 < r["ceiling"] < 2.0


def test_tile_ceiling_measures_a_ratio() -> None:
    """bench.qr_parallel.tile_ceiling: one 64-column tile update alone vs one per worker
    (the trailing update's own ceiling), a time ratio and a rate, not an error."""
    from bench.qr_parallel import tile_ceiling

    for offset in (0, 16):
        r = tile_ceiling(2, quick=True, offset=offset)
        assert "error" not in r, r
        assert r["rows"] == 384 and r["offset_bytes"] == offset
        assert r["one_block_gflops"] > 0.1 and 0.2 < r["ceiling"] < 2.0
