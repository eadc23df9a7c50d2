"""What loop versioning leaves in the AST for the lowerings (node types, not names),
and its side table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pycparser import c_ast

# ---------------------------------------------------------------------------
# What the pass leaves in the AST for the lowerings: node types, not names.
# The marks are subclasses with the same slots, so they survive the deep
# copies of enclosing versioned loops; each lowering dispatches on the type.


class UncheckedCall(c_ast.FuncCall):
    """cap_load_T/cap_store_T whose index a loop guard proved in range."""

    __slots__ = ()


class UncheckedRef(c_ast.ArrayRef):
    """One subscript level of a local array that a loop guard proved in range."""

    __slots__ = ()


class QuietFor(c_ast.For):
    """A loop without a per-iteration pollcheck (it polls once after itself)."""

    __slots__ = ()


class QuietWhile(c_ast.While):
    __slots__ = ()


class QuietDoWhile(c_ast.DoWhile):
    __slots__ = ()


QUIET_LOOPS = (QuietFor, QuietWhile, QuietDoWhile)
_QUIET = {c_ast.For: QuietFor, c_ast.While: QuietWhile, c_ast.DoWhile: QuietDoWhile}


class Versioned(c_ast.If):
    """``if (guard) fast copy else checked copy``: iffalse is the checked code that
    runs (and faults at the exact access) when the guard fails."""

    __slots__ = ()


class PollPoint(c_ast.Node):
    """One pollcheck, after a quiet loop."""

    __slots__ = ("coord", "__weakref__")
    attr_names = ()

    def __init__(self, coord: Any = None):
        self.coord = coord

    def children(self) -> tuple:
        return ()


@dataclass
class LoopPlan:
    """One versioned loop: its guard terms, the accesses they cover, and polling."""

    line: int
    guards: list[c_ast.Node]
    covered: list[c_ast.Node]
    quiet: bool  # its fast copy has a copy without per-iteration pollchecks


@dataclass
class Versioning:
    """The side table of one function's loop versioning."""

    loops: list[LoopPlan] = field(default_factory=list)
    #: cover guards computed by functions of their own (GPU, see versioning._outline):
    #: the lowering emits them, not inlined, before the function that calls them
    guards: list[c_ast.FuncDef] = field(default_factory=list)


def mark_nopoll(loop: c_ast.Node) -> None:
    cls = _QUIET.get(type(loop))
    if cls is not None:
        loop.__class__ = cls
