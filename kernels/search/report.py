"""Leaderboard and best-time-versus-iteration plot of a search database."""

from __future__ import annotations

from pathlib import Path

from .. import mutate as mut
from .store import Row, Store


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f}"


def _seed_time(rows: list[Row]) -> float | None:
    seed = mut.key(mut.seed_genomes()[0])
    ts = [r.time_s for r in rows if r.genome_key == seed and r.status == "ok"]
    return ts[0] if ts else None


def leaderboard(store: Store, run_id: int | None = None, top: int = 15) -> str:
    """Text report of one run (default: the newest): leaderboard, failures, held-out."""
    run_id = store.last_run() if run_id is None else run_id
    if run_id is None:
        return "no runs in this database"
    rows = store.results(run_id)
    cfg = next((r["config"] for r in store.runs() if r["run_id"] == run_id), {})
    seed_t = _seed_time(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    out = [f"run {run_id}: {cfg.get('batch')} x {cfg.get('m')}x{cfg.get('n')}, "
           f"{len(rows)} evaluations (budget {cfg.get('budget')}): "
           + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    if seed_t:
        out.append(f"seed kernel (geqrf nb=32, checked): {_ms(seed_t)} ms")
    ok = sorted((r for r in rows if r.status == "ok" and r.time_s is not None),
                key=lambda r: r.time_s)
    out.append("")
    out.append(f"{'#':>3} {'iter':>5} {'ms':>10} {'speedup':>8} {'resid':>7} {'orth':>7} "
               f"{'held-out':<13} group / variant")
    for k, r in enumerate(ok[:top], 1):
        sp = f"{seed_t / r.time_s:.2f}x" if seed_t else "-"
        rat = r.ratios or {}
        ood = r.ood_status or "-"
        out.append(f"{k:>3} {r.iteration:>5} {_ms(r.time_s):>10} {sp:>8} "
                   f"{_fmt(rat.get('resid')):>7} {_fmt(rat.get('orth')):>7} {ood:<13} "
                   f"{r.grp}  [{mut.describe(r.params)}]")
    groups: dict[str, list[Row]] = {}
    for r in ok:
        groups.setdefault(r.grp, []).append(r)
    out.append("")
    out.append(f"idea groups with a passing variant: {len(groups)}")
    for g, rs in sorted(groups.items(), key=lambda kv: kv[1][0].time_s):
        out.append(f"  {g:<45} best {_ms(rs[0].time_s):>10} ms  ({len(rs)} passing)")
    fails = [r for r in rows if r.status != "ok"]
    if fails:
        out.append("")
        out.append("failures (newest last, up to 12):")
        for r in fails[-12:]:
            out.append(f"  it {r.iteration:4d} {r.status:<13} {(r.reason or '')[:110]}")
    fin = [r for r in rows if r.ood_status is not None]
    if fin:
        fast = [r for r in fin if seed_t and r.time_s is not None and r.time_s < seed_t]
        bad_fast = [r for r in fast if r.ood_status != "ok"]
        bad = [r for r in fin if r.ood_status != "ok"]
        out.append("")
        out.append(f"held-out re-check: {len(fin)} finalists, {len(bad)} fail; "
                   f"{len(fast)} are faster than the seed and {len(bad_fast)} of those fail "
                   f"held-out inputs")
        for r in sorted(fin, key=lambda r: r.time_s or 0):
            tag = "fast" if r in fast else "    "
            why = f"  ({(r.ood_reason or '')[:90]})" if r.ood_status != "ok" else ""
            out.append(f"  it {r.iteration:4d} {_ms(r.time_s):>10} ms {tag} {r.ood_status:<12} "
                       f"{mut.describe(r.params)}{why}")
    return "\n".join(out)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def plot(store: Store, path: str | Path, run_id: int | None = None) -> Path:
    """PNG of best-time-so-far versus iteration (and every passing time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_id = store.last_run() if run_id is None else run_id
    rows = store.results(run_id) if run_id is not None else []
    xs, ys, bx, by = [], [], [], []
    fx = []
    best = None
    for r in sorted(rows, key=lambda r: r.iteration):
        if r.status == "ok" and r.time_s is not None:
            xs.append(r.iteration)
            ys.append(r.time_s * 1e3)
            best = r.time_s * 1e3 if best is None else min(best, r.time_s * 1e3)
        elif r.status != "ok":
            fx.append(r.iteration)
        if best is not None:
            bx.append(r.iteration)
            by.append(best)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter(xs, ys, s=10, alpha=0.5, label="passing candidate")
    ax.step(bx, by, where="post", color="C3", label="best so far")
    if fx and ys:
        ax.scatter(fx, [max(ys) * 1.05] * len(fx), marker="x", s=12, color="0.5",
                   label="failed (fault / check / verify / ...)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("median launch time (ms, log scale)")
    if ys:
        ax.set_yscale("log")  # slow outliers (strided loop orders) would flatten the rest
    ax.set_title(f"kernels.search run {run_id}: best time vs iteration")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
