"""Line hulls: the first indices of an unrolled loop's accesses, two per line.

A loop unrolled by hand (or by a generator) reads ``M[(r + i*nw)*n + k]``,
``M[(r + i*nw + nw)*n + k]``, ... ``M[(r + i*nw + 3*nw)*n + k]``: one group of
loop versioning (same cap, stride, size and access), whose hull guard took the
minimum and maximum of all its first indices.  Those firsts are not unrelated:
as polynomials over the loop-invariant values they are built from, each is
f_0 + l_k * q for one polynomial q (here n*nw) and small integers l_k.  Such a
set is a *line*, and only its two extremes matter:

  Let A and B be the members with the smallest and largest l (D = lmax - lmin).
  In wrapping int64 arithmetic f_k = A + (l_k - lmin) * q (mod 2^64): every
  operation involved is a 64-bit +, - or * (ring operations mod 2^64); any other
  subexpression is an opaque value, the same in every first.  If A and B pass
  the hull guard they satisfy |A|, |B| < 2^IDX_LIMIT_LOG2 (RT_INB); if also
  |q| < 2^IDX_LIMIT_LOG2 (rt_line_ok) and D <= LINE_MAX_SPAN (16, so
  |A + l*q| < 2^58 + 2^62 < 2^63 for l in [0, D]), then every A + l*q is
  exact, so f_k equals it (two int64 values congruent mod 2^64 are equal), B
  equals A + D*q, and each f_k lies between A and B.

So the hull over a group is the hull over its lines' extremes, plus one
rt_line_ok(q) per distinct step of a line of three or more values (a line of
two keeps both): 8 firsts in two lines cost four first indices and six min/max
instead of eight and fourteen.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from math import gcd

from pycparser import c_ast, c_generator

from ...capabilities.abi import LINE_MAX_SPAN
from .astutil import cast_i64, int_literal, is_int64

Monomial = tuple[str, ...]          # sorted atom keys (a product)
Poly = dict[Monomial, int]          # monomial -> integer coefficient, no zero entries


@dataclass
class _Normal:
    """Polynomial normal forms of index expressions over opaque atoms."""

    types: dict[str, int]

    def __post_init__(self) -> None:
        self.atoms: dict[str, c_ast.Node] = {}
        self._gen = c_generator.CGenerator()

    def text(self, expr: c_ast.Node) -> str:
        """expr as C source: the key of an atom (and of a step, to merge equal ones)."""
        return self._gen.visit(expr)

    def atom(self, expr: c_ast.Node) -> Poly:
        key = self.text(expr)
        self.atoms.setdefault(key, expr)
        return {(key,): 1}

    def poly(self, expr: c_ast.Node) -> Poly:
        """expr's value mod 2^64 as a polynomial (only 64-bit ring operations are
        expanded; everything else is one atom)."""
        v = int_literal(expr)
        if v is not None:
            return {(): v} if v else {}
        if isinstance(expr, c_ast.BinaryOp) and expr.op in ("+", "-", "*") \
                and is_int64(expr, self.types):
            left, right = self.operand(expr.left), self.operand(expr.right)
            if expr.op == "*":
                return _mul(left, right)
            return _add(left, right, 1 if expr.op == "+" else -1)
        if isinstance(expr, c_ast.UnaryOp) and expr.op in ("-", "+") \
                and is_int64(expr.expr, self.types):
            inner = self.poly(expr.expr)
            return inner if expr.op == "+" else {m: -c for m, c in inner.items()}
        if isinstance(expr, c_ast.Cast) and is_int64(expr, self.types) \
                and is_int64(expr.expr, self.types):
            return self.poly(expr.expr)
        return self.atom(expr)

    def operand(self, expr: c_ast.Node) -> Poly:
        """An operand of a 64-bit operation: converted to int64 first, so a
        narrower subexpression is one value (an atom) and not expanded."""
        if int_literal(expr) is not None or is_int64(expr, self.types):
            return self.poly(expr)
        return self.atom(expr)

    def expr(self, p: Poly) -> c_ast.Node:
        """C for p in int64 arithmetic (p non-empty)."""
        out: c_ast.Node | None = None
        for mono, coef in sorted(p.items()):
            factors = [copy.deepcopy(self.atoms[key]) for key in mono]
            if abs(coef) != 1 or not factors:
                factors.insert(0, c_ast.Constant("int", str(abs(coef))))
            term: c_ast.Node = cast_i64(factors[0])
            for factor in factors[1:]:
                term = c_ast.BinaryOp("*", term, factor)
            if out is None:
                out = term if coef > 0 else c_ast.UnaryOp("-", term)
            else:
                out = c_ast.BinaryOp("+" if coef > 0 else "-", out, term)
        assert out is not None
        return out


def _add(a: Poly, b: Poly, sign: int) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + sign * c
    return {m: c for m, c in out.items() if c}


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return {m: c for m, c in out.items() if c}


def _primitive(p: Poly) -> tuple[Poly, int]:
    """p = scale * q with q's coefficients coprime and its first one positive."""
    g = 0
    for c in p.values():
        g = gcd(g, c)
    if p[min(p)] < 0:
        g = -g
    return {m: c // g for m, c in p.items()}, g


def _multiple(p: Poly, q: Poly) -> int | None:
    """The integer mult with p == mult*q, if there is one (p may be empty: mult = 0)."""
    if not p:
        return 0
    if set(p) != set(q):
        return None
    first = min(q)
    mult, rem = divmod(p[first], q[first])
    if rem or any(p[m] != mult * c for m, c in q.items()):
        return None
    return mult


@dataclass
class _Line:
    base: Poly
    members: list[tuple[int, int]]     # (index into firsts, mult)
    step: Poly | None = None


def line_hull(firsts: list[c_ast.Node], types: dict[str, int]
              ) -> tuple[list[c_ast.Node], list[c_ast.Node]]:
    """The first indices a hull must take (each line's two extremes, in input
    order) and the rt_line_ok conditions that make them enough."""
    norm = _Normal(types)
    lines: list[_Line] = []
    for k, e in enumerate(firsts):
        p = norm.poly(e)
        for line in lines:
            diff = _add(p, line.base, -1)
            if line.step is None:
                if diff:
                    line.step, mult = _primitive(diff)
                else:
                    mult = 0
            else:
                mult = _multiple(diff, line.step)
            if mult is not None:
                line.members.append((k, mult))
                break
        else:
            lines.append(_Line(p, [(k, 0)]))
    keep: set[int] = set()
    steps: dict[str, c_ast.Node] = {}
    for line in lines:
        distinct = {mult: k for k, mult in reversed(line.members)}  # mult -> its first member
        if line.step is None or len(distinct) < 3 or max(distinct) - min(distinct) > LINE_MAX_SPAN:
            keep.update(distinct.values())  # nothing to drop (or too long a line)
            continue
        keep.update((distinct[min(distinct)], distinct[max(distinct)]))
        step = norm.expr(line.step)
        steps.setdefault(norm.text(step), step)
    conds = [c_ast.FuncCall(c_ast.ID("rt_line_ok"), c_ast.ExprList([q])) for q in steps.values()]
    return [firsts[k] for k in sorted(keep)], conds

