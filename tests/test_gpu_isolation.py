"""A GPU kernel that never stops, on a GPU-less stand-in of libcuda that behaves as the
H100 did (tests/fake_libcuda.py): the host never hangs, and the isolated lane recovers.

On the device (bench/results/gpu-hang-probe-2026-12-06-h100-c0bfd1d.jsonl), a reset or
a destroy of the context waits for such a kernel forever, and so does every copy, free or
synchronisation behind it; only ending the process that owns the context ends it.

- The direct lane (driver in this process): KernelTimeout says the kernel is stuck, and
  every later GPU call raises DeviceStuck at once instead of blocking behind it.
- The isolated lane (``CAPQR_CUDA_ISOLATE=1``, runtime/cuda/remote.py): the lane kills
  its device process and starts another; the buffers made before are lost, kernels load
  again, and a new buffer and launch work.

Each scenario runs in a child process under a wall limit: a lane that blocked would
hang the test run.  The same scenarios on a GPU: tests/test_gpu_reset.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
WALL = 90

SCENARIO = r"""
import json, os, sys, time
import numpy as np
from capqr.runtime import CapabilityFault, KernelTimeout, cuda
from capqr.runtime.cuda import driver as drv, kernel as kmod, sequence
import fake_libcuda
from lane_probe import attempt

sequence.CANCEL_GRACE = 0.3
if os.environ.get("CAPQR_CUDA_ISOLATE") != "1":
    drv._state["lib"] = fake_libcuda.FakeLibcuda()  # the direct lane: in this process

PUT = '''
KERNEL void put(cap_t x, int64_t i, float v)
{
    cap_store_f32(x, i, v);
}
'''
HANG = '''
KERNEL void hang(cap_t flag)
{
    while (cap_load_i32(flag, 0) == 0) {
        cap_store_i32(flag, 1, 1);
    }
}
'''


def fake_kernel(src, name):
    cs = cuda.translate(src)
    img = fake_libcuda.image({name: [kind for _, kind in cs.kernels[name].params]})
    epoch, module, fn = kmod.load(name, img, cs, 0)
    return cuda.CudaKernel(name, src, True, cs, cs.kernels[name], module, fn, len(img),
                           image=img, epoch=epoch)


def pid():
    proc = getattr(getattr(drv.lib(), "process", None), "proc", None)
    return proc.pid if proc else os.getpid()


out = {"device": drv.device().name, "pid_before": pid()}
put, hang = fake_kernel(PUT, "put"), fake_kernel(HANG, "hang")
y = cuda.alloc_device(4, np.float32, name="y")
cuda.launch(put, [y], args=(1, 2.5), timeout=5)
out["before"] = y.numpy().tolist()
t0 = time.monotonic()
try:
    cuda.launch(hang, [y], grid=2, block=64, timeout=0.2)
    out["hang"] = "returned"
except KernelTimeout as e:
    out["hang"] = {"reset": e.context_reset, "stuck": getattr(e, "stuck", None),
                   "message": str(e)}
out["elapsed"] = time.monotonic() - t0
out["pid_after"] = pid()
out["old_numpy"] = attempt(y.numpy)
out["old_launch"] = attempt(lambda: cuda.launch(put, [y], args=(0, 1.0), timeout=5))


def fresh():
    z = cuda.alloc_device(4, np.float32, name="z")
    cuda.launch(put, [z], args=(3, 7.0), timeout=5)
    out["fresh_values"] = z.numpy().tolist()
    try:
        z.__cuda_array_interface__
        out["export"] = "exported"
    except BufferError as e:
        out["export"] = str(e)


out["fresh"] = attempt(fresh)
print(json.dumps(out), flush=True)
"""


def run_scenario(isolate: bool, script: str = SCENARIO,
                 blocked: str = "the lane blocked behind the hung kernel") -> dict:
    """Run ``script`` in a child process on the stand-in libcuda (in the device process
    when ``isolate``) and return the JSON it printed last; fails the test, saying
    ``blocked``, when the child runs past WALL seconds."""
    env = dict(os.environ, CAPQR_CUDA_ISOLATE="1" if isolate else "0",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    env.pop("CAPQR_LIBCUDA_PY", None)
    if isolate:
        env["CAPQR_LIBCUDA_PY"] = "fake_libcuda:FakeLibcuda"  # in the device process
    try:
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=WALL, env=env, cwd=TESTS)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the scenario ran {WALL} s: {blocked}\n"
                    f"{(e.stdout or b'')[-2000:]!r}\n{(e.stderr or b'')[-3000:]!r}")
    assert p.returncode == 0, f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_direct_lane_raises_instead_of_blocking_behind_a_stuck_kernel() -> None:
    """Before: the lane called cuDevicePrimaryCtxReset, which on the device (and this
    stand-in) waits for the kernel forever, so the host hung."""
    out = run_scenario(isolate=False)
    assert out["before"] == [0.0, 2.5, 0.0, 0.0], out
    assert out["hang"]["stuck"] is True and out["hang"]["reset"] is False, out
    assert "CAPQR_CUDA_ISOLATE=1" in out["hang"]["message"], out
    assert out["elapsed"] < 0.2 + 0.3 + 5.0, out
    # every later GPU use says so at once (a copy, a launch, an allocation)
    assert (out["old_numpy"], out["old_launch"], out["fresh"]) == ("DeviceStuck",) * 3, out


def test_isolated_lane_restarts_its_device_process_and_recovers() -> None:
    out = run_scenario(isolate=True)
    assert out["device"] == "Fake GPU", out  # served by the device process
    assert out["before"] == [0.0, 2.5, 0.0, 0.0], out
    assert out["hang"]["reset"] is True and out["hang"]["stuck"] is False, out
    assert "restarted its device process" in out["hang"]["message"], out
    assert out["elapsed"] < 0.2 + 0.3 + 5.0, out
    assert out["pid_after"] != out["pid_before"], out
    # what the old process held is lost, not used; a new buffer and the kernel (loaded
    # again in the new process) work
    assert (out["old_numpy"], out["old_launch"]) == ("fault:lost", "fault:lost"), out
    assert out["fresh"] == "ran" and out["fresh_values"] == [0.0, 0.0, 0.0, 7.0], out
    assert "isolated GPU lane" in out["export"], out


def test_isolated_lane_without_a_driver_is_unavailable() -> None:
    """No libcuda for the device process: cuda.available() says why, nothing hangs."""
    env = dict(os.environ, CAPQR_CUDA_ISOLATE="1", CAPQR_LIBCUDA="/nonexistent/libcuda.so")
    env.pop("CAPQR_LIBCUDA_PY", None)
    code = ("import ctypes.util, json; from capqr.runtime import cuda; "
            "print(json.dumps(cuda.available()))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=WALL, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    ok, why = json.loads(p.stdout.strip().splitlines()[-1])
    if ok:
        pytest.skip("this machine has a GPU driver the device process found anyway")
    assert "device process" in why, why


LOSS = SCENARIO.split("out = {")[0] + r"""
import signal
out = {}
put = fake_kernel(PUT, "put")
crash = fake_kernel(PUT.replace("put", "crash"), "crash")
y = cuda.alloc_device(4, np.float32, name="y")
cuda.launch(put, [y], args=(1, 2.5), sync=False)      # pending when the process dies
os.kill(drv.lib().process.proc.pid, signal.SIGKILL)
drv.lib().process.proc.wait()
out["killed_use"] = attempt(y.numpy)                 # the call that finds it gone
out["killed_sync"] = attempt(cuda.sync)               # the pending launch did not finish
out["killed_old"] = attempt(y.numpy)                  # the new process does not have y
z = cuda.alloc_device(4, np.float32, name="z")
cuda.launch(put, [z], args=(0, 1.5))
out["after_kill"] = z.numpy().tolist()
out["crash"] = attempt(lambda: cuda.launch(crash, [z], args=(0, 1.0)))
out["crash_old"] = attempt(z.numpy)
w = cuda.alloc_device(4, np.float32, name="w")
cuda.launch(put, [w], args=(3, 4.5))
out["after_crash"] = w.numpy().tolist()
print(json.dumps(out), flush=True)
"""


def test_isolated_lane_replaces_a_lost_device_process() -> None:
    """The device process killed with a launch pending, then a kernel that fails the
    context for good (an illegal address, as a raw kernel may make): each time the call
    that finds it raises CudaError saying so, the next sync says the pending launch was
    lost, the old buffers are lost, and the lane works again in a new process.  Before:
    every later call failed (a dead pipe, a failed context) until the host restarted."""
    out = run_scenario(isolate=True, script=LOSS)
    assert "device process is lost: it exited" in out["killed_use"], out
    assert "replaced at the next GPU call" in out["killed_use"], out
    assert "1 launch(es) enqueued since the last sync were lost" in out["killed_sync"], out
    assert out["killed_old"] == "fault:lost" and out["after_kill"] == [1.5, 0, 0, 0], out
    assert "700" in out["crash"] and "replaced at the next GPU call" in out["crash"], out
    assert out["crash_old"] == "fault:lost" and out["after_crash"] == [0, 0, 0, 4.5], out


INTERRUPT = SCENARIO.split("out = {")[0] + r"""
import signal, threading
from capqr.runtime.cuda import remote
remote.OWED_WAIT = 0.5
out = {}
put, hang = fake_kernel(PUT, "put"), fake_kernel(HANG, "hang")
y = cuda.alloc_device(4, np.float32, name="y")
cuda.launch(hang, [y], grid=2, block=64, sync=False)
# Python's Ctrl-C handler even where the suite was started with SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    cuda.sync()                          # no timeout: the device process blocks for good
    out["sync"] = "returned"
except KeyboardInterrupt:
    out["sync"] = "KeyboardInterrupt"
out["next"] = attempt(y.numpy)           # its reply is owed: waits OWED_WAIT, then kills
out["elapsed"] = time.monotonic() - t0
out["old"] = attempt(y.numpy)
z = cuda.alloc_device(4, np.float32, name="z")
cuda.launch(put, [z], args=(2, 6.5))
out["after"] = z.numpy().tolist()
print(json.dumps(out), flush=True)
"""


def test_isolated_lane_interrupted_wait_does_not_wedge_the_lane() -> None:
    """Ctrl-C in a sync without a timeout while the device process is blocked behind a
    kernel that never ends: the interrupt reaches the caller, the next call waits for the
    owed reply at most OWED_WAIT, then the process is replaced; before, that call read
    the owed reply forever."""
    out = run_scenario(isolate=True, script=INTERRUPT,
                       blocked="the lane waited for the owed reply forever")
    assert out["sync"] == "KeyboardInterrupt", out
    assert "did not answer within 0.5 s of an interrupted call" in out["next"], out
    assert out["elapsed"] < 0.5 + 0.5 + 10, out
    assert out["old"] == "fault:lost" and out["after"] == [0, 0, 6.5, 0], out
