"""capqr demo: a checked QR kernel, its exact check, then a buggy kernel caught.

Run: ``python -m capqr.demo`` (CPU only; embedded inputs, no server).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from . import capabilities, runtime

# A "generated" kernel with the classic bug: the store index is off by one
# (``j + 1``), so each row is written one element to the right and the last
# row's last store lands one element past the end of the buffer.  The loads
# stay in bounds: the fault is the store.
BUGGY = """
KERNEL void scale_rows(cap_t src, cap_t dst, int64_t m, int64_t n, float s)
{
    int64_t r = rt_block_idx();
    for (int64_t j = 0; j < n; j++)
        cap_store_f32(dst, r * n + j + 1, s * cap_load_f32(src, r * n + j));
}
"""


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns a process exit code (0: everything behaved)."""
    ap = argparse.ArgumentParser(prog="python -m capqr.demo", description=__doc__)
    ap.add_argument("--m", type=int, default=512, help="rows of each matrix (default 512)")
    ap.add_argument("--n", type=int, default=384, help="columns of each matrix (default 384)")
    ap.add_argument("--batch", type=int, default=4, help="matrices in the batch (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    opts = ap.parse_args(argv)

    from . import kernels

    rng = np.random.default_rng(opts.seed)
    A = rng.standard_normal((opts.batch, opts.m, opts.n)).astype(np.float32)
    print(f"capqr demo: {runtime.threads()} worker threads; "
          f"QR of a batch of {opts.batch} {opts.m}x{opts.n} float32 matrices")
    t0 = time.perf_counter()
    H, tau = kernels.qr(A, variant="blocked")
    t1 = time.perf_counter()
    report = kernels.check(A, H, tau)
    print(f"  blocked Householder QR (checked capabilities): {t1 - t0:.3f} s "
          "(includes compile on first run)")
    print("  " + str(report).replace("\n", "\n  "))
    ok = bool(report.ok)

    print("\nNow a generated kernel with an off-by-one store, on a buffer with canaries:")
    m, n = 8, 16
    src = capabilities.wrap(rng.standard_normal(m * n).astype(np.float32), perms="r",
                            name="src")
    backing = rng.standard_normal(m * n + 64).astype(np.float32)
    before = backing.copy()
    victim = capabilities.wrap(backing[32:32 + m * n], name="rows")
    k = runtime.compile(BUGGY, "scale_rows")
    try:
        runtime.launch(k, [src, victim], args=(m, n, 2.0), grid=m)
        print("  NOT CAUGHT (this is a bug in capqr)")
        ok = False
    except runtime.CapabilityFault as fault:
        print(f"  caught: {fault}")
        print(f"  fault.kernel={fault.kernel!r} block={fault.block} buffer={fault.buffer!r} "
              f"index={fault.index} access={fault.access} reason={fault.reason}")
        # the story above: the store one past the end of 'rows', by the last row's block
        ok = ok and (fault.access, fault.buffer, fault.index) == ("store", "rows", m * n)
    intact = (np.array_equal(backing[:32], before[:32])
              and np.array_equal(backing[32 + m * n:], before[32 + m * n:]))
    print(f"  canaries around the buffer intact: {intact}")
    ok = ok and intact
    print("\ndemo", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
