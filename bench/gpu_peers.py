"""GPU QR peers of bench/gpu_bench.py: torch.geqrf and cublasSgeqrfBatched (through ctypes),
and the pure speedup/geomean/table logic over their rows.

cublasSgeqrfBatched factors each matrix with one thread block's worth of unblocked
Householder steps; it is fast for tiny matrices and very slow for large ones (19.6 s at
(8,2048) on an H100, 2026-12-06).  Each peer gets one timed run per shape when that run
exceeds the per-shape budget, and shapes where an earlier measurement already exceeded it
are skipped, with that measurement as the reason.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .timing import geomean

PEERS = ("torch.geqrf", "cublasSgeqrfBatched")
#: ms measured for cublasSgeqrfBatched on an NVIDIA H100 80GB HBM3 on 2026-12-06
#: (/work/shared/device-results/2026-12-06-h100-b59f755/peers-cublas-batched-h100.txt);
#: (2,4096) did not finish inside that run's limit.  Only used to skip hopeless shapes.
KNOWN_MS: dict[str, dict[tuple[int, int], float]] = {
    "cublasSgeqrfBatched": {(20, 32): 0.278, (40, 176): 15.2, (40, 352): 90.2,
                            (640, 512): 495.0, (60, 1024): 2950.0, (8, 2048): 19630.0,
                            (2, 4096): float("inf")},
}
PEER_BUDGET_S = 5.0


def known_too_slow(peer: str, batch: int, n: int, budget_s: float) -> str | None:
    """Why ``peer`` is skipped at (batch, n): an earlier run above ``budget_s``, else None."""
    ms = KNOWN_MS.get(peer, {}).get((batch, n))
    if ms is None or ms <= budget_s * 1e3:
        return None
    seen = "did not finish in an earlier run" if ms == float("inf") else f"took {ms:.0f} ms"
    return (f"skipped: {peer} {seen} at ({batch},{n}) on an H100 (2026-12-06), over the "
            f"{budget_s:g} s per-shape budget")


def timed_runs(run_once: Callable[[], float], repeat: int, budget_s: float
               ) -> dict[str, Any]:
    """``run_once()`` returns one run's ms.  A first run warms up; when it took longer than
    ``budget_s`` it is the only sample (``single_run``), else as many of ``repeat`` timed
    runs as fit the budget (at least one) follow."""
    first = run_once()
    if first > budget_s * 1e3:
        return {"ms": first, "samples_ms": [first], "single_run": True}
    n = max(1, min(repeat, int(budget_s * 1e3 / max(first, 1e-3)) - 1))
    ts = [run_once() for _ in range(n)]
    return {"ms": statistics.median(ts), "samples_ms": ts, "single_run": False}


# -- the measurements (need a CUDA GPU and torch) -------------------------------------

def torch_geqrf_once(x0: Any) -> Callable[[], float]:
    """One torch.geqrf of a fresh clone of ``x0`` (clone outside the timing), in ms."""
    import torch

    def once() -> float:
        x = x0.clone()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.geqrf(x)
        e.record()
        e.synchronize()
        return float(s.elapsed_time(e))
    return once


def cublas_candidates() -> list[str]:
    """libcublas paths: the one this process already loaded (torch's), torch's bundled
    nvidia wheels, CUDA_HOME / /usr/local/cuda, then the loader's search path."""
    out: list[str] = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            p = line.split()[-1]
            if "libcublas.so" in p and "Lt" not in p and p not in out:
                out.append(p)
    except OSError:
        pass
    try:
        import torch

        site = Path(torch.__file__).resolve().parents[1]
        out += sorted(glob.glob(str(site / "nvidia" / "*" / "lib" / "libcublas.so*")))
        out += sorted(glob.glob(str(site / "nvidia" / "cublas" / "lib" / "libcublas.so*")))
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    out += sorted(glob.glob(f"{home}/lib64/libcublas.so*"))
    found = ctypes.util.find_library("cublas")
    if found:
        out.append(found)
    return list(dict.fromkeys(out))


class Cublas:
    """cublasSgeqrfBatched through ctypes, on torch's current stream."""

    def __init__(self) -> None:
        errors = []
        for path in cublas_candidates():
            try:
                self.lib = ctypes.CDLL(path)
                self.lib.cublasSgeqrfBatched  # noqa: B018 - raises AttributeError if absent
                self.path = path
                break
            except (OSError, AttributeError) as e:
                errors.append(f"{path}: {e}")
        else:
            raise RuntimeError("no libcublas with cublasSgeqrfBatched: "
                               + ("; ".join(errors) or "none found"))
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned {rc}")

    def geqrf_once(self, x0: Any) -> Callable[[], float]:
        """One cublasSgeqrfBatched of a fresh copy of the (batch, n, n) CUDA tensor ``x0``
        (copy and pointer arrays outside the timing), in ms; cuBLAS reads column-major,
        so it factors each matrix's transpose: the same work on a random matrix."""
        import torch

        batch, m, n = x0.shape
        x = x0.clone()
        tau = torch.empty((batch, min(m, n)), dtype=torch.float32, device=x0.device)
        a_ptrs = torch.tensor([x[i].data_ptr() for i in range(batch)], dtype=torch.int64,
                              device=x0.device)
        t_ptrs = torch.tensor([tau[i].data_ptr() for i in range(batch)], dtype=torch.int64,
                              device=x0.device)
        info = ctypes.c_int(0)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.lib.cublasSetStream_v2(self.handle, stream), "cublasSetStream_v2")

        def once() -> float:
            x.copy_(x0)
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            rc = self.lib.cublasSgeqrfBatched(
                self.handle, ctypes.c_int(n), ctypes.c_int(m), ctypes.c_void_p(a_ptrs.data_ptr()),
                ctypes.c_int(n), ctypes.c_void_p(t_ptrs.data_ptr()), ctypes.byref(info),
                ctypes.c_int(batch))
            e.record()
            e.synchronize()
            self._check(rc, "cublasSgeqrfBatched")
            if info.value != 0:
                raise RuntimeError(f"cublasSgeqrfBatched info={info.value}")
            return float(s.elapsed_time(e))
        return once


def measure_peers(a: Any, peers: tuple[str, ...], repeat: int, budget_s: float,
                  cublas: Cublas | None) -> dict[str, Any]:
    """Every peer on the (batch, n, n) numpy array ``a``: {peer: result or {"skipped": why}}."""
    try:
        import torch
    except ImportError:
        return {p: {"skipped": "skipped: torch is not installed"} for p in peers}

    batch, _, n = a.shape
    x0 = torch.from_numpy(a).cuda()
    out: dict[str, Any] = {}
    for peer in peers:
        why = known_too_slow(peer, batch, n, budget_s)
        if why:
            out[peer] = {"skipped": why}
            continue
        if peer == "cublasSgeqrfBatched" and cublas is None:
            out[peer] = {"skipped": "skipped: no libcublas with cublasSgeqrfBatched"}
            continue
        try:
            once = (torch_geqrf_once(x0) if peer == "torch.geqrf" else cublas.geqrf_once(x0))
            out[peer] = timed_runs(once, repeat, budget_s)
        except Exception as e:  # noqa: BLE001 - one failing peer must not end the run
            out[peer] = {"error": f"{type(e).__name__}: {e}"[:300]}
    del x0
    torch.cuda.empty_cache()
    return out


# -- pure logic: speedups, geomeans, the table ----------------------------------------------

def speedups(row: dict[str, Any]) -> dict[str, Any]:
    """A row's speedups (peer ms / checked ms) vs torch.geqrf and vs the best measured peer."""
    ours = row.get("checked_ms")
    peers = {k: v["ms"] for k, v in row.get("peers", {}).items() if "ms" in v}
    if not ours or not peers:
        return {}
    best = min(peers, key=lambda k: peers[k])
    out = {"best_peer": best, "best_peer_ms": peers[best], "speedup_vs_best_peer":
           peers[best] / ours}
    if "torch.geqrf" in peers:
        out["speedup_vs_torch"] = peers["torch.geqrf"] / ours
    return out


def geomeans(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geomean speedups over the shapes where each was measured, and how many shapes."""
    out: dict[str, Any] = {}
    for key in ("speedup_vs_torch", "speedup_vs_best_peer"):
        xs = [r[key] for r in rows if r.get(key)]
        out[f"geomean_{key}"] = geomean(xs) if xs else None
        out[f"shapes_{key}"] = len(xs)
    return out


def _peer_cell(p: dict[str, Any] | None) -> str:
    if p is None:
        return f"{'-':>12}"
    if "ms" in p:
        return f"{p['ms']:11.3f}" + ("*" if p.get("single_run") else " ")
    return f"{'skipped' if 'skipped' in p else 'error':>12}"


def table(rows: list[dict[str, Any]]) -> str:
    """Text table of checked ms, each peer's ms, the best peer and the speedups."""
    lines = [f"{'shape':>12} {'checked ms':>11} " + " ".join(f"{p:>12}" for p in PEERS)
             + f" {'best peer':>19} {'vs torch':>8} {'vs best':>8}"]
    for r in rows:
        sp, st = r.get("speedup_vs_best_peer"), r.get("speedup_vs_torch")
        shape = f"({r['batch']},{r['n']})"
        lines.append(f"{shape:>12} {r['checked_ms']:11.3f} "
                     + " ".join(_peer_cell(r.get("peers", {}).get(p)) for p in PEERS)
                     + f" {r.get('best_peer', '-'):>19} "
                     + (f"{st:7.2f}x" if st else f"{'-':>8}") + " "
                     + (f"{sp:7.2f}x" if sp else f"{'-':>8}"))
    g = geomeans(rows)

    def gm(key: str) -> str:
        v = g[f"geomean_{key}"]
        return (f"{v:.2f}x" if v else "n/a") + f" over {g[f'shapes_{key}']} shapes"
    lines.append(f"geomean speedup of checked capqr: vs torch.geqrf {gm('speedup_vs_torch')}, "
                 f"vs the best peer {gm('speedup_vs_best_peer')}")
    lines.append("* one run only: it took longer than the per-shape budget")
    for r in rows:
        for p, v in r.get("peers", {}).items():
            if "skipped" in v or "error" in v:
                lines.append(f"({r['batch']},{r['n']}) {p}: {v.get('skipped') or v['error']}")
    return "\n".join(lines) + "\n"
