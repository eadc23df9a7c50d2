# Sourced by the device scripts (bench/*device*.sh): the checkout's root is the package
# capqr, so import it as such without installing when nothing else provides it.
if ! python3 -c "import capqr" 2>/dev/null; then
    mkdir -p /tmp/capqr-path && ln -sfn "$PWD" /tmp/capqr-path/capqr
    export PYTHONPATH="/tmp/capqr-path${PYTHONPATH:+:$PYTHONPATH}"
fi

# machine_txt FILE: the GPU, its driver and clock, python and torch, cores and load
machine_txt() {
    { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
      python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"
      nproc; uptime
    } > "$1" 2>&1
}

# precompile [gpu_precompile options...]: the GPU kernels of the plans built ahead into the
# cache, NVRTC in spawned processes ($OUT/precompile.txt; PRECOMPILE_S, 150 s)
precompile() {
    timeout "${PRECOMPILE_S:-150}" python3 -m capqr.bench.gpu_precompile "$@" \
        > "$OUT/precompile.txt" 2>&1
    echo "rc=$?" >> "$OUT/precompile.txt"
    tail -2 "$OUT/precompile.txt"
}

# bench_run NAME SHAPES SECONDS [gpu_bench options...]: bench.gpu_bench without peers,
# checked and raw, into $OUT/NAME.{json,txt,log}; SHAPES "" for the contest shapes;
# BENCH_S overrides SECONDS, REPEAT and REPEAT_LARGE the runs, TAIL the lines shown
bench_run() {
    local name=$1 shapes=$2 secs=$3
    shift 3
    local sel=()
    [ -n "$shapes" ] && sel=(--shapes "$shapes")
    timeout "${BENCH_S:-$secs}" python3 -m capqr.bench.gpu_bench "$@" --peers "" \
        --repeat "${REPEAT:-5}" --repeat-large "${REPEAT_LARGE:-3}" ${sel[@]+"${sel[@]}"} \
        --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    echo "rc=$?" >> "$OUT/$name.log"
    tail -"${TAIL:-2}" "$OUT/$name.log"
}
