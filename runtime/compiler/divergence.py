"""Which values and branches may differ between the threads of a block (GPU target).

Warp shuffles and reductions wait for every existing lane of the warp, block
barriers (``rt_sync_threads()``) and tile copies for every thread of the block:
a thread that skips one (because a condition that depends on the thread index
sent it elsewhere) leaves the others waiting or reading an undefined lane (CUDA
leaves a divergent ``__syncthreads`` undefined).  The verifier therefore admits these calls only
under *uniform* control flow, decided here.

A value is *varying* when threads of one block may hold different values:
``rt_thread_idx()``, ``rt_lane_idx()``, shuffle and warp-sum results, and
everything computed from them (data flow), plus every variable assigned under
varying control flow (``if (t == 0) x = 1;`` makes ``x`` varying).  Arrays are
tracked as a whole: one varying store (value or subscript) makes the array
varying.  A load through a uniform cap at a uniform index is uniform (a racing
write could break that, which changes values only: every access stays
checked).  Kernel parameters are uniform; a helper's parameter is varying when
some call passes a varying argument, its result when it returns a varying value
or returns under varying control.

Control flow is varying inside a branch or loop whose condition is varying
(also the right operand of ``&&``/``||`` and the arms of ``?:``), inside a loop
that some threads may leave early (``return``, ``break`` or ``continue`` under
varying control, also in a nested loop: the threads that left are missing from
the collectives of every later iteration), after a ``return`` under varying
control, and in a helper called under varying control.  The analysis is
flow-insensitive over variables (iterated to a fixed point) and errs towards
"varying": it may refuse a correct kernel, never admit one whose collectives
can diverge.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field

from pycparser import c_ast

from ..errors import VerifyError
from .astutil import INC_DEC, write_target
from .dialect_api import TILE_FUNCS, WARP_FUNCS

#: Calls whose result differs between the threads of a block by definition.
VARYING_SOURCES = frozenset({"rt_thread_idx", "rt_lane_idx"})
#: Calls every thread (of the warp or block) must reach together.
COLLECTIVES = TILE_FUNCS | WARP_FUNCS | {"rt_sync_threads", "rt_group_sync"}
_LOOPS = (c_ast.For, c_ast.While, c_ast.DoWhile)


@dataclass
class _Facts:
    """What the fixed point knows about one function."""

    params: list[str]
    varying: set[str] = field(default_factory=set)
    divergent: bool = False      # called under varying control somewhere
    ret_varying: bool = False


@dataclass
class _Flow:
    """What one statement may do under varying control."""

    returned: bool = False   # a return taken by some threads only
    broke: bool = False      # a break (of the enclosing loop or switch), by some threads only
    continued: bool = False  # a continue of the enclosing loop, by some threads only

    def __or__(self, other: _Flow) -> _Flow:
        return _Flow(self.returned or other.returned, self.broke or other.broke,
                     self.continued or other.continued)

    @property
    def diverged(self) -> bool:
        return self.returned or self.broke or self.continued


def check_uniform_collectives(funcs: dict[str, c_ast.FuncDef]) -> None:
    """Raise VerifyError for a collective call under varying control flow."""
    funcs = {name: _unique_locals(f) for name, f in funcs.items()}
    facts = {name: _Facts(_param_names(f)) for name, f in funcs.items()}
    changed = True
    while changed:  # terminates: every round only adds facts, and there are finitely many
        a = _Analysis(facts, funcs)
        for name, f in funcs.items():
            a.function(name, f)
        changed = a.changed
    a = _Analysis(facts, funcs, report=True)
    for name, f in funcs.items():
        a.function(name, f)


def _unique_locals(f: c_ast.FuncDef) -> c_ast.FuncDef:
    """A copy of ``f`` in which every local declaration has a name of its own
    (``j#3``: no C identifier has a '#').  The analysis is flow-insensitive over
    names, and sibling blocks may reuse one: a counter ``j`` of a loop under
    ``if (t < 32)`` must not make the ``j`` of another loop varying."""
    f = copy.deepcopy(f)
    fresh = itertools.count()

    def walk(node: c_ast.Node, scopes: list[dict[str, str]]) -> None:
        if isinstance(node, c_ast.Decl) and node.name and not isinstance(node.type,
                                                                         c_ast.FuncDecl):
            if node.init is not None:
                walk(node.init, scopes)
            scopes[-1][node.name] = node.name = f"{node.name}#{next(fresh)}"
            return
        if isinstance(node, c_ast.ID):
            for scope in reversed(scopes):
                if node.name in scope:
                    node.name = scope[node.name]
                    break
            return
        if isinstance(node, c_ast.FuncCall):  # the callee's name is not a variable
            if node.args is not None:
                walk(node.args, scopes)
            return
        opens = isinstance(node, (c_ast.Compound, c_ast.For))
        if opens:
            scopes.append({})
        for _, c in node.children():
            walk(c, scopes)
        if opens:
            scopes.pop()

    walk(f.body, [{}])
    return f


def _param_names(f: c_ast.FuncDef) -> list[str]:
    args = f.decl.type.args
    return [p.name for p in (args.params if args else []) if getattr(p, "name", None)]


class _Analysis:
    def __init__(self, facts: dict[str, _Facts], funcs: dict[str, c_ast.FuncDef],
                 report: bool = False):
        self.facts = facts
        self.funcs = funcs
        self.report = report
        self.changed = False
        self.fn: _Facts | None = None
        self.fn_name = ""

    # -- facts ---------------------------------------------------------------
    def _mark(self, name: str | None) -> None:
        assert self.fn is not None
        if name is not None and name not in self.fn.varying:
            self.fn.varying.add(name)
            self.changed = True

    def _set(self, facts: _Facts, attr: str) -> None:
        if not getattr(facts, attr):
            setattr(facts, attr, True)
            self.changed = True

    def varying(self, e: c_ast.Node | None) -> bool:
        """Whether threads may compute different values for expression ``e``."""
        assert self.fn is not None
        if e is None or isinstance(e, c_ast.Constant):
            return False
        if isinstance(e, c_ast.ID):
            return e.name in self.fn.varying
        if isinstance(e, c_ast.FuncCall) and isinstance(e.name, c_ast.ID):
            name = e.name.name
            if name in VARYING_SOURCES or name in WARP_FUNCS:
                return True
            if name in self.facts and self.facts[name].ret_varying:
                return True
            return any(self.varying(a) for a in (e.args.exprs if e.args else []))
        return any(self.varying(c) for _, c in e.children())

    # -- walk ------------------------------------------------------------------
    def function(self, name: str, f: c_ast.FuncDef) -> None:
        self.fn, self.fn_name = self.facts[name], name
        self.walk(f.body, self.fn.divergent)

    def walk(self, node: c_ast.Node | None, ctl: bool) -> _Flow:
        """Visit ``node`` with ``ctl`` = under varying control; say how it may exit."""
        assert self.fn is not None
        if node is None:
            return _Flow()
        if isinstance(node, (c_ast.Compound, c_ast.Case, c_ast.Default)):
            # in order: after some threads returned, broke or continued, the rest diverge
            flow = _Flow()
            items = node.block_items if isinstance(node, c_ast.Compound) else node.stmts
            for item in items or []:
                flow = flow | self.walk(item, ctl or flow.diverged)
            return flow
        if isinstance(node, c_ast.If):
            self.walk(node.cond, ctl)
            inner = ctl or self.varying(node.cond)
            return self.walk(node.iftrue, inner) | self.walk(node.iffalse, inner)
        if isinstance(node, _LOOPS):
            return self.loop(node, ctl)
        if isinstance(node, c_ast.Switch):
            self.walk(node.cond, ctl)
            flow = self.walk(node.stmt, ctl or self.varying(node.cond))
            flow.broke = False  # its breaks end at the switch; a continue goes on to the loop
            return flow
        if isinstance(node, c_ast.Break):
            return _Flow(broke=ctl)
        if isinstance(node, c_ast.Continue):
            return _Flow(continued=ctl)
        if isinstance(node, c_ast.Return):
            self.walk(node.expr, ctl)
            if ctl or self.varying(node.expr):
                self._set(self.fn, "ret_varying")
            return _Flow(returned=ctl)
        if isinstance(node, c_ast.Decl):
            if node.init is not None:
                self.walk(node.init, ctl)
                if ctl or self.varying(node.init):
                    self._mark(node.name)
            return _Flow()
        if isinstance(node, c_ast.Assignment):
            self.walk(node.rvalue, ctl)
            self.walk(node.lvalue, ctl)
            if ctl or self.varying(node.rvalue) or self.varying(node.lvalue):
                self._mark(_base_name(node.lvalue))
            return _Flow()
        if isinstance(node, c_ast.UnaryOp) and node.op in INC_DEC:
            self.walk(node.expr, ctl)
            if ctl or self.varying(node.expr):
                self._mark(_base_name(node.expr))
            return _Flow()
        if isinstance(node, c_ast.BinaryOp) and node.op in ("&&", "||"):
            self.walk(node.left, ctl)
            self.walk(node.right, ctl or self.varying(node.left))
            return _Flow()
        if isinstance(node, c_ast.TernaryOp):
            self.walk(node.cond, ctl)
            inner = ctl or self.varying(node.cond)
            self.walk(node.iftrue, inner)
            self.walk(node.iffalse, inner)
            return _Flow()
        if isinstance(node, c_ast.FuncCall):
            self.call(node, ctl)
            return _Flow()
        flow = _Flow()
        for _, c in node.children():
            flow = flow | self.walk(c, ctl)
        return flow

    def loop(self, node: c_ast.Node, ctl: bool) -> _Flow:
        if isinstance(node, c_ast.For):
            self.walk(node.init, ctl)
        cond = node.cond
        inner = ctl or self.varying(cond)
        if isinstance(node, c_ast.For):
            # the step runs once per iteration: a varying step makes the counter varying
            inner = inner or self.varying(node.next)
        self.walk(cond, inner)
        flow = self.walk(node.stmt, inner)
        if isinstance(node, c_ast.For):
            self.walk(node.next, inner)
        if flow.diverged and not inner:
            # some threads left early (returned, broke or continued): they are not at
            # the collectives of the rest of this iteration nor of the next ones, so
            # the whole body, its condition and step are divergent from here on
            flow = flow | self.walk(node.stmt, True)
            self.walk(cond, True)
            if isinstance(node, c_ast.For):
                self.walk(node.next, True)
        return _Flow(returned=flow.returned)

    def call(self, node: c_ast.FuncCall, ctl: bool) -> None:
        assert self.fn is not None
        args = node.args.exprs if node.args else []
        for a in args:
            self.walk(a, ctl)
        name = node.name.name if isinstance(node.name, c_ast.ID) else ""
        if name in COLLECTIVES and ctl and self.report:
            line = node.coord.line if node.coord else None
            kind = ("a block barrier waits for every thread of the block"
                    if name in ("rt_sync_threads", "rt_group_sync")
                    else "a tile copy ends in a block barrier" if name in TILE_FUNCS
                    else "a warp shuffle waits for every lane of the warp")
            raise VerifyError(line, f"call to '{name}' under thread-dependent control flow",
                              f"{kind}: threads that a condition depending on rt_thread_idx() "
                              "(or an early return/break taken by some threads) sends "
                              "elsewhere would never arrive; call it unconditionally and select "
                              "its result with ?: instead")
        if name in TILE_FUNCS and name.startswith("cap_tile_load_") and len(args) > 5 and (
                ctl or any(self.varying(a) for a in args)):
            self._mark(_base_name(args[5]))  # the array now holds thread-dependent data
        callee = self.facts.get(name)
        if callee is not None:
            if ctl:
                self._set(callee, "divergent")
            for pname, a in zip(callee.params, args, strict=False):
                if pname not in callee.varying and self.varying(a):
                    callee.varying.add(pname)
                    self.changed = True


def _base_name(lv: c_ast.Node) -> str:
    """The variable a write to ``lv`` changes (an element write changes its array:
    arrays are tracked as a whole), by the verifier's one rule for write targets;
    the tile-load operand, a plain array name, takes the same path."""
    return write_target(lv)[0]
