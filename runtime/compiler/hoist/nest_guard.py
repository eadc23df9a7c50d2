"""Nest guards: one interval check before a whole loop nest.

Per-loop versioning (versioning.py) needs indices affine in the counters and inner bounds
invariant in the loop around them (a box).  Deeper nests, triangular inner
bounds (q < p), bounds computed in the body (pe = t < jb ? t : jb) and
accesses under a condition (if (t < jb) w[t][l] ...) are covered by interval
arithmetic instead: walking the nest in source order, every integer the
indices depend on gets an interval [lo, hi] computed once before the nest:

  invariant names      [x, x]   (not assigned anywhere in the nest)
  for counters         [lo(A), hi(B) - 1] (or hi(B) for <=; downward loops
                       mirrored); the counter is not assigned in its body
                       and the guard checks that the last step cannot wrap
  T x = E;             [lo(E), hi(E)] when x is not assigned again in its scope
  +, -, *, / by a positive literal, casts, min/max ternaries (t < jb ? t : jb)
  if (v < E) / c ? :   v narrowed to [lo(v), min(hi(v), hi(E) - 1)] inside;
                       v + e < E (v - e, e + v) narrows v to E - e, when the
                       interval of v + e says the sum cannot wrap

Every bound is computed with overflow-checked arithmetic (a bound that
overflows fails the guard), and a subexpression of int (32-bit) type must stay
in int range, so the value the nest computes (wrapping arithmetic) is the
mathematical one and lies in its interval.  An access whose index interval is
inside the buffer (rt_range_ok at both ends: every index between two
in-bounds ones is in bounds) or the local array is covered.  All or nothing:
if any scalar access of the nest cannot be bounded, the nest is not guarded
here and the loops inside it are considered in turn.  An interval that comes
out empty belongs to code that never runs (every interval encloses its value
whenever the code runs): a counter's, or a name narrowed by a condition that
fails for this thread.  The code after it carries that as a guard variable
(0 where it cannot run), and its accesses leave the hulls alone there, so a
thread whose rows end above the matrix is not held to bounds of rows it never
touches; a hull that stays empty holds.  The fast copy is the
nest with every access unchecked; the checked copy is the nest as the
per-loop versioning leaves it, so a failing guard still ends in the exact fault.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from pycparser import c_ast, c_generator

from ..astutil import INDEX_BUILTINS, INT_TYPES, int_literal, is_int64, pure_expr, write_counts
from .affine import const, decl64
from .loops import (
    ACCESS_PREFIX,
    ELEM,
    ELEM_SIZE,
    array_chain,
    assigned,
    down_shape,
    ids_in,
    loop_shape,
)
from .marks import UncheckedRef

if TYPE_CHECKING:
    from .versioning import Ctx

_I64_MAX = (1 << 63) - 1
_I64_MIN = -(1 << 63)
_I32_MAX = (1 << 31) - 1
_I32_MIN = -(1 << 31)
_Bound = int | str          # a Python constant or the name of a guard variable
_Ival = tuple[_Bound, _Bound]
#: The environments' entry (no C name) for where their code can run: (r, r), r 1, 0 or
#: a guard variable that is 0 where an interval on the way there came out empty.
_REACH = "#reach"


class NoBound(Exception):
    """The nest has a scalar access or a counter no interval covers."""


class NestGuard:
    """Builds the guard of one nest: guard variables, conditions, covered accesses."""

    def __init__(self, loop: c_ast.Node, ctx: Ctx, k: int):
        self.ctx = ctx
        self.prefix = f"__n{k}_"
        self.count = 0
        self.decls: list[c_ast.Node] = []   # int64_t guard variables, in order
        self.written = assigned(loop)      # names the nest declares or assigns
        # one hull per buffer (cap, element size, store) or local-array extent: the
        # indices between two in-bounds ones are in bounds, so checking the
        # smallest and the largest of a group is the same as checking each
        self.hulls: dict[tuple, tuple[_Bound, _Bound]] = {}
        self.memo: dict[tuple, _Bound] = {}
        # caps the nest derives once (cap_t M = cap_offset_T(A, e), e one value at
        # the guard): the guard checks their accesses through the same expression
        self.cap_exprs: dict[str, c_ast.Node] = {}
        self.writes = write_counts(loop)
        # id(for loop) -> (its counter's interval, its smallest step): what
        # short_loops needs to bound a loop's trip count before the nest
        self.counters: dict[int, tuple[_Ival, _Bound]] = {}

    @property
    def terms(self) -> list[c_ast.Node]:
        return [self._term(key, iv) for key, iv in self.hulls.items()]

    def _term(self, key: tuple, iv: _Ival) -> c_ast.Node:
        """One hull's range check; an empty hull (lo > hi) holds.  Every interval
        encloses its index's value whenever the access runs, so a hull that comes
        out empty (each of its intervals then does) belongs to accesses that never
        run: a condition that fails for this thread (if (t < j) with t >= nb)."""
        lo, hi = iv
        d = c_ast.BinaryOp("-", self._node(hi), self._node(lo))
        if key[0] == "cap":
            _kind, cap, size, store = key
            cap_node = copy.deepcopy(self.cap_exprs.get(cap, c_ast.ID(cap)))
            check = c_ast.FuncCall(c_ast.ID("rt_range_ok"), c_ast.ExprList([
                cap_node, self._node(lo), d, const(1), const(size), const(store)]))
        else:
            check = c_ast.FuncCall(c_ast.ID("rt_lrange_ok"), c_ast.ExprList([
                self._node(lo), d, const(1), const(key[1])]))
        if isinstance(lo, int) and isinstance(hi, int):
            return const(1) if lo > hi else check
        return c_ast.BinaryOp("||", c_ast.BinaryOp(">", self._node(lo), self._node(hi)), check)

    def _cover(self, key: tuple, iv: _Ival, env: dict[str, _Ival | None]) -> None:
        r = self._reach(env)
        if r == 0:
            return  # the access never runs
        if r != 1:  # where it cannot run it leaves the hull alone (an empty interval)
            iv = (self._new(c_ast.TernaryOp(c_ast.ID(r), self._node(iv[0]), self._node(_I64_MAX))),
                  self._new(c_ast.TernaryOp(c_ast.ID(r), self._node(iv[1]), self._node(_I64_MIN))))
        if key in self.hulls:
            lo, hi = self.hulls[key]
            iv = (self._pick("<", lo, iv[0]), self._pick(">", hi, iv[1]))
        self.hulls[key] = iv

    # -- where the code can run -------------------------------------------
    @staticmethod
    def _reach(env: dict[str, _Ival | None]) -> _Bound:
        """1, 0, or the guard variable that is 0 where env's code cannot run."""
        iv = env.get(_REACH)
        return 1 if iv is None else iv[0]

    def _narrowed(self, env: dict[str, _Ival | None], lo: _Bound, hi: _Bound) -> None:
        """env's code runs only where [lo, hi] (an interval of it) is not empty."""
        r = self._reach(env)
        if r == 0:
            return
        if isinstance(lo, int) and isinstance(hi, int):
            if lo > hi:
                env[_REACH] = (0, 0)
            return
        key = ("reach", r, lo, hi)
        if key not in self.memo:
            cond: c_ast.Node = c_ast.BinaryOp("<=", self._node(lo), self._node(hi))
            if r != 1:
                cond = c_ast.BinaryOp("&&", c_ast.ID(r), cond)
            self.memo[key] = self._new(cond)
        env[_REACH] = (self.memo[key], self.memo[key])

    # -- guard variables and checked arithmetic --------------------------
    def _new(self, init: c_ast.Node | None = None) -> str:
        self.count += 1
        name = f"{self.prefix}{self.count}"
        self.decls.append(decl64(name, init if init is not None else const(0)))
        return name

    @staticmethod
    def _node(b: _Bound) -> c_ast.Node:
        if isinstance(b, int):
            if b == _I64_MIN:  # -2^63 has no literal of its own
                return c_ast.BinaryOp("-", c_ast.UnaryOp("-", const(_I64_MAX)), const(1))
            return const(b) if b >= 0 else c_ast.UnaryOp("-", const(-b))
        return c_ast.ID(b)

    def _ovf(self, fn: str, a: _Bound, b: _Bound) -> _Bound:
        """a op b, the guard failing if it overflows (constants fold here)."""
        if isinstance(a, int) and isinstance(b, int):
            v = {"rt_add_ovf": a + b, "rt_sub_ovf": a - b, "rt_mul_ovf": a * b}[fn]
            if not _I64_MIN <= v <= _I64_MAX:
                raise NoBound
            return v
        if b == 0 and fn != "rt_mul_ovf" or b == 1 and fn == "rt_mul_ovf":
            return a
        if a == 0 and fn == "rt_add_ovf" or a == 1 and fn == "rt_mul_ovf":
            return b
        if (fn, a, b) in self.memo:
            return self.memo[(fn, a, b)]
        r = self._new()
        self.memo[(fn, a, b)] = r
        call = c_ast.FuncCall(c_ast.ID(fn), c_ast.ExprList(
            [self._node(a), self._node(b), c_ast.UnaryOp("&", c_ast.ID(r))]))
        self.decls.append(c_ast.Assignment("&=", c_ast.ID(self.ok), c_ast.UnaryOp("!", call)))
        return r

    def _pick(self, op: str, a: _Bound, b: _Bound) -> _Bound:
        """min (op '<') or max (op '>') of two bounds."""
        if isinstance(a, int) and isinstance(b, int):
            return min(a, b) if op == "<" else max(a, b)
        if a == b:
            return a
        if (op, a, b) in self.memo:
            return self.memo[(op, a, b)]
        self.memo[(op, a, b)] = self._new(c_ast.TernaryOp(
            c_ast.BinaryOp(op, self._node(a), self._node(b)), self._node(a), self._node(b)))
        return self.memo[(op, a, b)]

    def _require(self, cond: c_ast.Node) -> None:
        """The guard holds only if cond does: folded into ok where it arises, so the
        values it reads need no register until the end (the guard variables are
        safe to compute whatever an earlier condition said: _div, _mod)."""
        key = ("require", c_generator.CGenerator().visit(cond))
        if key not in self.memo:
            self.memo[key] = 0
            self.decls.append(c_ast.Assignment("&=", c_ast.ID(self.ok), cond))

    def _in_int(self, iv: _Ival) -> None:
        lo, hi = iv
        if isinstance(lo, int) and isinstance(hi, int):
            if not (_I32_MIN <= lo and hi <= _I32_MAX):
                raise NoBound
            return
        self._require(c_ast.BinaryOp(
            "&&", c_ast.BinaryOp(">=", self._node(lo), self._node(_I32_MIN)),
            c_ast.BinaryOp("<=", self._node(hi), self._node(_I32_MAX))))

    # -- intervals of expressions -----------------------------------------
    def ival(self, e: c_ast.Node, env: dict[str, _Ival | None]) -> _Ival:
        iv = self._ival(e, env)
        if not is_int64(e, self.ctx.types) and not isinstance(e, (c_ast.ID, c_ast.Constant)):
            self._in_int(iv)  # an int subexpression must not wrap mod 2^32
        return iv

    def _ival(self, e: c_ast.Node, env: dict[str, _Ival | None]) -> _Ival:
        if isinstance(e, c_ast.Constant):
            v = int_literal(e)
            if v is None or not _I64_MIN <= v <= _I64_MAX:
                raise NoBound
            return v, v
        if isinstance(e, c_ast.ID):
            if e.name in env:
                iv = env[e.name]
                if iv is None:
                    raise NoBound
                return iv
            if e.name in self.written or self.ctx.types.get(e.name, 0) not in (32, 64):
                raise NoBound
            return e.name, e.name
        if (isinstance(e, c_ast.FuncCall) and isinstance(e.name, c_ast.ID)
                and e.name.name in INDEX_BUILTINS and not (e.args and e.args.exprs)):
            key = ("call", e.name.name)  # fixed for the launch: one guard variable
            if key not in self.memo:
                self.memo[key] = self._new(copy.deepcopy(e))
            v = self.memo[key]
            return v, v
        if isinstance(e, c_ast.Cast):
            names = getattr(getattr(e.to_type, "type", None), "type", None)
            names = getattr(names, "names", [])
            if names in (["int64_t"], ["long"]):
                return self.ival(e.expr, env)
            if names in (["int"], ["int32_t"]):
                iv = self.ival(e.expr, env)
                self._in_int(iv)
                return iv
            raise NoBound
        if isinstance(e, c_ast.UnaryOp) and e.op == "-":
            lo, hi = self.ival(e.expr, env)
            return self._ovf("rt_sub_ovf", 0, hi), self._ovf("rt_sub_ovf", 0, lo)
        if isinstance(e, c_ast.UnaryOp) and e.op == "+":
            return self.ival(e.expr, env)
        if isinstance(e, c_ast.BinaryOp) and e.op in ("+", "-"):
            a, b = self.ival(e.left, env), self.ival(e.right, env)
            if e.op == "+":
                return self._ovf("rt_add_ovf", a[0], b[0]), self._ovf("rt_add_ovf", a[1], b[1])
            return self._ovf("rt_sub_ovf", a[0], b[1]), self._ovf("rt_sub_ovf", a[1], b[0])
        if isinstance(e, c_ast.BinaryOp) and e.op == "*":
            a, b = self.ival(e.left, env), self.ival(e.right, env)
            if isinstance(b[0], int) and b[0] == b[1]:
                a, b = b, a  # constant first
            if isinstance(a[0], int) and a[0] == a[1]:
                c = a[0]
                p, q = self._ovf("rt_mul_ovf", c, b[0]), self._ovf("rt_mul_ovf", c, b[1])
                return (p, q) if c >= 0 else (q, p)
            if a[0] == a[1] or b[0] == b[1]:  # one factor is a single (symbolic) value
                if b[0] != b[1]:
                    a, b = b, a
                p, q = self._ovf("rt_mul_ovf", a[0], b[0]), self._ovf("rt_mul_ovf", a[1], b[0])
                return self._pick("<", p, q), self._pick(">", p, q)
            ps = [self._ovf("rt_mul_ovf", x, y) for x in a for y in b]
            return (self._pick("<", self._pick("<", ps[0], ps[1]), self._pick("<", ps[2], ps[3])),
                    self._pick(">", self._pick(">", ps[0], ps[1]), self._pick(">", ps[2], ps[3])))
        if isinstance(e, c_ast.BinaryOp) and e.op in ("/", "%"):
            c0, c1 = self._divisor(e.right, env)
            lo, hi = self.ival(e.left, env)
            if e.op == "/":
                if c0 == c1:  # truncating division by c > 0 is monotone
                    return (self._div(lo, c0), self._div(hi, c0))
                # and, for a fixed dividend, monotone in c > 0: the box's corners
                qs = [self._div(b, c) for b in (lo, hi) for c in (c0, c1)]
                qlo = qhi = qs[0]
                for q in qs[1:]:
                    qlo, qhi = self._pick("<", qlo, q), self._pick(">", qhi, q)
                return qlo, qhi
            if lo == hi and c0 == c1:
                return self._mod(lo, c0), self._mod(lo, c0)
            # C's remainder takes the dividend's sign: in [0, min(hi, c-1)] when
            # lo >= 0, else in [-(c-1), c-1] (a symbolic lo: chosen at the guard)
            top = self._ovf("rt_sub_ovf", c1, 1)
            if isinstance(lo, int) and lo >= 0:
                return 0, self._pick("<", hi, top)
            if isinstance(lo, int):
                return self._ovf("rt_sub_ovf", 1, c1), top
            nonneg = c_ast.BinaryOp(">=", c_ast.ID(lo), const(0))
            return (self._new(c_ast.TernaryOp(nonneg, const(0),
                                              self._node(self._ovf("rt_sub_ovf", 1, c1)))),
                    self._new(c_ast.TernaryOp(copy.deepcopy(nonneg),
                                              self._node(self._pick("<", hi, top)),
                                              self._node(top))))
        if isinstance(e, c_ast.TernaryOp):
            if not pure_expr(e.cond):
                raise NoBound
            mm = _minmax(e)
            if mm is not None:
                # min(x, y) lies in [min(lo x, lo y), min(hi x, hi y)] (max alike);
                # the operands' own intervals, not narrowed by the condition
                a, b = self.ival(e.iftrue, env), self.ival(e.iffalse, env)
                op = "<" if mm == "min" else ">"
                return self._pick(op, a[0], b[0]), self._pick(op, a[1], b[1])
            # otherwise the hull of the branches, each narrowed by its condition
            a = self.ival(e.iftrue, self.refine(e.cond, env, True))
            b = self.ival(e.iffalse, self.refine(e.cond, env, False))
            return self._pick("<", a[0], b[0]), self._pick(">", a[1], b[1])
        raise NoBound

    def _divisor(self, e: c_ast.Node, env: dict[str, _Ival | None]) -> _Ival:
        """A divisor's interval, positive at the guard: a literal, or bounds the
        guard requires > 0 (one value, or a range: n - j over a loop's columns)."""
        c = int_literal(e)
        if c is not None:
            if c <= 0:
                raise NoBound
            return c, c
        lo, hi = self.ival(e, env)
        if isinstance(lo, int):
            if lo <= 0:
                raise NoBound
        else:
            self._require(c_ast.BinaryOp(">", self._node(lo), const(0)))
        return lo, hi

    def _div(self, b: _Bound, c: _Bound) -> _Bound:
        if isinstance(b, int) and isinstance(c, int):
            return b // c if b >= 0 else -((-b) // c)  # C truncates toward zero
        if ("/", b, c) not in self.memo:
            q = c_ast.BinaryOp("/", self._node(b), self._node(c))
            if not isinstance(c, int):  # guard variables are computed before the
                # conditions are tested: never divide by a divisor they refuse
                q = c_ast.TernaryOp(c_ast.BinaryOp(">", self._node(c), const(0)), q, const(0))
            self.memo[("/", b, c)] = self._new(q)
        return self.memo[("/", b, c)]

    def _mod(self, b: _Bound, c: _Bound) -> _Bound:
        if isinstance(b, int) and isinstance(c, int):
            return b - c * self._div(b, c)
        if ("%", b, c) not in self.memo:
            r = c_ast.BinaryOp("%", self._node(b), self._node(c))
            if not isinstance(c, int):  # as in _div
                r = c_ast.TernaryOp(c_ast.BinaryOp(">", self._node(c), const(0)), r, const(0))
            self.memo[("%", b, c)] = self._new(r)
        return self.memo[("%", b, c)]

    def refine(self, cond: c_ast.Node, env: dict[str, _Ival | None], holds: bool
               ) -> dict[str, _Ival | None]:
        """env narrowed by what ``cond`` (pure) says when it holds (comparisons of a
        variable with an expression, joined by &&; when it fails, !(v < E) too)."""
        facts: list[tuple] = []  # (name, op, other[, the compared sum])
        flip = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
        mirror = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}

        def collect(c: c_ast.Node, pos: bool) -> None:
            if isinstance(c, c_ast.BinaryOp) and c.op == "&&" and pos:
                collect(c.left, pos)
                collect(c.right, pos)
            elif isinstance(c, c_ast.BinaryOp) and c.op == "||" and not pos:
                collect(c.left, pos)
                collect(c.right, pos)
            elif isinstance(c, c_ast.UnaryOp) and c.op == "!":
                collect(c.expr, not pos)
            elif isinstance(c, c_ast.BinaryOp) and c.op in flip:
                op = c.op if pos else flip[c.op]
                for side, other, sop in ((c.left, c.right, op), (c.right, c.left, mirror[op])):
                    if isinstance(side, c_ast.ID):
                        facts.append((side.name, sop, other))
                    elif shifted := _shifted(side):
                        # x + e < E: x < E - e, when x + e cannot wrap (its interval,
                        # overflow-checked, says so)
                        facts.append((shifted[0], sop, c_ast.BinaryOp(
                            "-" if shifted[1] == "+" else "+", other, shifted[2]), side))

        collect(cond, holds)
        if not facts:
            return env
        out = dict(env)
        for name, op, other, *whole in facts:
            try:
                for w in whole:
                    self.ival(w, env)  # x + e does not wrap
                cur = self._ival(c_ast.ID(name), out)
                lo_o, hi_o = self.ival(other, env)
                lo, hi = cur
                if op == "<":
                    hi = self._pick("<", hi, self._ovf("rt_sub_ovf", hi_o, 1))
                elif op == "<=":
                    hi = self._pick("<", hi, hi_o)
                elif op == ">":
                    lo = self._pick(">", lo, self._ovf("rt_add_ovf", lo_o, 1))
                else:
                    lo = self._pick(">", lo, lo_o)
                out[name] = (lo, hi)
                self._narrowed(out, lo, hi)
            except NoBound:
                continue  # no narrowing from this fact
        return out

    # -- the nest, in source order ---------------------------------------
    def stmt(self, n: c_ast.Node | None, env: dict[str, _Ival | None]) -> None:
        if n is None:
            return
        if isinstance(n, c_ast.Compound):
            inner = dict(env)
            items = n.block_items or []
            for k, item in enumerate(items):
                if isinstance(item, c_ast.Decl):
                    self.decl(item, inner, items[k + 1:])
                else:
                    self.stmt(item, inner)
            return
        if isinstance(n, c_ast.Decl):
            self.decl(n, env, [])
            return
        if isinstance(n, c_ast.For):
            self.loop(n, env)
            return
        if isinstance(n, (c_ast.While, c_ast.DoWhile)):
            raise NoBound
        if isinstance(n, c_ast.If):
            self.expr(n.cond, env)
            self.stmt(n.iftrue, self.refine(n.cond, env, True) if pure_expr(n.cond) else env)
            self.stmt(n.iffalse, self.refine(n.cond, env, False) if pure_expr(n.cond) else env)
            return
        self.expr(n, env)

    def decl(self, d: c_ast.Decl, env: dict[str, _Ival | None], rest: list[c_ast.Node]) -> None:
        if d.init is not None:
            self.expr(d.init, env)
        env[d.name] = None
        if self.writes.get(d.name) == 1 and self._derived(d, env):
            return
        if (d.init is not None and isinstance(d.type, c_ast.TypeDecl)
                and isinstance(d.type.type, c_ast.IdentifierType)
                and INT_TYPES.get(" ".join(d.type.type.names))
                and not any(d.name in assigned(r) for r in rest)):
            # (ival accepts only side-effect-free arithmetic and guards its own
            # divisions, so the init need not be safe to evaluate early itself)
            try:
                iv = self.ival(d.init, env)
                if INT_TYPES[" ".join(d.type.type.names)] == 32:
                    self._in_int(iv)
                env[d.name] = iv
            except NoBound:
                pass  # a use in an index fails later

    def _derived(self, d: c_ast.Decl, env: dict[str, _Ival | None]) -> bool:
        """A cap fixed for the thread, declared once and never assigned: a copy
        of a cap, or a cap offset by one value (cap_t M = cap_offset_f32(A, b * n);),
        is one cap expression, which the guard may evaluate: it reads nothing the
        nest writes and never faults (rt_offset only moves the origin)."""
        init = d.init
        if not (isinstance(d.type, c_ast.TypeDecl)
                and isinstance(d.type.type, c_ast.IdentifierType)):
            return False
        names = d.type.type.names
        if names == ["cap_t"] and isinstance(init, c_ast.ID):  # cap_t P = D;
            base = self._cap_node(init.name)
            if base is not None:
                self.cap_exprs[d.name] = base
            return base is not None
        if not (isinstance(init, c_ast.FuncCall) and isinstance(init.name, c_ast.ID)):
            return False
        fn = init.name.name
        args = init.args.exprs if init.args is not None else []
        if not (fn.startswith("cap_offset_") and names == ["cap_t"] and len(args) == 2
                and isinstance(args[0], c_ast.ID) and pure_expr(args[1])):
            return False
        base = self._cap_node(args[0].name)
        if base is None:
            return False
        try:
            lo, hi = self.ival(args[1], env)
        except NoBound:
            return False
        if lo != hi:
            return False
        self.cap_exprs[d.name] = c_ast.FuncCall(c_ast.ID(fn), c_ast.ExprList(
            [copy.deepcopy(base), self._node(lo)]))
        return True

    def _cap_node(self, name: str) -> c_ast.Node | None:
        """What the guard evaluates for cap ``name``: a derived cap's expression,
        an unassigned cap (a parameter) itself, else None."""
        if name in self.cap_exprs:
            return self.cap_exprs[name]
        return None if name in self.written else c_ast.ID(name)

    def loop(self, f: c_ast.For, env: dict[str, _Ival | None]) -> None:
        shape = loop_shape(f) or down_shape(f)
        if shape is None or f.stmt is None:
            raise NoBound
        var, bits, a_expr, b_expr, cmp, step = shape
        if var in assigned(f.stmt):
            raise NoBound
        s: _Bound
        s_min: _Bound
        if isinstance(step, int):
            s = s_min = step
        elif pure_expr(step) and not (ids_in(step) & self.written):
            s = s_min = self._new(copy.deepcopy(step))
        else:
            # a step the nest computes (int64_t nw = P / 32;), one value or a range
            # (a column's row groups): the counter's interval does not depend on it,
            # the guard requires it positive and checks the last step with its top
            lo_s, s = self.ival(step, env)
            s_min = lo_s
            if lo_s != s:
                if isinstance(lo_s, int):
                    if lo_s <= 0:
                        raise NoBound
                else:
                    self._require(c_ast.BinaryOp(">", c_ast.ID(lo_s), const(0)))
        if isinstance(s, int):
            if not 0 < s <= 1 << 20:
                raise NoBound
        else:
            self._require(c_ast.BinaryOp("&&", c_ast.BinaryOp(">", c_ast.ID(s), const(0)),
                                         c_ast.BinaryOp("<=", c_ast.ID(s), const(1 << 20))))
        a, b = self.ival(a_expr, env), self.ival(b_expr, env)
        top, bottom = (_I64_MAX, _I64_MIN) if bits == 64 else (_I32_MAX, _I32_MIN)
        if bits == 32:
            self._in_int(a)
        if cmp in ("<", "<="):
            hi = self._ovf("rt_sub_ovf", b[1], 1) if cmp == "<" else b[1]
            # the step after the last iteration must not wrap the counter
            self._le(self._ovf("rt_add_ovf", hi, s), top)
            iv: _Ival = (a[0], hi)
        else:
            lo = self._ovf("rt_add_ovf", b[0], 1) if cmp == ">" else b[0]
            self._ge(self._ovf("rt_sub_ovf", lo, s), bottom)
            iv = (lo, a[1])
        self.expr(f.cond, env)
        self.counters[id(f)] = (iv, s_min)
        body = dict(env)
        body[var] = iv
        self._narrowed(body, *iv)  # an empty counter interval: the body never runs
        self.stmt(f.stmt, body)

    def short_loop(self, f: c_ast.For, limit: int) -> bool:
        """Require that ``f`` (a loop this guard walked) runs at most ``limit``
        iterations wherever it runs: its counter's interval spans less than limit
        steps of its smallest step.  False (nothing required) where constants say
        it cannot hold or the loop was not walked."""
        if id(f) not in self.counters:
            return False
        (lo, hi), step = self.counters[id(f)]
        if isinstance(lo, int) and isinstance(hi, int) and isinstance(step, int):
            return hi - lo < limit * step
        try:  # raises (before adding anything) only for two constants that overflow
            width = self._ovf("rt_sub_ovf", hi, lo)
        except NoBound:
            return False
        # loop() holds the step in (0, 2^20] and limit <= SHORT_TRIP: no overflow
        most = self._ovf("rt_mul_ovf", step, limit)
        self._require(c_ast.BinaryOp("<", self._node(width), self._node(most)))
        return True

    def _le(self, b: _Bound, limit: int) -> None:
        if isinstance(b, int):
            if b > limit:
                raise NoBound
        else:
            self._require(c_ast.BinaryOp("<=", c_ast.ID(b), self._node(limit)))

    def _ge(self, b: _Bound, limit: int) -> None:
        if isinstance(b, int):
            if b < limit:
                raise NoBound
        else:
            self._require(c_ast.BinaryOp(">=", c_ast.ID(b), self._node(limit)))

    def expr(self, e: c_ast.Node | None, env: dict[str, _Ival | None]) -> None:
        """Bound every access in an expression (conditional branches narrowed)."""
        if e is None:
            return
        if isinstance(e, c_ast.TernaryOp):
            self.expr(e.cond, env)
            pure = pure_expr(e.cond)
            self.expr(e.iftrue, self.refine(e.cond, env, True) if pure else env)
            self.expr(e.iffalse, self.refine(e.cond, env, False) if pure else env)
            return
        if isinstance(e, c_ast.BinaryOp) and e.op in ("&&", "||"):
            self.expr(e.left, env)
            self.expr(e.right, self.refine(e.left, env, e.op == "&&")
                      if pure_expr(e.left) else env)
            return
        if isinstance(e, c_ast.FuncCall) and isinstance(e.name, c_ast.ID) \
                and e.name.name.startswith(ACCESS_PREFIX):
            t = e.name.name.rsplit("_", 1)[1]
            if t in ELEM and e.args is not None and len(e.args.exprs) >= 2:
                for a in e.args.exprs[1:]:
                    self.expr(a, env)
                cap, idx = e.args.exprs[0], e.args.exprs[1]
                # (idx need not be pure_expr: ival accepts only side-effect-free
                # arithmetic and guards its own divisions)
                if not isinstance(cap, c_ast.ID) or (
                        cap.name in self.written and cap.name not in self.cap_exprs):
                    raise NoBound
                store = 1 if e.name.name.startswith("cap_store_") else 0
                self._cover(("cap", cap.name, ELEM_SIZE[t], store), self.ival(idx, env), env)
                return
        if isinstance(e, c_ast.ArrayRef):
            base, chain = array_chain(e)
            dims = self.ctx.arrays.get(base.name) if isinstance(base, c_ast.ID) else None
            for depth, ref in enumerate(chain):
                self.expr(ref.subscript, env)
                if dims is None or depth >= len(dims) or isinstance(ref, UncheckedRef):
                    continue
                self._cover(("array", dims[depth]), self.ival(ref.subscript, env), env)
            return
        if isinstance(e, (c_ast.For, c_ast.While, c_ast.DoWhile, c_ast.Compound, c_ast.If)):
            self.stmt(e, env)
            return
        for _name, c in e.children():
            self.expr(c, env)

    ok = "__nok"  # replaced per nest in build()


def _shifted(e: c_ast.Node) -> tuple[str, str, c_ast.Node] | None:
    """x + e, e + x or x - e (x a name, e pure) -> (x, '+' or '-', e), else None."""
    if not (isinstance(e, c_ast.BinaryOp) and e.op in ("+", "-")):
        return None
    if isinstance(e.left, c_ast.ID) and pure_expr(e.right):
        return e.left.name, e.op, e.right
    if e.op == "+" and isinstance(e.right, c_ast.ID) and pure_expr(e.left):
        return e.right.name, "+", e.left
    return None


def _minmax(e: c_ast.TernaryOp) -> str | None:
    """'min' for a < b ? a : b (and the mirrored forms), 'max' likewise, else None."""
    c = e.cond
    if not (isinstance(c, c_ast.BinaryOp) and c.op in ("<", "<=", ">", ">=")):
        return None
    g = c_generator.CGenerator()
    L, R, T, F = (g.visit(x) for x in (c.left, c.right, e.iftrue, e.iffalse))
    if (L, R) == (T, F):
        return "min" if c.op in ("<", "<=") else "max"
    if (L, R) == (F, T):
        return "max" if c.op in ("<", "<=") else "min"
    return None
