"""Which host action ends a GPU kernel that never stops, and how fast (run on a device).

Each strategy runs in its own child process under a wall limit, logging each stage
with its time on stderr, so a strategy that blocks shows where:

- ``reset``:          cuDevicePrimaryCtxReset while a spin kernel runs (what the lane did).
- ``reset-barrier``:  the same, the kernel stuck in a named barrier half its threads reach.
- ``trap``:           a one-thread kernel executing ``trap`` on a non-blocking second
                      stream of the same context, then the reset.
- ``trap-full``:      the same with the spin kernel filling every SM (the trap kernel has
                      to wait for a free slot).
- ``trap-barrier-full``: the barrier kernel filling every SM, then ``trap``.
- ``destroy``:        the spin in a context of its own (cuCtxCreate), then cuCtxDestroy.
- ``kill``:           the spin in a child process that is killed (SIGKILL); then a fresh
                      process runs a kernel.

Every strategy ends by running a small kernel in a fresh (or reset) context and checking
its result, so "ended" means the device is usable again.  One JSON line per strategy
on stdout: ``{"strategy", "ok", "seconds", "stages", "error"}``.

Usage: python -m capqr.bench.gpu_hang_probe [--limit 40] [strategy ...]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

SOURCE = r"""
extern "C" __global__ void spin(volatile int *flag)
{
    while (flag[0] == 0) { flag[1 + (threadIdx.x & 7)] = threadIdx.x; }
}
extern "C" __global__ void barrier(volatile int *flag)
{
    /* warp 1 leaves; warp 0 waits at a barrier counting 64 threads: forever */
    if (threadIdx.x >= 32) return;
    asm volatile("bar.sync 1, 64;");
    flag[1] = 1;
}
extern "C" __global__ void killer() { asm volatile("trap;"); }
extern "C" __global__ void put(int *out) { out[threadIdx.x] = 7 * threadIdx.x; }
"""

STRATEGIES = ("reset", "reset-barrier", "trap", "trap-full", "trap-barrier-full", "destroy",
              "kill")


class Probe:
    """The driver through ctypes (independent of the lane's bindings), stage log on stderr."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.stage("start")
        self.call("cuInit", 0)
        self.dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(self.dev), 0)
        self.ctx = ctypes.c_void_p()

    def stage(self, what: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.3f}] {what}", file=sys.stderr, flush=True)

    def rc(self, name: str, *args: object) -> int:
        return int(getattr(self.cu, name)(*args))

    def call(self, name: str, *args: object) -> None:
        r = self.rc(name, *args)
        if r != 0:
            raise RuntimeError(f"{name} -> {r}")

    def primary(self) -> None:
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self.call("cuCtxSetCurrent", self.ctx)

    def own_context(self) -> None:
        self.call("cuCtxCreate_v2", ctypes.byref(self.ctx), 0, self.dev)

    def load(self) -> None:
        from capqr.runtime.cuda import nvrtc
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(major), 75, self.dev)
        self.call("cuDeviceGetAttribute", ctypes.byref(minor), 76, self.dev)
        image = nvrtc.compile_cubin(SOURCE, arch=f"sm_{major.value}{minor.value}",
                                    name="hang_probe.cu")
        self.mod = ctypes.c_void_p()
        self.call("cuModuleLoadData", ctypes.byref(self.mod), image)
        self.fns = {}
        for name in ("spin", "barrier", "killer", "put"):
            f = ctypes.c_void_p()
            self.call("cuModuleGetFunction", ctypes.byref(f), self.mod, name.encode())
            self.fns[name] = f
        sms = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(sms), 16, self.dev)
        self.sms = sms.value

    def alloc(self, nbytes: int) -> ctypes.c_uint64:
        p = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(nbytes))
        self.call("cuMemsetD8_v2", p, ctypes.c_ubyte(0), ctypes.c_size_t(nbytes))
        return p

    def stream(self) -> ctypes.c_void_p:
        s = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(s), 1)  # CU_STREAM_NON_BLOCKING
        return s

    def launch(self, name: str, grid: int, block: int, stream: ctypes.c_void_p,
               *args: ctypes.c_uint64) -> int:
        holders = [ctypes.c_uint64(a.value) for a in args]
        params = (ctypes.c_void_p * max(len(holders), 1))(
            *[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
        u = ctypes.c_uint
        return self.rc("cuLaunchKernel", self.fns[name], u(grid), u(1), u(1), u(block), u(1),
                       u(1), u(0), stream, params, None)

    def usable(self) -> bool:
        """A fresh kernel runs and writes what it should."""
        out = self.alloc(4 * 32)
        s = self.stream()
        self.call("cuCtxSynchronize")
        if self.launch("put", 1, 32, s, out) != 0:
            return False
        self.call("cuStreamSynchronize", s)
        host = (ctypes.c_int * 32)()
        self.call("cuMemcpyDtoH_v2", host, out, ctypes.c_size_t(4 * 32))
        return list(host) == [7 * i for i in range(32)]

    def wait_error(self, s: ctypes.c_void_p, limit: float) -> int:
        """cuStreamQuery until it stops answering NOT_READY (600) or ``limit`` passes."""
        end = time.monotonic() + limit
        while True:
            r = self.rc("cuStreamQuery", s)
            if r != 600 or time.monotonic() > end:
                return r
            time.sleep(0.01)


def child(strategy: str) -> None:
    p = Probe()
    stages: dict[str, object] = {}
    if strategy == "destroy":
        p.own_context()
    else:
        p.primary()
    p.load()
    flag = p.alloc(64)
    s = p.stream()
    full = strategy.endswith("-full")
    kernel = "barrier" if "barrier" in strategy else "spin"
    grid, block = (p.sms * 32, 64) if full else (2, 64)
    stages["launch"] = p.launch(kernel, grid, block, s, flag)
    p.stage(f"launched {kernel} grid={grid} block={block}")
    time.sleep(1.0)
    stages["running"] = p.rc("cuStreamQuery", s)  # 600: still running
    p.stage(f"after 1 s cuStreamQuery={stages['running']}")
    if strategy.startswith("trap"):
        side = p.stream()
        stages["trap_launch"] = p.launch("killer", 1, 1, side)
        p.stage(f"trap launched rc={stages['trap_launch']}")
        stages["trap_query"] = p.wait_error(side, 20.0)
        p.stage(f"trap stream query={stages['trap_query']}")
        stages["hang_query"] = p.rc("cuStreamQuery", s)
        p.stage(f"hung stream query={stages['hang_query']}")
    if strategy == "destroy":
        stages["destroy"] = p.rc("cuCtxDestroy_v2", p.ctx)
        p.stage(f"cuCtxDestroy={stages['destroy']}")
        p.primary()
    else:
        stages["reset"] = p.rc("cuDevicePrimaryCtxReset_v2", p.dev)
        p.stage(f"cuDevicePrimaryCtxReset={stages['reset']}")
        p.primary()
    p.load()
    stages["usable"] = p.usable()
    p.stage(f"usable={stages['usable']}")
    print(json.dumps(stages), flush=True)


def kill_child() -> None:
    p = Probe()
    p.primary()
    p.load()
    flag = p.alloc(64)
    s = p.stream()
    p.launch("spin", 2, 64, s, flag)
    p.stage("spinning; waiting to be killed")
    time.sleep(600)


def run_kill(limit: float) -> dict[str, object]:
    t0 = time.monotonic()
    victim = subprocess.Popen([sys.executable, "-m", "capqr.bench.gpu_hang_probe", "--child",
                               "kill-victim"], stderr=subprocess.PIPE, text=True)
    line = victim.stderr.readline()
    while line and "spinning" not in line:
        line = victim.stderr.readline()
    stages: dict[str, object] = {"spinning_after": round(time.monotonic() - t0, 3)}
    time.sleep(1.0)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    stages["killed_after"] = round(time.monotonic() - t0, 3)
    after = subprocess.run([sys.executable, "-m", "capqr.bench.gpu_hang_probe", "--child",
                            "fresh"], capture_output=True, text=True, timeout=limit)
    stages["fresh"] = after.stdout.strip()[-200:]
    stages["usable"] = '"usable": true' in after.stdout
    return stages


def fresh() -> None:
    p = Probe()
    p.primary()
    p.load()
    print(json.dumps({"usable": p.usable()}), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("strategies", nargs="*", default=list(STRATEGIES))
    ap.add_argument("--limit", type=float, default=40.0, help="seconds per strategy")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child == "kill-victim":
        kill_child()
        return 0
    if a.child == "fresh":
        fresh()
        return 0
    if a.child:
        child(a.child)
        return 0
    for strategy in a.strategies:
        t0 = time.monotonic()
        row: dict[str, object] = {"strategy": strategy}
        try:
            if strategy == "kill":
                row["stages"] = run_kill(a.limit)
                row["ok"] = bool(row["stages"]["usable"])  # type: ignore[index]
            else:
                r = subprocess.run([sys.executable, "-m", "capqr.bench.gpu_hang_probe",
                                    "--child", strategy], capture_output=True, text=True,
                                   timeout=a.limit)
                lines = r.stdout.strip().splitlines()
                row["stages"] = json.loads(lines[-1]) if lines else None
                row["ok"] = bool(row["stages"] and row["stages"].get("usable"))
                row["log"] = r.stderr[-1500:]
                row["rc"] = r.returncode
        except subprocess.TimeoutExpired as e:
            row["ok"] = False
            row["error"] = f"over {a.limit} s"
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            row["log"] = err[-1500:]
        row["seconds"] = round(time.monotonic() - t0, 2)
        print(json.dumps(row), flush=True)
        os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
