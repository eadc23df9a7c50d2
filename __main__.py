"""``python -m capqr``: the command line (demo, warmup, version)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status."""
    ap = argparse.ArgumentParser(
        prog="python -m capqr",
        description="capqr: checked kernels at raw speed (run a command with --help for "
                    "its options)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("demo", add_help=False,
                   help="checked QR and a buggy kernel caught (CPU only; the same as "
                        "python -m capqr.demo, which takes --help)")
    w = sub.add_parser("warmup", help="compile the kernels kernels.qr uses into the cache "
                                      "($CAPQR_CACHE), in parallel, so first calls are fast")
    w.add_argument("--dtypes", default="float32,float64",
                   help="comma-separated dtypes to build for (default: float32,float64)")
    w.add_argument("--raw", action="store_true",
                   help="also build the unchecked baselines the benchmarks compare against")
    w.add_argument("--jobs", type=int, default=None,
                   help="compilers run at once (default: the worker pool's size)")
    sub.add_parser("version", help="print the installed version and the kernel cache folder")
    ns, rest = ap.parse_known_args(argv)
    if ns.command == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    if rest:
        ap.error(f"unrecognised arguments: {' '.join(rest)}")
    if ns.command == "warmup":
        from .kernels import precompile

        built = precompile([d for d in ns.dtypes.split(",") if d], raw=ns.raw, jobs=ns.jobs,
                           progress=True)
        print(f"{len(built)} kernels ready")
        return 0
    from . import __version__
    from .runtime.build import cache_dir

    print(f"capqr {__version__}; kernel cache {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
