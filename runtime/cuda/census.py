"""Which checks the GPU lowering leaves inside loops: a census of the generated code.

Loop versioning (runtime/compiler/hoist/) and the static range proofs
(runtime/compiler/ranges.py) decide which accesses run unchecked; this module
counts what is left on the path a kernel takes when every guard holds (its *fast
path*: the checked copy of each :class:`~runtime.compiler.hoist.Versioned`
statement is left out, since it runs only when its guard fails).  Counted inside
loops (a loop's body, or a helper called there), where a check runs once per
iteration:

* ``checks``: accesses that test their own index - ``rt_load_T``/``rt_store_T``
  (cap accesses) and ``rt_local_idx`` (local-array subscripts);
* ``guards``: versioning guards that test ranges (an ``rt_*_ok`` predicate in
  their condition), evaluated once per iteration of the loops around them;
* ``tiles``: tile copies, one check per tile (the grain the kernels aim for).

The census reads the lowered AST the CUDA text is printed from
(``_Instrumenter.lowered``), so it counts exactly what NVRTC compiles; no GPU is
needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pycparser import c_ast

from .. import pipeline
from ..compiler.astutil import USER_PREFIX
from ..compiler.hoist import Versioned
from .lower import _Instrumenter

#: A guard's range predicates (rt_range_ok, rt_lrange_hull_ok, rt_line_ok, ...).
_PREDICATE = re.compile(r"rt_\w+_ok\Z")
_CHECKED_ACCESS = re.compile(r"rt_(load|store)_\w+\Z|rt_local_idx\Z")


@dataclass
class LoopChecks:
    """The checks one kernel runs per loop iteration on its fast path, each as
    (what, kernel source line), once per source site (the quiet and polling copies
    of a loop are one site)."""

    checks: list[tuple[str, int]] = field(default_factory=list)
    guards: list[tuple[str, int]] = field(default_factory=list)
    tiles: list[tuple[str, int]] = field(default_factory=list)

    @property
    def per_element(self) -> int:
        """Checks and range guards that run per iteration (tile copies excluded)."""
        return len(self.checks) + len(self.guards)


def _name(call: c_ast.FuncCall) -> str:
    return call.name.name if isinstance(call.name, c_ast.ID) else ""


def _line(call: c_ast.FuncCall) -> int:
    """The kernel line a check reports (its last argument), else the call's own."""
    args = call.args.exprs if call.args is not None else []
    if args and isinstance(args[-1], c_ast.Constant) and args[-1].value.isdigit():
        return int(args[-1].value)
    return call.coord.line if call.coord else 0


def _predicates(cond: c_ast.Node) -> list[str]:
    out: list[str] = []

    class V(c_ast.NodeVisitor):
        def generic_visit(self, n: c_ast.Node) -> None:
            if isinstance(n, c_ast.FuncCall) and _PREDICATE.match(_name(n)):
                out.append(_name(n))
            for _, c in n.children():
                self.visit(c)

    V().visit(cond)
    return out


def loop_checks(source: str) -> dict[str, LoopChecks]:
    """Kernel name -> the checks its fast path runs inside loops (checked build)."""
    verified = pipeline.verified(source, "cuda")
    lowering = _Instrumenter(verified, checked=True, hoist=True)
    lowering.run()
    funcs = {USER_PREFIX + name: fn for name, fn in lowering.lowered.items()}
    out: dict[str, LoopChecks] = {}

    def walk(n: c_ast.Node, looped: bool, res: LoopChecks, stack: tuple[str, ...]) -> None:
        if isinstance(n, Versioned):
            preds = _predicates(n.cond)
            if looped and preds:
                res.guards.append((",".join(sorted(set(preds))), n.coord.line if n.coord else 0))
            walk(n.iftrue, looped, res, stack)  # the checked copy is not the fast path
            return
        if isinstance(n, c_ast.FuncCall):
            name = _name(n)
            if looped and _CHECKED_ACCESS.match(name):
                res.checks.append((name, _line(n)))
            elif looped and name.startswith("rt_tile_"):
                res.tiles.append((name, _line(n)))
            elif looped and name in funcs and name not in stack:
                walk(funcs[name].body, True, res, stack + (name,))
        if isinstance(n, (c_ast.For, c_ast.While, c_ast.DoWhile)):
            for attr, c in n.children():
                walk(c, looped or attr == "stmt", res, stack)
            return
        for _, c in n.children():
            walk(c, looped, res, stack)

    for name in verified.kernels:
        res = LoopChecks()
        walk(lowering.lowered[name].body, False, res, (USER_PREFIX + name,))
        out[name] = LoopChecks(*(sorted(set(sites), key=lambda s: (s[1], s[0]))
                                 for sites in (res.checks, res.guards, res.tiles)))
    return out
