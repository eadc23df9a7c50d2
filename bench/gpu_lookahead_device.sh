#!/usr/bin/env bash
# The look-ahead plan (kernels.gpu.LOOKAHEAD: panels and each next panel's update on a
# second, high-priority stream, the rest of each update on the launch stream;
# runtime/cuda/lanes.py) against the plan without it, on a GPU, in one device call of
# under 9 minutes on an H100, each part under its own `timeout`, files flat in $OUT:
#   machine.txt                 nvidia-smi, python and torch versions, cores, load
#   precompile.txt              bench.gpu_precompile: every kind of the plans, checked and raw
#   tests.txt                   pytest -m gpu: tests/test_gpu_qr.py (the look-ahead tests and
#                               every plan's), test_gpu_graphs.py, test_gpu_async.py  (TESTS_S)
#   base.{json,txt,log}         bench.gpu_bench --lookahead off, no peers, checked and raw
#   new.{json,txt,log}          bench.gpu_bench --lookahead on --graph both (the sequence as
#                               checked_ms, its CUDA graph as checked_graph_ms)
#   new-compare.txt             base vs new (bench.gpu_compare)
# Usage: OUT=/some/dir bash bench/gpu_lookahead_device.sh, the wheels installed and
# PYTHONPATH set as at the top of bench/device_run.sh.  PARTS (default "tests base new")
# picks parts; SHAPES narrows the benches; TESTS_K selects tests (pytest -k).
set -u
OUT=${OUT:-bench-results/lookahead}
PARTS=${PARTS:-tests base new}
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
machine_txt "$OUT/machine.txt"
precompile
if [[ " $PARTS " == *" tests "* ]]; then
    timeout "${TESTS_S:-170}" python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 \
        ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu_qr.py tests/test_gpu_graphs.py \
        tests/test_gpu_async.py > "$OUT/tests.txt" 2>&1
    echo "rc=$?" >> "$OUT/tests.txt"
    tail -3 "$OUT/tests.txt"
fi
[[ " $PARTS " == *" base "* ]] && bench_run base "${SHAPES:-}" 130 --lookahead off
[[ " $PARTS " == *" new "* ]] && bench_run new "${SHAPES:-}" 130 --lookahead on --graph both
if [ -f "$OUT/base.json" ] && [ -f "$OUT/new.json" ]; then
    python3 -m capqr.bench.gpu_compare "$OUT/base.json" "$OUT/new.json" --out "$OUT/new-compare.txt"
    cat "$OUT/new-compare.txt"
fi
