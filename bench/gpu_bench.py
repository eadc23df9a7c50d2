"""GPU lane benchmark: checked vs raw batched QR, and vs torch.geqrf, on the contest shapes.

``python -m bench.gpu_bench`` writes ``bench/results/gpu-<date>.json``.  Each
time is the median of >= 7 launches timed with CUDA events around the kernel
alone (the input is restored by a device-to-device copy before every launch,
outside the timed region).  torch.geqrf is timed the same way with
torch.cuda.Event around the call (its clone of the input is outside).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
from pathlib import Path

import numpy as np

from .peers import BATCHED
from .timing import geomean

#: The contest's (batch, n) shapes, the same list the CPU peer comparison uses.
CONTEST_SHAPES: tuple[tuple[int, int], ...] = BATCHED["full"]


def bench_shape(batch: int, n: int, repeat: int) -> dict:
    """Time checked, raw and torch.geqrf for one (batch, n)."""
    import kernels.gpu as g
    from runtime import cuda
    from runtime.cuda import driver as drv

    rng = np.random.default_rng(batch * 100003 + n)
    a = rng.standard_normal((batch, n, n)).astype(np.float32)
    A0 = cuda.to_device(a, perms="r", name="A0")
    A = cuda.alloc_device(a.shape, np.float32, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")

    def restore() -> None:
        drv.check(drv.lib().cuMemcpyDtoD_v2(A.ptr, A0.ptr, A.nbytes), "cuMemcpyDtoD")

    row: dict = {"batch": batch, "n": n, "block": g.qr_block_size(n)}
    outs = {}
    for name, checked in (("checked", True), ("raw", False)):
        k = g.qr_kernel(checked)
        ts = cuda.time_launch(k, [A, tau], args=(n,), grid=batch, block=g.qr_block_size(n),
                              repeat=repeat, warmup=1, before=restore)
        row[f"{name}_ms"] = statistics.median(ts)
        row[f"{name}_samples_ms"] = ts
        row[f"{name}_registers"] = k.registers()
        outs[name] = (A.numpy(), tau.numpy())
    row["overhead"] = row["checked_ms"] / row["raw_ms"]
    row["checked_equals_raw"] = bool(
        np.array_equal(outs["checked"][0].view(np.uint32), outs["raw"][0].view(np.uint32))
        and np.array_equal(outs["checked"][1].view(np.uint32), outs["raw"][1].view(np.uint32)))
    for c in (A0, A, tau):
        c.free()
    try:
        import torch

        if torch.cuda.is_available():
            x0 = torch.from_numpy(a).cuda()
            ts = []
            for it in range(repeat + 1):
                x = x0.clone()
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                torch.geqrf(x)
                e.record()
                e.synchronize()
                if it:
                    ts.append(s.elapsed_time(e))
            row["torch_geqrf_ms"] = statistics.median(ts)
            row["torch_geqrf_samples_ms"] = ts
            row["speedup_vs_torch"] = row["torch_geqrf_ms"] / row["checked_ms"]
            del x0, x
            torch.cuda.empty_cache()
    except ImportError:
        row["torch_geqrf_ms"] = None
    return row


def main(argv: list[str] | None = None) -> Path:
    """Run the benchmark and write the JSON; returns its path."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--repeat-large", type=int, default=7,
                    help="repeats for n >= 4096 (each launch takes seconds there)")
    ap.add_argument("--shapes", default="", help="e.g. 20x32,40x176 (default: contest shapes)")
    ap.add_argument("--out", default="")
    ns = ap.parse_args(argv)
    from runtime.cuda import driver as drv

    shapes = ([tuple(int(v) for v in s.split("x")) for s in ns.shapes.split(",")]
              if ns.shapes else CONTEST_SHAPES)
    dev = drv.device()
    rows: list[dict] = []
    out = Path(ns.out) if ns.out else (Path(__file__).parent / "results" /
                                       f"gpu-{_dt.date.today().isoformat()}.json")
    for b, n in shapes:
        rep = ns.repeat_large if n >= 4096 else ns.repeat
        r = bench_shape(b, n, rep)
        r["repeat"] = rep
        rows.append(r)
        _write(out, dev, rows, ns.repeat)  # after every shape: partial results survive
        tt = r.get("torch_geqrf_ms") or float("nan")
        print(f"({b:4d},{n:5d}) checked {r['checked_ms']:10.3f} ms  raw {r['raw_ms']:10.3f} ms  "
              f"overhead {r['overhead']:.3f}x  torch {tt:10.3f}"
              f" ms  speedup {r.get('speedup_vs_torch', float('nan')):.2f}x", flush=True)
    res = _write(out, dev, rows, ns.repeat)
    print(f"geomean overhead {res['geomean_overhead']:.3f}x"
          + (f", geomean speedup vs torch.geqrf {res['geomean_speedup_vs_torch']:.2f}x"
             if "geomean_speedup_vs_torch" in res else ""))
    print(f"wrote {out}")
    return out


def _write(out: Path, dev, rows: list[dict], repeat: int) -> dict:
    from runtime.cuda import nvrtc

    res = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": dev.name, "compute_capability": list(dev.cc), "sm_count": dev.sm_count,
        "driver_version": dev.driver_version, "compiler": nvrtc.version(),
        "python": platform.python_version(), "repeat": repeat,
        "method": "median of CUDA-event times of the kernel alone; input restored by a "
                  "device-to-device copy outside the timed region; float32",
        "kernel": "kernels/gpu/qr.c (unblocked Householder, one block per matrix)",
        "shapes": rows,
        "geomean_overhead": geomean([r["overhead"] for r in rows]),
    }
    sp = [r["speedup_vs_torch"] for r in rows if r.get("speedup_vs_torch")]
    if sp:
        res["geomean_speedup_vs_torch"] = geomean(sp)
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
