"""A verified source the CUDA toolchain still refuses: CompileError on kernel lines.

The front end's diagnostics reach kernel lines through the lowering's ``#line``
directives; ptxas's and the module loader's name an entry function instead
("Entry function 'capqr_u_k' uses too much shared data"), which
runtime/cuda/nvrtc.py puts on its KERNEL's line.  The message keeps the errors; the
runtime prelude's warnings stay in ``compiler_output``.  (The module loader's log:
tests/test_gpu_reset.py, on the fake device.)
"""

from __future__ import annotations

import pytest
from capqr.runtime import CompileError
from capqr.runtime.cuda import nvrtc
from capqr.runtime.cuda.kernel import entry_lines
from capqr.runtime.cuda.lower import entry_symbol

#: what nvcc wrote for a kernel of 4500 int64 parameters (tail), and a ptxas refusal
LOG = """/tmp/t/k.cu(200): warning #177-D: function "rt_loop_span32" was declared but never \
referenced
    static int rt_loop_span32(rt_i64 a, rt_i64 b, rt_i64 step, int incl, rt_i64 *span)
               ^
Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"
kernel(4505): Error: Formal parameter space overflowed (36052 bytes required, max 32764 \
bytes allowed) in function capqr_u_many

ptxas error   : Entry function 'capqr_u_put2' uses too much shared data (0x10100 bytes, \
0xc000 max)
ptxas fatal   : Ptx assembly aborted due to errors
"""


def test_diagnostics_go_on_kernel_lines_errors_first() -> None:
    """Before: the message began with the prelude's warnings (its 40 lines could miss the
    error), 'Error:' was not taken for an error (line None), and ptxas's refusal named
    capqr_u_put2 with no line."""
    entries = {"capqr_u_many": ("many", 3), "capqr_u_put": ("put", 9),
               "capqr_u_put2": ("put2", 17)}
    e = nvrtc.cuda_compile_error("the CUDA C (nvcc)", LOG, entries, {"/tmp/t/k.cu": "<cuda>"})
    text = str(e).split("\n")
    assert e.line == 3 and e.compiler_output == LOG  # (4505: past the wrapper's body)
    assert text[1].strip().startswith("line 3: Error: Formal parameter space overflowed")
    assert text[1].endswith("in function 'many'")
    assert text[2].strip() == ("line 17: ptxas error: Entry function 'put2' uses too much "
                               "shared data (0x10100 bytes, 0xc000 max)")
    assert "warning" not in str(e) and "capqr_u_" not in str(e)


def test_entry_lines_are_the_kernels_definitions() -> None:
    from capqr.runtime.cuda import translate

    src = "\nstatic int64_t h(int64_t a) { return a; }\n\nKERNEL void k(cap_t x)\n{\n" \
          "    cap_store_i64(x, 0, h(1));\n}\n"
    assert entry_lines(translate(src)) == {entry_symbol("k"): ("k", 4)}


@pytest.mark.skipif(nvrtc.version() == "none", reason="neither NVRTC nor nvcc on this machine")
def test_parameter_space_overflow_is_on_the_kernels_lines() -> None:
    """4200 int64_t parameters pass the verifier and overflow CUDA's 32764-byte parameter
    space: a CompileError naming the kernel on its KERNEL line (through NVRTC, or nvcc
    where there is no libnvrtc).  Before: line 4205, past the source's end (the
    __global__ wrapper's lines count on from the body's last #line)."""
    from capqr.runtime.cuda import translate

    n = 4200
    params = ", ".join(f"int64_t a{i}" for i in range(n))
    body = "\n".join(f"    cap_store_i64(x, {i}, a{i});" for i in range(n))
    src = f"KERNEL void many(cap_t x, {params})\n{{\n{body}\n}}\n"
    cs = translate(src)
    with pytest.raises(CompileError) as e:
        nvrtc.compile_cubin(cs.text, arch="sm_90", options=("-lineinfo",),
                            entries=entry_lines(cs))
    assert e.value.line == 1
    assert "parameter space" in str(e.value) and "'many'" in str(e.value)
    assert entry_symbol("many") not in str(e.value)
