#!/usr/bin/env bash
# The plan replayed as one CUDA graph (runtime/cuda/graphs.py, kernels.gpu.qr_launch's
# graphs) against the launch sequence, on a GPU, under 8 minutes on an H100, each part
# under its own `timeout`, files flat in $OUT:
#   machine.txt      nvidia-smi, python and torch versions, cores, load
#   precompile.txt   bench.gpu_precompile (the default plans' kernels, checked and raw)
#   tests.txt        pytest -m gpu tests/test_gpu_graphs.py tests/test_gpu_async.py
#   graph.{json,txt,log}  bench.gpu_bench --graph both, no peers: checked_ms / raw_ms by
#                    the launch sequence, checked_graph_ms / raw_graph_ms by the graph,
#                    in the same process, on the same buffers
# Usage: OUT=/some/dir bash bench/gpu_graph_device.sh, the wheels installed and PYTHONPATH
# set as at the top of bench/device_run.sh.  SHAPES narrows the bench (e.g. 40x176,2x4096).
set -u
OUT=${OUT:-bench-results/graph}
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
machine_txt "$OUT/machine.txt"
precompile
timeout "${TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 \
    tests/test_gpu_graphs.py tests/test_gpu_async.py > "$OUT/tests.txt" 2>&1
echo "rc=$?" >> "$OUT/tests.txt"
tail -3 "$OUT/tests.txt"
TAIL=4 bench_run graph "${SHAPES:-}" 200 --graph both
