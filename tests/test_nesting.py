"""Deeply nested and very wide kernels: compiled, or refused with a reason.

Every pass of the front end (verification, analyses, instrumentation, C generation)
walks the syntax tree recursively.  A long sum nests as deep as it has terms, and
before the nesting limit a 150-term sum ended the compile in a RecursionError
instead of compiling or a VerifyError.  Now every source up to
``parse.MAX_NESTING`` levels compiles on both lanes and a deeper one is refused
at its line, and the guards loop versioning builds over many accesses nest
log2(n) deep (``astutil.conjoin``), not n.
"""

from __future__ import annotations

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime.compiler import astutil
from capqr.runtime.compiler.parse import MAX_NESTING
from pycparser import c_ast, c_generator


def _sum_kernel(terms: int) -> str:
    """out[0] = x[0] + x[1] + ... as one expression (it nests ``terms`` deep)."""
    expr = " + ".join(f"cap_load_f32(x, {i})" for i in range(terms))
    return f"KERNEL void k(cap_t x, cap_t out) {{\n    cap_store_f32(out, 0, {expr});\n}}\n"


def _if_kernel(depth: int) -> str:
    """``depth`` nested ifs around one store (two tree levels per if)."""
    opens = "".join(f"if (n > {i}) {{ " for i in range(depth))
    return (f"KERNEL void k(cap_t out, int64_t n) {{\n    {opens}cap_store_f32(out, 0, 1.0f);"
            f"{' }' * depth}\n}}\n")


def _wide_loop_kernel(width: int) -> str:
    """A loop whose body makes ``width`` loads (its version's guard has as many terms)."""
    body = "".join(f"        s = s + cap_load_f32(x, i * {width} + {k});\n" for k in range(width))
    return ("KERNEL void k(cap_t x, cap_t out, int64_t m) {\n    float s = 0.0f;\n"
            "    for (int64_t i = 0; i < m; i++) {\n" + body + "    }\n"
            "    cap_store_f32(out, 0, s);\n}\n")


@pytest.mark.parametrize("checked", [True, False])
def test_long_sum_compiles_and_adds_in_order(checked: bool) -> None:
    terms = 300  # raised RecursionError before the limit (from about 150 terms on)
    k = runtime.compile(_sum_kernel(terms), "k", checked=checked)
    x = np.random.default_rng(0).standard_normal(terms).astype(np.float32)
    out = np.zeros(1, np.float32)
    runtime.launch(k, [capabilities.wrap(x), capabilities.wrap(out)])
    expect = np.float32(0)
    for v in x:  # C's left-to-right additions, in float
        expect = np.float32(expect + v)
    assert out[0] == expect


def test_nesting_past_the_limit_is_refused_with_its_line() -> None:
    src = "\n\n" + _sum_kernel(MAX_NESTING + 50)
    with pytest.raises(runtime.VerifyError) as e:
        runtime.compile(src, "k")
    assert e.value.line == 4 and "nesting deeper than" in e.value.construct
    assert "split the expression into statements" in e.value.reason


@pytest.mark.parametrize("depth", [MAX_NESTING, 20_000])
def test_nested_ifs_past_the_limit_are_refused(depth: int) -> None:
    """Refused by the nesting check, or where the parser itself runs out of recursion
    (20,000 ifs), with the same construct and reason, not a bare RecursionError."""
    with pytest.raises(runtime.VerifyError) as e:
        runtime.compile(_if_kernel(depth), "k")
    assert "nesting deeper than" in e.value.construct


def test_deep_statements_compile_and_run() -> None:
    depth = (MAX_NESTING - 20) // 2
    k = runtime.compile(_if_kernel(depth), "k")
    out = np.zeros(1, np.float32)
    runtime.launch(k, [capabilities.wrap(out)], args=[depth])
    assert out[0] == 1.0
    out[0] = 0.0
    runtime.launch(k, [capabilities.wrap(out)], args=[depth - 1])  # the innermost test fails
    assert out[0] == 0.0


def test_deep_source_lowers_for_the_gpu() -> None:
    from capqr.runtime.cuda import translate

    for src in (_sum_kernel(MAX_NESTING - 10), _if_kernel((MAX_NESTING - 20) // 2)):
        for checked in (True, False):
            cs = translate(src, checked=checked)
            assert list(cs.kernels) == ["k"] and "cap_store_f32" not in cs.text


def test_wide_loop_guard_is_balanced_and_still_checks() -> None:
    """200 accesses in one loop body: compiled, right, and an access past the buffer in
    the last iteration faults at its index."""
    width = 200
    k = runtime.compile(_wide_loop_kernel(width), "k")
    m = 3
    x = np.random.default_rng(1).standard_normal(m * width).astype(np.float32)
    out = np.zeros(1, np.float32)
    runtime.launch(k, [capabilities.wrap(x), capabilities.wrap(out)], args=[m])
    expect = np.float32(0)
    for v in x:
        expect = np.float32(expect + v)
    assert out[0] == expect
    with pytest.raises(runtime.CapabilityFault) as e:
        runtime.launch(k, [capabilities.wrap(x[:-1], name="x"), capabilities.wrap(out)],
                       args=[m])
    assert (e.value.buffer, e.value.index, e.value.access) == ("x", m * width - 1, "load")


def test_conjoin_is_balanced_and_keeps_the_order() -> None:
    terms = [c_ast.ID(f"t{i}") for i in range(1000)]
    tree = astutil.conjoin("&&", terms)

    def depth(n: c_ast.Node) -> int:
        return 1 + max((depth(c) for _, c in n.children()), default=0)

    assert depth(tree) <= 11
    text = c_generator.CGenerator().visit(tree)
    assert text.replace("(", "").replace(")", "").split(" && ") == [f"t{i}" for i in range(1000)]
    assert astutil.conjoin("&", [c_ast.ID("a")]).name == "a"
