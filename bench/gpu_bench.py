"""GPU lane benchmark: checked vs raw batched QR, and vs torch.geqrf, on the contest shapes.

``python -m capqr.bench.gpu_bench`` writes ``gpu-<date>.json`` and ``.txt`` into --out.  Each
time is the median of >= 7 runs timed with CUDA events around the whole
launch sequence of the blocked QR (kernels/gpu, host gaps between launches
included; the input is restored by a device-to-device copy before every run,
outside the timed region).  The peers, torch.geqrf and cublasSgeqrfBatched
(bench/gpu_peers.py), are timed with torch.cuda.Event around the call (the copy of
the input outside), within a per-shape budget.  Without a GPU it says why and exits 0.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import platform
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import gpu_peers
from .outdir import default_out
from .peers import BATCHED
from .timing import geomean

#: The ceilings the TFLOP/s column is read against (H200, dense): not measured here.
CEILINGS_TFLOPS = {"fp32_simt": 50, "fp16_tensor": 790,
                   "source": "the GPU-speed issue's figures for the H200, not measured here"}

#: The contest's (batch, n) shapes, the same list the CPU peer comparison uses.
CONTEST_SHAPES: tuple[tuple[int, int], ...] = BATCHED["full"]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"20x32,2x4096" -> [(20, 32), (2, 4096)] (the GPU benches' --shapes)."""
    return [(int(b), int(n)) for b, n in (s.split("x") for s in text.split(","))]


@contextmanager
def qr_buffers(a: np.ndarray) -> Iterator[tuple]:
    """(A0, A, tau, ws) on the device for the (batch, n, n) input ``a``: A0 holds it
    (read-only, for :func:`restore`), A is factored in place; all freed on exit."""
    from ..kernels import gpu as g
    from ..runtime import cuda

    batch, n = a.shape[0], a.shape[1]
    A0 = cuda.to_device(a, perms="r", name="A0")
    A = cuda.alloc_device(a.shape, np.float32, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    ws = g.Workspace.alloc(batch, n, prefix="")
    try:
        yield A0, A, tau, ws
    finally:
        ws.free()
        for c in (A0, A, tau):
            c.free()


def bench_shape(batch: int, n: int, repeat: int, tall_rows: int | None | str = "auto",
                peers: tuple[str, ...] = ("torch.geqrf",),
                peer_budget_s: float = gpu_peers.PEER_BUDGET_S,
                cublas: gpu_peers.Cublas | None = None, graph: str = "off",
                check_matrices: int | None = None) -> dict:
    """Time checked and raw capqr and the ``peers`` for one (batch, n).

    ``graph``: "off" times the launch sequence (launch_many), "on" its CUDA graph
    (qr_launch's ``graphs``: recorded in the untimed first run, replayed after),
    "both" the sequence as checked_ms / raw_ms and the graph as checked_graph_ms /
    raw_graph_ms.  ``check_matrices``: how many matrices of the batch kernels.check
    verifies (None: all; checked equals raw is compared on all of them either way)."""
    from ..kernels import gpu as g
    from ..runtime.cuda import driver as drv

    rng = np.random.default_rng(batch * 100003 + n)
    a = rng.standard_normal((batch, n, n)).astype(np.float32)
    with qr_buffers(a) as (A0, A, tau, ws):
        plan = g.launch_plan(batch, n, tall_rows)
        row: dict = {"batch": batch, "n": n, "launches": len(plan), "two_panel": g.TWO_PANEL,
                     "reg_rows": g.REG_ROWS, "per_matrix": g.PER_MATRIX,
                     "mma_update": g.MMA_UPDATE, "mma_min_rows": g.MMA_MIN_ROWS,
                     "lookahead": any(s.lane for s in plan),
                     "tall_rows": g.default_tall_rows(batch) if tall_rows == "auto" else tall_rows,
                     "graph": graph}
        outs = {}
        start, end = drv.Event(), drv.Event()
        graphs: dict = {}
        modes = {"off": ((False, ""),), "on": ((True, ""),),
                 "both": ((False, ""), (True, "_graph"))}[graph]
        for (use_graph, suffix), (name, checked) in itertools.product(
                modes, (("checked", True), ("raw", False))):
            ks = g.blocked_kernels(checked)
            ts = []
            for it in range(repeat + 1):  # the first run compiles/records/warms up: not timed
                ms = time_qr(A0, A, tau, ws, n, start, end, checked=checked, tall_rows=tall_rows,
                             graphs=graphs if use_graph else None)
                if it:
                    ts.append(ms)
            row[f"{name}{suffix}_ms"] = statistics.median(ts)
            row[f"{name}{suffix}_samples_ms"] = ts
            row[f"{name}_registers"] = {k: v.registers() for k, v in ks.items()}
            res = (A.numpy(), tau.numpy())
            if name in outs and not all(np.array_equal(x.view(np.uint32), y.view(np.uint32))
                                        for x, y in zip(outs[name], res, strict=True)):
                row[f"{name}_graph_differs"] = True  # the graph must give the sequence's bits
            outs.setdefault(name, res)
        for gr in graphs.values():
            gr.close()
        if graph == "both":
            row["graph_speedup_checked"] = row["checked_ms"] / row["checked_graph_ms"]
            row["graph_speedup_raw"] = row["raw_ms"] / row["raw_graph_ms"]
        flops = batch * (4.0 / 3.0) * n ** 3
        row["checked_tflops"] = flops / (row["checked_ms"] * 1e-3) / 1e12
        row["overhead"] = row["checked_ms"] / row["raw_ms"]
        for name, checked in (("checked", True), ("raw", False)):
            restore(A0, A)
            row[f"profile_{name}"] = _profile(g, A, tau, ws, plan, checked)
        row["checked_equals_raw"] = bool(
            np.array_equal(outs["checked"][0].view(np.uint32), outs["raw"][0].view(np.uint32))
            and np.array_equal(outs["checked"][1].view(np.uint32), outs["raw"][1].view(np.uint32)))
    from .. import kernels

    k = checked_count(batch, check_matrices)
    rep = kernels.check(a[:k], outs["checked"][0][:k], outs["checked"][1][:k])
    row["check_matrices"] = k
    row["check_ok"] = bool(rep.ok)
    row["check_worst"] = {k: float(v) for k, v in rep.worst().items()}
    if peers:
        row["peers"] = gpu_peers.measure_peers(a, peers, repeat, peer_budget_s, cublas)
        row["torch_geqrf_ms"] = row["peers"].get("torch.geqrf", {}).get("ms")
        row.update(gpu_peers.speedups(row))
    return row


def restore(A0, A) -> None:
    """A's input again, from A0 (a device-to-device copy on the launch stream)."""
    from ..runtime.cuda import driver as drv

    drv.check(drv.lib().cuMemcpyDtoD_v2(A.ptr, A0.ptr, A.nbytes), "cuMemcpyDtoD")


def time_qr(A0, A, tau, ws, n: int, start, end, **options) -> float:
    """ms of one kernels.gpu.qr_launch(A, tau, ws, n, **options) by CUDA events around it,
    A restored from A0 and the device idle before (outside the timing)."""
    from ..kernels import gpu as g
    from ..runtime.cuda import driver as drv

    restore(A0, A)
    drv.check(drv.lib().cuCtxSynchronize(), "cuCtxSynchronize")
    start.record()
    g.qr_launch(A, tau, ws, n, **options)
    end.record()
    end.synchronize()
    return start.elapsed_ms(end)


def checked_count(batch: int, check_matrices: int | None) -> int:
    """How many matrices of a batch the bench verifies with kernels.check: all (None), or
    the first ``check_matrices`` (at least 1).  On the device host the check of all 640
    matrices of (640,512) takes longer than the timings."""
    return batch if check_matrices is None else max(1, min(batch, check_matrices))


def _profile(g, A, tau, ws, plan: list, checked: bool = True) -> dict:
    """One run of the launch sequence (the ``checked`` or the raw build) with CUDA events
    between the launches:
    GPU ms per kind of kernel (the events sit on the stream between the kernels, so
    they time the kernels and the gaps between them, not the host), the host time
    to enqueue the whole sequence, and the wall time to its end."""
    import time

    from ..runtime import cuda
    from ..runtime.cuda import driver as drv

    ks = g.blocked_kernels(checked)
    ws.for_plan(plan)
    evs = [(drv.Event(), drv.Event()) for _ in plan]
    drv.check(drv.lib().cuCtxSynchronize(), "cuCtxSynchronize")
    t0 = time.perf_counter()
    for (s, e), step in zip(evs, plan, strict=True):
        caps = ws.caps(step, A, tau)
        s.record()
        cuda.launch(ks[step.kernel], caps, args=step.args, grid=step.grid, block=step.block,
                    group=step.group, sync=False)
        e.record()
    enqueue = (time.perf_counter() - t0) * 1e3
    cuda.sync()
    wall = (time.perf_counter() - t0) * 1e3
    gpu: dict[str, float] = {}
    for (s, e), step in zip(evs, plan, strict=True):
        gpu[step.kernel] = gpu.get(step.kernel, 0.0) + s.elapsed_ms(e)
    return {"wall_ms": wall, "gpu_ms_by_kernel": gpu,
            "panel_gpu_ms": sum(v for k, v in gpu.items() if not k.startswith("update")),
            "update_gpu_ms": sum(v for k, v in gpu.items() if k.startswith("update")),
            "launches": len(plan), "enqueue_ms": enqueue,
            "host_us_per_launch": enqueue / len(plan) * 1e3}


def gpu_missing() -> str | None:
    """Why this host cannot run the GPU bench, or None."""
    try:
        from ..runtime import cuda

        ok, why = cuda.available()
    except Exception as e:  # noqa: BLE001 - no cffi/libcuda: a reason, not a crash
        return f"runtime.cuda unusable ({type(e).__name__}: {e})"
    return None if ok else f"no usable GPU ({why})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.gpu_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per shape (median)")
    ap.add_argument("--repeat-large", type=int, default=7,
                    help="repeats for n >= 4096 (each launch takes seconds there)")
    ap.add_argument("--shapes", default="", help="e.g. 20x32,40x176 (default: contest shapes)")
    ap.add_argument("--out", default="",
                    help="JSON path (default gpu-<date>.json in $CAPQR_BENCH_OUT or "
                         "./bench-results); the table goes beside it as .txt")
    ap.add_argument("--tall-rows", default="auto",
                    help="factor panels of more rows by column steps: a number, 'none' "
                         "or 'auto' (kernels.gpu.default_tall_rows)")
    ap.add_argument("--two-panel", choices=("default", "on", "off"), default="default",
                    help="one trailing update per pair of panels (kernels.gpu.TWO_PANEL)")
    ap.add_argument("--mma-update", choices=("default", "on", "off"), default="default",
                    help="the trailing update on the tensor cores (kernels.gpu.MMA_UPDATE)")
    ap.add_argument("--panel-reg", choices=("default", "on", "off"), default="default",
                    help="on: panels of at most kernels.gpu.REG_MAX_ROWS rows in registers; "
                         "off: none; default: of at most kernels.gpu.REG_ROWS")
    ap.add_argument("--lookahead", choices=("default", "on", "off"), default="default",
                    help="the panels and each next panel's update on a second stream: "
                         "default kernels.gpu.use_lookahead's rule, on or off for every shape")
    ap.add_argument("--per-matrix", choices=("default", "on", "off"), default="default",
                    help="one launch, one block per matrix, where the batch allows "
                         "(kernels.gpu.PER_MATRIX)")
    ap.add_argument("--mma-min-rows", type=int, default=None,
                    help="rows from which an update takes the tensor cores "
                         "(kernels.gpu.MMA_MIN_ROWS)")
    ap.add_argument("--graph", choices=("off", "on", "both"), default="off",
                    help="time the launch sequence (off), its CUDA graph replayed (on), or "
                         "both (the graph as checked_graph_ms / raw_graph_ms)")
    ap.add_argument("--check-matrices", type=int, default=None,
                    help="verify only the first N matrices of each batch with kernels.check "
                         "(default: all; for short device experiments)")
    ap.add_argument("--peers", default=",".join(gpu_peers.PEERS),
                    help="comma-separated peers to time beside capqr, from "
                         f"{','.join(gpu_peers.PEERS)}; empty for none")
    ap.add_argument("--peer-budget-s", type=float, default=gpu_peers.PEER_BUDGET_S,
                    help="seconds each peer may take per shape: one run only when a run "
                         "exceeds it, and shapes where an earlier run exceeded it are skipped")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> Path | None:
    """Run the benchmark and write the JSON and the table; returns the JSON path, or None
    (after saying why) where there is no usable GPU."""
    ns = parse_args(argv)
    why = gpu_missing()
    if why:
        print(f"gpu_bench: skipped: {why}")
        return None
    if ns.two_panel != "default":
        from ..kernels import gpu as g

        g.TWO_PANEL = ns.two_panel == "on"
    _set_plan_options(ns)
    tall = ns.tall_rows if ns.tall_rows == "auto" else (
        None if ns.tall_rows == "none" else int(ns.tall_rows))
    peers = tuple(p for p in ns.peers.split(",") if p)
    bad = [p for p in peers if p not in gpu_peers.PEERS]
    if bad:
        raise SystemExit(f"unknown peer(s) {bad}; have {gpu_peers.PEERS}")
    cublas = None
    if "cublasSgeqrfBatched" in peers:
        try:
            cublas = gpu_peers.Cublas()
            print(f"cublasSgeqrfBatched from {cublas.path}", flush=True)
        except (RuntimeError, ImportError) as e:
            print(f"cublasSgeqrfBatched: skipped: {e}", flush=True)
    from ..runtime.cuda import driver as drv

    shapes = parse_shapes(ns.shapes) if ns.shapes else CONTEST_SHAPES
    dev = drv.device()
    rows: list[dict] = []
    out = Path(ns.out) if ns.out else default_out() / f"gpu-{_dt.date.today().isoformat()}.json"
    for b, n in shapes:
        rep = ns.repeat_large if n >= 4096 else ns.repeat
        r = bench_shape(b, n, rep, tall, peers, ns.peer_budget_s, cublas, ns.graph,
                        ns.check_matrices)
        r["repeat"] = rep
        rows.append(r)
        _write(out, dev, rows, ns.repeat)  # after every shape: partial results survive
        pr, pw = r["profile_checked"], r["profile_raw"]
        print(f"    profile: panel {pr['panel_gpu_ms']:.3f} ms, "
              f"update {pr['update_gpu_ms']:.3f} ms, "
              f"{pr['launches']} launches, enqueue {pr['host_us_per_launch']:.1f} us/launch, "
              f"{r['checked_tflops']:.2f} TFLOP/s", flush=True)
        print("    checked/raw ms by kernel: " + ", ".join(
            f"{k} {v:.3f}/{pw['gpu_ms_by_kernel'].get(k, 0.0):.3f}"
            for k, v in pr["gpu_ms_by_kernel"].items()), flush=True)
        pm = "  ".join(f"{p} {v['ms']:.3f} ms" if "ms" in v else f"{p} {next(iter(v))}"
                       for p, v in r.get("peers", {}).items())
        print(f"({b:4d},{n:5d}) checked {r['checked_ms']:10.3f} ms  raw {r['raw_ms']:10.3f} ms  "
              f"overhead {r['overhead']:.3f}x  {pm}", flush=True)
        if ns.graph == "both":
            print(f"    graph: checked {r['checked_graph_ms']:.3f} ms "
                  f"({r['graph_speedup_checked']:.3f}x), raw {r['raw_graph_ms']:.3f} ms "
                  f"({r['graph_speedup_raw']:.3f}x), checked/raw "
                  f"{r['checked_graph_ms'] / r['raw_graph_ms']:.3f}x"
                  + ("  RESULTS DIFFER" if r.get("checked_graph_differs")
                     or r.get("raw_graph_differs") else ""), flush=True)
    res = _write(out, dev, rows, ns.repeat)
    text = gpu_peers.table(rows) + f"geomean checked/raw {res['geomean_overhead']:.3f}x\n"
    if "geomean_graph_speedup_checked" in res:
        text += ("CUDA graph vs launch sequence: checked "
                 f"{res['geomean_graph_speedup_checked']:.3f}x, raw "
                 f"{res['geomean_graph_speedup_raw']:.3f}x faster (geomean); with graphs "
                 f"checked/raw {res['geomean_graph_overhead']:.3f}x\n")
    out.with_suffix(".txt").write_text(text)
    print(text + f"wrote {out} and {out.with_suffix('.txt')}")
    return out


def _set_plan_options(ns: argparse.Namespace) -> None:
    """--mma-update / --mma-min-rows / --panel-reg / --per-matrix / --lookahead into
    kernels.gpu (the plan reads them when built)."""
    from ..kernels import gpu as g

    if ns.mma_update != "default":
        g.MMA_UPDATE = ns.mma_update == "on"
    if ns.mma_min_rows is not None:
        g.MMA_MIN_ROWS = ns.mma_min_rows
    if ns.panel_reg != "default":
        g.REG_ROWS = g.REG_MAX_ROWS if ns.panel_reg == "on" else 0
    if ns.per_matrix != "default":
        g.PER_MATRIX = ns.per_matrix == "on"
    if ns.lookahead != "default":
        g.LOOKAHEAD = ns.lookahead == "on"


def _write(out: Path, dev, rows: list[dict], repeat: int) -> dict:
    from ..runtime.cuda import nvrtc
    from .machine import git_commit, host, source_digest

    res = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": dev.name, "compute_capability": list(dev.cc), "sm_count": dev.sm_count,
        "driver_version": dev.driver_version, "compiler": nvrtc.version(),
        "python": platform.python_version(), "repeat": repeat, "machine": host(),
        "git": git_commit(), "source_digest": source_digest(),
        "method": "median of CUDA-event times around the whole launch sequence (host gaps "
                  "between launches included); input restored by a device-to-device copy "
                  "outside the timed region; float32",
        "kernel": "kernels/gpu (blocked Householder, compact WY, host-driven launch "
                  "sequence: sync=False launches, one host sync at the end)",
        "shapes": rows,
        "ceilings_tflops": CEILINGS_TFLOPS,
        "geomean_overhead": geomean([r["overhead"] for r in rows]),
    }
    graphed = [r for r in rows if "checked_graph_ms" in r]
    if graphed:  # --graph both
        res["geomean_graph_speedup_checked"] = geomean(
            [r["graph_speedup_checked"] for r in graphed])
        res["geomean_graph_speedup_raw"] = geomean([r["graph_speedup_raw"] for r in graphed])
        res["geomean_graph_overhead"] = geomean(
            [r["checked_graph_ms"] / r["raw_graph_ms"] for r in graphed])
    res.update(gpu_peers.geomeans(rows))
    if res.get("geomean_speedup_vs_torch"):
        try:
            import torch

            res["torch_version"] = torch.__version__
        except ImportError:
            pass
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
