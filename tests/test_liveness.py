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
        assert "rt_pollcheck(__rt);" not in text


def test_entry_poll_follows_the_rooting_of_cap_parameters() -> None:
    """With shadow frames on, a cap argument (here a fresh object the caller holds only in
    the call) is rooted by the callee before its entry poll lets the collector run."""
    src = ("static void leaf(cap_t c) { cap_store_f64(c, 0, 1.0); }\n"
           "static void mid(cap_t c) { leaf(c); leaf(c); }\n"
           "KERNEL void k(int64_t n) { mid(cap_alloc_f64(n)); }\n")
    body = _function(_c_source(src, "k", "checked"), "static void mid(")
    assert body.index("rt_root(") < body.index("rt_pollcheck(__rt);"), body


def test_gpu_lowering_polls_the_threads_clock_at_entry() -> None:
    """The GPU lowering: the poll clock is the thread's, passed by reference to every
    function; callers poll at entry; raw builds have neither."""
    from capqr.runtime.compiler.astutil import readable
    from capqr.runtime.cuda import translate

    checked = readable(translate(dag_source(3), checked=True).text)
    for f in ("h1", "h2", "h3"):
        body = _function(checked, f"static __device__ __forceinline__ long long {f}(rt_pc_t")
        assert body.split("{\n", 1)[1].lstrip().startswith("RT_POLL(__rt_pc);"), body
        assert f"h{int(f[1:]) - 1}(__rt_pc, " in body
    assert "RT_POLL" not in _function(checked, "static __device__ __forceinline__ long long h0(")
    assert "unsigned int __rt_pc = rt_poll_clock();\n  __rtk_dag(__rt_pc, x, v);" in checked
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
import _thread, signal
# Python's Ctrl-C handler even where the suite was started with SIGINT ignored (a
# background job): interrupt_main does nothing then
signal.signal(signal.SIGINT, signal.default_int_handler)
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
    thread of the DAG block reads it at an entry poll and exits, recording the timeout.
    Seen failing before entry polls: the probe was killed at its wall limit."""
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


# ---------------------------------------------------------------------------
# heavy bodies under the poll thresholds: the work between two polls, not the trip count
#
# A nest of 4000 x 256 iterations (under OUTER_SHORT_TRIP x INNER_CONST_TRIP) whose
# body calls sin() HEAVY times: before the work bound it was a quiet nest, polling once
# after the whole nest (tens of seconds on the 2-core VM), however heavy its body.

HEAVY = 256      # sin() calls per inner iteration: ~10 ms per outer iteration on the VM
HEAVY_TRIPS = 4000


def heavy_nest(name: str, prologue: str, base: str) -> str:
    """``name``(x, n): ``prologue``, then the heavy nest over x[base .. base + 255]."""
    chain = "\n".join(f"            s = sin(s) * 0.75 + {0.1 + k * 1e-3:.4f};"
                      for k in range(HEAVY))
    return f"""
KERNEL void {name}(cap_t x, int64_t n)
{{
{prologue}
    int64_t base = {base};
    for (int64_t u = 0; u < n; u++)
        for (int64_t l = 0; l < 256; l++) {{
            double s = cap_load_f64(x, base + l);
{chain}
            cap_store_f64(x, base + l, s);
        }}
}}
"""


HEAVY_CPU = heavy_nest("heavy", "", "0") + heavy_nest("heavy_fault", """
    cap_t started = cap_offset_f64(x, 512);
    if (rt_block_idx() == 0) {
        while (cap_load_f64(started, 0) == 0.0) {}   /* polls: until block 1 runs */
        cap_store_f64(x, -1, 0.0);                    /* out of bounds: the launch faults */
    }
    cap_store_f64(started, 0, 1.0);""", "256")

HEAVY_TIMEOUT_PROBE = PRELUDE + r"""
k = runtime.compile(sys.argv[1], "heavy")
x = capabilities.alloc(256, np.float64)
t0 = time.monotonic()
try:
    runtime.launch(k, [x], args=(int(sys.argv[3]),), timeout=float(sys.argv[2]))
    got = "returned"
except runtime.KernelTimeout:
    got = "KernelTimeout"
print(json.dumps({"got": got, "elapsed": time.monotonic() - t0}))
"""

HEAVY_FAULT_PROBE = PRELUDE + r"""
k = runtime.compile(sys.argv[1], "heavy_fault")
x = capabilities.alloc(513, np.float64, name="x")
t0 = time.monotonic()
try:
    runtime.launch(k, [x], args=(int(sys.argv[2]),), grid=2)
    got = {"got": "returned"}
except runtime.CapabilityFault as e:
    got = {"got": "CapabilityFault", "block": e.block, "index": e.index}
got["elapsed"] = time.monotonic() - t0
print(json.dumps(got))
"""


def test_quiet_limits_follow_the_work_of_an_iteration() -> None:
    """The generated C: a light innermost loop stays quiet up to SHORT_TRIP iterations, one
    calling sin() HEAVY times up to QUIET_WORK of estimated work; a nest's quiet copy also
    needs the run-time test of its work (trips times one outer iteration)."""
    import re

    from capqr.runtime.compiler.hoist.polls import LIBM_WORK, QUIET_WORK, SHORT_TRIP

    def limits(src: str, name: str) -> set[int]:
        """The quiet tests' trip limits (one per copy of the loop)."""
        text = _c_source(src, name, "checked")
        return {int(v) for v in re.findall(r"__h\d+_span, 1, 0\) < (\d+)\)", text)}

    loop = """
KERNEL void one(cap_t x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double s = cap_load_f64(x, i);
BODY
        cap_store_f64(x, i, s);
    }
}
"""
    assert limits(loop.replace("BODY", "s = s * 0.75;"), "one") == {SHORT_TRIP}
    heavy = "\n".join(["s = sin(s) * 0.75;"] * HEAVY)
    (limit,) = limits(loop.replace("BODY", heavy), "one")
    assert limit * HEAVY * LIBM_WORK <= QUIET_WORK < 2 * limit * HEAVY * (LIBM_WORK + 16)
    assert f"<= {QUIET_WORK})" in _c_source(HEAVY_CPU, "heavy", "checked")


def test_heavy_nest_under_the_poll_thresholds_stops_at_its_timeout() -> None:
    """Seen failing before the work bound: the launch returned KernelTimeout after 10.8 s
    (the quiet nest polled once, after all of its 4000 x 256 iterations)."""
    runtime.compile(HEAVY_CPU, "heavy")
    out = _probe(HEAVY_TIMEOUT_PROBE, HEAVY_CPU, str(TIMEOUT), str(HEAVY_TRIPS))
    assert out["got"] == "KernelTimeout", out
    assert out["elapsed"] < TIMEOUT + 1.0, out


def test_fault_in_one_block_stops_a_heavy_nest_in_another() -> None:
    """Block 0 faults once block 1 is in its heavy nest; block 1 stops at its next poll.
    Seen failing before the work bound: the fault came back after the whole nest."""
    runtime.compile(HEAVY_CPU, "heavy_fault")
    out = _probe(HEAVY_FAULT_PROBE, HEAVY_CPU, str(HEAVY_TRIPS), CAPQR_THREADS="2")
    assert out["got"] == "CapabilityFault", out
    assert (out["block"], out["index"]) == (0, -1), out
    assert out["elapsed"] < TIMEOUT + 1.0, out


# the GPU lowering, emulated: the same nest per thread; a fault of block 0 reaches block 1
# through the sequence record (rt_group_sync first: the emulation runs the blocks together)
HEAVY_GPU = heavy_nest("heavy", "", "rt_thread_idx() * 256") + heavy_nest(
    "heavy_group", """
    rt_group_sync();
    if (rt_block_idx() == 0)
        cap_store_f64(x, -1, 0.0);   /* out of bounds: block 1 must stop */""",
    "rt_block_idx() * 256")

HEAVY_EMU_PROBE = PRELUDE + r"""
sys.path.insert(0, "tests")
from emulate_cuda import build
from capqr.capabilities import abi
ks = build(sys.argv[1], checked=True, workdir=__import__("pathlib").Path(sys.argv[2]))
name, grid, block = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cancel = float(sys.argv[6]) if sys.argv[6] != "-" else None
x = np.zeros(512, np.float64)
t0 = time.monotonic()
rec = ks[name].launch([x, int(sys.argv[7])], grid, block, cancel_after=cancel)
print(json.dumps({"rec": rec, "elapsed": time.monotonic() - t0,
                  "timeout_kind": abi.FAULT_CODE["TIMEOUT"]}))
"""


@pytest.fixture(scope="module")
def heavy_emu_dir(tmp_path_factory) -> Path:
    """The heavy kernels' emulated build (g++, once here)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    sys.path.insert(0, str(ROOT / "tests"))
    from emulate_cuda import build

    d = tmp_path_factory.mktemp("emu_heavy")
    build(HEAVY_GPU, checked=True, workdir=d)
    return d


def test_emulated_gpu_heavy_nest_stops_at_cancel(heavy_emu_dir: Path) -> None:
    """Two threads in their heavy nests; the host cancels 0.5 s in.  Seen failing before
    the work bound (the quiet nest polled after all of it) and, with it but the poll
    counter read every 1024th tick, after 1024 outer iterations (seconds)."""
    out = _probe(HEAVY_EMU_PROBE, HEAVY_GPU, str(heavy_emu_dir), "heavy", "1", "2",
                 str(TIMEOUT), str(HEAVY_TRIPS))
    assert out["rec"] is not None and out["rec"]["kind"] == out["timeout_kind"], out
    assert out["elapsed"] < TIMEOUT + 1.0, out


def test_emulated_gpu_fault_in_one_block_stops_a_heavy_nest_in_another(
        heavy_emu_dir: Path) -> None:
    """Block 0 faults right after the grid barrier; block 1, in its heavy nest, sees the
    record's fault flag at its next poll read and exits."""
    out = _probe(HEAVY_EMU_PROBE, HEAVY_GPU, str(heavy_emu_dir), "heavy_group", "2", "1", "-",
                 str(HEAVY_TRIPS))
    rec = out["rec"]
    assert rec is not None and (rec["block"], rec["index"]) == (0, -1), out
    assert out["elapsed"] < TIMEOUT + 1.0, out
