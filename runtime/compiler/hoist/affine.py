"""Affine algebra of versioning guards: affine indices, their coefficients and corners,
and the range checks (rt_range_ok and kin) over a loop's span or a nest's box."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from pycparser import c_ast, c_generator

from ..astutil import cast_i64, int_literal, is_int64
from ..lines import line_hull
from .loops import ids_in, subst


def affine(expr: c_ast.Node, var: str) -> bool:
    """True if expr is a*var + b with a, b free of var (no /, %, calls on var)."""
    return affine_in(expr, {var})


def affine_in(expr: c_ast.Node, vs: set[str]) -> bool:
    """True if expr is affine in the variables vs jointly: c + sum a_k*v_k with
    coefficients free of vs (so no v*w product of two of them)."""
    if not (vs & ids_in(expr)):
        return True
    if isinstance(expr, c_ast.ID):
        return True
    if isinstance(expr, c_ast.BinaryOp):
        if expr.op in ("+", "-"):
            return affine_in(expr.left, vs) and affine_in(expr.right, vs)
        if expr.op == "*":
            lv, rv = bool(vs & ids_in(expr.left)), bool(vs & ids_in(expr.right))
            if lv and rv:
                return False
            return affine_in(expr.left if lv else expr.right, vs)
        return False
    if isinstance(expr, c_ast.UnaryOp) and expr.op in ("-", "+"):
        return affine_in(expr.expr, vs)
    if isinstance(expr, c_ast.Cast):
        tn = getattr(getattr(expr.to_type, "type", None), "type", None)
        names = getattr(tn, "names", [])
        return names in (["int64_t"], ["long"]) and affine_in(expr.expr, vs)
    return False


def step_node(step: int | c_ast.Node) -> c_ast.Node:
    return const(step) if isinstance(step, int) else copy.deepcopy(step)


def const(v: int) -> c_ast.Constant:
    return c_ast.Constant("int", str(v))


def decl64(name: str, init: c_ast.Node) -> c_ast.Decl:
    t = c_ast.TypeDecl(name, [], None, c_ast.IdentifierType(["int64_t"]))
    return c_ast.Decl(name, [], [], [], [], t, init, None)


@dataclass
class Term:
    """One range fact a guard checks: index expression, cap (None: a local array
    subscript), element size (or the array dimension), store or load."""

    idx: c_ast.Node
    cap: str | None
    size: int
    store: int


@dataclass
class Span:
    """The guard variables of one counted loop and how they are computed."""

    h0: str     # first value of the counter
    hb: str     # the bound
    hs: str     # last - first (set by rt_loop_span; 0 when the loop does not run)
    hok: str    # whether hs is exact and the counter cannot wrap
    bits: int
    a_expr: c_ast.Node
    b_expr: c_ast.Node
    cmp: str
    step: int | c_ast.Node

    def runs(self) -> c_ast.BinaryOp:
        return c_ast.BinaryOp(self.cmp, c_ast.ID(self.h0), c_ast.ID(self.hb))

    def is_int(self) -> c_ast.Node:
        """Bounds (and a run-time step) are signed integers; a step in (0, 2^20]."""
        out: c_ast.Node = c_ast.BinaryOp("&&", rt_is_int(self.a_expr), rt_is_int(self.b_expr))
        if not isinstance(self.step, int):
            # tested before rt_loop_span divides by it
            out = c_ast.BinaryOp("&&", out, c_ast.BinaryOp(
                "&&", rt_is_int(self.step), c_ast.BinaryOp(
                    "&&", c_ast.BinaryOp(">", step_node(self.step), const(0)),
                    c_ast.BinaryOp("<=", step_node(self.step), const(1 << 20)))))
        return out

    def decls(self, is_int: c_ast.Node) -> list[c_ast.Node]:
        span_fn = "rt_loop_span" if self.bits == 64 else "rt_loop_span32"
        span_ok = c_ast.FuncCall(c_ast.ID(span_fn), c_ast.ExprList([
            c_ast.ID(self.h0), c_ast.ID(self.hb), step_node(self.step),
            const(1 if self.cmp == "<=" else 0), c_ast.UnaryOp("&", c_ast.ID(self.hs))]))
        ok_init = c_ast.BinaryOp("&&", is_int,
                                 c_ast.BinaryOp("||", c_ast.UnaryOp("!", self.runs()), span_ok))
        return [decl64(self.h0, copy.deepcopy(self.a_expr)),
                decl64(self.hb, copy.deepcopy(self.b_expr)),
                decl64(self.hs, const(0)),
                decl64(self.hok, ok_init)]


def coef(expr: c_ast.Node, var: str) -> c_ast.Node:
    """The coefficient of var in an expression :func:`affine` accepts, in int64
    arithmetic: equal mod 2^64 to the guard's E(first + 1) - E(first), where the
    counter is an int64 (every subexpression holding it is int64; one without it
    keeps its own type, as in E), without evaluating E twice."""
    if var not in ids_in(expr):
        return const(0)
    if isinstance(expr, c_ast.ID):
        return cast_i64(const(1))
    if isinstance(expr, c_ast.BinaryOp) and expr.op in ("+", "-"):
        left, right = coef(expr.left, var), coef(expr.right, var)
        if _is_zero(right):
            return left
        if _is_zero(left):
            return right if expr.op == "+" else c_ast.UnaryOp("-", right)
        return c_ast.BinaryOp(expr.op, left, right)
    if isinstance(expr, c_ast.BinaryOp) and expr.op == "*":
        on_left = var in ids_in(expr.left)
        inner = coef(expr.left if on_left else expr.right, var)
        other = copy.deepcopy(expr.right if on_left else expr.left)
        if _is_zero(inner):
            return inner
        if _is_unit(inner):  # (int64_t)1 * x: x promoted
            return cast_i64(other)
        return c_ast.BinaryOp("*", inner, other) if on_left else c_ast.BinaryOp("*", other, inner)
    if isinstance(expr, c_ast.UnaryOp):
        inner = coef(expr.expr, var)
        return c_ast.UnaryOp("-", inner) if expr.op == "-" and not _is_zero(inner) else inner
    if isinstance(expr, c_ast.Cast):  # to int64_t (affine_in): the inner part is int64 already
        return coef(expr.expr, var)
    raise ValueError(f"not affine in {var}: {type(expr).__name__}")


def _is_zero(node: c_ast.Node) -> bool:
    return int_literal(node) == 0


def _is_unit(node: c_ast.Node) -> bool:
    return isinstance(node, c_ast.Cast) and int_literal(node.expr) == 1


def corner(idx: c_ast.Node, var: str, span: Span, ivar: str | None = None,
            ispan: Span | None = None) -> c_ast.Node:
    """The index at the first iteration (of the nest, with an inner counter)."""
    e0 = subst(idx, var, c_ast.ID(span.h0))
    return e0 if ivar is None or ispan is None else subst(e0, ivar, c_ast.ID(ispan.h0))


def _hull(firsts: list[c_ast.Node]) -> tuple[c_ast.Node, c_ast.Node]:
    """rt_min64 / rt_max64 chains over the first indices of a group."""
    lo, hi = firsts[0], copy.deepcopy(firsts[0])
    for e in firsts[1:]:
        lo = c_ast.FuncCall(c_ast.ID("rt_min64"), c_ast.ExprList([lo, e]))
        hi = c_ast.FuncCall(c_ast.ID("rt_max64"), c_ast.ExprList([hi, copy.deepcopy(e)]))
    return lo, hi


def _groups(terms: list[Term], strides: list[tuple[c_ast.Node, ...]]
            ) -> list[tuple[Term, tuple[c_ast.Node, ...], list[int]]]:
    """Terms that differ only in their first index: same cap (or local array),
    element size, access and strides.  Their index sets are translates of one
    another, so the hull [min first, max first] + stride * [0, span] holds them
    all, and it is in range exactly when each is (the in-range indices of an
    object form an interval): one check per group, with the same answer."""
    gen = c_generator.CGenerator()
    out: dict[str, tuple[Term, tuple[c_ast.Node, ...], list[int]]] = {}
    seen: set[str] = set()
    for k, (term, d) in enumerate(zip(terms, strides, strict=True)):
        key = f"{term.cap}|{term.size}|{term.store}|" + "|".join(gen.visit(x) for x in d)
        index = gen.visit(term.idx)
        if key + "|" + index in seen:
            continue  # the same index again (a local array read and written back)
        seen.add(key + "|" + index)
        out.setdefault(key, (term, d, []))[2].append(k)
    return list(out.values())


def range_terms(terms: list[Term], var: str, span: Span, types: dict[str, int]
                 ) -> list[c_ast.Node]:
    """One range check per group of terms (:func:`_groups`) over [first, first + span]:
    rt_range_ok / rt_lrange_ok for a single term, the *_hull_ok forms for more."""
    strides = [(coef(t.idx, var),) for t in terms]
    return [_group_check("range", term, [corner(terms[k].idx, var, span) for k in members],
                         [copy.deepcopy(d), c_ast.ID(span.hs)], types)
            for term, (d,), members in _groups(terms, strides)]


def box_terms(terms: list[Term], var: str, span: Span, ivar: str, ispan: Span,
               types: dict[str, int]) -> list[c_ast.Node]:
    """rt_range2_ok/rt_lrange2_ok (rt_*range2_hull_ok for a group) over the nest's
    iteration box: the index at the first corner and its strides along each
    counter (exact for an index affine in both: E(i, j) = E00 + di*(i - i0) +
    dj*(j - j0) mod 2^64)."""
    strides = [(coef(t.idx, var), coef(t.idx, ivar)) for t in terms]
    return [_group_check("range2", term,
                         [corner(terms[k].idx, var, span, ivar, ispan) for k in members],
                         [copy.deepcopy(di), c_ast.ID(span.hs), copy.deepcopy(dj),
                          c_ast.ID(ispan.hs)], types)
            for term, (di, dj), members in _groups(terms, strides)]


def _group_check(kind: str, term: Term, firsts: list[c_ast.Node], strides: list[c_ast.Node],
                 types: dict[str, int]) -> c_ast.Node:
    """rt_<kind>_ok (one first index) or rt_<kind>_hull_ok (min and max of several), with
    an l prefix for a local array: (cap,) first(s), strides and spans, size (, store).
    Firsts on a line (runtime/compiler/lines.py) enter the hull by their two extremes."""
    firsts, conds = line_hull(firsts, types) if len(firsts) > 1 else (firsts, [])
    name, lead = (f"{kind}_ok", firsts) if len(firsts) == 1 else \
        (f"{kind}_hull_ok", list(_hull(firsts)))
    args = lead + strides + [const(term.size)]
    if term.cap is None:
        out: c_ast.Node = c_ast.FuncCall(c_ast.ID("rt_l" + name), c_ast.ExprList(args))
    else:
        out = c_ast.FuncCall(c_ast.ID("rt_" + name), c_ast.ExprList(
            [c_ast.ID(term.cap)] + args + [const(term.store)]))
    for cond in conds:
        out = c_ast.BinaryOp("&", cond, out)
    return out


def irange_term(part: c_ast.Node, var: str, span: Span) -> c_ast.FuncCall:
    """rt_irange_ok for an int part of an index over [first, first + span]."""
    return c_ast.FuncCall(c_ast.ID("rt_irange_ok"), c_ast.ExprList(
        [corner(part, var, span), coef(part, var), c_ast.ID(span.hs)]))


def ibox_term(part: c_ast.Node, var: str, span: Span, ivar: str, ispan: Span
               ) -> c_ast.FuncCall:
    """rt_irange2_ok for an int part of an index over a nest's iteration box."""
    return c_ast.FuncCall(c_ast.ID("rt_irange2_ok"), c_ast.ExprList(
        [corner(part, var, span, ivar, ispan), coef(part, var), c_ast.ID(span.hs),
         coef(part, ivar), c_ast.ID(ispan.hs)]))


def narrow_parts(expr: c_ast.Node, narrow: set[str], types: dict[str, int]
                  ) -> list[c_ast.Node] | None:
    """The parts of an affine index that the loop computes in 32-bit int
    arithmetic from an int counter in ``narrow`` (maximal subexpressions, not
    the bare counter).  The guard substitutes 64-bit values for the counters,
    so it computes these parts in 64 bits: the two agree only while a part
    stays in int range, which rt_irange_ok checks.  None if such a part has an
    operand that is not a signed int (unsigned or of unknown type), whose
    wrapped value the int range does not pin down."""
    types = {**types, **{v: 32 for v in narrow}}
    parts: list[c_ast.Node] = []

    def walk(e: c_ast.Node) -> bool:
        if isinstance(e, c_ast.ID) or not (narrow & ids_in(e)):
            return True
        if not is_int64(e, types):
            parts.append(e)
            return _signed_int(e, types)
        return all(walk(child) for _name, child in e.children())

    return parts if walk(expr) else None


def _signed_int(expr: c_ast.Node, types: dict[str, int]) -> bool:
    """Every leaf of expr is a signed int or int64 variable or a plain int literal."""
    if isinstance(expr, c_ast.ID):
        return types.get(expr.name, 0) in (32, 64)
    if isinstance(expr, c_ast.Constant):
        v = int_literal(expr)
        return (expr.type == "int" and v is not None and 0 <= v < (1 << 31)
                and not set(expr.value.lower()) & {"u", "l"})
    if isinstance(expr, (c_ast.BinaryOp, c_ast.UnaryOp)):
        return all(_signed_int(child, types) for _name, child in expr.children())
    return False


def rt_is_int(expr: c_ast.Node) -> c_ast.FuncCall:
    return c_ast.FuncCall(c_ast.ID("RT_IS_INT"), c_ast.ExprList([copy.deepcopy(expr)]))
