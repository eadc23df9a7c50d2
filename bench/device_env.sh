# Sourced by the device scripts (bench/*device*.sh): the checkout's root is the package
# capqr, so import it as such without installing when nothing else provides it.
if ! python3 -c "import capqr" 2>/dev/null; then
    mkdir -p /tmp/capqr-path && ln -sfn "$PWD" /tmp/capqr-path/capqr
    export PYTHONPATH="/tmp/capqr-path${PYTHONPATH:+:$PYTHONPATH}"
fi
