"""Wrapped host memory stays allocated while a capability can reach it.

``capabilities.wrap`` hands kernels the array's data pointer, so the data (not
only the array object) must outlive every capability on it: numpy's
``resize(..., refcheck=False)`` and torch's ``resize_`` / ``set_`` /
``untyped_storage().resize_`` / ``share_memory_`` must not free it.  Each
dangerous sequence runs in a subprocess: before the fix a launch wrote into
freed heap and glibc aborted, which must fail the test, not kill pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = r"""
import gc as pygc, json, sys
import numpy as np
from capqr import capabilities, runtime

FILL = runtime.compile('''
KERNEL void fill(cap_t x, int64_t n, double v)
{
    for (int64_t i = 0; i < n; i++)
        cap_store_f32(x, i, (float)v);
}
''', "fill")

def churn():
    # malloc/free traffic that reuses a freed block: a stray write into one
    # corrupts the heap, and freeing it then makes glibc abort
    junk = [np.ones(n, np.float32) for n in (1 << 16, 1 << 15, 1 << 16)]
    del junk
"""


def _run(body: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", PRELUDE + body], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"subprocess died (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_numpy_resize_refused_while_wrapped_and_allowed_after_release() -> None:
    r = _run(r"""
n = 1 << 16
a = np.zeros(n, np.float32)
cap = capabilities.wrap(a, name="a")
out = {}
try:
    a.resize(0, refcheck=False)
    out["resize"] = "allowed"
except ValueError as e:
    out["resize"] = "refused"
churn()
runtime.launch(FILL, [cap], args=(n, 7.0))
churn()
out["data"] = bool((cap.numpy() == 7).all())
# a view: resizing its owner must be refused too
b = np.zeros(n, np.float32)
capv = capabilities.wrap(b[n // 2:], name="view")
try:
    b.resize(0, refcheck=False)
    out["view_owner_resize"] = "allowed"
except ValueError:
    out["view_owner_resize"] = "refused"
runtime.launch(FILL, [capv], args=(n // 2, 3.0))
churn()
# freeing the capability releases the pin (once the collector releases the object)
cap.free()
del cap
runtime.gc_collect()
a.resize(0, refcheck=False)
out["after_free"] = a.shape
print(json.dumps(out))
""")
    assert r == {"resize": "refused", "data": True, "view_owner_resize": "refused",
                 "after_free": [0]}


def test_numpy_pin_released_when_capability_is_collected() -> None:
    r = _run(r"""
a = np.zeros(64, np.float32)
cap = capabilities.wrap(a)
del cap
pygc.collect()
runtime.gc_collect()
a.resize(0, refcheck=False)
print(json.dumps({"shape": a.shape}))
""")
    assert r == {"shape": [0]}


torch = pytest.importorskip("torch")


def test_torch_resize_and_set_cannot_free_wrapped_storage() -> None:
    r = _run(r"""
import torch
n = 1 << 16
out = {}
def attempt(key, op):
    try:
        op()
        out[key] = "allowed"
    except RuntimeError as e:
        out[key] = "refused" if "not resizable" in str(e) else f"error: {e}"

t = torch.zeros(n)
cap = capabilities.wrap(t, name="t")
attempt("tensor_resize", lambda: t.resize_(4 * n))
attempt("storage_resize", lambda: t.untyped_storage().resize_(0))
churn()
runtime.launch(FILL, [cap], args=(n, 5.0))
# a refused resize_ leaves t's shape changed (torch sets sizes before it
# resizes the storage), so read the data through the capability
out["data"] = bool((cap.numpy() == 5).all())
# set_ points the tensor elsewhere; the wrapped memory must stay allocated
t.set_(torch.zeros(3))
churn()
runtime.launch(FILL, [cap], args=(n, 6.0))
churn()
out["after_set"] = bool((cap.numpy() == 6).all())
# as after torch's own Tensor.numpy(), the storage stays non-resizable
# once wrapped (restoring it could undo a numpy view's protection)
v = torch.zeros(8)
capv = capabilities.wrap(v)
capv.free()
del capv
runtime.gc_collect()
out["released"] = v.untyped_storage().resizable()
print(json.dumps(out))
""")
    assert r == {"tensor_resize": "refused", "storage_resize": "refused", "data": True,
                 "after_set": True, "released": False}


def test_torch_share_memory_cannot_free_wrapped_storage() -> None:
    # share_memory_ copies a CPU storage into shared memory and frees the old
    # block even when the storage is not resizable; before the fix the block
    # was reused by the next tensors and the launch overwrote them
    r = _run(r"""
import torch
n = 1 << 16
u = torch.zeros(n)
old = u.data_ptr()
cap = capabilities.wrap(u, name="u")
u.share_memory_()
victims = [torch.ones(n) for _ in range(8)]
runtime.launch(FILL, [cap], args=(n, 2.0))
print(json.dumps({"moved": u.data_ptr() != old,
                  "reused": any(v.data_ptr() == old for v in victims),
                  "victims_intact": all(bool((v == 1).all()) for v in victims),
                  "cap_data": bool((cap.numpy() == 2).all())}))
""")
    assert r["moved"] and r["cap_data"]
    assert not r["reused"] and r["victims_intact"], r


def test_torch_shared_memory_tensor_stays_shared_and_pinned() -> None:
    r = _run(r"""
import torch
n = 1 << 12
t = torch.zeros(n).share_memory_()
ptr = t.data_ptr()
cap = capabilities.wrap(t, name="t")
out = {"shared": t.is_shared()}
t.share_memory_()                         # a no-op for a shared tensor
out["same_block"] = t.data_ptr() == ptr
try:
    t.untyped_storage().resize_(0)
    out["resize"] = "allowed"
except RuntimeError:
    out["resize"] = "refused"
runtime.launch(FILL, [cap], args=(n, 4.0))
out["data"] = bool((t == 4).all())
print(json.dumps(out))
""")
    assert r == {"shared": True, "same_block": True, "resize": "refused", "data": True}


def test_torch_without_a_cxx_compiler_checks_the_storage_at_each_use() -> None:
    # no pin can be built: a launch on a tensor whose storage swapped its block
    # faults "freed" instead of writing into the released one
    r = _run(r"""
import os, torch
from capqr.runtime import CapabilityFault
os.environ["CXX"] = "false"
n = 1 << 16
u = torch.zeros(n)
cap = capabilities.wrap(u, name="u")
runtime.launch(FILL, [cap], args=(n, 1.0))
ok = bool((u == 1).all())
u.share_memory_()
try:
    runtime.launch(FILL, [cap], args=(n, 2.0))
    out = "launched"
except CapabilityFault as e:
    out = e.reason
print(json.dumps({"before": ok, "after_share": out}))
""")
    assert r == {"before": True, "after_share": "freed"}
