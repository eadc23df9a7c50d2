"""Static ranges (runtime/compiler/ranges.py): subscripts proved in range lose their check,
everything else keeps it, and rt_require_block_dim is checked where it is stated.

The oracle for soundness is the fully checked build (hoist=False, no static
ranges): the same kernel must give the same stores and the same fault.
"""

from __future__ import annotations

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime.compiler.astutil import readable
from capqr.runtime.cuda import translate
from capqr.runtime.errors import CapabilityFault, VerifyError


def _body(decls: str, index: str) -> str:
    return f"""
KERNEL void fill(cap_t x, int64_t n)
{{
    float w[8];
{decls}
    for (int i = 0; i < 8; i++)
        w[i] = 0.0f;
    for (int i = 0; i < 8; i++)
        w[{index}] = (float)(i + 1);
    for (int i = 0; i < 8; i++)
        cap_store_f32(x, i, w[i]);
}}
"""


#: (declarations, subscript of the store in the second loop, proved in range?)
CASES = [
    ("", "i", True),
    ("", "7 - i", True),
    ("", "i + 1", False),                    # 8 on the last pass: faults
    ("", "i - 1", False),                    # -1 on the first pass
    ("", "(i - 5) % 4 + 3", True),           # C's remainder: (i-5)%4 in [-3, 3]
    ("", "(i * 3) / 4 + 2", True),           # at most 7
    ("", "(i * 3) / 4 + 3", False),          # 8 for i = 7
    ("    int64_t k = 2;", "k + i / 2", True),
    ("    int64_t k = 2;\n    k = 5;", "k + i / 2", False),  # written twice: unknown
    ("    int64_t k = 4;", "k + i", False),  # 11 at the end
    ("", "n + i - n", False),                # depends on a parameter
    ("", "(int)(i + 2147483647) - 2147483640", False),  # would wrap an int
]


@pytest.mark.parametrize("decls,index,proved", CASES, ids=[c[1] + ("#" + c[0].strip() if c[0]
                                                                    else "") for c in CASES])
def test_static_ranges_match_the_fully_checked_build(decls, index, proved) -> None:
    src = _body(decls, index)
    fast = runtime.compile(src, "fill")
    slow = runtime.compile(src, "fill", hoist=False)
    # every copy of the store (loop versioning keeps a checked one) is unchecked iff proved
    stores = [ln for ln in readable(fast.c_source).splitlines() if "= (float) (i + 1)" in ln]
    assert stores and all("rt_local_idx" not in ln for ln in stores) == proved, stores
    results = []
    for k in (fast, slow):
        x = np.zeros(8, np.float32)
        try:
            runtime.launch(k, [capabilities.wrap(x, name="x")], args=(3,), timeout=20)
            results.append(("ok", x.tobytes()))
        except CapabilityFault as f:
            results.append((f.reason, f.index, f.line, x.tobytes()))
    assert results[0] == results[1]


def test_a_subscript_off_by_one_still_faults_exactly() -> None:
    k = runtime.compile(_body("", "i + 1"), "fill")
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(k, [capabilities.wrap(np.zeros(8, np.float32), name="x")], args=(3,),
                       timeout=20)
    assert e.value.reason == "local-array" and e.value.index == 8 and e.value.buffer == "w"


# Names declared again in another block, and names narrowed by a condition.
SCOPED = """
KERNEL void scoped(cap_t x, int64_t n)
{
    float w[8];
    for (int i = 0; i < 8; i++) {
        int64_t k = i / 2;
        w[k + {a}] = 0.0f;
    }
    for (int i = 0; i < 8; i++) {
        int64_t k = 7 - i;
        w[k] = (float)(i + 1);
    }
    for (int i = 0; i < 16; i++) {
        if (i < 8 && n > 0)
            w[i + {b}] = w[i] + 1.0f;
        else if (!(i < 8))
            w[i - 8] = w[i - 8] + 2.0f;
        int64_t j = i % 8;
        w[j > 3 ? j - {c} : j] = 3.0f;
    }
    for (int i = 0; i < 8; i++)
        cap_store_f32(x, i, w[i]);
}
"""


@pytest.mark.parametrize("a,b,c,proved", [(0, 0, 0, True), (5, 0, 0, False),
                                          (0, 1, 0, False), (0, 0, -4, False)])
def test_redeclared_names_and_conditions_bound_subscripts(a, b, c, proved) -> None:
    """k is a variable of each loop's own block, i < 8 bounds w[i + b] where it holds
    (and w[i - 8] where it fails), j > 3 bounds j - c: every subscript
    is proved, or, one bound off, keeps its check and faults exactly like the fully
    checked build."""
    src = SCOPED.replace("{a}", str(a)).replace("{b}", str(b)).replace("{c}", str(c))
    fast = runtime.compile(src, "scoped")
    slow = runtime.compile(src, "scoped", hoist=False)
    body = readable(fast.c_source).split(" scoped(rt_block", 1)[1]
    assert ("rt_local_idx" not in body) == proved, body
    results = []
    for k in (fast, slow):
        x = np.zeros(8, np.float32)
        try:
            runtime.launch(k, [capabilities.wrap(x, name="x")], args=(3,), timeout=20)
            results.append(("ok", x.tobytes()))
        except CapabilityFault as f:
            results.append((f.reason, f.index, f.line, x.tobytes()))
    assert results[0] == results[1]
    assert (results[0][0] == "ok") == proved


TILE_OWNER = """
KERNEL void owner(cap_t x)
{
{decl}    float smem_a[512];
    int64_t t = rt_thread_idx();
    int64_t rg = t / 16;
    int64_t cg = t % 16;
    smem_a[rg * 64 + cg] = 1.0f;
    for (int64_t q = 0; q < 4; q++)
        smem_a[rg * 64 + 16 + q * 4 + cg % 4] = 2.0f;
    cap_store_f32(x, t, smem_a[rg * 64 + cg]);
}
"""


def _owner_checks(decl: str) -> int:
    text = readable(translate(TILE_OWNER.replace("{decl}", decl)).text)
    return text.split("__rtk_owner(", 1)[1].count("rt_local_idx(")


def test_a_stated_block_size_bounds_the_thread_index() -> None:
    # 128 threads: rg < 8, every subscript < 512, no check left; 256: rg < 16 and
    # rg * 64 + cg reaches 975, so the checks stay (and the fast/slow copies of the loop)
    assert _owner_checks("    rt_require_block_dim(128);\n") == 0
    assert _owner_checks("    rt_require_block_dim(256);\n") > 0
    assert _owner_checks("") > 0  # unstated: up to 1024 threads
    assert translate(TILE_OWNER.replace("{decl}", "    rt_require_block_dim(128);\n")
                          ).kernels["owner"].block_dim == 128


def test_the_update_kernels_register_tiles_are_proved() -> None:
    from capqr.kernels import gpu as g

    text = readable(translate(g.UPDATE_SOURCE).text)
    apply = text.split("void __rtk_gpu_qr_update_apply(", 1)[1].split("void __rtk_", 1)[0]
    # the 8 x 4 register tile's loads, stores and operands (rg < 8, cg < 16, q < 32)
    assert "smem_c[((((rg * 8) + 0) * 64) + (cg * 4)) + 0]" in apply
    for checked in ("smem_c[rt_local_idx(((((rg", "smem_vt[rt_local_idx(",
                    "smem_w[rt_local_idx(((q"):
        assert checked not in apply


@pytest.mark.parametrize("src,target,construct,why", [
    ("KERNEL void k(cap_t x)\n{\n    rt_require_block_dim(128);\n}\n", "cpu",
     "call to 'rt_require_block_dim'", "exists only on the GPU"),
    ("KERNEL void k(cap_t x)\n{\n    int64_t b = 64;\n    rt_require_block_dim(b);\n}\n",
     "cuda", "argument 1 of 'rt_require_block_dim'", "integer literal in 1..1024"),
    ("KERNEL void k(cap_t x)\n{\n    rt_require_block_dim(0);\n}\n", "cuda",
     "argument 1 of 'rt_require_block_dim'", "integer literal in 1..1024"),
    ("KERNEL void k(cap_t x)\n{\n    rt_require_block_dim(2048);\n}\n", "cuda",
     "argument 1 of 'rt_require_block_dim'", "integer literal in 1..1024"),
    ("KERNEL void k(cap_t x)\n{\n    rt_require_block_dim(64);\n    rt_require_block_dim(64);"
     "\n}\n", "cuda", "call to 'rt_require_block_dim'", "stated once"),
    ("KERNEL void k(cap_t x, int64_t n)\n{\n    if (n > 0)\n        rt_require_block_dim(64);"
     "\n}\n", "cuda", "call to 'rt_require_block_dim'", "kernel's own body"),
    ("void h(void)\n{\n    rt_require_block_dim(64);\n}\nKERNEL void k(cap_t x)\n{\n    h();\n}\n",
     "cuda", "call to 'rt_require_block_dim'", "kernel's own body"),
], ids=["cpu", "variable", "zero", "too-big", "twice", "in-a-branch", "in-a-helper"])
def test_rt_require_block_dim_is_refused_with_a_reason(src, target, construct, why) -> None:
    from capqr.runtime.compiler.parse import parse
    from capqr.runtime.compiler.verifier import verify

    with pytest.raises(VerifyError) as e:
        verify(parse(src), target=target)
    assert e.value.construct == construct and why in e.value.reason


def test_readme_example() -> None:
    from tests.readme_examples import run_readme_example

    run_readme_example("Subscripts proved at compile time")
