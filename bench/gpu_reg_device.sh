#!/usr/bin/env bash
# The register panel (kernels.gpu.REG_ROWS, kernels/gpu/gen_panel_reg.py) and the
# one-launch per-matrix kernel (kernels.gpu.PER_MATRIX, kernels/gpu/gen_matrix.py) on a
# GPU, under 7 minutes on an H100 (the default parts), each part under its own `timeout`, files flat in $OUT:
#   machine.txt                 nvidia-smi, python and torch versions
#   precompile.txt              bench.gpu_precompile: every kind of the plans, checked and
#                               raw, 12 compilers at once; registers and local bytes each
#   tests.txt                   pytest -m gpu tests/test_gpu_qr.py (default plans)  (TESTS_S)
#   {base,new,reg,matrix}.{json,txt,log}  bench.gpu_bench, no peers, checked and raw:
#                               base: --panel-reg off --per-matrix off (the plan before);
#                               new: both on, every shape;
#                               reg: --panel-reg on --per-matrix off;
#                               matrix: both on, the shapes the per-matrix launch takes
#   new-compare.txt             base vs new (bench.gpu_compare); reg-compare.txt and
#                               matrix-compare.txt (base vs reg, reg vs matrix) when run
# Usage: OUT=/some/dir bash bench/gpu_reg_device.sh, the wheels installed and PYTHONPATH
# set as at the top of bench/device_run.sh.  SHAPES narrows the base and reg runs,
# MATRIX_SHAPES the matrix run; PARTS (default "tests base new") picks parts; TESTS_K
# selects tests (pytest -k).
set -u
OUT=${OUT:-bench-results/panel-reg}
PARTS=${PARTS:-tests base new}
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
machine_txt "$OUT/machine.txt"
pm=default
[[ " $PARTS " == *" new "* || " $PARTS " == *" matrix "* ]] && pm=both
precompile --per-matrix $pm
if [[ " $PARTS " == *" tests "* ]]; then
    timeout "${TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 \
        ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu_qr.py > "$OUT/tests.txt" 2>&1
    echo "rc=$?" >> "$OUT/tests.txt"
    tail -3 "$OUT/tests.txt"
fi
[[ " $PARTS " == *" base "* ]] && bench_run base "${SHAPES:-}" 100 --panel-reg off --per-matrix off
[[ " $PARTS " == *" new "* ]] && bench_run new "${SHAPES:-}" 100 --panel-reg on --per-matrix on
[[ " $PARTS " == *" reg "* ]] && bench_run reg "${SHAPES:-}" 100 --panel-reg on --per-matrix off
[[ " $PARTS " == *" matrix "* ]] && bench_run matrix "${MATRIX_SHAPES:-20x32,40x176,40x352,640x512,60x1024}" 100 \
    --panel-reg on --per-matrix on
if [ -f "$OUT/base.json" ] && [ -f "$OUT/new.json" ]; then
    python3 -m capqr.bench.gpu_compare "$OUT/base.json" "$OUT/new.json" --out "$OUT/new-compare.txt"
fi
if [ -f "$OUT/base.json" ] && [ -f "$OUT/reg.json" ]; then
    python3 -m capqr.bench.gpu_compare "$OUT/base.json" "$OUT/reg.json" --out "$OUT/reg-compare.txt"
fi
if [ -f "$OUT/reg.json" ] && [ -f "$OUT/matrix.json" ]; then
    python3 -m capqr.bench.gpu_compare "$OUT/reg.json" "$OUT/matrix.json" \
        --out "$OUT/matrix-compare.txt"
fi
