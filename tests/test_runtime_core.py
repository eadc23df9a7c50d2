"""Runtime core: public API, launch argument matching, grids, timeouts, the kernel
cache, checked-vs-raw equivalence, wrapping numpy/torch memory, read-only views,
free(), int(cap) and capabilities.from_int()."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import CapabilityFault, KernelTimeout

# ---------------------------------------------------------------------------
# kernels shared by several tests

FILL_SRC = """
KERNEL void fill(cap_t x, int64_t n, double v)
{
    for (int64_t i = rt_block_idx(); i < n; i += rt_grid_dim())
        cap_store_f64(x, i, v);
}
"""

ORDER_SRC = """
KERNEL void order(cap_t a, int64_t n, cap_t b, double s, float f)
{
    for (int64_t i = 0; i < n; i++)
        cap_store_f64(b, i, cap_load_f64(a, i) * s + (double)f);
}
"""

TWO_CAPS_SRC = """
KERNEL void two(cap_t x, cap_t y, int64_t n)
{
    cap_store_f64(x, 0, 1.0);
    cap_store_f64(y, 0, (double)n);
}
"""

GRID_SRC = """
KERNEL void grid(cap_t idx, cap_t dim, cap_t count)
{
    int64_t b = rt_block_idx();
    cap_store_i64(idx, b, b);
    cap_store_i64(dim, b, rt_grid_dim());
    cap_store_i64(count, b, cap_load_i64(count, b) + 1);
}
"""

SPIN_SRC = """
KERNEL void spin(cap_t x)
{
    int64_t k = 0;
    while (cap_load_i64(x, 0) != 12345) {
        k++;
    }
    cap_store_i64(x, 1, k);
}
"""

SPIN_SOME_SRC = """
KERNEL void spin_some(cap_t out)
{
    int64_t b = rt_block_idx();
    if (b % 3 == 1) {
        for (;;) { }
    }
    cap_store_i64(out, b, b + 1);
}
"""

STORE0_SRC = """
KERNEL void store0(cap_t x)
{
    cap_store_f64(x, 0, 42.0);
}
"""

LOAD0_SRC = """
KERNEL void load0(cap_t x, cap_t out)
{
    cap_store_f64(out, 0, cap_load_f64(x, 0));
}
"""

ADDR_SRC = """
KERNEL void addr(cap_t x, cap_t out)
{
    cap_store_i64(out, 0, cap_to_int(x));
}
"""

BAD_SRC = """
KERNEL void bad(cap_t x, int64_t n)
{
    for (int64_t i = 0; i <= n; i++) cap_store_f64(x, i, 1.0);
}"""


@pytest.fixture(scope="module")
def fill():
    return runtime.compile(FILL_SRC, "fill")


# ---------------------------------------------------------------------------
# API surface


def test_public_names_exist():
    """The names other issues rely on are exported."""
    for name in ("compile", "launch", "CapabilityFault", "VerifyError", "KernelTimeout"):
        assert hasattr(runtime, name), name
    for name in ("alloc", "wrap", "from_int", "Capability"):
        assert hasattr(capabilities, name), name
    assert issubclass(CapabilityFault, runtime.CapqrError)
    assert issubclass(KernelTimeout, runtime.CapqrError)
    assert runtime.threads() >= 1


def test_alloc_attributes_and_zeroed():
    c = capabilities.alloc((3, 4), np.float32, name="mat")
    assert c.name == "mat"
    assert c.nbytes == 48
    assert np.dtype(c.dtype) == np.float32
    assert c.perms == "rw"
    a = c.numpy()
    assert a.shape == (3, 4) and a.dtype == np.float32
    assert not a.any()
    a[1, 2] = 5.0
    assert c.numpy()[1, 2] == 5.0  # the view is the buffer, not a copy


def test_alloc_rejects_bad_dtype_and_perms():
    with pytest.raises(TypeError):
        capabilities.alloc(4, np.complex128)
    with pytest.raises(ValueError):
        capabilities.alloc(4, np.float64, perms="w")


def test_compile_returns_kernel_with_signature():
    k = runtime.compile(ORDER_SRC, "order")
    assert isinstance(k, runtime.Kernel)
    assert k.name == "order" and k.checked and k.mode == "checked"
    assert [kind for _, kind in k.signature.params] == ["cap", "int64", "cap", "double",
                                                        "float"]
    raw = runtime.compile(ORDER_SRC, "order", checked=False)
    assert not raw.checked and raw.mode == "raw"
    assert raw is not k


# ---------------------------------------------------------------------------
# launch argument matching


def test_caps_and_scalars_matched_in_order():
    """Caps fill cap_t params in order, args fill the scalars in order, even interleaved."""
    k = runtime.compile(ORDER_SRC, "order")
    a = capabilities.wrap(np.arange(6, dtype=np.float64))
    b = capabilities.alloc(6, np.float64)
    runtime.launch(k, [a, b], args=(5, 3.0, 0.5))
    np.testing.assert_array_equal(b.numpy(), [0.5, 3.5, 6.5, 9.5, 12.5, 0.0])


def test_single_cap_not_in_a_list(fill):
    x = capabilities.alloc(4, np.float64)
    runtime.launch(fill, x, args=(4, 2.0))
    assert (x.numpy() == 2.0).all()


def test_numpy_integer_and_float_scalars_accepted(fill):
    x = capabilities.alloc(4, np.float64)
    runtime.launch(fill, [x], args=(np.int64(3), np.float32(1.5)))
    np.testing.assert_array_equal(x.numpy(), [1.5, 1.5, 1.5, 0.0])


@pytest.mark.parametrize(
    "caps_kind,args",
    [
        ("none", (1,)),            # too few caps
        ("three", (1,)),           # too many caps
        ("ndarray", (1,)),         # a numpy array where a cap is needed
        ("int", (1,)),             # an address where a cap is needed
        ("ok", ()),                # too few scalars
        ("ok", (1, 2)),            # too many scalars
        ("ok", ("1",)),            # str for int64_t
        ("ok", (1.0,)),            # float for int64_t
        ("ok", (True,)),           # bool for int64_t
        ("ok", (None,)),           # None for int64_t
    ],
)
def test_wrong_count_or_type_is_typeerror_before_running(caps_kind, args):
    """Nothing runs: x keeps its contents when the launch is refused."""
    k = runtime.compile(TWO_CAPS_SRC, "two")
    x = capabilities.alloc(1, np.float64, name="x")
    y = capabilities.alloc(1, np.float64, name="y")
    caps = {
        "none": [],
        "three": [x, y, y],
        "ndarray": [x, np.zeros(1)],
        "int": [x, int(y)],
        "ok": [x, y],
    }[caps_kind]
    with pytest.raises(TypeError):
        runtime.launch(k, caps, args=args)
    assert x.numpy()[0] == 0.0 and y.numpy()[0] == 0.0
    runtime.launch(k, [x, y], args=(7,))  # and the kernel itself works
    assert x.numpy()[0] == 1.0 and y.numpy()[0] == 7.0


def test_float_scalar_rejects_non_numbers():
    k = runtime.compile(ORDER_SRC, "order")
    a = capabilities.alloc(2, np.float64)
    b = capabilities.alloc(2, np.float64)
    with pytest.raises(TypeError):
        runtime.launch(k, [a, b], args=(2, "3.0", 1.0))
    with pytest.raises(TypeError):
        runtime.launch(k, [a, b], args=(2, 3.0, [1.0]))


@pytest.mark.parametrize("grid", [2.0, True, "4", None])
def test_bad_grid_is_typeerror(fill, grid):
    x = capabilities.alloc(4, np.float64)
    with pytest.raises(TypeError):
        runtime.launch(fill, [x], args=(4, 1.0), grid=grid)
    assert not x.numpy().any()


# ---------------------------------------------------------------------------
# grid semantics


@pytest.mark.parametrize("grid", [1, 2, 7, 64, 1000])
def test_every_block_runs_exactly_once(grid):
    """rt_block_idx() covers 0..grid-1 once each; rt_grid_dim() == grid everywhere."""
    k = runtime.compile(GRID_SRC, "grid")
    n = grid + 3
    idx = capabilities.wrap(np.full(n, -1, dtype=np.int64))
    dim = capabilities.alloc(n, np.int64)
    count = capabilities.alloc(n, np.int64)
    runtime.launch(k, [idx, dim, count], grid=grid)
    np.testing.assert_array_equal(idx.numpy()[:grid], np.arange(grid))
    assert (idx.numpy()[grid:] == -1).all()
    assert (dim.numpy()[:grid] == grid).all() and not dim.numpy()[grid:].any()
    assert (count.numpy()[:grid] == 1).all() and not count.numpy()[grid:].any()


def test_grid_zero_is_refused(fill):
    """grid=0 is a caller's mistake (a computed block count of zero), not a no-op."""
    x = capabilities.alloc(8, np.float64)
    with pytest.raises(ValueError, match="grid must be at least 1"):
        runtime.launch(fill, [x], args=(8, 3.0), grid=0)
    assert not x.numpy().any()


def test_grid_stride_loop_covers_everything(fill):
    x = capabilities.alloc(1001, np.float64)
    runtime.launch(fill, [x], args=(1001, 4.0), grid=13)
    assert (x.numpy() == 4.0).all()


def test_concurrent_launches_from_python_threads(fill):
    """Launches release the GIL and may overlap; each gets its own results."""
    bufs = [capabilities.alloc(5000, np.float64) for _ in range(4)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                runtime.launch(fill, [bufs[i]], args=(5000, float(i + 1)), grid=8)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors
    for i, b in enumerate(bufs):
        assert (b.numpy() == i + 1).all()


# ---------------------------------------------------------------------------
# timeouts


def test_timeout_stops_infinite_loops_and_pool_survives(fill):
    """Every block spins forever (more blocks than workers); the deadline stops them."""
    k = runtime.compile(SPIN_SRC, "spin")
    x = capabilities.alloc(2, np.int64)
    t0 = time.monotonic()
    with pytest.raises(KernelTimeout) as ei:
        runtime.launch(k, [x], grid=4 * runtime.threads() + 3, timeout=0.3)
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 10.0
    assert ei.value.kernel == "spin" and ei.value.timeout == 0.3
    assert x.numpy()[1] == 0  # no block got past its loop
    # The worker pool is still usable afterwards.
    y = capabilities.alloc(777, np.float64)
    runtime.launch(fill, [y], args=(777, 9.0), grid=32)
    assert (y.numpy() == 9.0).all()


def test_timeout_with_some_blocks_looping():
    """Blocks 1, 4, 7, ... loop forever; the rest may finish; the launch still times out."""
    k = runtime.compile(SPIN_SOME_SRC, "spin_some")
    out = capabilities.alloc(12, np.int64)
    with pytest.raises(KernelTimeout) as ei:
        runtime.launch(k, [out], grid=12, timeout=0.2)
    assert ei.value.blocks_done is None or ei.value.blocks_done <= 8
    got = out.numpy()
    for b in range(12):
        assert got[b] in ((0, b + 1) if b % 3 != 1 else (0,)), (b, got[b])


def test_timeout_not_reached_is_normal_completion(fill):
    x = capabilities.alloc(100, np.float64)
    runtime.launch(fill, [x], args=(100, 1.25), grid=4, timeout=30.0)
    assert (x.numpy() == 1.25).all()


def test_timeout_must_be_positive(fill):
    x = capabilities.alloc(4, np.float64)
    with pytest.raises(ValueError):
        runtime.launch(fill, [x], args=(4, 1.0), timeout=0)
    assert not x.numpy().any()


def test_repeated_timeouts_do_not_leak_workers(fill):
    """Several timed-out launches in a row; then a big grid still completes."""
    k = runtime.compile(SPIN_SRC, "spin")
    x = capabilities.alloc(2, np.int64)
    for _ in range(3):
        with pytest.raises(KernelTimeout):
            runtime.launch(k, [x], grid=3, timeout=0.05)
    y = capabilities.alloc(10_000, np.float64)
    runtime.launch(fill, [y], args=(10_000, 2.5), grid=100, timeout=30.0)
    assert (y.numpy() == 2.5).all()


IDLE_PROBE = """
import json, sys, time
import numpy as np
from capqr import capabilities, runtime
k = runtime.compile(sys.argv[1], "fill")
x = capabilities.alloc(4096, np.float64)
for _ in range(50):  # a launch sequence: the workers spin between its launches
    runtime.launch(k, [x], args=(4096, 1.0), grid=runtime.threads())
time.sleep(0.05)
c0 = time.process_time()
time.sleep(0.5)
print(json.dumps(dict(threads=runtime.threads(), idle_cpu_s=time.process_time() - c0)))
"""


def _probe_process(probe: str, *argv: str, **env_vars: str | None):
    """Run ``probe`` (Python source) in a fresh process that imports this checkout as
    capqr, with ``env_vars`` set (None: removed); the CompletedProcess."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var, value in env_vars.items():
        if value is None:
            env.pop(var, None)
        else:
            env[var] = value
    return subprocess.run([sys.executable, "-c", probe, *argv], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def _probe_json(probe: str, *argv: str, **env_vars: str | None) -> dict:
    """:func:`_probe_process` for a probe that prints a JSON line last: that JSON,
    after asserting the process succeeded."""
    p = _probe_process(probe, *argv, **env_vars)
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _probe_with_4_workers(probe: str, *argv: str) -> dict:
    """Run ``probe`` (Python source printing a JSON line last) in a process with a
    pool of 4 workers; its JSON."""
    out = _probe_json(probe, *argv, CAPQR_THREADS="4")
    assert out["threads"] == 4, out
    return out


def test_idle_workers_stop_spinning():
    """Between the launches of a sequence idle workers watch for work briefly
    instead of sleeping (runtime/csrc/launch.c, RT_WORKER_SPIN_NS); once the
    sequence is over they must go to sleep, not burn the cores: half a second
    of idleness costs the process almost no CPU time."""
    out = _probe_with_4_workers(IDLE_PROBE, FILL_SRC)
    assert out["idle_cpu_s"] < 0.1, out


WAKE_SRC = """
KERNEL void spin_blocks(cap_t x, int64_t spin)
{
    double s = 0.0;
    for (int64_t i = 0; i < spin; i++)
        s = s * 0.5 + 1.0;
    cap_store_f64(x, rt_block_idx(), s);
}

/* Blocks 0 and 1 each say they started, then watch up to `spin` steps for the
 * other: x[4 + b] = 1 iff block b saw the other one running. */
KERNEL void meeting_blocks(cap_t x, cap_t flag, int64_t spin)
{
    int64_t b = rt_block_idx();
    double met = 0.0;
    cap_store_i32(flag, b, 1);
    for (int64_t i = 0; i < spin && met == 0.0; i++)
        if (cap_load_i32(flag, 1 - b) == 1)
            met = 1.0;
    cap_store_f64(x, 4 + b, met);
}

KERNEL void paired_blocks(cap_t x)
{
    cap_store_f64(x, rt_block_idx(), 1.0);
    rt_group_sync();
    cap_store_f64(x, rt_block_idx() + 2, cap_load_f64(x, 1 - rt_block_idx()));
}
"""

WAKE_PROBE = """
import json, sys, time
import numpy as np
from capqr import capabilities, runtime
from capqr.runtime.core import lib
spin = runtime.compile(sys.argv[1], "spin_blocks")
pair = runtime.compile(sys.argv[1], "paired_blocks")
meet = runtime.compile(sys.argv[1], "meeting_blocks")
x = capabilities.alloc(8, np.float64)
flag = capabilities.alloc(2, np.int32)

def wakes(k, grid, args=(), group=None, caps=None):
    time.sleep(0.02)   # every worker asleep (an idle one watches for work 0.2 ms)
    before = lib.rt_core_wakes_asked()
    runtime.launch(k, caps or [x], args=args, grid=grid, group=group)
    return lib.rt_core_wakes_asked() - before

out = {"threads": runtime.threads()}
out["unknown"] = wakes(spin, 2, (0,))
# five tries each: a worker preempted for 50 us between its claims (a loaded
# host) makes the launcher wake every sleeper, as it should (+4)
out["short"] = [wakes(spin, 2, (0,)) for _ in range(5)]
out["short_grid3"] = [wakes(spin, 3, (0,)) for _ in range(5)]
wakes(spin, 2, (3_000_000,))   # ms blocks, after us ones (meeting_blocks checks that case)
out["long"] = wakes(spin, 2, (3_000_000,))
out["long_grid3"] = wakes(spin, 3, (3_000_000,))
out["sums_ok"] = bool(np.all(x.numpy()[:3] > 1.0))
# meeting_blocks' first launch has blocks that meet at once: short, so the next
# launch wakes one worker, whose block then waits ~tens of ms for the other
x.numpy()[4:6] = 0.0
flag.numpy()[:] = 0
out["meet_first"] = wakes(meet, 2, (50_000_000,), caps=[x, flag])
out["meet_short"] = wakes(meet, 2, (1,), caps=[x, flag])
x.numpy()[4:6] = 0.0
flag.numpy()[:] = 0
out["meet_grown"] = wakes(meet, 2, (50_000_000,), caps=[x, flag])
out["met"] = x.numpy()[4:6].tolist()
out["group_unknown"] = wakes(pair, 2, group=2)
for _ in range(20):   # back to back, the pair meets at once: a block time of microseconds
    runtime.launch(pair, [x], grid=2, group=2)
out["group_short"] = wakes(pair, 2, group=2)
out["group_ok"] = x.numpy()[2:4].tolist() == [1.0, 1.0]
print(json.dumps(out))
"""


def test_short_launches_wake_fewer_sleeping_workers():
    """A launch wakes one sleeping worker per 50 us of expected work (its entry
    point's block time at its last launch; runtime/csrc/launch.c, workers_to_wake),
    one per block for an entry not seen before, at least its group for a group
    launch, and every sleeper once blocks wait unclaimed while none was claimed
    for 50 us (a block time that grew).  Counted by the pool itself
    (rt_core_wakes_asked) in a pool of 4 whose workers all sleep before each
    launch."""
    out = _probe_with_4_workers(WAKE_PROBE, WAKE_SRC)
    assert out["unknown"] == 2, json.dumps(out)
    # short blocks: one worker asked for; a try whose claims stalled 50 us on a
    # loaded host adds the fallback's 4, and at least one try of five is quiet.  Three
    # blocks may be estimated at two workers' work: the estimate is the last launch's
    # block time, and one block on a core just woken took over 17 us on the 2-core VM
    # (a CI run at 086bb96 saw [2, 1, 1, 1, 1])
    assert set(out["short"]) <= {1, 1 + 4} and min(out["short"]) == 1, json.dumps(out)
    grid3 = out["short_grid3"]
    assert set(grid3) <= {1, 2, 1 + 4, 2 + 4} and min(grid3) == 1, json.dumps(out)
    assert (out["long"], out["long_grid3"]) == (2, 3), json.dumps(out)
    # blocks that grew since the estimate: one worker is asked for, and the
    # launcher wakes the rest (+4) once claims stall, unless the one signal
    # happened to wake two (a condition variable may); either way both ran at once
    assert out["meet_grown"] in (1, 1 + 4) and out["met"] == [1.0, 1.0], json.dumps(out)
    assert (out["group_unknown"], out["group_short"]) == (2, 2), json.dumps(out)
    assert out["sums_ok"] and out["group_ok"], json.dumps(out)


def test_buffers_start_on_a_cache_line():
    """Every collector-owned payload starts on a 64-byte line (gc/blocks.c), small
    (inline, from the size-class lists, reused after a collection) and large
    (a payload of its own) alike, zero-filled: a kernel's vector loads do not
    depend on where malloc put its buffer."""
    sizes = [1, 3, 17, 100, 1000, 4096, 4097, 70_000, 1 << 20]
    for rnd in range(2):
        bufs = [capabilities.alloc((n,), dt) for n in sizes for dt in (np.uint8, np.float32)
                for _ in range(3)]
        assert [int(b) % 64 for b in bufs] == [0] * len(bufs), rnd
        assert all(not b.numpy().any() for b in bufs)
        for b in bufs:
            b.numpy()[:] = 7
        del bufs
        runtime.gc_collect()   # the second round reuses the lists' blocks


# ---------------------------------------------------------------------------
# the kernel cache


def test_kernel_cache_hit_is_fast_and_same_object():
    src = FILL_SRC.replace("fill", "fill_cache")
    k1 = runtime.compile(src, "fill_cache")
    t0 = time.perf_counter()
    k2 = runtime.compile(src, "fill_cache")
    dt = time.perf_counter() - t0
    assert k2 is k1
    assert dt < 0.05, f"cache hit took {dt:.3f}s"


def test_cache_key_distinguishes_mode_and_source():
    k = runtime.compile(FILL_SRC, "fill")
    assert runtime.compile(FILL_SRC, "fill", checked=False) is not k
    other = runtime.compile(FILL_SRC.replace("v);", "v + 1.0);"), "fill")
    assert other is not k
    x = capabilities.alloc(3, np.float64)
    runtime.launch(other, [x], args=(3, 1.0))
    assert (x.numpy() == 2.0).all()


def _front_end_fails(*_a, **_k):
    raise AssertionError("the front end ran")


def _forget_front_ends(monkeypatch) -> None:
    """What a new process has not got: the kernels and lowerings kept in memory."""
    from capqr.runtime import pipeline

    monkeypatch.setattr(pipeline, "_kept", {})
    pipeline.verified.cache_clear()
    pipeline.lowered.cache_clear()


def _front_end_must_not_run(monkeypatch) -> None:
    from capqr.runtime import pipeline
    from capqr.runtime.cpu import kernel
    from capqr.runtime.cuda import kernel as cuda_kernel

    for module, name in ((pipeline, "parse"), (pipeline, "verify"), (kernel, "instrument"),
                         (cuda_kernel, "instrument")):
        monkeypatch.setattr(module, name, _front_end_fails)


def test_a_new_process_reuses_the_front_end_result(tmp_path, monkeypatch):
    """compile() keeps the front end's result (name, signature, generated C) next to
    the compiled module; a process that has not compiled the key itself (the
    in-memory caches cleared here) loads both and runs no parse, verify or
    instrument, and the kernel it gets is the same."""
    monkeypatch.setenv("CAPQR_CACHE", str(tmp_path))
    src = FILL_SRC.replace("fill", "fill_record")
    first = runtime.compile(src, None)   # the name comes from the source
    assert len(list(tmp_path.glob("_capqr_k_*.json"))) == 1
    _forget_front_ends(monkeypatch)
    _front_end_must_not_run(monkeypatch)
    again = runtime.compile(src, None)
    assert again is not first
    assert (again.name, again.c_source, again.signature) == (first.name, first.c_source,
                                                             first.signature)
    x = capabilities.alloc(5, np.float64)
    runtime.launch(again, [x], args=(5, 4.5))
    assert (x.numpy() == 4.5).all()


def test_an_unreadable_front_end_record_is_rebuilt(tmp_path, monkeypatch):
    """A damaged record (or one of another key) is ignored: the front end runs and
    writes it again; a source that fails to verify leaves no record."""
    monkeypatch.setenv("CAPQR_CACHE", str(tmp_path))
    src = FILL_SRC.replace("fill", "fill_damaged")
    first = runtime.compile(src, "fill_damaged")
    (record,) = tmp_path.glob("_capqr_k_*.json")
    good = record.read_text()
    for damage in ("{not json", good.replace(first.key, "0" * 64), "{}"):
        record.write_text(damage)
        _forget_front_ends(monkeypatch)
        k = runtime.compile(src, "fill_damaged")
        assert k.c_source == first.c_source
        assert json.loads(record.read_text()) == json.loads(good)
    with pytest.raises(runtime.VerifyError):
        runtime.compile("KERNEL void bad(cap_t x) { int *p = 0; }", "bad")
    assert list(tmp_path.glob("_capqr_k_*.json")) == [record]


def _gpu_front_end(src: str, name: str | None, checked: bool = True):
    from capqr.runtime import pipeline
    from capqr.runtime.cuda.kernel import CudaTarget

    return pipeline.front_end(src, name, CudaTarget(checked=checked))


def test_the_gpu_lane_reuses_its_front_end_result(tmp_path, monkeypatch):
    """The CUDA lane keeps its front end's result (entry name, CUDA text, signatures,
    local-array fault names) under its cache key too: a process that has not
    lowered the source itself (the in-memory caches cleared here) gets the same
    result without parse, verify or lowering.  No GPU needed: the front end
    stops before NVRTC."""
    monkeypatch.setenv("CAPQR_CACHE", str(tmp_path))
    src = FILL_SRC.replace("fill", "fill_gpu_record").replace("double v", "float v").replace(
        "cap_store_f64", "cap_store_f32")
    _forget_front_ends(monkeypatch)
    first = {c: _gpu_front_end(src, None, checked=c) for c in (True, False)}
    assert first[True][1].text != first[False][1].text
    assert len(list((tmp_path / "cuda").glob("_capqr_cu_*.json"))) == 2
    _forget_front_ends(monkeypatch)
    _front_end_must_not_run(monkeypatch)
    for c in (True, False):
        assert _gpu_front_end(src, None, checked=c) == first[c]
    assert first[True][0] == "fill_gpu_record"


def test_an_unreadable_gpu_front_end_record_is_rebuilt(tmp_path, monkeypatch):
    """As on the CPU: a damaged record, or one of another key, is lowered again and
    rewritten; an unknown entry point is a VerifyError and leaves no record."""
    monkeypatch.setenv("CAPQR_CACHE", str(tmp_path))
    src = FILL_SRC.replace("fill", "fill_gpu_damaged").replace("double v", "float v").replace(
        "cap_store_f64", "cap_store_f32")
    first = _gpu_front_end(src, "fill_gpu_damaged")
    (record,) = (tmp_path / "cuda").glob("_capqr_cu_*.json")
    good = record.read_text()
    key = json.loads(good)["key"]
    for damage in ("{not json", good.replace(key, "0" * 64), "{}", json.dumps({"key": key})):
        record.write_text(damage)
        _forget_front_ends(monkeypatch)
        assert _gpu_front_end(src, "fill_gpu_damaged") == first
        assert json.loads(record.read_text()) == json.loads(good)
    with pytest.raises(runtime.VerifyError, match="no KERNEL function"):
        _gpu_front_end(src, "no_such_kernel")
    assert list((tmp_path / "cuda").glob("_capqr_cu_*.json")) == [record]


# ---------------------------------------------------------------------------
# checked and raw builds agree on correct kernels

EQUIV_KERNELS = {
    # f64 with a static helper and a grid-stride loop
    "axpy64": ("""
static double twice(double v) { return v + v; }
KERNEL void axpy64(cap_t x, cap_t y, int64_t n, double a)
{
    for (int64_t i = rt_block_idx(); i < n; i += rt_grid_dim())
        cap_store_f64(y, i, fma(a, cap_load_f64(x, i), twice(cap_load_f64(y, i))));
}""", np.float64),
    # f32 3-point smoothing through a local array, cap_len_f32 for the length
    "smooth32": ("""
KERNEL void smooth32(cap_t x, cap_t y, int64_t n, double a)
{
    float w[3];
    w[0] = 0.25f; w[1] = 0.5f; w[2] = 0.25f;
    int64_t len = cap_len_f32(x);
    for (int64_t i = 1 + rt_block_idx(); i < len - 1; i += rt_grid_dim()) {
        float acc = 0.0f;
        for (int k = 0; k < 3; k++) acc = fmaf(w[k], cap_load_f32(x, i - 1 + k), acc);
        cap_store_f32(y, i, acc * (float)a);
    }
}""", np.float32),
    # f16 storage, float arithmetic, per-block window through cap_offset_f16
    "half16": ("""
KERNEL void half16(cap_t x, cap_t y, int64_t n, double a)
{
    int64_t chunk = (n + rt_grid_dim() - 1) / rt_grid_dim();
    int64_t lo = rt_block_idx() * chunk;
    if (lo >= n) return;
    cap_t xs = cap_offset_f16(x, lo);
    cap_t ys = cap_offset_f16(y, lo);
    int64_t m = cap_len_f16(xs) < chunk ? cap_len_f16(xs) : chunk;
    for (int64_t i = 0; i < m; i++)
        cap_store_f16(ys, i, sqrtf(fabsf(cap_load_f16(xs, i))) * (float)a);
}""", np.float16),
    # i32 per-block prefix sums with cap_offset_i32 / cap_len_i32
    "scan32": ("""
KERNEL void scan32(cap_t x, cap_t y, int64_t n, double a)
{
    int64_t b = rt_block_idx();
    int64_t chunk = 16;
    if (b * chunk >= n) return;
    cap_t xs = cap_offset_i32(x, b * chunk);
    cap_t ys = cap_offset_i32(y, b * chunk);
    int64_t m = cap_len_i32(xs) < chunk ? cap_len_i32(xs) : chunk;
    int32_t s = 0;
    for (int64_t i = 0; i < m; i++) {
        s = s + cap_load_i32(xs, i);
        cap_store_i32(ys, i, s);
    }
}""", np.int32),
    # i64 hashing with a 2-D local table and a static helper using it by value
    "hash64": ("""
static uint64_t mix(uint64_t h, int64_t v)
{
    h ^= (uint64_t)v;
    h *= 0x100000001b3ULL;
    return h ^ (h >> 29);
}
KERNEL void hash64(cap_t x, cap_t y, int64_t n, double a)
{
    int64_t t[2][4];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) t[r][c] = r * 4 + c + 1;
    for (int64_t i = rt_block_idx(); i < n; i += rt_grid_dim()) {
        uint64_t h = 0xcbf29ce484222325ULL;
        h = mix(h, cap_load_i64(x, i));
        h = mix(h, t[i % 2][i % 4]);
        cap_store_i64(y, i, (int64_t)h);
    }
}""", np.int64),
}


def _equiv_inputs(name: str, dtype, n: int, rng):
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal(n).astype(dtype)
        y = rng.standard_normal(n).astype(dtype)
    else:
        info = np.iinfo(dtype)
        lo, hi = (-1000, 1000) if dtype == np.int32 else (info.min, info.max)
        x = rng.integers(lo, hi, n, dtype=dtype, endpoint=True)
        y = np.zeros(n, dtype=dtype)
    return x, y


@pytest.mark.parametrize("name", sorted(EQUIV_KERNELS))
@pytest.mark.parametrize("n,grid", [(1, 1), (37, 3), (1000, 8)])
def test_checked_and_raw_identical(name, n, grid):
    src, dtype = EQUIV_KERNELS[name]
    kc = runtime.compile(src, name)
    kr = runtime.compile(src, name, checked=False)
    rng = np.random.default_rng(n * 31 + grid)
    x, y = _equiv_inputs(name, dtype, n, rng)
    outs = []
    for k in (kc, kr):
        xc = capabilities.wrap(x.copy())
        yc = capabilities.wrap(y.copy())
        runtime.launch(k, [xc, yc], args=(n, 1.5), grid=grid)
        np.testing.assert_array_equal(xc.numpy(), x)  # inputs untouched
        outs.append(yc.numpy().copy())
    assert outs[0].tobytes() == outs[1].tobytes()
    assert outs[0].tobytes() != y.tobytes() or n == 1 and name == "smooth32"


def test_checked_results_match_numpy_reference():
    """The checked f64 and i32 kernels compute what they claim (not just agree with raw)."""
    src, _ = EQUIV_KERNELS["axpy64"]
    k = runtime.compile(src, "axpy64")
    x = np.linspace(-1, 1, 50)
    y = np.linspace(2, 3, 50)
    yc = capabilities.wrap(y.copy())
    runtime.launch(k, [capabilities.wrap(x), yc], args=(50, 0.5), grid=4)
    np.testing.assert_allclose(yc.numpy(), 0.5 * x + 2 * y, rtol=1e-15)
    src, _ = EQUIV_KERNELS["scan32"]
    k = runtime.compile(src, "scan32")
    x = np.arange(40, dtype=np.int32)
    yc = capabilities.alloc(40, np.int32)
    runtime.launch(k, [capabilities.wrap(x), yc], args=(40, 0.0), grid=3)
    want = np.concatenate([np.cumsum(x[i:i + 16]) for i in range(0, 40, 16)])
    np.testing.assert_array_equal(yc.numpy(), want)


# ---------------------------------------------------------------------------
# wrapping host memory


def test_wrap_numpy_is_zero_copy(fill):
    a = np.zeros(10)
    c = capabilities.wrap(a, name="host")
    assert c.name == "host" and c.nbytes == 80 and c.perms == "rw"
    assert np.shares_memory(c.numpy(), a)
    runtime.launch(fill, [c], args=(10, 6.0))
    assert (a == 6.0).all()  # the kernel wrote the caller's array
    a[3] = -1.0
    k = runtime.compile(LOAD0_SRC, "load0")
    out = capabilities.alloc(1, np.float64)
    runtime.launch(k, [capabilities.wrap(a[3:]), out])
    assert out.numpy()[0] == -1.0  # and reads see the caller's writes


def test_wrap_keeps_array_alive(fill):
    c = capabilities.wrap(np.zeros(1000))
    import gc

    gc.collect()
    runtime.launch(fill, [c], args=(1000, 5.0))
    assert (c.numpy() == 5.0).all()


def test_wrap_rejects_non_contiguous_and_readonly_arrays():
    with pytest.raises(ValueError):
        capabilities.wrap(np.zeros((4, 4))[:, 1])
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        capabilities.wrap(ro)
    c = capabilities.wrap(ro, perms="r")  # read-only is fine for an "r" capability
    assert c.perms == "r"
    with pytest.raises(TypeError):
        capabilities.wrap([1.0, 2.0])


def test_wrap_cpu_torch_tensor(fill):
    torch = pytest.importorskip("torch")
    t = torch.zeros(12, dtype=torch.float64)
    c = capabilities.wrap(t, name="tensor")
    assert c.nbytes == 96
    runtime.launch(fill, [c], args=(12, 3.5), grid=3)
    assert bool((t == 3.5).all())  # the tensor itself changed: zero-copy
    assert int(c) == t.data_ptr()
    t32 = torch.arange(8, dtype=torch.float32)
    k = runtime.compile(EQUIV_KERNELS["smooth32"][0], "smooth32")
    out = torch.zeros(8, dtype=torch.float32)
    runtime.launch(k, [capabilities.wrap(t32, perms="r"), capabilities.wrap(out)],
                   args=(8, 1.0))
    assert out[1:7].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    with pytest.raises(ValueError):
        capabilities.wrap(torch.zeros(4, 4).t())


# ---------------------------------------------------------------------------
# read-only capabilities


def test_readonly_view_is_not_writeable():
    c = capabilities.alloc(4, np.float64, perms="r")
    v = c.numpy()
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0] = 1.0
    w = capabilities.wrap(np.arange(4.0), perms="r")
    assert not w.numpy().flags.writeable


def test_readonly_cap_can_be_loaded_not_stored():
    a = np.array([2.5, 0.0])
    ro = capabilities.wrap(a, perms="r", name="ro")
    out = capabilities.alloc(1, np.float64)
    runtime.launch(runtime.compile(LOAD0_SRC, "load0"), [ro, out])
    assert out.numpy()[0] == 2.5
    with pytest.raises(CapabilityFault) as ei:
        runtime.launch(runtime.compile(STORE0_SRC, "store0"), [ro])
    f = ei.value
    assert (f.reason, f.access, f.buffer, f.kernel, f.index) == (
        "read-only", "store", "ro", "store0", 0)
    assert a[0] == 2.5


# ---------------------------------------------------------------------------
# free(), int(cap), from_int()


def test_free_then_python_use_faults_freed():
    c = capabilities.alloc(4, np.float64, name="gone")
    c.free()
    assert c.freed
    for use in (c.numpy, lambda: int(c)):
        with pytest.raises(CapabilityFault) as ei:
            use()
        assert ei.value.reason == "freed" and ei.value.buffer == "gone"


def test_free_then_launch_faults_freed_and_runs_nothing():
    k = runtime.compile(TWO_CAPS_SRC, "two")
    x = capabilities.alloc(1, np.float64, name="x")
    y = capabilities.alloc(1, np.float64, name="dead")
    y.free()
    with pytest.raises(CapabilityFault) as ei:
        runtime.launch(k, [x, y], args=(3,))
    assert ei.value.reason == "freed" and ei.value.buffer == "dead"
    assert x.numpy()[0] == 0.0  # the launch never started


def test_double_free_raises():
    c = capabilities.alloc(4, np.float64, name="twice")
    c.free()
    with pytest.raises(CapabilityFault) as ei:
        c.free()
    assert ei.value.reason == "freed"
    w = capabilities.wrap(np.zeros(3))
    w.free()
    with pytest.raises(CapabilityFault):
        w.free()


def test_int_of_cap_is_the_address():
    a = np.zeros(5)
    c = capabilities.wrap(a)
    assert int(c) == a.ctypes.data
    d = capabilities.alloc(5, np.float64)
    assert int(d) == d.numpy().ctypes.data
    out = capabilities.alloc(1, np.int64)
    runtime.launch(runtime.compile(ADDR_SRC, "addr"), [d, out])
    assert int(out.numpy()[0]) == int(d)  # cap_to_int agrees with int(cap)


@pytest.mark.parametrize("src,name", [(STORE0_SRC, "store0"), (LOAD0_SRC, "load0")])
def test_from_int_launch_faults_no_bounds(src, name):
    a = np.array([7.0])
    c = capabilities.wrap(a, name="real")
    forged = capabilities.from_int(int(c))
    assert int(forged) == int(c)
    k = runtime.compile(src, name)
    caps = [forged] if name == "store0" else [forged, capabilities.alloc(1, np.float64)]
    with pytest.raises(CapabilityFault) as ei:
        runtime.launch(k, caps)
    f = ei.value
    assert f.reason == "no-bounds" and f.kernel == name and f.block == 0
    assert f.access == ("store" if name == "store0" else "load")
    assert a[0] == 7.0


# ---------------------------------------------------------------------------
# fault attributes and recovery


def test_fault_attributes_of_the_documented_example():
    k = runtime.compile(BAD_SRC, "bad")
    x = capabilities.alloc(10, np.float64, name="victim")
    with pytest.raises(CapabilityFault) as ei:
        runtime.launch(k, [x], args=(10,), grid=4)
    f = ei.value
    assert (f.reason, f.access, f.buffer, f.index, f.kernel, f.line) == (
        "out-of-bounds", "store", "victim", 10, "bad", 4)
    assert 0 <= f.block < 4
    assert "victim" in str(f) and "out-of-bounds" in str(f)


def test_pool_usable_after_many_faults(fill):
    k = runtime.compile(BAD_SRC, "bad")
    x = capabilities.alloc(10, np.float64)
    for _ in range(20):
        with pytest.raises(CapabilityFault):
            runtime.launch(k, [x], args=(10,), grid=8)
    y = capabilities.alloc(4096, np.float64)
    runtime.launch(fill, [y], args=(4096, 8.0), grid=64)
    assert (y.numpy() == 8.0).all()


# ---------------------------------------------------------------------------
# caps held across calls: a cap computed by one argument while a sibling
# argument polls (and the collector runs) must sit in a rooted slot.  Each
# spin() hands control to the host, which runs full collections before it
# lets the kernel continue: an unrooted temporary is reclaimed for sure.
# Fresh objects are 64 MiB, above glibc's largest mmap threshold, so a
# released payload is unmapped and a late access is a SIGSEGV; the kernels
# run in a child process so that a crash fails the test instead of pytest.

ROOT_HELPERS = """
int64_t spin(cap_t flag)
{
    int64_t want = cap_load_i64(flag, 1) + 1;
    cap_store_i64(flag, 1, want);
    while (cap_load_i64(flag, 0) < want) {
        cap_store_i64(flag, 2, cap_load_i64(flag, 2) + 1);
    }
    return 0;
}
cap_t fresh(int64_t k)
{
    cap_t x = cap_alloc_f64(1 << 23);
    cap_store_f64(x, 1, 7.0 + (double)k);
    return x;
}
cap_t pick(cap_t x, int64_t k) { return cap_offset_f64(x, k); }
cap_t pick_r(int64_t k, cap_t x) { return cap_offset_f64(x, k); }
int64_t nsum(int64_t a, int64_t b) { return a + b; }
void put(int64_t k, cap_t x, cap_t out) { cap_store_f64(out, k, cap_load_f64(x, 1)); }
"""

ROOT_RUNNER = r"""
import json, sys, threading
import numpy as np
from capqr import capabilities, runtime

helpers, stmts = sys.argv[1], json.loads(sys.argv[2])
body = "\n".join(f"    if (which == {i}) {{ {s} }}" for i, s in enumerate(stmts))
src = helpers + ("KERNEL void probe(cap_t flag, cap_t t, cap_t out, cap_t keep, int64_t which)\n"
                 "{\n" + body + "\n}\n"
                 "KERNEL void setup(cap_t t) { cap_store_cap(t, 0, fresh(0)); }\n"
                 "KERNEL void read_keep(cap_t keep, cap_t out)\n"
                 "{ cap_store_f64(out, 1, cap_load_f64(cap_load_cap(keep, 0), 1)); }\n")
probe, setup, read_keep = (runtime.compile(src, n) for n in ("probe", "setup", "read_keep"))
flag = capabilities.alloc(3, np.int64, name="flag")
t = capabilities.alloc(1, "cap", name="t")
runtime.launch(setup, [t])
results = []
for i in range(len(stmts)):
    out = capabilities.alloc(2, np.float64, name="out")
    keep = capabilities.alloc(1, "cap", name="keep")
    err = []

    def go():
        try:
            runtime.launch(probe, [flag, t, out, keep], args=(i,), timeout=120)
        except BaseException as e:
            err.append(repr(e))

    th = threading.Thread(target=go)
    th.start()
    f = flag.numpy()
    while th.is_alive():
        if f[1] > f[0]:
            runtime.gc_collect()
            runtime.gc_collect()
            f[0] = f[1]
        th.join(0.001)
    if not err and "keep" in stmts[i]:
        try:
            runtime.launch(read_keep, [keep, out])
        except BaseException as e:
            err.append(repr(e))
    results.append(dict(err=err, out=out.numpy().tolist()))
print(json.dumps(dict(results=results, verify_failures=runtime.gc_stats()["verify_failures"])))
"""


def _run_root_probe(stmts: list[str]) -> dict:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", ROOT_RUNNER, ROOT_HELPERS, json.dumps(stmts)],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


# Arguments run in source order: a cap loaded or allocated by an earlier
# argument survives the collections during a later spin().
ROOT_SHAPES = [
    "put(0, fresh(0), out); put(spin(flag), fresh(0), out);",
    "put(0, pick(fresh(0), spin(flag)), out);",
    "put(0, pick_r(spin(flag), fresh(0)), out);",
    "cap_store_cap(keep, 0, pick(fresh(0), spin(flag)));",
    "cap_store_f64(out, 0, cap_load_f64(fresh(0), spin(flag) + 1));",
    "cap_store_cap(keep, spin(flag), fresh(0));",
    "put(spin(flag), cap_load_cap(t, 0), out);",
    "put(0, pick(cap_load_cap(t, 0), nsum(spin(flag), spin(flag))), out);",
]


def test_caps_held_across_calls_are_rooted():
    r = _run_root_probe(ROOT_SHAPES)
    assert r["verify_failures"] == 0
    for stmt, res in zip(ROOT_SHAPES, r["results"], strict=True):
        assert res["err"] == [], (stmt, res)
        got = res["out"][1] if "keep" in stmt else max(res["out"])
        assert got == 7.0, (stmt, res)


def _cap_expr(depth: int = 0):
    from hypothesis import strategies as st

    leaf = st.sampled_from(["fresh(0)", "cap_load_cap(t, 0)"])
    if depth >= 3:
        return leaf
    sub, num = _cap_expr(depth + 1), _num_expr(depth + 1)
    return st.one_of(
        leaf,
        st.builds(lambda c, n: f"pick({c}, {n})", sub, num),
        st.builds(lambda n, c: f"pick_r({n}, {c})", num, sub),
        st.builds(lambda c: f"cap_offset_f64({c}, 0)", sub),
    )


def _num_expr(depth: int):
    from hypothesis import strategies as st

    leaf = st.sampled_from(["spin(flag)", "0"])
    if depth >= 3:
        return leaf
    return st.one_of(
        leaf,
        st.builds(lambda a, b: f"nsum({a}, {b})", _num_expr(depth + 1), _num_expr(depth + 1)),
        st.builds(lambda c: f"((int64_t)cap_load_f64({c}, 1) - 7)", _cap_expr(depth + 1)),
    )


def _root_stmt():
    from hypothesis import strategies as st

    c, n = _cap_expr(), _num_expr(0)
    return st.one_of(
        st.builds(lambda n, c: f"put({n}, {c}, out);", n, c),
        st.builds(lambda c, n: f"cap_store_f64(out, 0, cap_load_f64({c}, 1) + (double)({n}));",
                  c, n),
        st.builds(lambda n, c: f"cap_store_cap(keep, {n}, {c});", n, c),
    )


def test_nested_call_and_load_expressions_keep_their_caps():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=3, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(_root_stmt(), min_size=12, max_size=12))
    def check(stmts):
        r = _run_root_probe(stmts)
        assert r["verify_failures"] == 0
        for stmt, res in zip(stmts, r["results"], strict=True):
            assert res["err"] == [], (stmt, res)
            got = res["out"][1] if "keep" in stmt else res["out"][0]
            assert got == 7.0, (stmt, res)

    check()


AFFINITY_PROBE = """
import json, os
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from capqr import runtime
print(json.dumps({"threads": runtime.threads()}))
"""


def test_default_pool_follows_cpu_affinity():
    """Without $CAPQR_THREADS the pool has one worker per CPU the process may run on
    (sched_getaffinity: taskset, cpusets), not per CPU online: more workers than CPUs
    would stall every group barrier whenever one of them is descheduled."""
    import os

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    assert _probe_json(AFFINITY_PROBE, CAPQR_THREADS=None) == {"threads": 1}


PIN_PROBE = """
import json, os
from capqr import runtime
runtime.threads()
cpus = sorted(os.sched_getaffinity(0))
single = sorted(min(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")
                if len(os.sched_getaffinity(int(t))) == 1)
print(json.dumps({"threads": runtime.threads(), "cpus": cpus, "pinned": single,
                  "says_pinned": runtime.pinned()}))
"""


@pytest.mark.parametrize("pin", ["1", None, "0"])
def test_pinned_pool_puts_each_worker_on_its_own_cpu(pin):
    """Worker i runs on the i-th CPU of the process's affinity set (one CPU each, none
    shared while there are enough) with $CAPQR_PIN=1 and with it unset (the default);
    with $CAPQR_PIN=0 no thread of the process is confined to one CPU."""
    import os

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs sched_getaffinity and at least two CPUs")
    out = _probe_json(PIN_PROBE, CAPQR_THREADS="2", CAPQR_PIN=pin)
    assert out["threads"] == 2, out
    assert out["pinned"] == (out["cpus"][:2] if pin != "0" else []), out
    assert out["says_pinned"] == (pin != "0"), out


def test_pin_setting_other_than_0_or_1_is_refused():
    """$CAPQR_PIN=yes is neither pinned nor silently unpinned: importing the runtime
    fails with a message that names the variable and its values."""
    p = _probe_process("from capqr import runtime; runtime.threads()", CAPQR_PIN="yes")
    assert p.returncode != 0
    assert "CAPQR_PIN must be 0 or 1, got 'yes'" in p.stderr, p.stderr[-2000:]
