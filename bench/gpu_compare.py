"""Two bench.gpu_bench runs of one plan option, off against on.

``python -m capqr.bench.gpu_compare OFF.json ON.json [--out FILE]``: OFF.json from
``gpu_bench`` with an option off (``--mma-update off``, ``--panel-reg off``), ON.json with
it on (same device, same session: bench/gpu_mma_update_device.sh and
bench/gpu_reg_device.sh run both).  Per shape: checked and raw ms of each, off/on
(above 1: on is faster), the panel and update kernels' GPU ms (the profiled checked
run), whether the on run passed kernels.check and gave checked equal to raw bit for
bit; geomeans; the registers of the on run's kernels.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .timing import geomean


def _by_shape(res: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r["batch"], r["n"]): r for r in res["shapes"]}


def compare(off: dict[str, Any], on: dict[str, Any]) -> str:
    """Text table of the shapes both runs measured."""
    a, b = _by_shape(off), _by_shape(on)
    shapes = [s for s in a if s in b]
    head = (f"{'shape':>12} {'checked off':>11} {'on':>9} {'off/on':>7} {'raw off':>9} "
            f"{'on':>9} {'off/on':>7} {'panel off':>10} {'on':>9} {'update off':>10} {'on':>9} "
            f"{'check':>6} {'c==r':>5}")
    lines = [f"device {on.get('device')}, git {on.get('git')}; mma_min_rows "
             f"{b[shapes[0]].get('mma_min_rows') if shapes else '-'}", head]
    prof = ("panel_gpu_ms", "update_gpu_ms")
    ratios: dict[str, list[float]] = {"checked": [], "raw": []}
    for s in shapes:
        x, y = a[s], b[s]
        cells = []
        for kind, width in (("checked", 11), ("raw", 9)):
            ms_off, ms_on = x[f"{kind}_ms"], y[f"{kind}_ms"]
            ratios[kind].append(ms_off / ms_on)
            cells.append(f"{ms_off:{width}.3f} {ms_on:9.3f} {ms_off / ms_on:6.3f}x")
        upd = [r.get("profile_checked", {}).get(p) for p in prof for r in (x, y)]
        lines.append(f"{f'({s[0]},{s[1]})':>12} {cells[0]} {cells[1]} "
                     + " ".join(f"{u:10.3f}" if u is not None else f"{'-':>10}" for u in upd)
                     + f" {str(y.get('check_ok')):>6} {str(y.get('checked_equals_raw')):>5}")
    if shapes:
        lines.append(f"geomean off/on: checked {geomean(ratios['checked']):.3f}x, "
                     f"raw {geomean(ratios['raw']):.3f}x over {len(shapes)} shapes")
    regs = {}
    for s in shapes:
        for kind in ("checked", "raw"):
            for k, v in b[s].get(f"{kind}_registers", {}).items():
                regs[f"{k} {kind}"] = v
    if regs:
        lines.append("registers: " + ", ".join(f"{k} {v}" for k, v in sorted(regs.items())))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m capqr.bench.gpu_compare",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("off", help="gpu_bench JSON with the option off")
    ap.add_argument("on", help="gpu_bench JSON with the option on")
    ap.add_argument("--out", default="", help="write the table here too")
    ns = ap.parse_args(argv)
    text = compare(*(json.loads(Path(p).read_text()) for p in (ns.off, ns.on)))
    if ns.out:
        Path(ns.out).write_text(text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
