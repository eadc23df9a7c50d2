"""The search loop: propose -> evaluate (on the backend) -> store -> select.

Evaluations are asynchronous: the loop keeps every worker busy, and each
result is written to the store the moment it comes back (so a crash of the
loop or of a worker loses only what is in flight).  When the budget is
spent, the best member of each of the best groups (plus the seed kernel, as
a control) is re-checked on held-out inputs and the verdicts are stored.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import mutate as mut
from .backends import Dask, InProcess
from .evaluate import default_task
from .population import Member, Population
from .store import Store


@dataclass
class SearchConfig:
    """Everything a search run depends on (stored with the run)."""

    m: int = 640
    n: int = 512
    batch: int = 8
    budget: int = 200
    seed: int = 0
    db: str = "search.db"
    use_dask: bool = True
    scheduler: str | None = None
    workers: int = 2
    threads: int = 0              # CAPQR_THREADS per evaluation; 0: cores // workers
    bug_rate: float = 0.15        # chance a child also gets a risky (bug-like) edit
    struct_rate: float = 0.15     # chance a child gets/loses an algorithmic edit
    finalists: int = 6            # groups whose best goes to the held-out re-check
    reps: int = 3
    timeout: float = 60.0         # per launch until the seed's time is known
    inflight: int = 0             # evaluations queued at once; 0: 2 x workers


@dataclass
class SearchResult:
    """What a finished run produced."""

    run_id: int
    db: str
    counts: dict[str, int] = field(default_factory=dict)
    best: dict | None = None
    finalists: list[dict] = field(default_factory=list)


def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, flush=True)


def search(cfg: SearchConfig, *, quiet: bool = False,
           on_result: Callable[[int, dict], None] | None = None) -> SearchResult:
    """Run a search; returns a summary (the full record is in ``cfg.db``)."""
    rng = random.Random(cfg.seed)
    store = Store(cfg.db)
    run_id = store.new_run(asdict(cfg))
    workers = 1 if not cfg.use_dask else cfg.workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = cfg.threads or max(1, (cpus or 1) // max(1, workers))
    backend: Any = (Dask(cfg.scheduler, cfg.workers) if cfg.use_dask else InProcess())
    _say(quiet, f"search run {run_id}: {cfg.batch} x {cfg.m}x{cfg.n}, budget {cfg.budget}, "
         f"on {backend.name}, {threads} thread(s) per evaluation, db {cfg.db}")
    pop = Population()
    seen: set[str] = set()
    seeds = mut.seed_genomes()
    rows: dict[int, int] = {}           # iteration -> row id
    cands: dict[int, dict] = {}         # iteration -> candidate, while in flight
    counts: dict[str, int] = {}
    state = {"timeout": cfg.timeout, "seed_time": None, "best": None, "done": 0}
    inflight_cap = cfg.inflight or 2 * workers
    it = 0

    def propose() -> dict | None:
        for _ in range(200):
            if seeds:
                g, parent = seeds.pop(0), None
            else:
                par = pop.select(rng)
                base = par.genome if par else rng.choice(mut.seed_genomes())
                parent = par.iteration if par else None
                g = mut.mutate(base, rng, bug_rate=cfg.bug_rate, struct_rate=cfg.struct_rate)
            k = mut.key(g)
            if k in seen:
                continue
            seen.add(k)
            try:
                src, entry = mut.render(g)
            except mut.RenderError:
                continue  # a hole the current seed lacks: not a candidate
            return {"genome": g, "key": k, "group": mut.structure(g), "parent": parent,
                    "source": src, "entry": entry}
        return None

    def submit_one() -> bool:
        nonlocal it
        cand = propose()
        if cand is None:
            return False
        p = cand["genome"]["params"]
        # Generous per-launch deadline (20x the seed, at least 2 s): only hung
        # candidates hit it.  The child's wall limit also covers compilation.
        task = default_task(cand["source"], cand["entry"], m=cfg.m, n=cfg.n, batch=cfg.batch,
                            nb=p["nb"], seed=cfg.seed * 1_000_003 + it, timeout=state["timeout"],
                            reps=cfg.reps, threads=threads,
                            wall_timeout=300 + 12 * state["timeout"])
        cands[it] = cand
        backend.submit(it, task)
        it += 1
        return True

    try:
        while it < cfg.budget and backend.pending() < inflight_cap:
            if not submit_one():
                break
        while backend.pending():
            for i, res in backend.as_completed():
                cand = cands.pop(i)
                rows[i] = store.put_result(run_id, i, cand, res)
                state["done"] += 1
                counts[res["status"]] = counts.get(res["status"], 0) + 1
                _absorb(pop, state, cand, i, res)
                if on_result:
                    on_result(i, res)
                _say(quiet, _progress(state, cfg.budget, i, cand, res))
                while it < cfg.budget and backend.pending() < inflight_cap:
                    if not submit_one():
                        break
        finals = _recheck(cfg, pop, store, rows, backend, threads, state, quiet)
        store.finish_run(run_id)
    finally:
        backend.close()
        store.close()
    best = pop.best()
    return SearchResult(run_id, cfg.db, counts,
                        None if best is None else {"iteration": best.iteration,
                                                   "time_s": best.time_s,
                                                   "genome": best.genome,
                                                   "describe": mut.describe(best.genome)},
                        finals)


def _absorb(pop: Population, state: dict, cand: dict, i: int, res: dict) -> None:
    """Add a passing result to the population; learn the seed's time."""
    if res["status"] != "ok" or res.get("time_s") is None:
        return
    pop.add(Member(cand["genome"], float(res["time_s"]), i, cand["group"]))
    if cand["parent"] is None and cand["genome"] == mut.seed_genomes()[0] \
            and state["seed_time"] is None:
        state["seed_time"] = float(res["time_s"])
        state["timeout"] = min(120.0, max(2.0, 20.0 * state["seed_time"]))
    b = pop.best()
    state["best"] = b.time_s if b else None


def _progress(state: dict, budget: int, i: int, cand: dict, res: dict) -> str:
    t = res.get("time_s")
    ts = f"{t * 1e3:9.2f} ms" if t is not None else " " * 12
    best = state["best"]
    bs = f"best {best * 1e3:.2f} ms" if best is not None else "best -"
    why = "" if res["status"] == "ok" else f"  ({(res.get('reason') or '')[:90]})"
    return (f"[{state['done']:4d}/{budget}] it {i:4d} {res['status']:<13} {ts}  {bs}  "
            f"{mut.describe(cand['genome'])}{why}")


def _recheck(cfg: SearchConfig, pop: Population, store: Store, rows: dict[int, int],
             backend: Any, threads: int, state: dict, quiet: bool) -> list[dict]:
    """Re-check finalists (and the seed, as a control) on held-out inputs."""
    finals = pop.finalists(cfg.finalists)
    seed_key = mut.key(mut.seed_genomes()[0])
    seed = [m for ms in pop.groups.values() for m in ms if mut.key(m.genome) == seed_key]
    if seed and all(m.iteration != seed[0].iteration for m in finals):
        finals.append(seed[0])
    if not finals:
        return []
    _say(quiet, f"held-out re-check of {len(finals)} finalist(s) "
         f"(new shapes and value classes, never used in selection)")
    for m in finals:
        src, entry = mut.render(m.genome)
        task = default_task(src, entry, m=cfg.m, n=cfg.n, batch=cfg.batch,
                            nb=m.genome["params"]["nb"], seed=cfg.seed + 104729,
                            timeout=state["timeout"], reps=0, kind="ood", threads=threads,
                            wall_timeout=300 + 20 * state["timeout"])
        backend.submit(m.iteration, task)
    out = []
    by_it = {m.iteration: m for m in finals}
    while backend.pending():
        for i, res in backend.as_completed():
            store.put_ood(rows[i], res)
            m = by_it[i]
            seed_t = state["seed_time"]
            fast = seed_t is not None and m.time_s < seed_t
            out.append({"iteration": i, "group": m.group, "time_s": m.time_s, "fast": fast,
                        "ood_status": res["status"], "ood_reason": res.get("reason"),
                        "describe": mut.describe(m.genome)})
            _say(quiet, f"  it {i:4d} {m.time_s * 1e3:9.2f} ms {'fast' if fast else '    '} "
                 f"OOD {res['status']:<12} {mut.describe(m.genome)}"
                 + (f"  ({(res.get('reason') or '')[:90]})" if res["status"] != "ok" else ""))
    return sorted(out, key=lambda d: d["time_s"])


def main_summary(res: SearchResult) -> str:
    """Closing lines printed by the CLI."""
    lines = [f"run {res.run_id} done: " + ", ".join(f"{k} {v}" for k, v in
                                                    sorted(res.counts.items()))]
    if res.best:
        lines.append(f"best: {res.best['time_s'] * 1e3:.2f} ms  {res.best['describe']} "
                     f"(iteration {res.best['iteration']})")
    fast = [f for f in res.finalists if f["fast"]]
    bad = [f for f in fast if f["ood_status"] != "ok"]
    if res.finalists:
        lines.append(f"held-out: {len(res.finalists)} finalists, {len(fast)} faster than the "
                     f"seed, {len(bad)} of those fail held-out inputs")
    lines.append(f"results in {res.db}; `python -m capqr.kernels.search report --db {res.db}`")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use python -m capqr.kernels.search")
