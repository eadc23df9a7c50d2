"""Collector safety cases that each once let a kernel or a handle touch freed
memory: black allocation before the barrier, wrapped arrays released under a
running kernel, epoch wrap, handle attributes after free(), freed tables
keeping children alive.  Races are made deterministic with the collector's
pause points; every scenario that could crash runs in a subprocess so a
SIGSEGV or a verifier abort fails the test instead of killing pytest."""

from __future__ import annotations

import gc as pygc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import CapabilityFault
from capqr.runtime.core import lib

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = r"""
import gc as pygc, json, sys, threading, time, weakref
import numpy as np
from capqr import capabilities, runtime
from capqr.runtime.core import lib

def wait(cond, what, limit=30):
    deadline = time.time() + limit
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.001)
"""


def run_script(body: str, env_extra: dict, timeout: float = 120) -> dict:
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", PRELUDE + body], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-4000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# black allocation must not start before every thread runs the barrier

BLACK_ALLOC = r"""
SRC = '''
KERNEL void k(cap_t flag, cap_t out)
{
    cap_t x = cap_alloc_f64(2);
    cap_store_f64(x, 0, 42.0);
    cap_store_i64(flag, 1, 1);
    while (cap_load_i64(flag, 0) == 0) {
        cap_store_i64(flag, 2, cap_load_i64(flag, 2) + 1);
    }
    cap_t t = cap_alloc_cap(1);
    cap_store_cap(t, 0, x);
    x = cap_from_int(0);
    cap_store_i64(flag, 1, 2);
    while (cap_load_i64(flag, 0) == 1) {
        cap_store_i64(flag, 2, cap_load_i64(flag, 2) + 1);
    }
    cap_t y = cap_load_cap(t, 0);
    cap_store_f64(out, 0, cap_load_f64(y, 0));
}
'''
kern = runtime.compile(SRC, "k")
runtime.gc_set_enabled(False)
flag = capabilities.alloc(3, np.int64, name="flag")
out = capabilities.alloc(1, np.float64, name="out")
runtime.gc_collect()
th = threading.Thread(target=runtime.launch, args=(kern, [flag, out]))
th.start()
wait(lambda: flag.numpy()[1] == 1, "kernel never allocated x")   # x: white for the next cycle
lib.gc_debug_pause(4)
c = threading.Thread(target=runtime.gc_collect)
c.start()
wait(lambda: lib.gc_debug_phase() == 4, "collector never reached pause point 4")
flag.numpy()[0] = 1           # the kernel allocates t, stores x into it, drops x
wait(lambda: flag.numpy()[1] == 2, "kernel never stored x")
lib.gc_debug_pause(0)         # the stack scan finds t only: t must be traced
c.join(30)
runtime.gc_collect()
flag.numpy()[0] = 2
th.join(30)
assert not th.is_alive()
s = runtime.gc_stats()
print(json.dumps(dict(value=float(out.numpy()[0]), verify_failures=s["verify_failures"])))
"""


@pytest.mark.parametrize("stw", ["0", "1"], ids=["concurrent", "stw"])
def test_black_allocation_waits_for_the_barrier(stw):
    r = run_script(BLACK_ALLOC, {"CAPQR_GC_VERIFY": "1", "CAPQR_GC_STW": stw,
                                 "CAPQR_GC_POISON": "1"}, timeout=90)
    assert r["verify_failures"] == 0
    assert r["value"] == 42.0


# ---------------------------------------------------------------------------
# wrapped (numpy) memory stays alive while a running kernel can reach it

WRAPPED = r"""
SRC = '''
KERNEL void writer(cap_t t, cap_t flag, int64_t n)
{
    cap_t x = cap_load_cap(t, 0);
    cap_store_i64(flag, 1, 1);
    int64_t rounds = 0;
    while (cap_load_i64(flag, 0) == 0) {
        for (int64_t i = 0; i < n; i++) {
            cap_store_f32(x, i, 1.0f);
        }
        rounds++;
    }
    cap_store_i64(flag, 2, rounds);
}
KERNEL void kstore(cap_t t, cap_t v, int64_t i) { cap_store_cap(t, i, v); }
KERNEL void kclear(cap_t t, int64_t i) { cap_store_cap(t, i, cap_from_int(0)); }
'''
writer = runtime.compile(SRC, "writer")
kstore = runtime.compile(SRC, "kstore")
kclear = runtime.compile(SRC, "kclear")
n = 4 << 20                                   # 16 MiB of float32: numpy mmaps it
arr = np.zeros(n, np.float32)
alive = weakref.ref(arr)
table = capabilities.alloc(1, "cap", name="table")
flag = capabilities.alloc(3, np.int64, name="flag")
h = capabilities.wrap(arr, name="wrapped")
runtime.launch(kstore, [table, h], args=(0,))
th = threading.Thread(target=lambda: runtime.launch(writer, [table, flag], args=(n,), timeout=120))
th.start()
wait(lambda: flag.numpy()[1] == 1, "kernel never loaded the cap")
runtime.launch(kclear, [table], args=(0,))    # only the kernel's frame reaches it now
del h, arr
pygc.collect()
for _ in range(3):
    runtime.gc_collect()
    junk = [np.ones(n, np.float32) for _ in range(2)]   # reuse what numpy released
    del junk
alive_during = alive() is not None
flag.numpy()[0] = 1
th.join(60)
assert not th.is_alive()
for _ in range(3):
    runtime.gc_collect()
runtime.heap.drain_releases()
print(json.dumps(dict(rounds=int(flag.numpy()[2]), alive_during=alive_during,
                      released_after=alive() is None)))
"""


def test_wrapped_array_outlives_a_running_kernel():
    r = run_script(WRAPPED, {"CAPQR_GC_POISON": "1"}, timeout=120)
    assert r["rounds"] >= 1
    assert r["alive_during"], "the array was released while a kernel could reach it"
    assert r["released_after"], "the array was never released once unreachable"


def test_wrapped_array_released_once_unreachable():
    arr = np.zeros(1000, np.float32)
    import weakref

    alive = weakref.ref(arr)
    h = capabilities.wrap(arr)
    del arr
    assert alive() is not None
    del h
    pygc.collect()
    runtime.gc_collect()
    runtime.gc_collect()
    runtime.heap.drain_releases()
    assert alive() is None


# ---------------------------------------------------------------------------
# epoch wrap: marks stay correct across the 31-bit epoch limit

EPOCH = r"""
SRC = '''
KERNEL void mk(cap_t t, int64_t i)
{
    cap_t x = cap_alloc_f64(2);
    cap_store_f64(x, 0, 7.0 + (double)i);
    cap_store_cap(t, i, x);
}
KERNEL void rd(cap_t t, cap_t out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        cap_t x = cap_load_cap(t, i);
        cap_store_f64(out, i, cap_load_f64(x, 0));
    }
}
'''
mk = runtime.compile(SRC, "mk")
rd = runtime.compile(SRC, "rd")
runtime.gc_set_enabled(False)
n = 4
table = capabilities.alloc(n, "cap", name="table")
out = capabilities.alloc(n, np.float64, name="out")
runtime.gc_collect()
lib.gc_debug_set_epoch(int(sys.argv[1]))
for i in range(n):
    runtime.launch(mk, [table], args=(i,))
    runtime.gc_collect()
for _ in range(3):
    runtime.gc_collect()
runtime.launch(rd, [table, out], args=(n,))
s = runtime.gc_stats()
print(json.dumps(dict(values=[float(v) for v in out.numpy()], epoch=int(lib.gc_debug_epoch()),
                      verify_failures=s["verify_failures"])))
"""


@pytest.mark.parametrize("start", [(1 << 31) - 3])
def test_epoch_wraps_safely(start):
    r = run_script(EPOCH.replace("sys.argv[1]", str(start)),
                   {"CAPQR_GC_VERIFY": "1", "CAPQR_GC_POISON": "1"}, timeout=60)
    assert r["verify_failures"] == 0
    assert r["values"] == [7.0, 8.0, 9.0, 10.0]


# ---------------------------------------------------------------------------
# handle attributes after free(): defined, never read from a released header


def test_handle_attributes_after_free_and_reclaim():
    a = capabilities.alloc((3, 4), np.float64, name="gone")
    aid = a.id
    a.free()
    pygc.collect()
    for _ in range(3):
        runtime.gc_collect()
    assert not lib.gc_is_live_id(aid)        # the header itself is released now
    # churn the allocator so the released header's memory is reused
    junk = [capabilities.alloc(12, np.float64) for _ in range(64)]
    del junk
    assert a.nbytes == 96
    assert a.shape == (3, 4) and a.size == 12 and a.name == "gone" and a.id == aid
    assert a.freed
    for use in (a.numpy, lambda: int(a), a.free):
        with pytest.raises(CapabilityFault) as e:
            use()
        assert e.value.reason == "freed"


# ---------------------------------------------------------------------------
# a freed cap table has no outgoing edges

TABLE_SRC = """
KERNEL void mk(cap_t t, int64_t i)
{
    cap_t x = cap_alloc_f64(2);
    cap_store_cap(t, i, x);
}
KERNEL void kstore(cap_t t, cap_t v, int64_t i) { cap_store_cap(t, i, v); }
"""


def test_freed_table_does_not_keep_children_alive():
    mk = runtime.compile(TABLE_SRC, "mk")
    kstore = runtime.compile(TABLE_SRC, "kstore")
    root = capabilities.alloc(1, "cap", name="root")
    t = capabilities.alloc(2, "cap", name="parent")
    runtime.launch(kstore, [root, t], args=(0,))   # root -> parent
    s0 = lib.gc_last_id()
    runtime.launch(mk, [t], args=(0,))              # parent -> child
    child = s0 + 1
    assert lib.gc_last_id() == child
    runtime.gc_collect()
    assert lib.gc_is_live_id(child)
    t.free()
    runtime.gc_collect()                 # one cycle: freed objects are not scanned
    assert lib.gc_is_live_id(t.id)       # still reachable: its header stays (traps "freed")
    assert not lib.gc_is_live_id(child)  # but a freed table has no outgoing edges


# ---------------------------------------------------------------------------
# the poison oracle itself: a late access to a released payload faults

POISON = r"""
import ctypes
a = capabilities.alloc(1024, np.float64, name="late")
addr = int(a)
ctypes.c_double.from_address(addr).value = 1.0      # mapped while live
a.free()
del a
pygc.collect()
for _ in range(3):
    runtime.gc_collect()
print("reading", flush=True)
print(ctypes.c_double.from_address(addr).value)      # released: must fault
"""


def test_poison_mode_faults_on_a_late_access():
    env = dict(os.environ, CAPQR_GC_POISON="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", PRELUDE + POISON], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert "reading" in p.stdout, p.stderr[-2000:]
    assert p.returncode == -11, (p.returncode, p.stdout, p.stderr[-2000:])


# ---------------------------------------------------------------------------
# pacing: a fixed live set under churn from every worker keeps a bounded heap


def test_churn_heap_stays_bounded():
    sys.path.insert(0, str(ROOT))
    from capqr.bench import gc_bench

    r = gc_bench._child(gc_bench.CHURN_CHILD, [300_000, 16384, 256])
    assert r["allocations"] >= 300_000
    # the pacer's own accounting: occupancy + parked blocks stay within the
    # goal, live + 1.25 x live (default CAPQR_GC_RATIO), plus a few blocks
    assert r["peak_occupancy_mib"] <= 2.25 * r["live_occupancy_mib"] + 0.5, r
    assert r["peak_over_live_rss"] <= 3.0, json.dumps(r)


def test_freed_wrapped_array_released_while_its_header_is_reachable():
    import weakref

    kstore = runtime.compile(TABLE_SRC, "kstore")
    get = runtime.compile("KERNEL void get(cap_t t, cap_t out)\n"
                          "{\n    cap_t x = cap_load_cap(t, 0);\n"
                          "    cap_store_f64(out, 0, cap_load_f64(x, 0));\n}\n", "get")
    arr = np.arange(4.0)
    alive = weakref.ref(arr)
    h = capabilities.wrap(arr, name="ext")
    table = capabilities.alloc(1, "cap", name="t")
    out = capabilities.alloc(1, np.float64)
    runtime.launch(kstore, [table, h], args=(0,))
    h.free()
    del h, arr
    pygc.collect()
    for _ in range(3):
        runtime.gc_collect()
    assert alive() is None            # released: no running block could reach it
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(get, [table, out])
    assert e.value.reason == "freed" and e.value.buffer == "ext"


# ---------------------------------------------------------------------------
# device payloads: released through the host's drain, never by the collector
# (fake device addresses: the host never dereferences them)


def test_device_payload_release_is_deferred_to_the_host():
    ffi = runtime.core.ffi
    recs = ffi.new("gc_release_rec[]", 8)
    while lib.gc_drain_device_releases(recs, 8):
        pass
    held = lib.gc_wrap_device_pinned(0x7F0000001000, 4096, 2, 3, b"dev-held")
    dropped = lib.gc_wrap_device_pinned(0x7F0000002000, 256, 2, 3, b"dev-dropped")
    held_id, dropped_id = int(held.id), int(dropped.id)
    lib.gc_hold(held)                  # a launch in flight
    assert lib.gc_free(held) == 0 and lib.gc_free(held) == -1
    lib.gc_unpin(held)
    lib.gc_unpin(dropped)
    for _ in range(3):
        runtime.gc_collect()
    n = lib.gc_drain_device_releases(recs, 8)
    assert [(int(recs[i].id), int(recs[i].handle), int(recs[i].nbytes)) for i in range(n)] == [
        (dropped_id, 0x7F0000002000, 256)]
    lib.gc_unhold(held)                # the launch ended
    for _ in range(3):
        runtime.gc_collect()
    n = lib.gc_drain_device_releases(recs, 8)
    assert [(int(recs[i].id), int(recs[i].handle)) for i in range(n)] == [
        (held_id, 0x7F0000001000)]
    assert not lib.gc_is_live_id(held_id) and not lib.gc_is_live_id(dropped_id)
