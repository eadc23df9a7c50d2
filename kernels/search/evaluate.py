"""The gate every candidate (and every submitted kernel) goes through.

verify -> compile checked -> run on fresh random inputs plus stress inputs
-> ``kernels.check`` on every output -> isolation (each matrix alone, the
workspace footprint: :func:`_isolation_problem`) -> time (median of
launches on the normal input).  The result is a dict; failures carry a ``status`` and a
one-line ``reason``:

    ok | verify_error | compile_error | fault | timeout | check_failed | crash

``run_gate`` runs in the calling process (used by ``--no-dask`` and inside
the isolated worker); ``evaluate_isolated`` runs it in a fresh child process
(``python -m capqr.kernels.search.evaluate``), so a hard crash (a signal, a
compiler blow-up, an out-of-memory kill) becomes a ``crash`` record instead
of taking the search down.

Kernel contract (seed kernels and submissions alike)::

    KERNEL void NAME(cap_t a, cap_t tau, cap_t work,
                     int64_t batch, int64_t m, int64_t n [, int64_t nb])

* ``a``: batch x m x n row-major, float32 (or float16 for half storage: the
  kernel reads ``a`` with ``cap_load_f16``/``cap_offset_f16``), overwritten
  by the LAPACK compact form (R on/above the diagonal, Householder vectors
  below, unit diagonal implicit);
* ``tau``: batch x min(m, n) float32;
* ``work``: float32 scratch of :func:`kernels.qr.work_size` elements,
  ``grid * (m*nb + nb*nb + nb)``, or ``grid * n`` when the kernel takes no
  ``nb``;
* launched with ``grid = batch`` (one block per matrix, ``rt_block_idx()``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any

import numpy as np

from ..mutate import storage_of
from ..qr import work_size
from . import inputs as inputs_mod

STATUSES = ("ok", "verify_error", "compile_error", "fault", "timeout", "check_failed", "crash")


def default_task(source: str, entry: str, *, m: int, n: int, batch: int, nb: int = 32,
                 seed: int = 0, timeout: float = 30.0, reps: int = 3, kind: str = "search",
                 storage: str | None = None, threads: int = 0,
                 wall_timeout: float = 600.0) -> dict:
    """A gate task (a JSON-able dict, the unit shipped to workers)."""
    return {"source": source, "entry": entry, "m": m, "n": n, "batch": batch, "nb": nb,
            "seed": seed, "timeout": timeout, "reps": reps, "kind": kind,
            "storage": storage or storage_of(source), "threads": threads,
            "wall_timeout": wall_timeout}


def _fail(status: str, reason: str, detail: Any = None, **kw: Any) -> dict:
    return {"status": status, "reason": reason, "detail": detail, **kw}


def run_gate(task: dict) -> dict:
    """Evaluate one kernel in this process; never raises (failures are results)."""
    t0 = time.monotonic()
    try:
        res = _gate(task)
    except Exception as e:  # a bug in the gate or the runtime: record, never crash the loop
        res = _fail("crash", f"{type(e).__name__} in the gate: {e}",
                    {"traceback": traceback.format_exc()[-4000:]})
    res["eval_s"] = time.monotonic() - t0
    res.setdefault("worker", f"{socket.gethostname()}:{os.getpid()}")
    return res


def _gate(task: dict) -> dict:
    from ... import runtime

    src, entry = task["source"], task["entry"]
    try:
        kern = runtime.compile(src, entry, checked=True)
    except runtime.VerifyError as e:
        return _fail("verify_error", f"VerifyError: {e}",
                     {"line": e.line, "construct": e.construct, "reason": e.reason})
    except runtime.CompileError as e:
        return _fail("compile_error", f"CompileError: {str(e)[:300]}", {"message": str(e)[-4000:]})
    except Exception as e:  # cffi/distutils errors surface as their own types
        return _fail("compile_error", f"{type(e).__name__}: {str(e)[:300]}",
                     {"message": str(e)[-4000:]})
    bad = _signature_problem(kern)
    if bad:
        return _fail("verify_error", f"signature: {bad}", {"params": kern.signature.params})

    if task["kind"] == "ood":
        cases = inputs_mod.ood_inputs(task["m"], task["n"], task["batch"], task["seed"])
    else:
        cases = inputs_mod.search_inputs(task["m"], task["n"], task["batch"], task["seed"])
    worst: dict[str, float] = {}
    verdicts = []
    for name, a in cases:
        out = _launch(kern, task, a)
        if isinstance(out, dict):  # fault / timeout
            out["detail"] = {**(out.get("detail") or {}), "input": name, "shape": list(a.shape)}
            out["reason"] = f"{out['reason']} [input {name} {_shape(a)}]"
            return out
        h, tau = out
        if not verdicts:
            first_out = (h, tau)
        rep = _check(a, h, tau)
        for k, v in rep.worst().items():
            worst[k] = max(worst.get(k, 0.0), v)
        verdicts.append({"input": name, "shape": list(a.shape), "ok": rep.ok,
                         **{k: _num(v) for k, v in rep.worst().items()}})
        if not rep.ok:
            why = rep.failures[0].reason if rep.failures else "check failed"
            return _fail("check_failed", f"{why} [input {name} {_shape(a)}]",
                         {"inputs": verdicts}, ratios=_nums(worst))
    leak = _isolation_problem(kern, task, cases[0][1], *first_out)
    if leak is not None:
        leak["reason"] = f"{leak['reason']} [input {cases[0][0]} {_shape(cases[0][1])}]"
        leak["detail"] = {**(leak.get("detail") or {}), "inputs": verdicts}
        return leak
    res = {"status": "ok", "reason": None, "detail": {"inputs": verdicts}, "ratios": _nums(worst)}
    if task["kind"] != "ood" and task.get("reps", 0) > 0:
        times = _time(kern, task, cases[0][1])
        if isinstance(times, dict):
            return times
        res["times"] = times
        res["time_s"] = statistics.median(times)
    return res


def _isolation_problem(kern: Any, task: dict, a: np.ndarray, h: np.ndarray,
                       tau: np.ndarray) -> dict | None:
    """Each matrix's result must depend on that matrix alone, and the blocks of a
    batch must not write the same workspace element.  A kernel that touches a
    neighbour's elements (an origin one element off, a wrong batch stride, an
    overlapping workspace slot) can pass the checker by luck, or because its
    blocks happened to run one after the other, and fail with more workers.

    Two deterministic checks, whatever the worker count: the first, second,
    middle and last matrices run again alone, each in a batch of one with
    buffers sized for one (a neighbour's element is then out of bounds: a
    fault), and must give bitwise the batch run's result (four, not all: a
    contest batch of 640 would cost 640 launches per candidate; a wrong batch
    stride or origin shows in the second or the last); and the workspace
    elements written by the batch must number ``batch`` times those written by
    one matrix alone (with the workspace filled with a marker first), else two
    blocks wrote the same element: a race once they run at the same time.
    None if both hold, else the failure."""
    batch = a.shape[0]
    if batch < 2:
        return None
    for b in sorted({0, 1, batch // 2, batch - 1}):
        out = _launch(kern, task, a[b:b + 1])
        if isinstance(out, dict):
            out["reason"] = f"{out['reason']} [matrix {b} run alone]"
            return out
        if not (np.array_equal(out[0][0], h[b], equal_nan=True)
                and np.array_equal(out[1][0], tau[b], equal_nan=True)):
            return _fail("check_failed", f"matrix {b} alone gives another result than in "
                         "the batch (it depends on other matrices or on the block order)")
    alone = _launch(kern, task, a[:1], footprint=True)
    together = _launch(kern, task, np.concatenate([a[:1]] * batch), footprint=True)
    for out in (alone, together):
        if isinstance(out, dict):
            out["reason"] = f"{out['reason']} [workspace footprint run]"
            return out
    if together != batch * alone:
        return _fail("check_failed", f"the {batch} blocks wrote {together} workspace elements, "
                     f"one matrix alone {alone}: blocks share workspace (a race between them)")
    return None


#: bit pattern the workspace holds before a footprint run (a NaN no arithmetic makes)
_MARK = np.uint32(0x7FBADBAD)


def _signature_problem(kern: Any) -> str | None:
    sig = kern.signature
    kinds = [k for _, k in sig.params]
    if kinds[:3] != ["cap", "cap", "cap"] or sig.n_caps != 3:
        return f"expected (cap_t a, cap_t tau, cap_t work, ...), got {sig.params}"
    if sig.n_scalars not in (3, 4) or any(k != "int64" for _, k in sig.scalar_params):
        return ("expected int64_t scalars (batch, m, n) or (batch, m, n, nb), got "
                f"{sig.scalar_params}")
    return None


def _buffers(kern: Any, task: dict, a: np.ndarray) -> tuple:
    from ... import capabilities

    batch, m, n = a.shape
    half = task["storage"] == "f16"
    with np.errstate(over="ignore"):
        h = np.array(a, dtype=np.float16 if half else np.float32, order="C", copy=True)
    tau = np.zeros((batch, min(m, n)), dtype=np.float32)
    nb = int(task["nb"]) if kern.signature.n_scalars == 4 else None
    work = capabilities.alloc((work_size(batch, m, n, nb),), np.float32, name="work")
    caps = [capabilities.wrap(h, name="a"), capabilities.wrap(tau, name="tau"), work]
    args = (batch, m, n) if nb is None else (batch, m, n, nb)
    return h, tau, caps, args


def _launch(kern: Any, task: dict, a: np.ndarray, footprint: bool = False) -> Any:
    """Run once on ``a``: (H, tau), or with ``footprint`` the number of workspace
    elements the launch wrote (the workspace holds _MARK before it); or a
    fault/timeout result dict."""
    from ... import runtime

    h, tau, caps, args = _buffers(kern, task, a)
    work = caps[2].numpy().view(np.uint32) if footprint else None
    if work is not None:
        work[:] = _MARK
    try:
        runtime.launch(kern, caps, args=args, grid=a.shape[0], timeout=task["timeout"])
        if work is not None:
            return int(np.count_nonzero(work != _MARK))
    except runtime.CapabilityFault as e:
        return _fail("fault", f"CapabilityFault: {e}", _fault_detail(e, task))
    except runtime.KernelTimeout as e:
        return _fail("timeout", f"KernelTimeout: {e}", {"timeout": task["timeout"]})
    finally:
        del work  # the view, before its buffer is freed
        caps[2].free()
    return h, tau


def _time(kern: Any, task: dict, a: np.ndarray) -> Any:
    """Launch times (seconds) on ``a``; inputs are restored outside the timed region."""
    from ... import runtime

    h, tau, caps, args = _buffers(kern, task, a)
    src = h.copy()
    times: list[float] = []
    try:
        # At least ``reps`` launches; tiny problems repeat until 0.2 s of samples
        # (at most 50) so the median is not timer noise.
        while len(times) < int(task["reps"]) or (sum(times) < 0.2 and len(times) < 50):
            np.copyto(h, src)
            t = time.perf_counter()
            runtime.launch(kern, caps, args=args, grid=a.shape[0], timeout=task["timeout"])
            times.append(time.perf_counter() - t)
    except runtime.CapabilityFault as e:
        return _fail("fault", f"CapabilityFault: {e} [timing run]",
                     _fault_detail(e, task))
    except runtime.KernelTimeout as e:
        return _fail("timeout", f"KernelTimeout: {e} [timing run]", {"timeout": task["timeout"]})
    finally:
        caps[2].free()
    return times


def _fault_detail(e: Any, task: dict) -> dict:
    d = {k: getattr(e, k, None) for k in ("reason", "kernel", "block", "buffer", "index",
                                          "access", "line")}
    if e.line:
        lines = task["source"].split("\n")
        if 0 < e.line <= len(lines):
            d["source_line"] = lines[e.line - 1].strip()
    return d


def _check(a: np.ndarray, h: np.ndarray, tau: np.ndarray) -> Any:
    from ... import kernels

    return kernels.check(a, h, tau)


def _num(v: float) -> float | None:
    # JSON has no inf/nan: store None (the status and reason already say why).
    return float(v) if np.isfinite(v) else None


def _nums(d: dict) -> dict:
    return {k: _num(v) for k, v in d.items()}


def _shape(a: np.ndarray) -> str:
    return "x".join(str(s) for s in a.shape)


# ---------------------------------------------------------------------------
# process isolation

def _die_with_parent() -> None:
    """In the child: get SIGKILL when the parent dies (no orphan evaluations)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def evaluate_isolated(task: dict, *, retries: int = 1) -> dict:
    """Run the gate in a fresh child process; a dead child becomes a ``crash`` result.

    A child killed by a signal is retried ``retries`` times first (the kill
    may have come from outside: an OOM killer, an operator, a test).
    """
    for attempt in range(retries + 1):
        res = _run_child(task)
        if res["status"] != "crash" or not res.get("detail", {}).get("signal") \
                or attempt == retries:
            if attempt:
                res.setdefault("detail", {})
                if isinstance(res["detail"], dict):
                    res["detail"]["attempts"] = attempt + 1
            return res
    return res  # pragma: no cover (loop always returns)


def _run_child(task: dict) -> dict:
    env = dict(os.environ)
    if task.get("threads"):
        env["CAPQR_THREADS"] = str(task["threads"])
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "capqr.kernels.search.evaluate"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True,
                                preexec_fn=_die_with_parent)
    except OSError as e:
        return _fail("crash", f"cannot start evaluation process: {e}", eval_s=0.0)
    try:
        out, err = proc.communicate(json.dumps(task), timeout=task.get("wall_timeout", 600))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return _fail("timeout", f"evaluation exceeded its wall limit of "
                     f"{task.get('wall_timeout')} s (killed)", {"stderr": err[-2000:]},
                     eval_s=time.monotonic() - t0)
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    rc = proc.returncode
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        return _fail("crash", f"evaluation process killed by {name}",
                     {"signal": name, "stderr": err[-2000:]}, eval_s=time.monotonic() - t0)
    return _fail("crash", f"evaluation process exited with {rc} and no result",
                 {"returncode": rc, "stderr": err[-2000:]}, eval_s=time.monotonic() - t0)


def main() -> None:
    """Child entry: a task as JSON on stdin, the result as one JSON line on stdout."""
    task = json.loads(sys.stdin.read())
    res = run_gate(task)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
