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
