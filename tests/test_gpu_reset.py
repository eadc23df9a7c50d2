"""A GPU kernel that never stops: the isolated lane restarts its device process, and
nothing of the old context is used again; the direct lane says it is stuck.

A checked kernel stops at its next pollcheck once the sequence is cancelled; one that
does not (a barrier or shuffle that some threads never reach and the verifier missed,
or a raw build, which has no pollchecks) is still running when the grace after the
deadline ends.  Only ending the process that owns its context ends it
(runtime/cuda/remote.py, sequence.py): in the isolated lane KernelTimeout says the
device process was restarted, every device buffer allocated before is lost (any use
raises CapabilityFault("lost") before a driver call, and its payload, gone with the
context, is never freed), kernels load their module again at their next launch, and a
new buffer and a launch work.

Part 1 runs the lane's host side on the fake device of tests/test_launch_sequence.py,
playing the device process: a restart drops its memory, queue, modules and functions,
and any later use of an old address or function handle fails the test (the process and
its protocol on a stand-in libcuda: tests/test_gpu_isolation.py).  Part 2 hangs a raw
kernel on a real GPU in both lanes (skipped without one).
"""

from __future__ import annotations

import gc as pygc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from capqr import runtime
from capqr.runtime import CapabilityFault, CompileError, KernelTimeout, cuda
from capqr.runtime.cuda import driver as real_drv
from capqr.runtime.cuda import memory, nvrtc, sequence
from readme_examples import example_source
from test_launch_sequence import (
    PUT_LINE,
    PUT_SRC,
    FakeDevice,
    _fake_kernel,
    _holds,
    _oob,
    installed,
)

SIDE = 0x51DE  # the side stream a reset makes (the fake's first one is "side")
CUDA_ERROR_INVALID_IMAGE = 200


class ResettableDevice(FakeDevice):
    """The fake device with a context to destroy and modules to load."""

    def __init__(self) -> None:
        super().__init__()
        self.dev.handle = 0
        self.resets = 0
        self.born: dict[Any, int] = {}       # function -> the context (reset count) it is of
        self.images: dict[int, bytes] = {}   # module handle -> image, this context only
        self.handles: dict[int, str] = {}    # function handle -> fake function, this context
        self.load_log: str | None = None     # set: cuModuleLoadDataEx refuses with this log

    def function(self, fn: Any) -> str:
        """The fake function a handle stands for; a handle of a destroyed context fails."""
        if not isinstance(fn, str):
            h = int(real_drv.ffi().cast("uintptr_t", fn))
            assert h in self.handles, f"function handle 0x{h:x} of a destroyed context"
            fn = self.handles[h]
        assert self.born.get(fn, 0) == self.resets, f"{fn}: a function of a destroyed context"
        return fn

    # -- the context ---------------------------------------------------------------
    def restart(self) -> None:
        """The device process ends, and everything in its context goes: memory (addresses
        are never handed out again, so any later use of an old one fails _find), the
        queue (the stuck kernel ends), modules and functions."""
        self._count("reset")
        self.resets += 1
        self.mem.clear()
        self.queue.clear()
        self.images.clear()
        self.handles.clear()

    def cuDevicePrimaryCtxRetain(self, c: Any, handle: int) -> int:
        c[0] = real_drv.ffi().cast("void *", 0xC0)
        return 0

    def cuCtxSetCurrent(self, ctx: Any) -> int:
        return 0

    def cuStreamCreate(self, s: Any, flags: int) -> int:
        s[0] = real_drv.ffi().cast("void *", SIDE)
        return 0

    def cuMemcpyHtoDAsync_v2(self, dst: int, src: Any, n: int, stream: Any) -> int:
        if not isinstance(stream, str):  # the side stream of the new context
            assert int(real_drv.ffi().cast("uintptr_t", stream)) == SIDE
            stream = "side"
        return super().cuMemcpyHtoDAsync_v2(dst, src, n, stream)

    def cuStreamSynchronize(self, stream: Any) -> int:
        if not isinstance(stream, str) and int(real_drv.ffi().cast("uintptr_t", stream)) == SIDE:
            return 0
        return super().cuStreamSynchronize(stream)

    # -- modules: a fake kernel's image names its function ---------------------------
    def cuModuleLoadDataEx(self, mod: Any, image: bytes, n: int, keys: Any,
                           values: Any) -> int:
        self._count("load")
        if self.load_log is not None:
            f = real_drv.ffi()
            log = self.load_log.encode()
            f.memmove(values[0], log + b"\0", len(log) + 1)  # the error log buffer
            return CUDA_ERROR_INVALID_IMAGE
        h = 0x1000 + len(self.images)
        self.images[h] = bytes(image)
        mod[0] = real_drv.ffi().cast("void *", h)
        return 0

    def cuModuleGetFunction(self, fn: Any, mod: Any, name: bytes) -> int:
        image = self.images[int(real_drv.ffi().cast("uintptr_t", mod))]
        old = image.decode()
        new = f"{old.split('#')[0]}#{self.resets}"  # the same kernel, in this context
        self.params[new], self.behaviour[new] = self.params[old], self.behaviour[old]
        self.born[new] = self.resets
        h = 0x2000 + len(self.handles)
        self.handles[h] = new
        fn[0] = real_drv.ffi().cast("void *", h)
        return 0

    # -- launches name their function in this context ----------------------------------
    def cuLaunchKernel(self, fn: Any, *a: Any) -> int:
        return super().cuLaunchKernel(self.function(fn), *a)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    d = ResettableDevice()
    # the isolated lane, its device process played by the fake (the process itself and
    # the direct lane: tests/test_gpu_isolation.py)
    monkeypatch.setattr(real_drv, "can_reset", lambda: True)
    monkeypatch.setattr(real_drv, "restart_device_process", d.restart)
    yield from installed(monkeypatch, d)
    # a lost payload is dropped unfreed (cuMemFree of it would fail), and still counted gone
    assert memory.device_payloads_owned() == 0


def _kernel(fake: ResettableDevice, behaviour: Any = None) -> cuda.CudaKernel:
    """A fake kernel whose image the fake can load again (it names the function)."""
    k = _fake_kernel(fake, PUT_SRC, "put", behaviour)
    fake.born[k.function] = fake.resets
    k.image = k.function.encode()
    return k


def _uses(x: cuda.DeviceCapability, put: cuda.CudaKernel) -> dict[str, Any]:
    """Every way to reach a buffer's payload."""
    return {"numpy": x.numpy, "ptr": lambda: x.ptr,
            "copy_from": lambda: x.copy_from(np.ones(4, np.float32)),
            "launch": lambda: runtime.launch(put, [x], args=(0, 1.0)),
            "launch_many": lambda: cuda.launch_many([(put, [x], (0, 1.0), 1, 32)]),
            "export": lambda: x.__cuda_array_interface__,
            "perms": lambda: setattr(x, "perms", "r")}


def test_fake_kernel_ignoring_the_cancel_resets_the_context(fake: ResettableDevice) -> None:
    """Seen failing before the reset: KernelTimeout without context_reset, the kernel
    still running and its buffers held with no way to end it."""
    stuck, put = _kernel(fake, "stuck"), _kernel(fake)
    x = cuda.alloc_device(4, np.float32, name="x")
    px, xid = x.ptr, x.id
    runtime.launch(put, [x], args=(0, 1.0), sync=False)
    runtime.launch(stuck, [x], args=(1, 1.0), sync=False)
    with pytest.raises(KernelTimeout, match="restarted its device process") as e:
        runtime.sync(timeout=0.05)
    assert e.value.context_reset and e.value.kernel == "sequence of 2 launches (put .. put)"
    assert fake.calls["reset"] == 1 and not fake.queue and px not in fake.mem
    assert not sequence.current.stuck and _holds(x) == 0
    assert x.lost and "lost" in repr(x)

    calls = dict(fake.calls)
    for what, use in _uses(x, put).items():
        with pytest.raises(CapabilityFault) as f:
            use()
        assert (f.value.reason, f.value.buffer) == ("lost", "x"), what
    assert fake.calls == calls, "a lost buffer reached the driver"

    # a new buffer, and a kernel loaded before the reset: its module is loaded again
    y = cuda.alloc_device(4, np.float32, name="y")
    runtime.launch(put, [y], args=(2, 3.0))
    assert fake.ran[-1] == ("put@1#1", 0) and fake.calls["load"] == 1
    runtime.launch(put, [y], args=(3, 3.0))
    assert fake.calls["load"] == 1  # once per context

    # the lost payload went with its context: dropping the handle frees nothing
    x.free()
    x = None
    pygc.collect()
    for _ in range(3):
        runtime.gc_collect()
    assert not memory.payload_pending(xid) and px not in fake.freed


def test_fake_after_a_reset_sequences_fault_and_time_out_as_before(
        fake: ResettableDevice) -> None:
    """The new context gets a new sequence record: a fault is reported exactly and a
    kernel that honours the cancel times out without another reset."""
    stuck = _kernel(fake, "stuck")
    bad = _kernel(fake, lambda launch: _oob(0, 9, PUT_LINE))
    spin = _kernel(fake, "spin")
    x = cuda.alloc_device(4, np.float32, name="x")
    record = fake.dev.seq_record
    runtime.launch(stuck, [x], args=(0, 1.0), sync=False)
    with pytest.raises(KernelTimeout):
        runtime.sync(timeout=0.05)
    y = cuda.alloc_device(4, np.float32, name="y")
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(bad, [y], args=(9, 1.0))
    assert (e.value.reason, e.value.buffer, e.value.index, e.value.line) == (
        "out-of-bounds", "y", 9, PUT_LINE)
    assert fake.dev.seq_record not in (0, record)
    with pytest.raises(KernelTimeout) as t:
        runtime.launch(spin, [y], args=(0, 1.0), timeout=0.05)
    assert not t.value.context_reset and fake.calls["reset"] == 1 and _holds(y) == 0


def test_fake_module_load_refusal_is_on_the_kernel_line(
        fake: ResettableDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    """cuModuleLoadDataEx refuses the cubin: CompileError on the KERNEL's line, with the
    loader's log (its entry symbol read as the kernel's name).  Before: a bare
    CudaError from cuModuleLoadData, no log, no line."""
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda *a, **k: b"put@image")
    fake.load_log = ("ptxas error   : Entry function 'capqr_u_put' uses too much shared data "
                     "(0x10100 bytes, 0xc000 max)")
    with pytest.raises(CompileError) as e:
        cuda.compile(PUT_SRC, "put")
    assert e.value.line == 2  # KERNEL void put(...)
    assert "line 2: ptxas error: Entry function 'put' uses too much shared data" in str(e.value)
    assert "capqr_u_put" in e.value.compiler_output


# ---------------------------------------------------------------------------
# Part 2: a real GPU

_OK, _WHY = cuda.available()
ROOT = Path(__file__).resolve().parent.parent

#: A raw build has no pollchecks: nothing reads the cancel flag, and the flag it spins
#: on is never set.  It stands in for a collective deadlock the verifier missed (a
#: barrier half the threads reach is refused at the source, so a raw spin is the hang
#: a verified source can still make).  The store in the loop keeps the compiler from
#: taking the loop for one without effects, which it may assume ends.
HANG = """
KERNEL void hang(cap_t flag)
{
    int64_t t = rt_thread_idx();
    while (cap_load_i32(flag, 0) == 0) {
        t = t + 1;
        cap_store_i32(flag, 1, (int32_t)t);
    }
}
"""
GPU_PROBE = r"""
import json, os, sys, time
import numpy as np
from capqr import runtime
from capqr.runtime import KernelTimeout, cuda
from capqr.runtime.cuda import sequence
from lane_probe import attempt
sequence.CANCEL_GRACE = 2.0


def note(what):  # progress on stderr: a probe cut by the wall limit shows how far it got
    print(f"[{time.monotonic() - T0:7.3f}] {what}", file=sys.stderr, flush=True)


T0 = time.monotonic()
hang = cuda.compile(HANG, "hang", checked=False)
put = cuda.compile(PUT, "put")
old = cuda.to_device(np.zeros(4, np.float32), name="old")
flag = cuda.alloc_device(4, np.int32, name="flag")
note("compiled")
out = {}
t0 = time.monotonic()
try:
    cuda.launch(hang, [flag], grid=2, block=64, timeout=0.5)
    out["hang"] = "returned"
except KernelTimeout as e:
    out["hang"] = {"reset": e.context_reset, "stuck": e.stuck, "message": str(e)}
out["elapsed"] = time.monotonic() - t0
note(f"timed out: {out['hang']}")
out["old_numpy"] = attempt(old.numpy)
out["old_launch"] = attempt(lambda: cuda.launch(put, [old], args=(0, 1.0)))
note("old buffer tried")


def fresh():
    new = cuda.alloc_device(4, np.float32, name="new")
    cuda.launch(put, [new], args=(2, 5.0))          # put was loaded before the timeout
    out["new"] = new.numpy().tolist()
    again = cuda.compile(PUT, "put")                # and a compile after it
    cuda.launch(again, [new], args=(3, 7.0))
    out["again"] = new.numpy().tolist()


out["fresh"] = attempt(fresh)
note("fresh buffer tried")
print(json.dumps(out), flush=True)
note("exiting")
"""


def _probe(isolate: bool, wall: float) -> tuple[dict, float, str]:
    """Run GPU_PROBE in a child process: (its JSON, seconds to its exit, its stderr);
    the JSON is None when it printed none before ``wall`` seconds."""
    code = GPU_PROBE.replace("HANG", repr(HANG)).replace("PUT", repr(PUT_SRC))
    env = dict(os.environ, CAPQR_CUDA_ISOLATE="1" if isolate else "0",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=wall, env=env)
        stdout, stderr, took = p.stdout, p.stderr, time.monotonic() - t0
        assert p.returncode == 0, f"{stdout[-2000:]}\n{stderr[-3000:]}"
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        took = float("inf")
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    return (json.loads(lines[-1]) if lines else None), took, stderr


@pytest.mark.gpu
@pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")
def test_gpu_isolated_lane_recovers_from_a_hung_raw_kernel() -> None:
    """On the device, the isolated lane: the raw spin ignores the cancel; 2 s after it the
    lane kills its device process (KernelTimeout says so), the buffers made before are
    lost, and a kernel compiled before and one compiled after, on a new buffer, run."""
    out, took, log = _probe(isolate=True, wall=120)
    assert out is not None, f"no result in 120 s: {log[-3000:]}"
    assert (out["hang"]["reset"], out["hang"]["stuck"]) == (True, False), out
    assert "restarted its device process" in out["hang"]["message"], out
    assert out["elapsed"] < 0.5 + 2.0 + 10.0, out
    assert (out["old_numpy"], out["old_launch"]) == ("fault:lost", "fault:lost"), out
    assert out["fresh"] == "ran", out
    assert out["new"] == [0.0, 0.0, 5.0, 0.0] and out["again"] == [0.0, 0.0, 5.0, 7.0], out
    assert took < 120, f"the probe printed its result but did not exit: {log[-2000:]}"


@pytest.mark.gpu
@pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")
def test_gpu_direct_lane_says_stuck_instead_of_hanging() -> None:
    """On the device, the direct lane: the context cannot be reset under the spin, so the
    lane says so (KernelTimeout stuck) and every later GPU call raises DeviceStuck at
    once; before, it called cuDevicePrimaryCtxReset and the probe hung (cut at 90 s and
    150 s, bench/results/gpu-reset-2026-12-06-h100-6b9bd49.txt)."""
    out, took, log = _probe(isolate=False, wall=120)
    assert out is not None, f"no result in 120 s: {log[-3000:]}"
    assert (out["hang"]["reset"], out["hang"]["stuck"]) == (False, True), out
    assert out["elapsed"] < 0.5 + 2.0 + 10.0, out
    assert (out["old_numpy"], out["old_launch"], out["fresh"]) == ("DeviceStuck",) * 3, out
    # the process exits (the driver's teardown at exit ends the kernel: 3.2 s in all on an
    # H100, bench/results/gpu-direct-stuck-exit-2026-12-06-h100-99761dd.txt)
    assert took < 120, f"the probe printed its result but did not exit: {log[-2000:]}"


@pytest.mark.gpu
@pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")
def test_gpu_isolated_lane_docs_example_runs() -> None:
    """docs/launch.md's "Isolated GPU lane" example, as written, in a fresh process (it
    must choose the lane before the first GPU call)."""
    code = example_source("Isolated GPU lane")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
