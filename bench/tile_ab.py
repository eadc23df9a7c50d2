"""The tile update before and after a change, on all cores: three variants of kernels.qr
(checked, float32), one process per variant and round, alternating.

  A  an earlier kernels/src/tile.c (``--old``) without -fno-tree-loop-distribute-patterns
  B  that tile with the flag (today's BASE_CFLAGS)
  C  the checkout's tile.c with the flag

The script writes each variant's tile.c into the checkout before its process starts
and puts the checkout's own text back at the end (also after an error or Ctrl-C), so
run it on a copy that nothing else uses at the same time (the device machine's).  The
old text comes from ``git show REV:kernels/src/tile.c``.  Each process prints, per
shape, the min and median ms of ``--reps`` calls after one untimed call.

    python -m capqr.bench.tile_ab --old /tmp/tile_251cb5e.c --shapes 1:2048,1:4096,8:2048
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..kernels import gen_tile
from . import env_ab

#: CAPQR_CFLAGS that undoes BASE_CFLAGS' -fno-tree-loop-distribute-patterns (the last
#: of two contradicting flags wins).
NO_FLAG = "-march=native -ftree-loop-distribute-patterns"


def run_variant(tile: Path, text: str, cflags: str | None, shapes: str, reps: int) -> str:
    """One process of kernels.qr with ``text`` as the tile source: its printed line
    (bench.env_ab's child: min/median ms per shape and a digest of the factor, which
    a tile that changes only the code's shape leaves equal)."""
    tile.write_text(text)
    return env_ab.run_variant({"CAPQR_CFLAGS": cflags} if cflags else {}, shapes, reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True,
                    help="the earlier tile.c (git show REV:kernels/src/tile.c)")
    ap.add_argument("--shapes", default="1:2048,1:4096,8:2048", help="batch:n,... (n x n)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args(argv)
    tile = gen_tile.path()
    new = tile.read_text()
    old = Path(ns.old).read_text()
    variants = {"A": (old, NO_FLAG), "B": (old, None), "C": (new, None)}
    t0 = time.time()
    try:
        for name, (text, fl) in variants.items():  # builds, and a first look
            line = run_variant(tile, text, fl, "1:256", 1)
            print(f"build {name}: {line} ({time.time() - t0:.0f} s)", flush=True)
        for r in range(ns.rounds):
            for name, (text, fl) in variants.items():
                print(f"round {r} {name}: {run_variant(tile, text, fl, ns.shapes, ns.reps)}",
                      flush=True)
    finally:
        tile.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
