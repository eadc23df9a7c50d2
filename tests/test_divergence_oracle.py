"""The uniform-control-flow rule against an independent oracle: execution.

Random small kernels (branches, counted loops, break/continue/return, values
derived from the thread index or not, warp collectives and a helper around
one) are run by a Python interpreter for every thread of a block.  Whenever
the verifier accepts a kernel for the GPU, every thread must have executed the
same sequence of collective calls (else some lanes would wait at a shuffle the
others never reach).  The interpreter shares nothing with runtime/compiler/divergence.py:
it computes concrete values, not facts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.verifier import verify
from capqr.runtime.errors import VerifyError

N_ARG = 3      # the kernel's scalar argument n
THREADS = 40   # one full and one partial warp


class _Return(Exception):
    pass


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


def _cdiv_mod(a: int, b: int) -> int:
    """C's % (truncating), for b > 0."""
    r = abs(a) % b
    return -r if a < 0 else r


@dataclass
class _Gen:
    rnd: random.Random
    loops: int = 0     # loop counters declared so far (unique names)
    calls: int = 0     # collective call sites so far
    depth: int = 0
    in_loop: int = 0

    def expr(self) -> str:
        """Mostly uniform values, so that many kernels are accepted and executed."""
        if self.rnd.random() < 0.12:  # thread-dependent
            return self.rnd.choice(["t", "(t % 3)", "(v1 + t)", "(int64_t)s", "v2"])
        choice = self.rnd.randrange(5)
        if choice == 0:
            return str(self.rnd.randrange(-1, 4))
        if choice == 1:
            return "n"
        if choice == 2:
            return f"v{self.rnd.randrange(2)}"
        if choice == 3:
            return f"(v{self.rnd.randrange(2)} + {self.rnd.choice(['n', '1'])})"
        return f"(v{self.rnd.randrange(2)} % 3)"

    def cond(self) -> str:
        return f"{self.expr()} {self.rnd.choice(['<', '==', '>'])} {self.expr()}"

    def stmt(self) -> str:
        self.depth += 1
        try:
            kinds = ["assign", "assign", "call", "call", "helper", "flag"]
            if self.depth < 4:
                kinds += ["if", "if", "for"]
            if self.in_loop:
                kinds += ["break", "continue", "break", "continue"]
            kinds.append("return")
            kind = self.rnd.choice(kinds)
            if kind == "assign":
                return f"v{self.rnd.randrange(3)} = {self.expr()};"
            if kind == "flag":  # a uniform value assigned under a condition
                return f"if ({self.cond()}) v{self.rnd.randrange(2)} = {self.rnd.randrange(3)};"
            if kind == "call":
                self.calls += 1
                fn = self.rnd.choice(["rt_warp_sum_f32(s)", "rt_shfl_xor_f32(s, 1)"])
                return f"s = {fn} + (float)({self.calls} * 0);"
            if kind == "helper":
                return f"s = h(s, {self.expr()});"
            if kind == "if":
                body = self.block()
                if self.rnd.random() < 0.5:
                    return f"if ({self.cond()}) {body} else {self.block()}"
                return f"if ({self.cond()}) {body}"
            if kind == "for":
                i = f"i{self.loops}"
                self.loops += 1
                bound = self.rnd.choice(["2", "n", "(t % 3)", "(v0 % 3)", "(v1 % 2)", "v0"])
                self.in_loop += 1
                body = self.block()
                self.in_loop -= 1
                return f"for (int64_t {i} = 0; {i} < {bound}; {i}++) {body}"
            if kind in ("break", "continue"):
                return f"if ({self.cond()}) {kind};"
            return f"if ({self.cond()}) return;"
        finally:
            self.depth -= 1

    def block(self) -> str:
        return "{ " + " ".join(self.stmt() for _ in range(self.rnd.randrange(1, 4))) + " }"


HELPER = """
static float h(float a, int64_t p)
{
    if (p > 1)
        return rt_warp_sum_f32(a);
    return a;
}
"""


def _program(seed: int) -> str:
    g = _Gen(random.Random(seed))
    body = " ".join(g.stmt() for _ in range(g.rnd.randrange(2, 6)))
    return (HELPER + "KERNEL void k(cap_t x, int64_t n)\n{\n"
            "int64_t t = rt_thread_idx(); int64_t v0 = 0; int64_t v1 = 1; int64_t v2 = t;\n"
            "float s = 1.0f;\n" + body + "\ncap_store_f32(x, t, s);\n}\n")


class _Interp:
    """Runs the pycparser AST of one generated kernel for one thread."""

    def __init__(self, ast, t: int):
        self.t = t
        self.trace: list[int] = []
        self.funcs = {e.decl.name: e for e in ast.ext if type(e).__name__ == "FuncDef"}

    def run(self) -> list[int]:
        env = {"t": self.t, "n": N_ARG, "x": None}
        try:
            self.stmt(self.funcs["k"].body, env)
        except _Return:
            pass
        return self.trace

    def stmt(self, s, env) -> None:
        kind = type(s).__name__
        if kind == "Compound":
            for item in s.block_items or []:
                self.stmt(item, env)
        elif kind == "Decl":
            env[s.name] = self.expr(s.init, env) if s.init is not None else 0
        elif kind == "If":
            if self.expr(s.cond, env):
                self.stmt(s.iftrue, env)
            elif s.iffalse is not None:
                self.stmt(s.iffalse, env)
        elif kind == "For":
            for d in s.init.decls:
                env[d.name] = self.expr(d.init, env)
            while self.expr(s.cond, env):
                try:
                    self.stmt(s.stmt, env)
                except _Break:
                    break
                except _Continue:
                    pass
                self.expr(s.next, env)
        elif kind == "Break":
            raise _Break
        elif kind == "Continue":
            raise _Continue
        elif kind == "Return":
            if s.expr is not None:
                env["<ret>"] = self.expr(s.expr, env)
            raise _Return
        else:
            self.expr(s, env)

    def expr(self, e, env):
        kind = type(e).__name__
        if kind == "Constant":
            return float(e.value.rstrip("f")) if "." in e.value else int(e.value)
        if kind == "ID":
            return env[e.name]
        if kind == "Cast":
            v = self.expr(e.expr, env)
            return int(v) if e.to_type.type.type.names == ["int64_t"] else float(v)
        if kind == "Assignment":
            env[e.lvalue.name] = self.expr(e.rvalue, env)
            return env[e.lvalue.name]
        if kind == "UnaryOp" and e.op == "-":
            return -self.expr(e.expr, env)
        if kind == "UnaryOp":  # i++ of the generated loops
            env[e.expr.name] += 1
            return env[e.expr.name]
        if kind == "BinaryOp":
            a, b = self.expr(e.left, env), self.expr(e.right, env)
            return {"+": lambda: a + b, "*": lambda: a * b, "<": lambda: int(a < b),
                    ">": lambda: int(a > b), "==": lambda: int(a == b),
                    "%": lambda: _cdiv_mod(a, b)}[e.op]()
        if kind == "FuncCall":
            name = e.name.name
            args = [self.expr(a, env) for a in e.args.exprs] if e.args else []
            if name == "rt_thread_idx":
                return self.t
            if name.startswith(("rt_warp_sum", "rt_shfl_xor")):
                self.trace.append(e.coord.line * 1000 + e.coord.column)
                # the results differ between lanes (shuffle) or warps (sum)
                return args[0] + (self.t ^ 1 if "shfl" in name else self.t // 32)
            if name == "cap_store_f32":
                return 0
            f = self.funcs[name]
            local = {p.name: v for p, v in zip(f.decl.type.args.params, args, strict=True)}
            try:
                self.stmt(f.body, local)
            except _Return:
                return local.get("<ret>", 0)
            return 0
        raise AssertionError(kind)


def test_accepted_kernels_never_split_a_warp_at_a_collective() -> None:
    accepted = refused = 0
    for seed in range(1500):
        src = _program(seed)
        parsed = parse(src)
        try:
            verify(parsed, target="cuda")
        except VerifyError as e:
            assert "thread-dependent control flow" in e.construct, (src, e)
            refused += 1
            continue
        accepted += 1
        traces = {tuple(_Interp(parsed.ast, t).run()) for t in range(THREADS)}
        assert len(traces) == 1, f"threads reach different collectives:\n{src}"
    # the check is not vacuous: both verdicts occur often
    assert accepted >= 250 and refused >= 250, (accepted, refused)
