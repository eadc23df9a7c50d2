"""Liveness: the work between two pollchecks is bounded for every kernel, loops or not.

A DAG of loop-free helpers (h1 calls h0 twice, h2 calls h1 twice, ..., 40 deep)
makes 2^40 calls, hours of work, without a single loop.  With pollchecks on loop
back-edges only it never polled: a timeout, a cancel (Ctrl-C, a fault in another
block) or a collector handshake waited for the whole run.  Every function that
calls a same-source function now polls at its entry (runtime/compiler/hoist/polls.py,
entry_polls, for the CPU and the GPU lowering).

The launches run in subprocesses with a hard wall limit, so that a kernel that
does not stop fails its test instead of hanging the run.  The kernels are
compiled (or, for the emulated GPU lane, built) in the test process first and
loaded from the cache by the subprocess, so the wall limit covers the launch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from capqr import runtime

ROOT = Path(__file__).resolve().parent.parent
DEPTH = 40  # 2^40 calls of h0: hours, at a few ns per call
TIMEOUT = 0.5
#: what a probe may take beyond interpreter start and cache loads before it counts as hung
WALL = 90.0


def dag_source(depth: int, index: str = "rt_block_idx()") -> str:
    """h0 adds v to x[i]; h_k calls h_(k-1) twice; no loop anywhere.  Kernels:
    ``dag`` runs h_depth, ``dag_fault`` faults in block (thread) 0 once every other
    block (thread) has started its DAG, ``dag_fault_now`` faults in thread 0 at once."""
    parts = ["static int64_t h0(cap_t x, int64_t i, int64_t v)\n{\n"
             "    cap_store_i64(x, i, cap_load_i64(x, i) + v);\n    return v + 1;\n}\n"]
    for d in range(1, depth + 1):
        parts.append(f"static int64_t h{d}(cap_t x, int64_t i, int64_t v)\n{{\n"
                     f"    return h{d - 1}(x, i, h{d - 1}(x, i, v));\n}}\n")
    parts.append(f"KERNEL void dag(cap_t x, int64_t v)\n{{\n"
                 f"    int64_t i = {index};\n    cap_store_i64(x, i, h{depth}(x, i, v));\n}}\n")
    return "".join(parts)


CPU_FAULT_KERNEL = """
KERNEL void dag_fault(cap_t x, cap_t started, int64_t v)
{
    int64_t b = rt_block_idx();
    if (b == 0) {
        int64_t n = 0;
        while (n < rt_grid_dim() - 1) {  /* polls: waits until every DAG block runs */
            n = 0;
            for (int64_t k = 1; k < rt_grid_dim(); k++)
                n += cap_load_i64(started, k);
        }
        cap_store_i64(x, -1, 0);  /* out of bounds: the launch faults */
    }
    cap_store_i64(started, b, 1);
    cap_store_i64(x, b, HTOP(x, b, v));
}
""".replace("HTOP", f"h{DEPTH}")

GPU_FAULT_KERNEL = """
KERNEL void dag_fault_now(cap_t x, int64_t v)
{
    int64_t t = rt_thread_idx();
    if (t == 0)
        cap_store_i64(x, -1, 0);  /* out of bounds: the other threads must stop */
    cap_store_i64(x, t, HTOP(x, t, v));
}
""".replace("HTOP", f"h{DEPTH}")


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **extra)


def _probe(code: str, *argv: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (this checkout's runtime) under a hard wall
    limit; its last stdout line, a JSON object.  A probe still running at the limit
    fails the test (the kernel did not stop): it is never skipped."""
    try:
        p = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=_env(**env),
                           capture_output=True, text=True, timeout=WALL)
    except subprocess.TimeoutExpired:
        p = None  # (failed below, without the probe's arguments in the report)
    if p is None:
        pytest.fail(f"the probe ran {WALL:.0f} s and was killed: the kernel never stopped")
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


PRELUDE = r"""
import json, sys, threading, time
import numpy as np
from capqr import capabilities, runtime
"""


# ---------------------------------------------------------------------------
# placement (generated code)


def _c_source(src: str, name: str, mode: str) -> str:
    from capqr.runtime.compiler.astutil import readable
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify
    from capqr.runtime.cpu.lower import instrument

    return readable(instrument(verify(parse(src), target="cpu"), name, mode).c_source)


def _function(text: str, head: str) -> str:
    """The text of the function definition whose first line starts with ``head``."""
    start = text.index(head)
    return text[start:text.index("\n}\n", start) + 3]


@pytest.mark.parametrize("mode", ["checked", "raw_poll", "raw"])
def test_callers_poll_at_entry_leaves_do_not(mode: str) -> None:
    """Checked and raw_poll: every function that calls another polls first thing; the
    call-free h0 does not; raw has no pollcheck at all."""
    text = _c_source(dag_source(3), "dag", mode)
    polls = mode != "raw"
    for f in ("h1", "h2", "h3", "dag"):
        body = _function(text, f"static {'void' if f == 'dag' else 'int64_t'} {f}(")
        first = body.split("{\n", 1)[1].lstrip()
        assert first.startswith("rt_pollcheck(__rt);") == polls, (mode, body)
    assert "rt_pollcheck" not in _function(text, "static int64_t h0(")
    if not polls:
        assert "rt_pollcheck(__rt);" not in text.split("RT_DEFINE_TILE(f64, double)")[1]


def test_entry_poll_follows_the_rooting_of_cap_parameters() -> None:
    """With shadow frames on, a cap argument (here a fresh object the caller holds only in
    the call) is rooted by the callee before its entry poll lets the collector run."""
    src = ("static void leaf(cap_t c) { cap_store_f64(c, 0, 1.0); }\n"
           "static void mid(cap_t c) { leaf(c); leaf(c); }\n"
           "KERNEL void k(int64_t n) { mid(cap_alloc_f64(n)); }\n")
    body = _function(_c_source(src, "k", "checked"), "static void mid(")
    assert body.index("rt_root(") < body.index("rt_pollcheck(__rt);"), body


def test_gpu_lowering_ticks_the_threads_counter_at_entry() -> None:
    """The GPU lowering: the counter is the thread's, passed by reference to every
    function; callers tick it at entry; raw builds have neither."""
    from capqr.runtime.compiler.astutil import readable
    from capqr.runtime.cuda import translate

    checked = readable(translate(dag_source(3), checked=True).text)
    for f in ("h1", "h2", "h3"):
        body = _function(checked, f"static __device__ __forceinline__ long long {f}(rt_pc_t")
        assert body.split("{\n", 1)[1].lstrip().startswith("RT_POLL(__rt_pc);"), body
        assert f"h{int(f[1:]) - 1}(__rt_pc, " in body
    assert "RT_POLL" not in _function(checked, "static __device__ __forceinline__ long long h0(")
    assert "unsigned int __rt_pc = 0u;\n  __rtk_dag(__rt_pc, x, v);" in checked
    raw = readable(translate(dag_source(3), checked=False).text)
    assert "rt_pc_t __rt_pc" not in raw.split("kernel source follows")[1]
    assert "RT_POLL(__rt_pc);" not in raw


# ---------------------------------------------------------------------------
# the CPU lane, end to end

TIMEOUT_PROBE = PRELUDE + r"""
k = runtime.compile(sys.argv[1], "dag")
x = capabilities.alloc(runtime.threads(), np.int64)
t0 = time.monotonic()
try:
    runtime.launch(k, [x], args=(1,), grid=runtime.threads(), timeout=float(sys.argv[2]))
    got = "returned"
except runtime.KernelTimeout:
    got = "KernelTimeout"
print(json.dumps({"got": got, "elapsed": time.monotonic() - t0}))
"""


def test_call_dag_stops_at_its_timeout() -> None:
    """Seen failing before entry polls: the probe ran its whole wall limit past a 0.5 s
    timeout (the launch of 2^40 calls never polled)."""
    src = dag_source(DEPTH)
    runtime.compile(src, "dag")  # into the cache the probe loads from
    out = _probe(TIMEOUT_PROBE, src, str(TIMEOUT))
    assert out["got"] == "KernelTimeout", out
    assert out["elapsed"] < 2 * TIMEOUT, out


INTERRUPT_PROBE = PRELUDE + r"""
import _thread
k = runtime.compile(sys.argv[1], "dag")
x = capabilities.alloc(1, np.int64)
threading.Timer(float(sys.argv[2]), _thread.interrupt_main).start()
t0 = time.monotonic()
try:
    runtime.launch(k, [x], args=(1,), grid=1)
    got = "returned"
except KeyboardInterrupt:
    got = "KeyboardInterrupt"
print(json.dumps({"got": got, "elapsed": time.monotonic() - t0}))
"""


def test_call_dag_stops_at_ctrl_c() -> None:
    """Ctrl-C during the launch (no timeout) cancels the DAG at its next entry poll."""
    src = dag_source(DEPTH)
    runtime.compile(src, "dag")
    out = _probe(INTERRUPT_PROBE, src, str(TIMEOUT))
    assert out["got"] == "KeyboardInterrupt", out
    assert out["elapsed"] < 2 * TIMEOUT, out


GC_PROBE = PRELUDE + r"""
k = runtime.compile(sys.argv[1], "dag")
x = capabilities.alloc(1, np.int64)
launch = {}

def run():
    t0 = time.monotonic()
    try:
        runtime.launch(k, [x], args=(1,), grid=1, timeout=float(sys.argv[2]))
        launch["got"] = "returned"
    except runtime.KernelTimeout:
        launch["got"] = "KernelTimeout"
    launch["elapsed"] = time.monotonic() - t0

th = threading.Thread(target=run)
th.start()
time.sleep(0.3)  # the block is deep in its DAG
t0 = time.monotonic()
runtime.gc_collect()
gc_s = time.monotonic() - t0
th.join()
print(json.dumps({"gc_s": gc_s, "launch": launch}))
"""


def test_collection_completes_while_a_call_dag_runs() -> None:
    """The collector's soft handshake needs every running block to poll: a full cycle
    from the host ends while the DAG block keeps running (it stops only at its 2 s
    timeout).  Seen failing before entry polls: gc_collect() did not return within
    the probe's wall limit."""
    src = dag_source(DEPTH)
    runtime.compile(src, "dag")
    out = _probe(GC_PROBE, src, "2.0")
    assert out["gc_s"] < 1.0, out
    assert out["launch"]["got"] == "KernelTimeout", out
    assert out["launch"]["elapsed"] < 2 * 2.0, out


FAULT_PROBE = PRELUDE + r"""
k = runtime.compile(sys.argv[1], "dag_fault")
grid = 4
x = capabilities.alloc(grid, np.int64, name="x")
started = capabilities.alloc(grid, np.int64, name="started")
t0 = time.monotonic()
try:
    runtime.launch(k, [x, started], args=(1,), grid=grid)
    got = {"got": "returned"}
except runtime.CapabilityFault as e:
    got = {"got": "CapabilityFault", "block": e.block, "buffer": e.buffer, "index": e.index}
got["elapsed"] = time.monotonic() - t0
got["started"] = started.numpy().tolist()
print(json.dumps(got))
"""


def test_fault_in_one_block_stops_the_call_dags_of_the_others() -> None:
    """Block 0 faults once blocks 1..3 are inside their DAGs; they stop at their next
    entry poll and the launch raises the fault.  Seen failing before entry polls: the
    launch never returned (probe killed at its wall limit)."""
    src = dag_source(DEPTH) + CPU_FAULT_KERNEL
    runtime.compile(src, "dag_fault")
    out = _probe(FAULT_PROBE, src, CAPQR_THREADS="4")
    assert out["got"] == "CapabilityFault", out
    assert (out["block"], out["buffer"], out["index"]) == (0, "x", -1), out
    assert out["started"][1:] == [1, 1, 1], out  # the DAG blocks did run
    assert out["elapsed"] < 2 * TIMEOUT, out


# ---------------------------------------------------------------------------
# the GPU lane's lowering, under the CPU emulation (tests/emulate_cuda.py)

EMU_PROBE = PRELUDE + r"""
sys.path.insert(0, "tests")
from emulate_cuda import build
from capqr.capabilities import abi
ks = build(sys.argv[1], checked=True, workdir=__import__("pathlib").Path(sys.argv[2]))
name, cancel = sys.argv[3], (float(sys.argv[4]) if sys.argv[4] != "-" else None)
x = np.zeros(4, np.int64)
t0 = time.monotonic()
rec = ks[name].launch([x, 1], 1, 4, cancel_after=cancel)
print(json.dumps({"rec": rec, "elapsed": time.monotonic() - t0,
                  "timeout_kind": abi.FAULT_CODE["TIMEOUT"]}))
"""


@pytest.fixture(scope="module")
def emu_dir(tmp_path_factory) -> Path:
    """The DAG kernels' emulated build, made once here (g++, seconds) for the probes."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    sys.path.insert(0, str(ROOT / "tests"))
    from emulate_cuda import build

    d = tmp_path_factory.mktemp("emu_liveness")
    build(_gpu_source(), checked=True, workdir=d)
    return d


def _gpu_source() -> str:
    return dag_source(DEPTH, "rt_thread_idx()") + GPU_FAULT_KERNEL


def test_emulated_gpu_call_dag_stops_at_cancel(emu_dir: Path) -> None:
    """The host raises the record's cancel flag 0.5 s in (the lane's deadline); every
    thread of the DAG block reads it within 1024 entry ticks and exits, recording the
    timeout.  Seen failing before entry ticks: the probe was killed at its wall limit."""
    out = _probe(EMU_PROBE, _gpu_source(), str(emu_dir), "dag", str(TIMEOUT))
    assert out["rec"] is not None and out["rec"]["kind"] == out["timeout_kind"], out
    assert out["elapsed"] < 2 * TIMEOUT, out


def test_emulated_gpu_fault_stops_the_other_threads_call_dags(emu_dir: Path) -> None:
    """Thread 0 faults at once; threads 1..3, deep in their DAGs, see the record's
    fault flag at a slow poll and exit, and the launch ends with thread 0's fault."""
    out = _probe(EMU_PROBE, _gpu_source(), str(emu_dir), "dag_fault_now", "-")
    rec = out["rec"]
    assert rec is not None and (rec["thread"], rec["index"]) == (0, -1), out
    assert out["elapsed"] < 2 * TIMEOUT, out
