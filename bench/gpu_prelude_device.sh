#!/usr/bin/env bash
# What the checked build's parts cost on a GPU (bench/gpu_prelude_ab.py), under 8 minutes
# on an H100, each part under its own `timeout`, files flat in $OUT (at most 4):
#   machine.txt      nvidia-smi, python and torch versions, cores, load
#   precompile.txt   bench.gpu_precompile (the default plans' kernels, checked and raw)
#   ab.{log,json}    bench.gpu_prelude_ab --variant $VARIANTS (default: all of them): raw, v0, each variant
#                    interleaved run by run, then GPU ms per kernel kind
# Usage: OUT=/some/dir bash bench/gpu_prelude_device.sh, the wheels installed and PYTHONPATH
# set as at the top of bench/device_run.sh.  VARIANTS, SHAPES and REPEAT narrow the run.
set -u
OUT=${OUT:-bench-results/prelude}
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
machine_txt "$OUT/machine.txt"
timeout "${PRECOMPILE_S:-120}" python3 -m capqr.bench.gpu_precompile --reg default \
    > "$OUT/precompile.txt" 2>&1
echo "rc=$?" >> "$OUT/precompile.txt"
tail -2 "$OUT/precompile.txt"
sel=()
[ -n "${SHAPES:-}" ] && sel=(--shapes "$SHAPES")
timeout "${AB_S:-400}" python3 -m capqr.bench.gpu_prelude_ab \
    --variant "${VARIANTS:-no-loop-guards,no-nest-guard,no-barrier-test,no-polls,no-prologue,free-regs}" \
    --repeat "${REPEAT:-5}" ${sel[@]+"${sel[@]}"} --out "$OUT/ab.json" > "$OUT/ab.log" 2>&1
echo "rc=$?" >> "$OUT/ab.log"
cat "$OUT/ab.log"
