#!/usr/bin/env bash
# The tensor-core trailing update (kernels.gpu.MMA_UPDATE, kernels/gpu/update_mma.c) on a
# GPU, under 4 minutes on an H100, each part under its own `timeout`, files flat in $OUT:
#   machine.txt                nvidia-smi, python and torch versions
#   mma-tests.txt              pytest -m gpu tests/test_gpu_qr_mma.py            (TESTS_S, 80 s)
#   mma-off.{json,txt,log}     bench.gpu_bench --mma-update off, contest shapes,
#                              checked and raw, no peers                          (BENCH_S, 75 s)
#   mma-on.{json,txt,log}      the same with --mma-update on                      (BENCH_S, 75 s)
#   mma-update.txt             bench.gpu_compare: off/on per shape, geomeans, registers
# Usage: OUT=/some/dir bash bench/gpu_mma_update_device.sh, the wheels installed and
# PYTHONPATH set as at the top of bench/device_run.sh.  SHAPES (gpu_bench --shapes, e.g.
# 20x32,2x4096) narrows the shapes; MMA_MIN_ROWS sets kernels.gpu.MMA_MIN_ROWS for the on
# run.  Without a GPU the tests skip and gpu_bench says why and writes nothing.
set -u
OUT=${OUT:-bench-results/mma-update}
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
machine_txt "$OUT/machine.txt"
timeout "${TESTS_S:-80}" python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 \
    tests/test_gpu_qr_mma.py > "$OUT/mma-tests.txt" 2>&1
echo "rc=$?" >> "$OUT/mma-tests.txt"
tail -3 "$OUT/mma-tests.txt"
shapes=()
[ -n "${SHAPES:-}" ] && shapes=(--shapes "$SHAPES")
min_rows=()
[ -n "${MMA_MIN_ROWS:-}" ] && min_rows=(--mma-min-rows "$MMA_MIN_ROWS")
for mode in off on; do
    extra=()
    [ "$mode" = on ] && extra=(${min_rows[@]+"${min_rows[@]}"})
    timeout "${BENCH_S:-75}" python3 -m capqr.bench.gpu_bench --mma-update "$mode" \
        ${extra[@]+"${extra[@]}"} --two-panel off --peers "" --repeat "${REPEAT:-5}" \
        --repeat-large "${REPEAT_LARGE:-3}" ${shapes[@]+"${shapes[@]}"} \
        --out "$OUT/mma-$mode.json" > "$OUT/mma-$mode.log" 2>&1
    echo "rc=$?" >> "$OUT/mma-$mode.log"
    tail -2 "$OUT/mma-$mode.log"
done
if [ -f "$OUT/mma-off.json" ] && [ -f "$OUT/mma-on.json" ]; then
    python3 -m capqr.bench.gpu_compare "$OUT/mma-off.json" "$OUT/mma-on.json" \
        --out "$OUT/mma-update.txt"
fi
