"""The builtin table (runtime/compiler/dialect_api.py) against the verifier and the two
lowerings: on each target, the builtins the verifier admits are exactly the ones the
table gives a lowering there, and a kernel that calls every one of them lowers to
code its compiler accepts (gcc with cap.h for the CPU; g++ over the emulated device
header and the device prelude for CUDA), each call spelled as the table says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from capqr import capabilities
from capqr.runtime.compiler.dialect_api import BUILTINS, TILE_ELEM_TYPES, Builtin, on_target
from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.verifier import verify
from capqr.runtime.cpu.lower import instrument
from capqr.runtime.errors import VerifyError

TARGETS = ("cpu", "cuda")


def _arrays(target: str) -> dict[str, str]:
    """Argument kind "array" per tile element type: a local array of that type (shared
    on the GPU, where tile copies are cooperative)."""
    pre = "smem_" if target == "cuda" else ""
    return {t: f"{pre}tile_{t}" for t in TILE_ELEM_TYPES}


def _call(b: Builtin, target: str) -> str:
    """A call of ``b`` with arguments of the kinds its signature names."""
    arrays = _arrays(target)
    args = []
    for kind in b.args:
        if kind == "array":
            args.append(arrays[b.name.rsplit("_", 1)[1]])
        else:
            args.append({"cap": "x", "num": "v" if b.math else "n", "mma": "smem_mma",
                         "mask": "1", "dim": "32"}[kind])
    return f"{b.name}({', '.join(args)})"


def _kernel(names: list[str], target: str) -> str:
    """One KERNEL calling each builtin of ``names`` once, as a statement of its body."""
    body = [f"    {ty} {name}[256];" for t, name in _arrays(target).items()
            for ty in [TILE_ELEM_TYPES[t]]]
    body += ["    float smem_mma[2048];" if target == "cuda" else "",
             "    double v = 1.0;"]
    for k, name in enumerate(names):
        b = BUILTINS[name]
        call = _call(b, target)
        body.append({"cap": f"    cap_t c{k} = {call};", "num": f"    v = v + {call};",
                     "void": f"    {call};"}[b.result])
    body.append("    cap_store_f64(x, 0, v);")
    return "KERNEL void k(cap_t x, int64_t n)\n{\n" + "\n".join(body) + "\n}\n"


def _admitted(name: str, target: str) -> bool:
    """Whether the verifier admits a call of ``name`` on ``target``; a refusal must give
    the table's reason."""
    try:
        verify(parse(_kernel([name], target)), target=target)
    except VerifyError as e:
        assert e.reason == BUILTINS[name].absent_reason(target), (name, target, e)
        return False
    return True


@pytest.mark.parametrize("target", TARGETS)
def test_the_verifier_admits_exactly_what_the_target_lowers(target: str) -> None:
    admitted = {name for name in BUILTINS if _admitted(name, target)}
    assert admitted == on_target(target)
    assert admitted and admitted != set(BUILTINS)  # each target lacks some builtins


def _spelled(target: str, lowered: str, names: frozenset[str]) -> None:
    """Each builtin's call is spelled as the table says (the field form: a member)."""
    for name in names:
        low = BUILTINS[name].lowering(target)
        assert low is not None
        spelling = f"->{low.call}" if low.form == "field" else f"{low.call}("
        assert spelling in lowered, (name, spelling)


def test_every_cpu_builtin_lowers_to_c_that_compiles(tmp_path: Path) -> None:
    names = on_target("cpu")
    verified = verify(parse(_kernel(sorted(names), "cpu")), target="cpu")
    for mode in ("checked", "raw"):
        c = instrument(verified, "k", mode).c_source
        _spelled("cpu", c, names)
        src = tmp_path / f"k_{mode}.c"
        src.write_text(c)
        r = subprocess.run(["gcc", "-fsyntax-only", "-std=gnu11", "-Wall",
                            "-Werror=implicit-function-declaration", "-Werror=int-conversion",
                            "-Werror=incompatible-pointer-types",
                            f"-I{capabilities.INCLUDE_DIR}", str(src)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_every_cuda_builtin_lowers_to_cuda_that_compiles(tmp_path: Path) -> None:
    from capqr.runtime.cuda import translate
    from emulate_cuda import host_cpp

    names = on_target("cuda")
    src = _kernel(sorted(names), "cuda")
    for checked in (True, False):
        cs = translate(src, checked=checked)
        _spelled("cuda", cs.text, names)
        cpp = tmp_path / f"k_{int(checked)}.cpp"
        cpp.write_text(host_cpp(cs.text, max(cs.dynamic_smem.values(), default=0)))
        r = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-w", str(cpp)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
