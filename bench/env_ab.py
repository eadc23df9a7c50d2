"""kernels.qr under different environments: kernel compiler flags ($CAPQR_CFLAGS), the
worker pool ($CAPQR_THREADS).  One process per variant and round, alternating, so load
drifts spread over the variants.

Each process prints, per shape, the min and median ms of ``--reps`` calls after one
untimed call, and a digest of the factor's bytes: flags that only change code generation
(vector width, unrolling) and the pool size must leave every digest equal, since every
multiply-add in the kernels is an explicit fmaf(), -ffp-contract=off holds for all flags,
and no path's result depends on the worker count.

    python -m capqr.bench.env_ab --variant "256=CAPQR_CFLAGS=-march=native" \\
        --variant "512=CAPQR_CFLAGS=-march=native -mprefer-vector-width=512" \\
        --variant "15w=CAPQR_THREADS=15" --shapes 1:2048,65536x64
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CHILD = r"""
import hashlib, statistics, sys, time
import numpy as np
import capqr.kernels as K
from capqr import runtime
out = [f"workers={runtime.threads()}"]
for spec in sys.argv[1].split(","):
    rng = np.random.default_rng(0)
    shape, _, nb = spec.partition("/")
    kw = {"nb": int(nb)} if nb else {}
    if "x" in shape:
        m, n = (int(x) for x in shape.split("x"))
        a = rng.standard_normal((m, n)).astype(np.float32)
    else:
        b, n = (int(x) for x in shape.split(":"))
        a = rng.standard_normal((b, n, n)).astype(np.float32)
        a = a[0] if b == 1 else a
    h, tau = K.qr(a, **kw)
    digest = hashlib.sha256(np.ascontiguousarray(h).tobytes()).hexdigest()[:8]
    ts = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter(); K.qr(a, **kw); ts.append(time.perf_counter() - t)
    out.append(f"{spec}={min(ts) * 1e3:.1f}/{statistics.median(ts) * 1e3:.1f}#{digest}")
print(" ".join(out))
"""


def parse_env(spec: str) -> dict[str, str]:
    """``VAR=VALUE;VAR=VALUE`` as a dict (a value may hold spaces and '=')."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        var, sep, value = part.partition("=")
        if not sep or not var.isidentifier():
            raise SystemExit(f"env_ab: {part!r} is not VAR=VALUE")
        out[var] = value
    return out


def run_variant(env_vars: dict[str, str], shapes: str, reps: int) -> str:
    """One process of kernels.qr with ``env_vars`` set: its printed line."""
    env = dict(os.environ, CAPQR_QUIET="1", **env_vars)
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, shapes, str(reps)], env=env,
                           capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "timed out after 600 s"
    return r.stdout.strip() or f"rc={r.returncode}: " + r.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME=VAR=VALUE[;VAR=VALUE...] (repeatable)")
    ap.add_argument("--shapes", default="1:1024,1:2048,1:4096",
                    help="batch:n (n x n) or MxN, comma-separated; /NB after one sets "
                         "kernels.qr's panel width nb")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args(argv)
    variants = {}
    for v in ns.variant:
        name, _, spec = v.partition("=")
        variants[name] = parse_env(spec)
    t0 = time.time()
    for name, env in variants.items():  # builds, and a first look
        print(f"build {name} ({env}): {run_variant(env, '1:256', 1)} ({time.time() - t0:.0f} s)",
              flush=True)
    for r in range(ns.rounds):
        for name, env in variants.items():
            print(f"round {r} {name}: {run_variant(env, ns.shapes, ns.reps)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
