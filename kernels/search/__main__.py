"""Command line of kernels.search (``python -m capqr.kernels.search --help``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CONTRACT = """\
kernel contract (search candidates and submissions):
  KERNEL void NAME(cap_t a, cap_t tau, cap_t work,
                   int64_t batch, int64_t m, int64_t n [, int64_t nb])
  a     batch x m x n row-major float32 (float16 if the kernel reads a with
        cap_load_f16/cap_offset_f16), overwritten by LAPACK geqrf compact form
        (R on/above the diagonal, Householder vectors below, unit diagonal implicit)
  tau   batch x min(m,n) float32
  work  float32 scratch of kernels.qr.work_size(grid, m, n, nb) elements:
        grid*(m*nb + nb*nb + nb), or grid*n when the kernel takes no nb
  grid  = batch (one block per matrix: rt_block_idx())
  The gate: verify -> compile checked -> fresh random + stress inputs ->
  kernels.check (LAPACK ratios and contest bounds) -> median launch time;
  submit also re-checks on held-out shapes/value classes.
"""


def _shape(s: str) -> tuple[int, int]:
    try:
        m, n = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be MxN, e.g. 640x512, not {s!r}") from None
    if m < 1 or n < 1:
        raise argparse.ArgumentTypeError("shape dimensions must be positive")
    return m, n


def _search_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m capqr.kernels.search",
        description="Search QR kernel variants (also: `report`, `submit FILE`; see "
                    "`python -m capqr.kernels.search submit --help`).",
        epilog=CONTRACT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=_shape, default=(640, 512), help="MxN (default 640x512)")
    p.add_argument("--batch", type=int, default=8, help="matrices per launch (default 8)")
    p.add_argument("--budget", type=int, default=200, help="candidates to evaluate")
    p.add_argument("--seed", type=int, default=0, help="RNG seed of the search")
    p.add_argument("--db", default="search.db", help="sqlite results file (default search.db)")
    p.add_argument("--workers", type=int, default=2, help="local dask worker processes")
    p.add_argument("--scheduler", default=None, help="address of a running dask scheduler")
    p.add_argument("--no-dask", action="store_true", help="evaluate in this process (debug)")
    p.add_argument("--threads", type=int, default=0,
                   help="kernel threads per evaluation (default cores // workers)")
    p.add_argument("--bug-rate", type=float, default=0.15,
                   help="chance a child also gets a risky, bug-like edit")
    p.add_argument("--struct-rate", type=float, default=0.15,
                   help="chance a child gets/loses an algorithmic edit")
    p.add_argument("--finalists", type=int, default=6,
                   help="idea groups whose best is re-checked on held-out inputs")
    p.add_argument("--reps", type=int, default=3, help="timed launches per candidate (min)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="per-launch deadline (s) until the seed's time is known")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m capqr.kernels.search report",
                                description="Print the leaderboard of a run; write the plot.")
    p.add_argument("--db", default="search.db", help="sqlite results file (default search.db)")
    p.add_argument("--run", type=int, default=None, help="run id (default: the newest)")
    p.add_argument("--top", type=int, default=15, help="leaderboard rows (default 15)")
    p.add_argument("--plot", default=None, help="PNG path (default: <db stem>_progress.png)")
    return p


def _submit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m capqr.kernels.search submit",
        description="Run the search gate (and the held-out re-check) on a kernel source file "
                    "and print a verdict; exit status 0 on PASS, 1 on FAIL.",
        epilog=CONTRACT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="kernel source in the capqr dialect")
    p.add_argument("--name", default=None, help="KERNEL to use (default: the only one)")
    p.add_argument("--shape", type=_shape, default=(640, 512), help="MxN (default 640x512)")
    p.add_argument("--batch", type=int, default=8, help="matrices per launch (default 8)")
    p.add_argument("--nb", type=int, default=32, help="value passed as nb (if taken)")
    p.add_argument("--storage", choices=("f32", "f16"), default=None,
                   help="dtype of a (default: detected from the source)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-launch deadline (s)")
    p.add_argument("--no-baseline", action="store_true", help="skip timing the seed kernel")
    p.add_argument("--in-process", action="store_true", help="no child process (debug)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        from .report import leaderboard, plot
        from .store import Store

        a = _report_parser().parse_args(argv[1:])
        if not Path(a.db).exists():
            print(f"no database at {a.db}", file=sys.stderr)
            return 2
        with Store(a.db) as st:
            print(leaderboard(st, a.run, a.top))
            out = plot(st, a.plot or Path(a.db).with_name(Path(a.db).stem + "_progress.png"),
                       a.run)
        print(f"\nplot: {out}")
        return 0
    if argv and argv[0] == "submit":
        from .submit import submit_file

        a = _submit_parser().parse_args(argv[1:])
        m, n = a.shape
        v = submit_file(a.file, a.name, m=m, n=n, batch=a.batch, nb=a.nb, storage=a.storage,
                        timeout=a.timeout, baseline=not a.no_baseline,
                        isolated=not a.in_process)
        print(v)
        return 0 if v.passed else 1
    from .loop import SearchConfig, main_summary, search

    a = _search_parser().parse_args(argv)
    m, n = a.shape
    cfg = SearchConfig(m=m, n=n, batch=a.batch, budget=a.budget, seed=a.seed, db=a.db,
                       use_dask=not a.no_dask, scheduler=a.scheduler, workers=a.workers,
                       threads=a.threads, bug_rate=a.bug_rate, struct_rate=a.struct_rate,
                       finalists=a.finalists, reps=a.reps, timeout=a.timeout)
    res = search(cfg, quiet=a.quiet)
    print(main_summary(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
