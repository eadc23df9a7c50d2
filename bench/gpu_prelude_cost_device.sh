#!/usr/bin/env bash
# What the checked build's prelude costs, part by part: the same shapes timed with
# runtime/cuda/prelude.cuh edited in this (device) copy, one variant after another,
# each variant's kernels compiled by bench.gpu_precompile before its gpu_bench run.
#   v0   the prelude as committed
#   v1   v0 without the __rt_bfault test after every block barrier (rt_sync_threads,
#        rt_block_all): a faulted block's survivors run on to their next poll
#   v2   v1 with RT_POLL / RT_POLL_NOW compiled out (measurement only: no cancel)
#   v3   v2 with RT_PROLOGUE reading the record in every thread, without its barrier
#        (measurement only: the fault paths may see __rt_bseq unset)
# Files in $OUT: v0..v3.log and .json (gpu_bench --peers "", per-kernel checked/raw ms).
# The prelude is restored at the end.  Usage: OUT=dir bash bench/gpu_prelude_cost_device.sh
set -u
OUT=${OUT:-bench-results/prelude-cost}
SHAPES=${SHAPES:-40x176,640x512,8x2048}
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
P=runtime/cuda/prelude.cuh
cp "$P" "$OUT/.prelude.orig"
variant() {
    timeout "${PRECOMPILE_S:-90}" python3 -m capqr.bench.gpu_precompile > /dev/null 2>&1
    timeout "${BENCH_S:-100}" python3 -m capqr.bench.gpu_bench --peers "" --check-matrices 8 --repeat 5 \
        --repeat-large 3 --shapes "$SHAPES" --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1
    echo "rc=$?" >> "$OUT/$1.log"
    echo "== $1"; grep -E "^\(|by kernel|geomean checked" "$OUT/$1.log"
}
variant v0
sed -i '/^    if (__rt_bfault) asm volatile("exit;");/d' "$P"
variant v1
sed -i 's/^#define RT_POLL(pc) rt_poll(pc)$/#define RT_POLL(pc) ((void)(pc))/; s/^#define RT_POLL_NOW() rt_poll_slow() .*$/#define RT_POLL_NOW() ((void)0)/' "$P"
variant v2
python3 - "$P" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
i = s.index("#define RT_PROLOGUE(seq, launch)")
j = s.index("} while (0)", i) + len("} while (0)")
s = s[:i] + ("#define RT_PROLOGUE(seq, launch) do { if (threadIdx.x == 0) { __rt_bseq = (seq); "
             "__rt_blaunch = (launch); } if (*(volatile int *)&(seq)->flag | "
             "*(volatile int *)&(seq)->cancel) return; } while (0)") + s[j:]
open(p, "w").write(s)
PY
variant v3
cp "$OUT/.prelude.orig" "$P" && rm "$OUT/.prelude.orig"
