"""Throughput of ``rt_warp_mma_tf32`` and ``rt_warp_mma_f32``, checked and raw.

``python -m capqr.bench.gpu_mma [--blocks 528] [--iters 256] [--out FILE]``: every
warp of every block (128 threads) accumulates A[16x64] B[64x16] into its own
16 x 16 tile of shared memory per round, ``iters`` rounds: eight tf32 calls
(k = 8 each) or one fp32-accurate call (k = 64, three tf32 MMAs per step);
CUDA events around each launch (median of 5).  It measures the per-call checks
(lane agreement, tile ranges, alignment: checked vs raw) and the accumulator's
round trip through shared memory at every call, against the H200's dense tf32
tensor-core rate (about 400 TFLOP/s) and its fp32 SIMT rate (about 50).
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

MMA_SRC = """
KERNEL void mma_loop(cap_t out, int64_t iters)
{
    float smem_a[4096];
    float smem_b[4096];
    float smem_c[1024];
    rt_require_block_dim(128);
    int64_t t = rt_thread_idx();
    for (int64_t i = t; i < 4096; i += 128) {
        smem_a[i] = (float)(i % 7) * 0.125f;
        smem_b[i] = (float)(i % 5) * 0.25f;
    }
    for (int64_t i = t; i < 1024; i += 128)
        smem_c[i] = 0.0f;
    rt_sync_threads();
    int64_t w = t / 32;
    for (int64_t it = 0; it < iters; it++)
        for (int64_t k = 0; k < 8; k++)
            rt_warp_mma_tf32(smem_c, w * 256, 16, smem_a, w * 1024 + k * 128, 8,
                             smem_b, w * 1024 + k * 128, 16);
    rt_sync_threads();
    for (int64_t i = t; i < 1024; i += 128)
        cap_store_f32(out, rt_block_idx() * 1024 + i, smem_c[i]);
}
"""

#: the same accumulation with rt_warp_mma_f32: one call per round, k = 64
MMA_F32_SRC = MMA_SRC.replace("mma_loop", "mma32_loop").replace(
    """        for (int64_t k = 0; k < 8; k++)
            rt_warp_mma_tf32(smem_c, w * 256, 16, smem_a, w * 1024 + k * 128, 8,
                             smem_b, w * 1024 + k * 128, 16);""",
    """        rt_warp_mma_f32(smem_c, w * 256, 16, smem_a, w * 1024, 64,
                        smem_b, w * 1024, 16, 64);""")

def run(blocks: int, iters: int, repeat: int = 5) -> dict:
    from ..runtime import cuda

    out = cuda.alloc_device(blocks * 1024, np.float32, name="out")
    rows = []
    # both: per warp and round, C[16x16] += A[16x64] B[64x16] (fp32 flops counted once;
    # rt_warp_mma_f32 runs three tf32 MMAs for each)
    flops = blocks * 4 * iters * (2 * 16 * 16 * 64)
    for name, src, fn in (("rt_warp_mma_tf32", MMA_SRC, "mma_loop"),
                          ("rt_warp_mma_f32", MMA_F32_SRC, "mma32_loop")):
        for checked in (True, False):
            k = cuda.compile(src, fn, checked=checked)
            ms = cuda.time_launch(k, [out], args=(iters,), grid=blocks, block=128,
                                  repeat=repeat, warmup=1)
            med = statistics.median(ms)
            rows.append({"builtin": name, "checked": checked, "ms": med, "samples_ms": ms,
                         "tflops": flops / med / 1e9, "registers": k.registers()})
            print(f"{name:16s} {'checked' if checked else 'raw    '}: {med:8.3f} ms "
                  f"{flops / med / 1e9:7.2f} TFLOP/s ({k.registers()} registers)", flush=True)
    out.free()
    return {"blocks": blocks, "iters": iters, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=528, help="thread blocks per launch")
    ap.add_argument("--iters", type=int, default=256, help="mma loop iterations per warp")
    ap.add_argument("--out", default=None, help="write the results to this JSON file")
    ns = ap.parse_args(argv)
    res = run(ns.blocks, ns.iters)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
