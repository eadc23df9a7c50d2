#!/usr/bin/env bash
# A GPU machine's runs (H100, 16 cores), in parts that each fit one device call of under
# 9 minutes (PARTS, default "gpu"; "gpu" ~9 min, "reset cpu" ~8 min), each step under its
# own `timeout`, logs and JSON flat in $OUT:
#   machine.txt                 nvidia-smi, nproc, uptime, python and torch versions
#  gpu (gpubench: the bench alone, after bench.gpu_precompile; precompile.txt, PRECOMPILE_S):
#   gpu-tests.txt               pytest -m gpu on every GPU test file but the hang test
#                                                                               (TESTS_S, 340 s)
#   gpu-bench.{json,txt,log}    bench.gpu_bench, peers torch.geqrf and
#                               cublasSgeqrfBatched; GPU_SHAPES ("8x2048,2x4096") chooses
#                                                                          (GPU_BENCH_S, 190 s)
#  reset:
#   gpu-reset.txt               tests/test_gpu_reset.py -m gpu: a hung raw kernel, the
#                               isolated lane recovering, the direct one stuck  (RESET_S, 200 s)
#  isolated:
#   gpu-isolated.txt            GPU tests without torch memory, CAPQR_CUDA_ISOLATE=1
#                                                                            (ISOLATED_S, 200 s)
#  paths:
#   qr-paths.log + JSON         bench.qr_paths on all cores: steps vs one block vs tall vs coop
#                               per size, n or MxN
#                               (kernels.parallel.STEPS_MIN_N; PATHS_SIZES, PATHS_PATHS
#                               choose)                                        (PATHS_S, 100 s)
#  cpu (its parts peers, overhead, scaling may be named alone):
#   cpu-parallel-*.{json,txt},  bench.cpu_peers on all cores: capqr vs scipy sgeqrf and
#   cpu-peers.log               torch.geqrf, its own budget CPU_BUDGET_S   (CPU_BENCH_S, 260 s)
#   overhead.{json,log}         bench.overhead on all cores: checked/raw of every kernel and
#                               size, interleaved                          (OVERHEAD_S, 150 s)
#   scaling.log + JSON          bench.qr_parallel's scaling section at n=4096 (SCALING_S, 120 s)
#  warmup:
#   warmup.log                  python -m capqr warmup --raw, float32: the checked and raw CPU
#                               kernels built on every core before the timed parts (WARMUP_S, 150 s)
#  pathoverhead:
#   path-overhead.{json,log}    bench.overhead --kernel path: checked/raw/raw_poll of the launch
#                               paths one matrix takes on the pool (steps, group, tall) (PATHOV_S, 200 s)
#  tallnb:
#   tall-nb-*.{json,txt}, tall-nb.log  bench.tall_nb: the tall path's panel width (TALLNB_S, 100 s)
#  tallworkers:
#   tall-workers-*.{json,txt},  bench.tall_workers: the tall path's group size (TALL_WORKERS,
#   tall-workers.log            default 16,15,14,12,11,8 of the pool) at 65536x64 and 8192x256,
#                               kernel alone and through kernels.qr, 31 samples, slow-mode
#                               fraction, context switches and steal; 25-55 s   (TALLW_S, 90 s)
#  envab:
#   env-ab.log                  bench.env_ab: kernels.qr on a pool of every core and of one
#                               fewer (CAPQR_THREADS), panel widths 64 and 32 at n = 1024
#                               and 2048, alternating processes, 3 rounds   (ENVAB_S, 200 s);
#                               ENVAB_VARIANTS ("name=VAR=value;..."), ENVAB_SHAPES,
#                               ENVAB_ROUNDS and ENVAB_REPS choose
# Usage: OUT=/some/dir PARTS="gpu" bash bench/device_run.sh, with PYTHONPATH naming the
# installed wheels and the repository root.  The fake-driver tests (tests/test_launch_sequence.py,
# tests/test_gc_device.py) are not run here: they swap the driver module under a process
# that holds real device buffers.
#
# The device has python3.12 with torch (CUDA) and numpy only.  The wheels, downloaded on a
# machine with network access into the ignored folder .whl/ (carried to the device):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl \
#     cffi==1.17.1 pycparser==2.22 pytest==8.3.4 pluggy==1.5.0 iniconfig==2.0.0 \
#     pytest-timeout==2.3.1 hypothesis==6.122.3 sortedcontainers==2.4.0 attrs==24.3.0 \
#     threadpoolctl==3.5.0 scipy==1.18.1
# and on the device, before this script:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# (the script itself puts the checkout on the path as the package capqr)
set -u
OUT=${OUT:-bench-results/device}
PARTS=" ${PARTS:-gpu} "
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT"
missing=$(python3 - <<'PY'
import importlib.util
mods = ("numpy", "torch", "cffi", "pycparser", "pytest", "pytest_timeout", "hypothesis",
        "scipy", "threadpoolctl")
print(" ".join(m for m in mods if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
    echo "device_run.sh: missing Python modules: $missing" >&2
    echo "install the carried wheels and set PYTHONPATH (see the top of this script)" >&2
    exit 2
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; nproc; uptime
  lscpu | grep -E "Model name|^CPU\(s\)"
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"
} > "$OUT/machine.txt" 2>&1
step() {  # step NAME SECONDS LOG COMMAND...: run under a timeout, rc and load in the log
    local name=$1 secs=$2 log=$3
    shift 3
    echo "## $name: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T)" > "$log"
    timeout "$secs" "$@" >> "$log" 2>&1
    echo "rc=$? load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T)" >> "$log"
    tail -"${TAIL:-4}" "$log"
}
if [[ $PARTS == *" gpu "* ]]; then
    gpu_files=$(ls tests/test_gpu*.py tests/test_conformance.py tests/test_dlpack.py \
                   tests/test_cuda_diagnostics.py | grep -v test_gpu_reset.py)
    # shellcheck disable=SC2086
    step gpu-tests "${TESTS_S:-340}" "$OUT/gpu-tests.txt" \
        python3 -m pytest -q -p no:cacheprovider -m gpu $gpu_files
fi
if [[ $PARTS == *" gpubench "* && $PARTS != *" gpu "* ]]; then
    # without the GPU tests before it the cache is cold: build the plans' kernels in
    # parallel first, or the bench spends its time compiling (5 of 7 shapes in 170 s on
    # a fresh H100, bench/results/gpubench-partial-2026-12-07-h100-5b158b3.log)
    precompile --reg default
fi
if [[ $PARTS == *" gpu "* || $PARTS == *" gpubench "* ]]; then
    # cublasSgeqrfBatched: one run where a run exceeds PEER_BUDGET_S; (8,2048) and (2,4096)
    # are skipped (19.6 s and unfinished on the 2026-12-06 H100 run, bench/gpu_peers.py)
    TAIL=14 step gpu-bench "${GPU_BENCH_S:-190}" "$OUT/gpu-bench.log" \
        python3 -m capqr.bench.gpu_bench --repeat "${REPEAT:-5}" \
        --repeat-large "${REPEAT_LARGE:-3}" --peer-budget-s "${PEER_BUDGET_S:-5}" \
        ${GPU_SHAPES:+--shapes "$GPU_SHAPES"} --out "$OUT/gpu-bench.json"
fi
if [[ $PARTS == *" reset "* ]]; then
    step gpu-reset "${RESET_S:-200}" "$OUT/gpu-reset.txt" \
        python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_reset.py
fi
if [[ $PARTS == *" isolated "* ]]; then
    # the GPU tests that use no torch memory, with the driver in the lane's device process
    CAPQR_CUDA_ISOLATE=1 TAIL=6 step gpu-isolated "${ISOLATED_S:-200}" "$OUT/gpu-isolated.txt" \
        python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_faults.py \
        tests/test_gpu_async.py tests/test_gpu_group.py tests/test_gpu_builtins.py \
        tests/test_conformance.py
fi
if [[ $PARTS == *" paths "* ]]; then
    TAIL=12 step qr-paths "${PATHS_S:-100}" "$OUT/qr-paths.log" \
        python3 -m capqr.bench.qr_paths --sizes "${PATHS_SIZES:-128,192,256,384,512,640,768,1024}" \
        --paths "${PATHS_PATHS:-steps,oneblock,tall,coop}" --repeats "${PATHS_REPEATS:-7}" --out "$OUT"
fi
if [[ $PARTS == *" warmup "* ]]; then
    TAIL=3 step warmup "${WARMUP_S:-150}" "$OUT/warmup.log" \
        python3 -m capqr warmup --dtypes float32 --raw
fi
if [[ $PARTS == *" pathoverhead "* ]]; then
    TAIL=6 step path-overhead "${PATHOV_S:-200}" "$OUT/path-overhead.log" \
        python3 -m capqr.bench.overhead --kernel path --repeats "${OVERHEAD_REPEATS:-7}" \
        --out "$OUT/path-overhead.json"
fi
if [[ $PARTS == *" tallnb "* ]]; then
    TAIL=6 step tall-nb "${TALLNB_S:-100}" "$OUT/tall-nb.log" \
        python3 -m capqr.bench.tall_nb --out "$OUT"
fi
if [[ $PARTS == *" tallworkers "* ]]; then
    TAIL=16 step tall-workers "${TALLW_S:-90}" "$OUT/tall-workers.log" \
        python3 -m capqr.bench.tall_workers --tall-workers "${TALL_WORKERS:-16,15,14,12,11,8}" \
        --samples "${TALLW_SAMPLES:-31}" --max-seconds "${TALLW_SHAPE_S:-25}" --out "$OUT"
fi
if [[ $PARTS == *" envab "* ]]; then
    cores=$(nproc)
    variants=()
    IFS=';' read -ra specs <<< "${ENVAB_VARIANTS:-pool=CAPQR_THREADS=$cores;spare=CAPQR_THREADS=$((cores - 1))}"
    for v in "${specs[@]}"; do variants+=(--variant "$v"); done
    TAIL=12 step env-ab "${ENVAB_S:-200}" "$OUT/env-ab.log" \
        python3 -m capqr.bench.env_ab "${variants[@]}" --rounds "${ENVAB_ROUNDS:-3}" \
        --reps "${ENVAB_REPS:-3}" \
        --shapes "${ENVAB_SHAPES:-1:1024,1:1024/32,1:2048,1:2048/32,1:4096,8:2048,60:1024,2:4096,8192x256,65536x64}"
fi
# "cpu" is its three steps; "peers", "overhead" and "scaling" name one each
[[ $PARTS == *" cpu "* ]] && PARTS="$PARTS peers overhead scaling "
if [[ $PARTS == *" peers "* ]]; then
    TAIL=20 step cpu-peers "${CPU_BENCH_S:-260}" "$OUT/cpu-peers.log" \
        python3 -m capqr.bench.cpu_peers --threads "$(nproc)" \
        --max-seconds "${CPU_BUDGET_S:-230}" ${CPU_SHAPES:+--shapes "$CPU_SHAPES"} --out "$OUT"
fi
if [[ $PARTS == *" overhead "* ]]; then
    TAIL=6 step overhead "${OVERHEAD_S:-150}" "$OUT/overhead.log" \
        python3 -m capqr.bench.overhead --repeats "${OVERHEAD_REPEATS:-7}" \
        --out "$OUT/overhead.json"
fi
if [[ $PARTS == *" scaling "* ]]; then
    TAIL=12 step scaling "${SCALING_S:-120}" "$OUT/scaling.log" \
        python3 -m capqr.bench.qr_parallel --skip peers --skip profile --skip overhead \
        --skip launch --shapes "n=4096" --out "$OUT"
fi
