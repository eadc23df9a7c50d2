"""Results -> targets, markdown tables (latest.md) and PNG plots, and on request the
benchmark page docs/benchmarks.md.

Everything here is computed from the results dict, so the docs table is
regenerated from data, never typed.  Target statuses are reported, never
asserted: a missed target is printed as "not met" with its number.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on CI / servers
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OVERHEAD_GEOMEAN, OVERHEAD_WORST = 1.10, 1.25
HANDSHAKE_P99_US, MUTATOR_SLOWDOWN = 100.0, 0.05


# -- small formatting helpers -------------------------------------------------

def _fin(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_time(s: float) -> str:
    """Seconds as a short human string (us / ms / s)."""
    if not _fin(s):
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_x(x: Any, digits: int = 2) -> str:
    """A ratio as '1.07x' (or n/a)."""
    return f"{x:.{digits}f}x" if _fin(x) else "n/a"


def fmt_gf(x: Any) -> str:
    return f"{x:.1f}" if _fin(x) else "n/a"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _leaves(d: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) for every leaf of nested dicts/lists."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, d


# -- targets --------------------------------------------------------------------

def _status(ok: bool | None) -> str:
    return "no data" if ok is None else ("met" if ok else "not met")


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Where each benchmark target stands (overhead, speed vs scipy, collector), from ``res``."""
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, value: str, ok: bool | None, detail: str = "") -> None:
        out.append({"target": name, "goal": target, "value": value, "status": _status(ok),
                    "detail": detail})

    summ = res.get("overhead", {}).get("summary", {})
    for key, label in (("all", "all kernels (QR + micro)"), ("qr", "QR kernels")):
        s = summ.get("all") if key == "all" else summ.get("per_family", {}).get("qr")
        if not s or not s.get("n"):
            add(f"checked/raw geomean, {label}", f"<= {OVERHEAD_GEOMEAN:.2f}x", "n/a", None)
            add(f"checked/raw worst, {label}", f"<= {OVERHEAD_WORST:.2f}x", "n/a", None)
            continue
        g, w = s["geomean"], s["worst"]
        add(f"checked/raw geomean, {label}", f"<= {OVERHEAD_GEOMEAN:.2f}x", fmt_x(g, 3),
            g <= OVERHEAD_GEOMEAN if _fin(g) else None,
            f"{s['n']} kernel x size cases; ratio of fastest runs: "
            f"{fmt_x(s.get('geomean_of_min'), 3)}")
        add(f"checked/raw worst, {label}", f"<= {OVERHEAD_WORST:.2f}x", fmt_x(w, 3),
            w <= OVERHEAD_WORST if _fin(w) else None, f"at {s.get('worst_at')}")

    vs = res.get("peers", {}).get("vs_scipy", [])
    for label, sel in (("square n >= 1024", [r for r in vs if r["batch"] == 1 and r["n"] >= 1024]),
                       ("batched shapes", [r for r in vs if r["batch"] > 1])):
        if not sel:
            add(f"best checked QR faster than scipy sgeqrf, {label}", "speedup > 1x", "n/a", None)
            continue
        wins = [r for r in sel if r["speedup"] > 1]
        wins_best = [r for r in sel if _fin(r.get("speedup_best")) and r["speedup_best"] > 1]
        worst = min(sel, key=lambda r: r["speedup"])
        ok, ok_best = len(wins) == len(sel), len(wins_best) == len(sel)
        name = f"best checked QR faster than scipy sgeqrf, {label}"
        detail = (", ".join(f"{r['shape']} {fmt_x(r['speedup'])}" for r in sel)
                  + "; fastest run vs fastest run: "
                  + ", ".join(f"{r['shape']} {fmt_x(r.get('speedup_best'))}" for r in sel))
        value = (f"{len(wins)}/{len(sel)} shapes (fastest runs: {len(wins_best)}/{len(sel)}); "
                 f"min {fmt_x(worst['speedup'])} at {worst['shape']}")
        add(name, "speedup > 1x on every shape", value, ok, detail)
        if ok != ok_best:
            # medians and fastest runs disagree: background load decided it, not the kernels
            out[-1]["status"] = (f"unclear (medians: {_status(ok)}, "
                                 f"fastest runs: {_status(ok_best)})")

    gcb = res.get("gc_bench") if isinstance(res.get("gc_bench"), dict) else {}
    hs = [h for h in gcb.get("handshake", []) if isinstance(h, dict)]
    for h in hs:
        p99 = h.get("handshake_p99_us")
        add(f"collector p99 handshake latency, {h.get('busy_threads')} busy threads",
            f"< {HANDSHAKE_P99_US:.0f} us", f"{p99:.1f} us" if _fin(p99) else "n/a",
            (p99 < HANDSHAKE_P99_US) if _fin(p99) else None, "bench/gc_bench.py")
    col = res.get("overhead", {}).get("collector")
    if not hs:
        p99 = col.get("handshake_p99_us") if col else None
        add("collector p99 handshake latency", f"< {HANDSHAKE_P99_US:.0f} us",
            f"{p99:.1f} us" if _fin(p99) else "n/a",
            (p99 < HANDSHAKE_P99_US) if _fin(p99) else None,
            "gc_stats during the collector section" if col else "")
    tp = gcb.get("throughput") if isinstance(gcb.get("throughput"), dict) else None
    if tp and _fin(tp.get("throughput_ratio")) and tp["throughput_ratio"] > 0:
        slow = 1 / tp["throughput_ratio"] - 1
        add("mutator slowdown, collector running (gc_bench)", f"< {MUTATOR_SLOWDOWN:.0%}",
            f"{slow:+.1%}", slow < MUTATOR_SLOWDOWN,
            f"bench/gc_bench.py, {tp.get('threads')} mutator thread(s)")
    if col and _fin(col.get("ratio")):
        slow = col["ratio"] - 1
        add("mutator slowdown, QR kernel with cycles back to back", f"< {MUTATOR_SLOWDOWN:.0%}",
            f"{slow:+.1%}", slow < MUTATOR_SLOWDOWN,
            f"checked {col['kernel']} {col['size']} on all cores vs collector disabled")
    elif not tp:
        add("mutator slowdown, collector running", f"< {MUTATOR_SLOWDOWN:.0%}", "n/a", None)
    return out


# -- markdown -------------------------------------------------------------------

def _meta_lines(res: dict[str, Any]) -> list[str]:
    m = res.get("meta", {})
    th = m.get("threads", {})
    blas = "; ".join(f"{b.get('internal_api')} {b.get('version')} ({b.get('threading_layer')}, "
                     f"{b.get('num_threads')} threads)" for b in m.get("blas", [])
                     if b.get("user_api") == "blas")
    tb = m.get("torch_blas") or {}
    git = m.get("git", {})
    kind = "QUICK (tiny sizes, 1 repeat: not representative)" if res.get("quick") else "full"
    commit = (git.get("commit") or "?")[:10]
    lines = [
        f"- Run: {m.get('datetime_utc')} on `{m.get('host')}` ({m.get('cpu_model')}, "
        f"{th.get('cpu_count')} cores), {kind} run, {res.get('elapsed_s', float('nan')):.0f} s; "
        f"commit `{commit}`{' (+uncommitted changes)' if git.get('dirty') else ''}",
        f"- Threads: capqr workers {th.get('capqr_workers')} (QR: `parallel` spreads one "
        "matrix over column tiles on all workers; the other variants run one block per "
        f"matrix), OpenBLAS {blas or 'n/a'}, torch {th.get('torch')} "
        f"(BLAS {tb.get('BLAS_INFO', '?')})",
        f"- Kernel compiler: {(str(m.get('compiler', {}).get('cc', '?')).split('|') + ['?'])[1]} "
        f"flags `{' '.join(m.get('compiler', {}).get('kernel_cflags', []))}` "
        "(same for checked and raw)",
        f"- Load average at start/end: {m.get('loadavg_start')} / {m.get('loadavg_end')}; "
        f"concurrent load: {m.get('concurrent_load', 'possible')}",
    ]
    return lines


def _overhead_md(ov: dict[str, Any]) -> list[str]:
    rows = ov.get("rows", [])
    if not rows:
        return ["_Overhead: not run._"]
    out = [f"### Overhead: checked vs raw (same source, interleaved, median of >= "
           f"{ov['repeats']} samples)",
           ""]
    body = []
    for r in rows:
        c, rw = r["checked"], r["raw"]
        body.append([f"{r['family']}/{r['kernel']}", r["size"], fmt_time(rw["median_s"]),
                     fmt_time(c["median_s"]), fmt_x(r["ratio"], 3),
                     f"{fmt_x(c['min_s'] / rw['max_s'])}..{fmt_x(c['max_s'] / rw['min_s'])}",
                     fmt_x(r["poll_ratio"])])
    out += _table(["kernel", "size", "raw", "checked", "checked/raw",
                   "range (min/max..max/min)", "raw_poll/raw"], body)
    out += ["", "raw_poll = `runtime.compile(mode=\"raw_poll\")`: the raw build plus the "
            "pollchecks the instrumenter places, no bounds checks; raw_poll/raw is the cost of "
            "safepoint polling alone. Range column: fastest checked / slowest raw .. slowest "
            "checked / fastest raw (wide ranges = noisy samples).", ""]
    s = ov.get("summary", {})
    named = [(k, v) for k, v in s.get("per_kernel", {}).items()]
    named += [(f"**{fam} (all)**", v) for fam, v in s.get("per_family", {}).items()]
    if s.get("all"):
        named.append(("**all**", s["all"]))
    srows = [[k, str(v["n"]), fmt_x(v["geomean"], 3), f"{fmt_x(v['worst'], 3)} ({v['worst_at']})",
              fmt_x(v.get("geomean_of_min"), 3), fmt_x(v["poll_geomean"])] for k, v in named]
    out += _table(["kernel", "cases", "geomean checked/raw", "worst",
                   "geomean min(checked)/min(raw)", "geomean raw_poll/raw"], srows)
    col = ov.get("collector")
    if col:
        out += ["", f"Collector: checked {col['kernel']} {col['size']} with cycles back to back "
                f"{fmt_time(col['running']['median_s'])} vs disabled "
                f"{fmt_time(col['disabled']['median_s'])}: **{fmt_x(col['ratio'], 3)}** "
                f"({col['cycles_during_bench']} cycles; handshake p50/p99/max "
                f"{col['handshake_p50_us']:.1f}/{col['handshake_p99_us']:.1f}/"
                f"{col['handshake_max_us']:.1f} us). {col['note']}."]
    return out


def _peers_md(pe: dict[str, Any]) -> list[str]:
    rows = pe.get("rows", [])
    if not rows:
        return ["_Peers: not run._"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    sg = pe.get("sgemm", {})
    out = [f"### QR speed, {pe.get('dtype')}, GF/s ({pe.get('flops_formula')}; median of "
           f"{pe['repeats_range'][0]}..{pe['repeats_range'][1]} runs)", "",
           f"Practical ceiling: numpy float32 matmul (OpenBLAS sgemm) at n={sg.get('n')}: "
           f"**{fmt_gf(sg.get('gflops'))} GF/s** (best {fmt_gf(sg.get('gflops_best'))}).", ""]
    vs = {r["shape"]: r for r in pe.get("vs_scipy", [])}
    body = []
    for label in dict.fromkeys(r["shape"] for r in rows):
        sel = {r["impl"]: r for r in rows if r["shape"] == label}
        cells = []
        for i in impls:
            r = sel.get(i)
            if r is None:
                cells.append("")
            elif "error" in r:
                cells.append("error")
            elif "skipped" in r:
                cells.append("-")
            else:
                mark = " (fails check)" if r.get("check_passed") is False else ""
                cells.append(fmt_gf(r.get("gflops")) + mark)
        v = vs.get(label)
        reps = sorted({r.get("repeats") for r in sel.values() if r.get("repeats")})
        best = v["gflops"] if v else None
        cells += [f"{fmt_x(v['speedup'])} ({v['best'].split(':', 1)[1]})" if v else "n/a",
                  f"{best / sg['gflops']:.0%}" if v and _fin(sg.get("gflops")) else "n/a",
                  "/".join(str(x) for x in reps)]
        body.append([label] + cells)
    out += _table(["shape"] + impls + ["best capqr / scipy", "best capqr % sgemm", "runs"], body)
    lim = pe.get("max_flops") or {}
    if lim:
        out.append("`-`: skipped to fit the time budget: " + ", ".join(
            f"{k} above {v:.0e} flops" for k, v in lim.items()) + ".")
    absent = {r["impl"]: r["skipped"] for r in rows if "not installed" in r.get("skipped", "")}
    if absent:
        out.append("Not run: " + ", ".join(f"{k} ({v})" for k, v in absent.items()) + ".")
    warm = [r["shape"] for r in rows if r.get("warmup_counted")]
    if warm:
        out.append("Shapes whose round of all implementations took > "
                   f"{pe.get('long_round_s')} s count the first run as a sample (no separate "
                   f"warm-up): {', '.join(dict.fromkeys(warm))}.")
    capped = list(dict.fromkeys(r["shape"] for r in rows if r.get("capped")))
    out += ["", "capqr columns are checked builds called through `kernels.qr` (including its "
            "input copy); shapes are (batch, n) with n x n matrices. OpenBLAS's threaded "
            "sgeqrf (scipy, numpy) slows down far more than single-threaded-per-matrix "
            "kernels when other processes share the 2 cores, so the targets table also "
            "compares fastest runs."]
    if capped:
        out.append(f"Repeats capped below the maximum to fit the time budget: {', '.join(capped)}.")
    errs = [f"{r['impl']} at {r['shape']}: {r['error']}" for r in rows if "error" in r]
    if errs:
        out += ["", "Errors: " + "; ".join(errs)]
    return out


def _gc_bench_md(gcb: Any) -> list[str]:
    if gcb is None:
        return []
    out = ["### Collector benchmark (bench/gc_bench.py)", ""]
    if not isinstance(gcb, dict):
        return out + [f"`{str(gcb)[:300]}`"]
    body = [[p, f"{v:.4g}" if _fin(v) else str(v)] for p, v in _leaves(gcb)
            if not isinstance(v, (list, dict)) and "sample" not in p.lower()][:40]
    return out + _table(["metric", "value"], body)


def _gpu_md(gpu: list[dict[str, Any]]) -> list[str]:
    if not gpu:
        return []
    out = []
    for g in gpu:
        when = "measured in this run" if g.get("_rerun") else "not re-run here"
        out += [f"### GPU lane ({g.get('device')}, {g.get('date')}; from "
                f"`{g.get('_file')}`, {when})", ""]
        body = [[f"({r['batch']},{r['n']})", f"{r.get('checked_ms', float('nan')):.3f}",
                 f"{r.get('raw_ms', float('nan')):.3f}", fmt_x(r.get("overhead"), 3),
                 f"{r['torch_geqrf_ms']:.3f}" if _fin(r.get("torch_geqrf_ms")) else "n/a",
                 fmt_x(r.get("speedup_vs_torch")),
                 f"{r.get('best_peer')} {r['best_peer_ms']:.3f}"
                 if _fin(r.get("best_peer_ms")) else "n/a",
                 fmt_x(r.get("speedup_vs_best_peer")),
                 f"{r['checked_tflops']:.2f}" if _fin(r.get("checked_tflops")) else "n/a"]
                for r in g.get("shapes", [])]
        out += _table(["shape", "checked ms", "raw ms", "checked/raw", "torch.geqrf ms",
                       "speedup vs torch", "best peer ms", "speedup vs best peer",
                       "checked TFLOP/s"], body)
        ceil = g.get("ceilings_tflops") or {}
        out += [f"Geomean checked/raw {fmt_x(g.get('geomean_overhead'), 3)}"
                + (f", geomean speedup vs torch.geqrf {fmt_x(g['geomean_speedup_vs_torch'])}"
                   if _fin(g.get("geomean_speedup_vs_torch")) else "")
                + (f", vs the best peer {fmt_x(g['geomean_speedup_vs_best_peer'])}"
                   if _fin(g.get("geomean_speedup_vs_best_peer")) else "")
                + (f"; ceilings: fp32 SIMT {ceil['fp32_simt']} TFLOP/s, fp16 tensor cores "
                   f"{ceil['fp16_tensor']} TFLOP/s ({ceil.get('source', '')})" if ceil else ""),
                ""]
    return out


def markdown(res: dict[str, Any], plots: list[Path], link_from: Path = REPO) -> str:
    """The tables docs/benchmarks.md embeds (between its bench markers); plot links are
    relative to ``link_from``."""
    lines = ["<!-- generated by `python -m capqr.bench`; do not edit by hand -->", ""]
    lines += _meta_lines(res) + ["", "### Targets", ""]
    lines += _table(["target", "goal", "measured", "status", "detail"],
                    [[t["target"], t["goal"], t["value"], f"**{t['status']}**", t["detail"]]
                     for t in res.get("targets", [])])
    lines += [""] + _peers_md(res.get("peers", {})) + [""] + _overhead_md(res.get("overhead", {}))
    lines += [""] + _gc_bench_md(res.get("gc_bench")) + [""] + _gpu_md(res.get("gpu", []))
    if plots:
        lines += ["", "Plots: " + ", ".join(f"[{p.stem}]({_rel(p, link_from)})"
                                            for p in plots)]
    return "\n".join(lines).rstrip() + "\n"


def _rel(p: Path, start: Path = REPO) -> str:
    """Path relative to ``start`` (the repo root by default), else absolute."""
    try:
        return os.path.relpath(p.resolve(), start)
    except ValueError:
        return str(p)


# -- plots ----------------------------------------------------------------------

def plot_overhead(ov: dict[str, Any], path: Path) -> Path | None:
    """Bar chart of checked/raw and raw_poll/raw per case, target lines at 1.10 and 1.25."""
    rows = ov.get("rows", [])
    if not rows:
        return None
    labels = [f"{r['kernel']} {r['size']}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["ratio"] for r in rows], height=0.4, label="checked / raw")
    ax.barh([i - 0.2 for i in y], [r["poll_ratio"] for r in rows], height=0.4,
            label="raw_poll / raw", alpha=0.6)
    # log scale: ratios below and above 1 get equal room (0.5x and 2x are as far from 1)
    ax.set_xscale("log")
    ticks = [0.5, 0.8, 1.0, 1.1, 1.25, 1.5, 2, 4, 8, 16, 32]
    hi = max([r["ratio"] for r in rows] + [r["poll_ratio"] for r in rows] + [1.3])
    lo = min([r["ratio"] for r in rows] + [r["poll_ratio"] for r in rows] + [0.9])
    ax.set_xlim(lo * 0.9, hi * 1.1)
    ax.set_xticks([t for t in ticks if lo * 0.9 <= t <= hi * 1.1])
    ax.set_xticklabels([f"{t:g}" for t in ticks if lo * 0.9 <= t <= hi * 1.1], fontsize=7)
    ax.minorticks_off()
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(OVERHEAD_GEOMEAN, color="g", ls="--", lw=0.8, label="geomean target 1.10")
    ax.axvline(OVERHEAD_WORST, color="r", ls="--", lw=0.8, label="worst target 1.25")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time ratio vs raw, log scale (lower is better)")
    ax.set_title("capqr: checked vs raw, same source")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_peers(pe: dict[str, Any], path: Path) -> Path | None:
    """GF/s of every implementation: square sizes (lines) and batched shapes (bars)."""
    rows = [r for r in pe.get("rows", []) if _fin(r.get("gflops"))]
    if not rows:
        return None
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i in impls:
        sq = sorted((r["n"], r["gflops"]) for r in rows if r["impl"] == i and r["batch"] == 1)
        if sq:
            a1.plot([n for n, _ in sq], [g for _, g in sq], marker="o", label=i)
    sg = pe.get("sgemm", {}).get("gflops")
    for ax in (a1, a2):
        if _fin(sg):
            ax.axhline(sg, color="k", ls=":", lw=0.8, label="sgemm ceiling")
        ax.set_ylabel("GF/s (float32)")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("n (square, one matrix)")
    a1.set_title("QR, square")
    a1.legend(fontsize=7)
    shapes = list(dict.fromkeys(r["shape"] for r in rows if r["batch"] > 1))
    w = 0.8 / max(1, len(impls))
    for k, i in enumerate(impls):
        vals = {r["shape"]: r["gflops"] for r in rows if r["impl"] == i and r["batch"] > 1}
        a2.bar([j + k * w for j in range(len(shapes))], [vals.get(s, 0.0) for s in shapes],
               width=w, label=i)
    a2.set_xticks([j + 0.4 - w / 2 for j in range(len(shapes))])
    a2.set_xticklabels(shapes, fontsize=7, rotation=30)
    a2.set_title("QR, batched (batch, n)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- GPU results (bench/gpu_bench.py) ----------------------------------------------

def load_gpu_file(path: Path, rerun: bool = False) -> list[dict[str, Any]]:
    """[the GPU result in ``path``] (``rerun``: measured by this run), or [] if unreadable."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(d, dict) or "shapes" not in d:
        return []  # not a gpu_bench result
    d["_file"], d["_rerun"] = _rel(path), rerun
    return [d]


def load_gpu(results_dir: Path) -> list[dict[str, Any]]:
    """The newest full-run bench/results/gpu-*.json (written by bench/gpu_bench.py), if any."""
    runs = [r for f in results_dir.glob("gpu-*.json") if not f.stem.endswith("-quick")
            for r in load_gpu_file(f)]
    return [max(runs, key=lambda r: r.get("date", ""))] if runs else []


#: The committed benchmark page and where its plots live (both tracked: written only
#: by ``update_docs``).
DOCS_PAGE = REPO / "docs" / "benchmarks.md"
DOCS_PLOTS = REPO / "bench" / "results"


def _plots(res: dict[str, Any], out_dir: Path) -> list[Path]:
    return [p for p in (plot_overhead(res.get("overhead", {}), out_dir / "overhead.png"),
                        plot_peers(res.get("peers", {}), out_dir / "qr_speed.png")) if p]


def write(res: dict[str, Any], out_dir: Path, update_docs: bool = False) -> dict[str, Path]:
    """Targets into ``res``, then PNGs, latest.md and the JSON under ``out_dir``; with
    ``update_docs`` also the tables into docs/benchmarks.md and its plots (tracked files)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    res["targets"] = targets(res)
    plots = _plots(res, out_dir)
    md = out_dir / "latest.md"
    text = markdown(res, plots)
    md.write_text(text)
    docs: dict[str, Path] = {}
    if update_docs:
        doc_plots = _plots(res, DOCS_PLOTS) if DOCS_PLOTS.resolve() != out_dir.resolve() \
            else plots
        embed(markdown(res, doc_plots, DOCS_PAGE.parent), DOCS_PAGE)
        docs["docs"] = DOCS_PAGE
    m = res.get("meta", {})
    # quick runs get their own name so a smoke run never replaces a full result
    suffix = "-quick" if res.get("quick") else ""
    js = out_dir / f"{m.get('host', 'host')}-{m.get('date', 'date')}{suffix}.json"
    js.write_text(json.dumps(res, indent=1, default=_json_default) + "\n")
    return {"json": js, "markdown": md, **{p.stem: p for p in plots}, **docs}


BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"


def embed(text: str, page: Path) -> bool:
    """Replace ``page``'s text between the bench markers; False if it has none."""
    if not page.exists():
        return False
    doc = page.read_text()
    i, j = doc.find(BEGIN), doc.find(END)
    if i < 0 or j < i:
        return False
    page.write_text(doc[:i + len(BEGIN)] + "\n" + text + doc[j:])
    return True


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def main(argv: list[str] | None = None) -> None:
    """``python -m capqr.bench.report RESULT.json [OUT_DIR]``: regenerate latest.md and plots."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m capqr.bench.report",
                                 description="Regenerate latest.md, the plots and the JSON "
                                             "from a saved `python -m capqr.bench` result.")
    ap.add_argument("result", type=Path, help="a JSON result written by python -m capqr.bench")
    ap.add_argument("out_dir", type=Path, nargs="?", default=None,
                    help="output directory (default: the result's directory)")
    ap.add_argument("--update-docs", action="store_true",
                    help="also write the tables into docs/benchmarks.md and its plots into "
                         "bench/results/ (tracked files)")
    ns = ap.parse_args(argv)
    res = json.loads(ns.result.read_text())
    paths = write(res, ns.out_dir or ns.result.parent, ns.update_docs)
    print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
