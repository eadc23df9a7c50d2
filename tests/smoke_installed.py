"""Smoke test of an installed capqr, run by .ci/wheel-smoke from outside the checkout:
a QR that passes its check and an out-of-bounds launch that is contained."""

import sys
from pathlib import Path

import capqr
import numpy as np
from capqr import capabilities, kernels, runtime

here = Path(capqr.__file__).resolve().parent
checkout = Path(__file__).resolve().parent.parent
assert "site-packages" in here.parts, f"capqr imported from {here}, not from the install"
assert here != checkout and checkout not in here.parents, "capqr imported from the checkout"

a = np.random.default_rng(0).standard_normal((3, 40, 40)).astype(np.float32)
h, tau = kernels.qr(a)
assert kernels.check(a, h, tau).ok, "QR result failed its check"

src = """
KERNEL void fill(cap_t x, int64_t n)
{
    for (int64_t i = rt_block_idx(); i < n; i += rt_grid_dim())
        cap_store_f32(x, i, 1.0f);
}
"""
backing = np.zeros(12, np.float32)
x = capabilities.wrap(backing[2:10], name="x")
try:
    runtime.launch(runtime.compile(src, "fill"), [x], args=(9,), grid=2)
    sys.exit("the out-of-bounds launch did not fault")
except runtime.CapabilityFault as e:
    assert (e.reason, e.buffer, e.index) == ("out-of-bounds", "x", 8), e
assert not backing[:2].any() and not backing[10:].any(), "a write landed outside x"
# the GPU lane's translation needs no GPU: the device prelude and its headers are installed
from capqr.runtime.cuda import translate  # noqa: E402

assert "rt_fault_kind" in translate(src).text, "the device prelude lacks checks.h"
print(f"capqr {capqr.__version__} from {here}: QR checked, out-of-bounds store contained, "
      "CUDA translated")
