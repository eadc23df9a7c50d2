#!/usr/bin/env bash
# One session on a GPU machine: the GPU tests, the GPU bench and the many-core CPU bench,
# each under its own time limit, logs and JSON to $OUT (default bench/results/device).
# Usage: OUT=/some/dir bash bench/device_run.sh  (TWO_PANEL_S=300: also the two-panel update)
# The fake-driver tests (tests/test_launch_sequence.py, tests/test_gc_device.py) are not
# run here: they swap the driver module under a process that holds real device buffers.
set -u
OUT=${OUT:-bench/results/device}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; nproc; uptime; } \
    > "$OUT/machine.txt" 2>&1
timeout "${TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_gpu_async.py tests/test_gpu_qr.py tests/test_gpu_builtins.py tests/test_gpu.py \
    tests/test_gpu_group.py \
    tests/test_conformance.py > "$OUT/gpu-tests.txt" 2>&1
echo "rc=$?" >> "$OUT/gpu-tests.txt"
tail -3 "$OUT/gpu-tests.txt"
timeout "${GPU_BENCH_S:-240}" python3 -m bench.gpu_bench --repeat "${REPEAT:-3}" \
    --repeat-large "${REPEAT:-3}" --out "$OUT/gpu-bench.json" > "$OUT/gpu-bench.txt" 2>&1
tail -9 "$OUT/gpu-bench.txt"
# the smallest batch and the squares vs scipy, the launch cost (back to back and after
# idleness: how many sleeping workers a launch wakes) and scaling at 1, 2 and all workers
# (the other batches, profile and overhead sections are in the full run:
# python3 -m bench.qr_parallel)
timeout "${CPU_BENCH_S:-150}" python3 -m bench.qr_parallel --out "$OUT" --skip profile \
    --skip overhead --shapes "${CPU_SHAPES:-(20,32) n=1024 n=2048 n=4096}" \
    --min-repeats "${REPEAT:-3}" > "$OUT/cpu-parallel.txt" 2>&1
tail -12 "$OUT/cpu-parallel.txt"
# the two-panel trailing update (kernels.gpu.TWO_PANEL, off by default until measured):
# its GPU tests, then the bench with it on, next to the default run above
if [ "${TWO_PANEL_S:-0}" != 0 ]; then
    timeout "$TWO_PANEL_S" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_qr.py \
        -k two_panel > "$OUT/gpu-tests-two-panel.txt" 2>&1
    echo "rc=$?" >> "$OUT/gpu-tests-two-panel.txt"
    tail -3 "$OUT/gpu-tests-two-panel.txt"
    timeout "$TWO_PANEL_S" python3 -m bench.gpu_bench --two-panel on --repeat "${REPEAT:-3}" \
        --repeat-large "${REPEAT:-3}" --out "$OUT/gpu-bench-two-panel.json" \
        > "$OUT/gpu-bench-two-panel.txt" 2>&1
    tail -9 "$OUT/gpu-bench-two-panel.txt"
fi
