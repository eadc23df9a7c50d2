#!/usr/bin/env bash
# The GPU QR kernels' checks at the grain of tiles (branch gpuchecks): under 4 minutes on
# an H100, each part under its own `timeout`, results flat in $OUT:
#   machine.txt            nvidia-smi, python and torch versions
#   census.txt             checked accesses and range guards per kernel inside loops
#                          (runtime/cuda/census.py; no GPU needed, for the record)
#   gpu-tests.txt          pytest tests/test_gpu_qr.py tests/test_gpu.py      (TESTS_S, 110 s)
#   gpu-bench.{json,txt,log}  bench.gpu_bench --repeat 5, checked and raw at the contest
#                          shapes, no peers (checked/raw is the number this branch moves;
#                          PEERS=torch.geqrf,cublasSgeqrfBatched adds them) (GPU_BENCH_S, 110 s)
# Usage: OUT=/some/dir bash bench/gpu_checks_device.sh, with the wheels of
# bench/device_run.sh installed and on PYTHONPATH (see the top of that script).
set -u
OUT=${OUT:-bench-results/device}
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
missing=$(python3 - <<'EOF'
import importlib.util
mods = ("numpy", "torch", "cffi", "pycparser", "pytest", "hypothesis")
print(" ".join(m for m in mods if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    echo "gpu_checks_device.sh: missing Python modules: $missing" >&2
    echo "install the carried wheels and set PYTHONPATH (see bench/device_run.sh)" >&2
    exit 2
fi
machine_txt "$OUT/machine.txt"
timeout 60 python3 - > "$OUT/census.txt" 2>&1 <<'EOF'
from capqr.kernels import gpu as g
from capqr.runtime.cuda.census import loop_checks

for kind in g.LAUNCH_KINDS:
    src, name = g._kernel_spec(kind)[:2]
    r = loop_checks(src)[name]
    print(f"{kind:14s} checks in loops {len(r.checks):3d}  guards in loops {len(r.guards):3d}  "
          f"tile copies in loops {len(r.tiles):2d}")
EOF
timeout "${TESTS_S:-110}" python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu_qr.py tests/test_gpu.py > "$OUT/gpu-tests.txt" 2>&1
echo "rc=$?" >> "$OUT/gpu-tests.txt"
tail -3 "$OUT/gpu-tests.txt"
timeout "${GPU_BENCH_S:-110}" python3 -m capqr.bench.gpu_bench --repeat "${REPEAT:-5}" \
    --repeat-large "${REPEAT_LARGE:-3}" --peers "${PEERS:-}" \
    --out "$OUT/gpu-bench.json" > "$OUT/gpu-bench.log" 2>&1
echo "rc=$?" >> "$OUT/gpu-bench.log"
tail -4 "$OUT/gpu-bench.log"
