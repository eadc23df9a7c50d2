"""Gate an externally written kernel (an LLM agent's) and print a verdict.

The submitted source goes through exactly the gate of search candidates
(:mod:`kernels.search.evaluate`, in an isolated child process) and then the
held-out re-check; the verdict is PASS only if both pass.  The kernel must
have the contract documented in :mod:`kernels.search.evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import mutate as mut
from .evaluate import default_task, evaluate_isolated, run_gate


@dataclass
class Verdict:
    """Outcome of a submission."""

    passed: bool
    gate: dict
    ood: dict | None = None
    baseline_s: float | None = None
    lines: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(self.lines)


def submit(source: str, name: str | None = None, *, m: int = 640, n: int = 512,
           batch: int = 8, nb: int = 32, storage: str | None = None, seed: int = 12345,
           timeout: float = 60.0, reps: int = 3, baseline: bool = True,
           isolated: bool = True, threads: int = 0) -> Verdict:
    """Run the search gate (+ held-out re-check) on ``source``; never raises."""
    run = evaluate_isolated if isolated else run_gate
    task = default_task(source, name, m=m, n=n, batch=batch, nb=nb, seed=seed, timeout=timeout,
                        reps=reps, storage=storage, threads=threads)
    gate = run(task)
    v = Verdict(False, gate)
    v.lines.append(f"gate ({batch} x {m}x{n}, nb={nb}, storage {task['storage']}): "
                   f"{gate['status']}" + (f": {gate.get('reason')}" if gate.get("reason") else ""))
    if gate["status"] == "ok":
        rat = gate.get("ratios") or {}
        v.lines.append("  checker worst ratios: " + ", ".join(
            f"{k} {val:.3g}" for k, val in rat.items() if val is not None))
        v.lines.append(f"  time: median {gate['time_s'] * 1e3:.3f} ms over "
                       f"{len(gate['times'])} launches")
        v.ood = run({**task, "kind": "ood", "reps": 0})
        v.lines.append(f"held-out re-check: {v.ood['status']}"
                       + (f": {v.ood.get('reason')}" if v.ood.get("reason") else ""))
        if baseline:
            src, entry = mut.render(mut.seed_genomes()[0])
            b = run(default_task(src, entry, m=m, n=n, batch=batch, nb=32, seed=seed,
                                 timeout=timeout, reps=reps, threads=threads))
            if b["status"] == "ok":
                v.baseline_s = b["time_s"]
                v.lines.append(f"  seed kernel (geqrf nb=32): {b['time_s'] * 1e3:.3f} ms -> "
                               f"speedup {b['time_s'] / gate['time_s']:.2f}x")
        v.passed = v.ood["status"] == "ok"
    detail = gate.get("detail")
    if gate["status"] == "fault" and isinstance(detail, dict) and detail.get("source_line"):
        v.lines.append(f"  at line {detail.get('line')}: {detail['source_line']}")
    v.lines.insert(0, "VERDICT: " + ("PASS" if v.passed else "FAIL"))
    return v


def submit_file(path: str | Path, name: str | None = None, **kw: object) -> Verdict:
    """:func:`submit` on a file's text."""
    return submit(Path(path).read_text(), name, **kw)  # type: ignore[arg-type]
