"""The verifier checks the language that is compiled: C on the CPU lane, C++ on the
GPU lane (NVRTC).  pycparser parses C, so every C-vs-C++ difference that changes what
a kernel does is listed here, each either refused by verify() for both targets or
harmless (the compiler refuses it).

The one that matters most: C++ takes ``c ? a : b``, ``(x, a)``, ``a = b``, ``a += b``
and ``++a`` as lvalues where C does not.  ``++(1 ? off : off)`` then changes ``off``,
which every analysis that decides "this variable is unchanged" (runtime.compiler.astutil
write_counts: loop versioning, range proofs, divergence) missed, so a versioned loop
ran its fast copy with indices its guard never checked.

And the one analysis of names written (write_counts), which relies on that rule.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from capqr.runtime.compiler.astutil import write_counts
from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.ranges import prove_subscripts
from capqr.runtime.compiler.verifier import verify
from capqr.runtime.errors import VerifyError

TARGETS = ("cpu", "cuda")

# The statement goes on line 6.
TEMPLATE = """\
KERNEL void k(cap_t x, int64_t n)
{{
    int64_t off = 0;
    double a[4];
    a[0] = 0.0;
    {stmt}
    cap_store_f64(x, off, a[0]);
}}
"""

# Writes whose target C++ takes as an lvalue and C does not (or neither does, where
# pycparser still builds the tree): refused on both lanes.
LVALUE_WRITES = [
    ("increment-of-ternary", "++(1 ? off : off);"),
    ("decrement-of-ternary", "--(n > 0 ? off : off);"),
    ("postincrement-of-ternary", "(1 ? off : off)++;"),
    ("postincrement-of-comma", "(n, off)++;"),
    ("increment-of-comma", "++(n, off);"),
    ("assign-to-ternary", "(1 ? off : off) = 2;"),
    ("compound-assign-to-ternary", "(1 ? off : off) += 2;"),
    ("assign-to-comma", "(n, off) = 3;"),
    ("assign-to-assignment", "(off = n) = 3;"),
    ("compound-assign-to-compound", "(off += 1) += 2;"),
    ("increment-of-assignment", "++(off = n);"),
    ("postincrement-of-compound", "(off += 1)++;"),
    ("assign-to-preincrement", "++off = 3;"),
    ("preincrement-of-preincrement", "++ ++off;"),
    ("postincrement-of-preincrement", "(++off)++;"),
    ("predecrement-of-preincrement", "--(++off);"),
    ("postincrement-of-postincrement", "(off++)++;"),
    ("increment-of-cast", "((int64_t)off)++;"),
    ("element-ternary", "(1 ? a[0] : a[1]) = 2.0;"),
    ("element-increment-of-ternary", "++(n > 0 ? a[0] : a[1]);"),
    ("element-compound-comma", "(n, a[0]) *= 2.0;"),
]

# The write forms the dialect keeps: a plain name, an element of a local array.
PLAIN_WRITES = ["off++;", "--off;", "off += n;", "off = (n, 3);", "off = n > 0 ? off : 1;",
                "a[off & 3]++;", "--a[1];", "a[0] = a[1] = 2.0;", "a[2] *= 3.0;",
                "off = a[0] > 1.0 ? 1 : 2;"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stmt", [s for _, s in LVALUE_WRITES],
                         ids=[i for i, _ in LVALUE_WRITES])
def test_cxx_only_lvalues_are_refused(stmt: str, target: str) -> None:
    with pytest.raises(VerifyError) as info:
        verify(parse(TEMPLATE.format(stmt=stmt)), target=target)
    err = info.value
    assert err.line == 6, str(err)
    assert err.construct.startswith(("'++' on", "'--' on", "'=' on", "'+=' on", "'*=' on")), \
        str(err)
    assert "C++" in err.reason and "unchanged" in err.reason, str(err)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stmt", PLAIN_WRITES)
def test_plain_writes_are_accepted(stmt: str, target: str) -> None:
    verify(parse(TEMPLATE.format(stmt=stmt)), target=target)


# C++ keywords and alternative tokens are ordinary identifiers in C.  Today verify()
# accepts them as names on both lanes: on the GPU lane NVRTC then refuses the
# declaration (a compile error, never a change of meaning: every use of such a name
# needs its declaration, which C++ cannot parse).  Another developer is adding a
# renaming of all user identifiers at code generation, which makes them compile;
# until then this only records what verify() says.
CXX_KEYWORDS = ["and", "bitand", "bitor", "not", "not_eq", "or", "xor", "compl", "class",
                "new", "delete", "this", "template", "namespace", "operator", "private",
                "true", "false", "nullptr", "bool", "try", "catch", "throw"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", CXX_KEYWORDS)
def test_cxx_keywords_as_names_verify_today(name: str, target: str) -> None:
    src = (f"KERNEL void k(cap_t x, int64_t n)\n{{\n    int64_t {name} = n;\n"
           f"    cap_store_f64(x, {name}, 1.0);\n}}\n")
    verified = verify(parse(src), target=target)
    assert "k" in verified.kernels


# C++ constructs pycparser cannot parse, and C constructs C++ refuses or reads
# differently: refused (a VerifyError from parse or verify) on both lanes.
REFUSED_DIFFERENCES = [
    ("reference-local", "int64_t &r = off;", "syntax error"),
    ("auto-deduction", "auto v = 1.5;", "syntax error"),  # C: a storage class
    ("generic-selection", "off = _Generic(off, int64_t: 1, default: 2);", "_Generic"),
    ("switch-skips-initialiser",  # C accepts the jump, C++ refuses it
     "switch (n) { case 0: ; int64_t q = 1; default: off = q; }", "switch body"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stmt,needle", [c[1:] for c in REFUSED_DIFFERENCES],
                         ids=[c[0] for c in REFUSED_DIFFERENCES])
def test_other_cxx_differences_are_refused(stmt: str, needle: str, target: str) -> None:
    with pytest.raises(VerifyError) as info:
        verify(parse(TEMPLATE.format(stmt=stmt)), target=target)
    assert info.value.line == 6 and needle in info.value.construct, str(info.value)


def test_reference_parameter_is_refused() -> None:
    src = ("static void bump(int64_t &r)\n{\n    r++;\n}\n"
           "KERNEL void k(cap_t x)\n{\n    cap_store_f64(x, 0, 1.0);\n}\n")
    with pytest.raises(VerifyError) as info:
        parse(src)
    assert info.value.line == 1 and info.value.construct == "syntax error"


# ---- the one analysis of names written ------------------------------------------------

def test_write_counts_sees_every_admitted_write() -> None:
    src = TEMPLATE.format(stmt="off = 1; off += 2; off++; ++off; off--; --off; "
                               "a[off & 3] = 1.0; a[0]++; --a[1]; a[2] += 1.0;")
    parsed = parse(src)
    verify(parsed, target="cuda")
    counts = write_counts(parsed.funcs["k"].body)
    # a declaration counts once; an element write changes the array, not the name
    assert counts == {"off": 7, "a": 1}, counts


@pytest.mark.parametrize("stmt", ["++(1 ? off : off);", "(n, off)++;", "(off = n) = 3;",
                                  "++ ++off;"])
def test_write_counts_relies_on_the_verifier(stmt: str) -> None:
    """write_counts sees a name or an array element only: on a tree the verifier
    refuses it fails loudly instead of missing the write."""
    parsed = parse(TEMPLATE.format(stmt=stmt))
    with pytest.raises(AssertionError, match="verifier"):
        write_counts(parsed.funcs["k"].body)


# A loop whose index moves through a C++-only lvalue.  Loop versioning took `off` as
# unchanged: its guard checked i + off for off == 0 and the fast copy stored at
# i + off = 2i, unchecked.
MOVING_INDEX = """\
KERNEL void k(cap_t x, int64_t n)
{{
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {{
        cap_store_f32(x, i + off, 1.0f);
        {stmt}
    }}
}}
"""
MOVES = ["++(1 ? off : off);", "(n, off)++;", "(off += 1, off)++;", "(off = off + 1) += 0;"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
@pytest.mark.parametrize("stmt", MOVES[:2])
def test_moving_index_never_runs_unchecked_on_the_gpu_lane(tmp_path, stmt: str) -> None:
    """The GPU lane's generated code (tests/emulate_cuda.py, g++ as C++): refused, or
    every store checked (before the fix: accepted, and 256 stores landed past the
    end of a 512-element buffer with no fault)."""
    from emulate_cuda import build

    src = MOVING_INDEX.format(stmt=stmt)
    try:
        k = build(src, workdir=tmp_path)["k"]
    except VerifyError as e:
        assert e.line == 6
        return
    n = 512
    big = np.full(n + 1024, 5.0, np.float32)
    big[:n] = 0.0
    fault = k.launch([big[:n], n], 1, 1)
    past = int((big[n:] != 5.0).sum())
    assert past == 0, f"{past} unchecked stores past the buffer (fault record: {fault})"
    assert fault is not None


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stmt", MOVES)
def test_moving_index_is_refused(stmt: str, target: str) -> None:
    with pytest.raises(VerifyError) as info:
        verify(parse(MOVING_INDEX.format(stmt=stmt)), target=target)
    assert info.value.line == 6, str(info.value)


MOVING_SUBSCRIPT = """\
KERNEL void k(cap_t x, int64_t n)
{{
    double t[8];
    int64_t off = 0;
    for (int i = 0; i < 8; i++) {{
        t[i + off] = 1.0;
        {stmt}
    }}
    cap_store_f64(x, 0, t[0]);
}}
"""


@pytest.mark.parametrize("stmt", MOVES)
def test_moving_subscript_is_never_proved(stmt: str) -> None:
    """The range pass: refused, or t[i + off] keeps its check (before the fix it was
    proved from off == 0 and i < 8)."""
    parsed = parse(MOVING_SUBSCRIPT.format(stmt=stmt))
    try:
        verified = verify(parsed, target="cuda")
    except VerifyError as e:
        assert e.line == 7
        return
    proved = prove_subscripts(parsed.funcs["k"], verified.local_arrays["k"], {})
    assert [r.coord.line for r in proved.proved if r.coord.line == 6] == []
