"""Kernel names never meet the C preprocessor, C++ keywords or the host's headers.

A name the verifier admits is printed with a reserved prefix (runtime/compiler/astutil.py
USER_PREFIX) in the generated C and CUDA, and the CPU kernel is compiled in a
translation unit of its own (no Python.h).  The tests list every macro the exact
kernel translation unit of each lane defines (``gcc -dM -E`` / ``g++ -dM -E`` on
the generated text with the build's own command) and, for each, either see
verify() refuse it by name or run kernels that use it as a kernel parameter, a
local, a helper and a helper parameter, and read its plain value back.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.runtime import build
from capqr.runtime.compiler.astutil import USER_PREFIX, readable
from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.verifier import verify
from capqr.runtime.cpu.kernel import cc_command
from capqr.runtime.errors import CompileError, VerifyError

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on this machine")

#: A name in its roles, in a source of its own: verify() refuses it (by name) or not.
#: The three variable roles share one source (the verifier checks them alike, in
#: source order); a helper of that name would clash with them ("shadows a function").
#: A name refused there is refused; one admitted runs in those roles and, unless
#: refused as a helper too, as a helper.
VARIABLE_ROLES = """static void h_q(int64_t {n}) {{ }}
static void l_q(void) {{ int64_t {n} = 0; }}
KERNEL void k_q(int64_t {n}) {{ }}
"""
HELPER_ROLE = """static void {n}(void) {{ }}
KERNEL void k_q(void) {{ {n}(); }}
"""
#: The tests' own names (kept out of the names under test).
SCAFFOLD = {"h_q", "l_q", "v_q", "k_q", "o", "out", "acc_q", "base_q"}

#: C++ keywords and alternative tokens: plain identifiers in C, so the verifier
#: (a C parser) may admit them; the CUDA lane compiles C++.
CXX_WORDS = """and and_eq bitand bitor compl not not_eq or or_eq xor xor_eq alignas alignof
bool catch char8_t char16_t char32_t class concept consteval constexpr constinit const_cast
co_await co_return co_yield decltype delete dynamic_cast explicit export false final friend
import module mutable namespace new noexcept nullptr operator override private protected
public reinterpret_cast requires static_assert static_cast template this thread_local throw
true try typeid typename using virtual wchar_t""".split()

#: Words pycparser lexes as keywords besides C's own (refused as a syntax error).
PARSER_KEYWORDS = {"offsetof"}


def _defined_macros(cmd: list[str], text: str, suffix: str, tmp: Path) -> list[str]:
    """Every macro name the translation unit ``text`` defines, by ``cmd -dM -E``."""
    path = tmp / f"tu{suffix}"
    path.write_text(text)
    r = subprocess.run([*cmd, "-dM", "-E", str(path)], capture_output=True, text=True,
                       check=True)
    return sorted({m.group(1) for m in re.finditer(r"^#define (\w+)", r.stdout, re.M)})


def _admitted(names: list[str], template: str, target: str) -> list[str]:
    """The names verify() admits in ``template``'s roles; every refusal names the name."""
    out = []
    for n in names:
        try:
            verify(parse(template.format(n=n)), target=target)
        except VerifyError as e:
            # a word the C parser lexes as a keyword never is an identifier
            assert re.search(rf"\b{n}\b", str(e)) or (
                n in PARSER_KEYWORDS and e.construct == "syntax error"), (n, str(e))
            continue
        out.append(n)
    return out


def _chunks(names: list[str], size: int) -> list[list[str]]:
    return [names[i:i + size] for i in range(0, len(names), size)] or [[]]


def _variables_source(chunks: list[list[str]]) -> str:
    """Per chunk c of names, a kernel kv_c with a parameter per name, a helper with a
    parameter per name and a helper with a local per name; each sums its names (with
    weights, so every one counts) into one slot of ``out``."""
    out = []
    for c, names in enumerate(chunks):
        hp = ", ".join(["int64_t w_q"] + [f"int64_t {n}" for n in names])
        hp_sum = "".join(f"    acc_q += {i + 1} * {n};\n" for i, n in enumerate(names))
        hl = "".join(f"    int64_t {n} = base_q + {i};\n" for i, n in enumerate(names))
        hl_sum = "".join(f"    acc_q += {n};\n" for n in names)
        kp = ", ".join(["cap_t out"] + [f"int64_t {n}" for n in names])
        kp_sum = "".join(f"    acc_q += {n};\n" for n in names)
        call = ", ".join(["0"] + [str(3 * (i + 1)) for i in range(len(names))])
        out.append(
            f"static int64_t hp_{c}({hp})\n{{\n    int64_t acc_q = w_q;\n{hp_sum}"
            "    return acc_q;\n}\n"
            f"static int64_t hl_{c}(int64_t base_q)\n{{\n{hl}    int64_t acc_q = 0;\n"
            f"{hl_sum}    return acc_q;\n}}\n"
            f"KERNEL void kv_{c}({kp})\n{{\n    int64_t acc_q = 0;\n{kp_sum}"
            "    cap_store_i64(out, 0, acc_q);\n"
            f"    cap_store_i64(out, 1, hp_{c}({call}));\n"
            f"    cap_store_i64(out, 2, hl_{c}(1000));\n}}\n")
    return "".join(out)


def _variables_args(names: list[str]) -> tuple[int, ...]:
    return tuple(7 * (i + 1) for i in range(len(names)))


def _variables_expect(names: list[str]) -> list[int]:
    return [sum(7 * (i + 1) for i in range(len(names))),
            sum((i + 1) * 3 * (i + 1) for i in range(len(names))),
            sum(1000 + i for i in range(len(names)))]


def _helpers_source(chunks: list[list[str]]) -> str:
    """A helper per name (returning its argument plus its index) and, per chunk c, a
    kernel kf_c summing its helpers' results."""
    out = []
    for c, names in enumerate(chunks):
        defs = "".join(f"static int64_t {n}(int64_t v_q) {{ return v_q + {i}; }}\n"
                       for i, n in enumerate(names))
        calls = "".join(f"    acc_q += {n}(1);\n" for n in names)
        out.append(defs + f"KERNEL void kf_{c}(cap_t out)\n{{\n    int64_t acc_q = 0;\n"
                   + calls + "    cap_store_i64(out, 0, acc_q);\n}\n")
    return "".join(out)


def _helpers_expect(names: list[str]) -> list[int]:
    return [sum(1 + i for i in range(len(names)))]


def _cpu_run(src: str, name: str, n_out: int, args: tuple = ()) -> list[int]:
    out = np.zeros(n_out, np.int64)
    runtime.launch(runtime.compile(src, name), [capabilities.wrap(out, name="out")],
                   args=args, timeout=60)
    return out.tolist()


PROBE = "KERNEL void probe(cap_t o, int64_t n) { cap_store_i64(o, 0, n); }"


def test_cpu_kernel_tu_macros_are_refused_or_harmless(tmp_path) -> None:
    c_source = runtime.compile(PROBE, "probe").c_source
    macros = _defined_macros(cc_command(), c_source, ".c", tmp_path)  # the build's command
    assert "INT64_MAX" in macros and "HUGE_VAL" in macros  # the headers are there
    assert not [m for m in macros if m.startswith(USER_PREFIX)]  # the prefix is free
    # errno comes from Python.h's headers, which used to share the kernel's unit;
    # typeof is a GNU C keyword
    names = sorted(set(macros + ["errno", "typeof"]) - SCAFFOLD)
    variables = _admitted(names, VARIABLE_ROLES, "cpu")
    helpers = _admitted(variables, HELPER_ROLE, "cpu")
    assert {"HUGE_VAL", "linux", "unix", "errno", "M_PI"} <= set(variables) & set(helpers)
    # one build each: every name of a role in one kernel
    assert _cpu_run(_variables_source([variables]), "kv_0", 3,
                    _variables_args(variables)) == _variables_expect(variables)
    assert _cpu_run(_helpers_source([helpers]), "kf_0", 1) == _helpers_expect(helpers)


HIJACK = textwrap.dedent("""
    import numpy as np
    from capqr import capabilities, runtime
    p = "KERNEL void p(cap_t o, int64_t errno) { cap_store_i64(o, 0, errno + 1); }"
    q = "KERNEL void q(cap_t o) { double HUGE_VAL = 2.5; cap_store_f64(o, 1, HUGE_VAL * 2.0); }"
    o = np.zeros(2, np.int64)
    runtime.launch(runtime.compile(p, "p"), [capabilities.wrap(o, name="o")], args=(41,))
    print("P", o[0], flush=True)
    f = np.zeros(2, np.float64)
    runtime.launch(runtime.compile(q, "q"), [capabilities.wrap(f, name="o")])
    print("RESULT", o[0], f[1])
""")


def test_errno_parameter_and_huge_val_local_run_with_their_plain_meaning() -> None:
    """``int64_t errno`` as a parameter was ``int64_t (*__errno_location ())``: a function
    pointer the caller passes, called by the kernel (SIGSEGV in the host)."""
    r = subprocess.run([sys.executable, "-c", HIJACK], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert "RESULT 42 5.0" in r.stdout, r.stdout


def test_cpu_kernel_named_like_a_macro() -> None:
    for kname in ("linux", "unix", "errno"):
        src = f"KERNEL void {kname}(cap_t o, int64_t v) {{ cap_store_i64(o, 0, v + 1); }}"
        assert _cpu_run(src, kname, 1, (4,)) == [5]


# ---------------------------------------------------------------------------
# The GPU lane, through its CPU emulation (tests/emulate_cuda.py): g++ compiles the
# generated CUDA as C++, so C++ keywords and the C++ headers' macros are user names too.

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")


def _emu_run(src: str, name: str, n_out: int, args: tuple, tmp: Path) -> list[int]:
    from emulate_cuda import build as emu_build  # tests/ is on sys.path

    out = np.zeros(n_out, np.int64)
    fault = emu_build(src, checked=True, workdir=tmp)[name].launch([out, *args], 1, 1)
    assert fault is None, fault
    return out.tolist()


@needs_gxx
def test_cuda_tu_macros_and_cxx_keywords_are_refused_or_harmless(tmp_path) -> None:
    from capqr.runtime.cuda import translate
    from emulate_cuda import build as emu_build
    from emulate_cuda import host_cpp

    text = host_cpp(translate(PROBE).text)
    macros = _defined_macros(["g++", "-std=c++20"], text, ".cpp", tmp_path)
    assert "errno" in macros and "EXIT_FAILURE" in macros
    assert not [m for m in macros if m.startswith((USER_PREFIX, "__rtk_"))]
    names = sorted(set(macros + CXX_WORDS) - SCAFFOLD)
    variables = _admitted(names, VARIABLE_ROLES, "cuda")
    helpers = _admitted(variables, HELPER_ROLE, "cuda")
    for w in ("class", "new", "this", "and", "bitand", "not", "template", "errno"):
        assert w in variables and w in helpers, w
    # one g++ build per role; kernels of a chunk of names each (one huge function
    # would make the lowering's passes slow)
    for names, source, expect, args in (
            (variables, _variables_source, _variables_expect, _variables_args),
            (helpers, _helpers_source, _helpers_expect, lambda names: ())):
        chunks = _chunks(names, 128)
        built = emu_build(source(chunks), checked=True, workdir=tmp_path)
        for c, chunk in enumerate(chunks):
            kernel = built[f"{'kv' if source is _variables_source else 'kf'}_{c}"]
            out = np.zeros(len(expect(chunk)), np.int64)
            assert kernel.launch([out, *args(chunk)], 1, 1) is None
            assert out.tolist() == expect(chunk), (c, chunk)


@needs_gxx
def test_cuda_kernel_named_like_a_keyword_or_macro(tmp_path) -> None:
    src = "".join(f"KERNEL void {k}(cap_t o, int64_t v) {{ cap_store_i64(o, 0, v + {i}); }}\n"
                  for i, k in enumerate(("class", "errno", "linux", "delete")))
    for i, k in enumerate(("class", "errno", "linux", "delete")):
        assert _emu_run(src, k, 1, (10,), tmp_path) == [10 + i]


# ---------------------------------------------------------------------------
# Compiler failures after verification

TYPE_ERROR = """KERNEL void k(cap_t o, double d)
{
    int64_t i = rt_block_idx();
    cap_store_f64(o, i, ~d);
}
"""

READ_ONLY = """KERNEL void k(cap_t o, int64_t n)
{
    const int64_t limit = 1;

    limit = n;
    cap_store_i64(o, 0, limit);
}
"""


def test_compile_error_names_the_kernel_line_and_gcc_diagnostic() -> None:
    verify(parse(TYPE_ERROR))  # the verifier admits it; gcc does not
    with pytest.raises(CompileError) as e:
        runtime.compile(TYPE_ERROR, "k")
    msg = str(e.value)
    assert "line 4" in msg and "bit-complement" in msg, msg
    assert "exit code" not in msg, msg
    assert e.value.line == 4
    assert "bit-complement" in e.value.compiler_output


def test_compile_error_shows_user_names() -> None:
    with pytest.raises(CompileError) as e:
        runtime.compile(READ_ONLY, "k")
    msg = str(e.value)
    assert "line 5" in msg and "read-only variable 'limit'" in msg, msg


def test_nvrtc_log_lines_map_to_kernel_lines() -> None:
    """NVRTC's log names the file of the lowering's ``#line N "kernel"`` directives as
    ``kernel(N)`` (no GPU here: the log below is in NVRTC's format, as
    runtime/cuda/nvrtc.py hands it to compile_error)."""
    log = ('kernel(4): error: expression must have integral or unscoped enum type\n'
           '      rt_store_f64(capqr_u_o, capqr_u_i, ~capqr_u_d, 4);\n'
           '                                      ^\n\n'
           '1 error detected in the compilation of "kernel.cu".\n')
    err = build.compile_error("the CUDA C of kernel.cu (NVRTC: NVRTC_ERROR_COMPILATION)", log)
    assert err.line == 4 and err.compiler_output == log
    msg = str(err)
    assert "line 4: error: expression must have integral" in msg, msg
    assert "rt_store_f64(o, i, ~d, 4)" in msg, msg  # user names as written


def test_generated_text_carries_kernel_lines_and_prefixed_names() -> None:
    """Each user statement's line reaches the compiler; names are prefixed in the text
    and only there (the signature and fault names stay the user's)."""
    src = "KERNEL void k(cap_t o, int64_t n)\n{\n    double a[2];\n\n    a[n] = 1.0;\n}\n"
    k = runtime.compile(src, "k")
    assert '#line 5 "kernel"' in k.c_source and "capqr_u_a[" in k.c_source
    assert '"a"' in k.c_source  # the local-array fault names the array as written
    assert k.signature.params == [("o", "cap"), ("n", "int64")]
    assert "a[rt_local_idx(__rt, n, 2" in readable(k.c_source)
    with pytest.raises(runtime.CapabilityFault) as e:
        runtime.launch(k, [capabilities.wrap(np.zeros(1), name="o")], args=(2,))
    assert (e.value.buffer, e.value.line, e.value.kernel) == ("a", 5, "k")
