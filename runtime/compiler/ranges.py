"""Static ranges: local-array subscripts proved in range at compile time.

Loop versioning (hoist/) keeps a checked copy of every loop it guards, so a
kernel carries both copies and, on the GPU, the registers of the larger one.
A subscript whose every value is known at compile time to lie in [0, dim)
needs neither a check nor a copy.  This pass proves such subscripts with
constant intervals and marks them UncheckedRef (the mark the lowerings already
honour); hoist/ then leaves them out of its guards.

The facts, each an exact interval of Python integers:

  integer literals              [v, v] (no unsigned suffix)
  rt_thread_idx()               [0, threads - 1]: the kernel's
                                rt_require_block_dim(N) (the launch refuses any
                                other block size), else the CUDA limit 1024
  rt_lane_idx()                 [0, 31]
  T x = E;                      E's interval at the declaration, in the rest of
                                its block, when x is a signed integer that the
                                rest of the block never assigns, increments,
                                addresses or declares again
                                (astutil.write_counts) and no case label can
                                jump past the declaration (the verifier); a
                                name declared again in another block is another
                                variable (each block has its own names)
  for (T i = A; i < B; i += s)  [lo A, hi B - 1] (<=: hi B) in the body, for a
                                loop hoist.loop_shape counts whose step s is a
                                literal, when the loop writes i only in its
                                header and hi B + s fits an int (no wrap on the
                                final step)
  + - * unary -, / and % by a positive literal (C truncation), casts to the
  dialect's signed integer types
  c ? a : b                     the hull of a and b, each where c holds / fails
  if (v < E) / c ? : / && ||    v narrowed to [lo v, min(hi v, hi E - 1)] where
                                the condition holds (<=, >, >= alike, and when it
                                fails its negation), v a name known above: no
                                statement between the test and the subscript
                                changes it.  A narrowed interval that comes out
                                empty belongs to code that never runs.

Every interval must stay within int range, so no subexpression of any signed
type wraps and the value computed is the one the interval bounds.  Anything
else is unknown and keeps its check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pycparser import c_ast

from .astutil import INT_TYPES, int_literal, int_types, write_counts
from .hoist import UncheckedRef, array_chain, loop_shape
from .verifier import CUDA_MAX_BLOCK

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
WARP = 32

Ival = tuple[int, int]


@dataclass
class StaticRanges:
    """What the pass proved in one function: the subscripts it marked unchecked."""

    proved: list[c_ast.ArrayRef] = field(default_factory=list)


def builtin_ranges(target: str, block_dim: int | None) -> dict[str, Ival]:
    """Intervals of the lane's index builtins (none on the CPU lane)."""
    if target != "cuda":
        return {}
    return {"rt_thread_idx": (0, (block_dim or CUDA_MAX_BLOCK) - 1), "rt_lane_idx": (0, WARP - 1)}


def prove_subscripts(func: c_ast.FuncDef, arrays: dict[str, tuple[int, ...]],
                     builtins: dict[str, Ival]) -> StaticRanges:
    """Mark the local-array subscripts of ``func`` proved in range; see the module doc."""
    walk = _Walk(arrays, builtins, int_types(func))
    walk.node(func.body, {})
    return walk.result


class _Unknown(Exception):
    pass


class _Walk:
    def __init__(self, arrays: dict[str, tuple[int, ...]], builtins: dict[str, Ival],
                 types: dict[str, int]):
        self.arrays, self.builtins, self.types = arrays, builtins, types
        self.result = StaticRanges()

    # -- statements: carry the environment of known variables ------------------
    def node(self, n: c_ast.Node, env: dict[str, Ival]) -> None:
        if isinstance(n, c_ast.ArrayRef):
            self.subscript(n, env)
            return
        if isinstance(n, c_ast.For):
            self.loop(n, env)
            return
        if isinstance(n, c_ast.Compound):
            inner = dict(env)  # the block's declarations end with it
            items = n.block_items or []
            for k, item in enumerate(items):
                self.node(item, inner)
                if isinstance(item, c_ast.Decl):
                    self.bind(item, inner, items[k + 1:])
            return
        if isinstance(n, (c_ast.If, c_ast.TernaryOp)):
            self.node(n.cond, env)
            self.node(n.iftrue, self.narrow(n.cond, env, True))
            if n.iffalse is not None:
                self.node(n.iffalse, self.narrow(n.cond, env, False))
            return
        if isinstance(n, c_ast.BinaryOp) and n.op in ("&&", "||"):
            self.node(n.left, env)
            self.node(n.right, self.narrow(n.left, env, n.op == "&&"))
            return
        for _name, c in n.children():
            self.node(c, env)

    def bind(self, d: c_ast.Decl, env: dict[str, Ival], rest: list[c_ast.Node]) -> None:
        """After ``T x = E;``: x's interval for the rest of its block, if known and
        nothing there writes x (else x is unknown there: it shadows any outer x)."""
        env.pop(d.name, None)
        if d.init is None or self.types.get(d.name) not in (32, 64) \
                or not isinstance(d.type, c_ast.TypeDecl):
            return
        if any(write_counts(r).get(d.name) for r in rest):
            return
        iv = self.known(d.init, env)
        if iv is not None:
            env[d.name] = iv

    def narrow(self, cond: c_ast.Node, env: dict[str, Ival], holds: bool) -> dict[str, Ival]:
        """env where ``cond`` is ``holds``: known names compared with known values,
        through &&, || and !."""
        out = dict(env)
        flip = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
        mirror = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}

        def facts(c: c_ast.Node, pos: bool) -> None:
            if isinstance(c, c_ast.BinaryOp) and c.op == ("&&" if pos else "||"):
                facts(c.left, pos)
                facts(c.right, pos)
            elif isinstance(c, c_ast.UnaryOp) and c.op == "!":
                facts(c.expr, not pos)
            elif isinstance(c, c_ast.BinaryOp) and c.op in flip:
                op = c.op if pos else flip[c.op]
                for name, other, o in ((c.left, c.right, op), (c.right, c.left, mirror[op])):
                    if isinstance(name, c_ast.ID) and name.name in out:
                        bound = self.known(other, env)
                        if bound is not None:
                            out[name.name] = _narrowed(out[name.name], o, bound)

        facts(cond, holds)
        return out

    def loop(self, loop: c_ast.For, env: dict[str, Ival]) -> None:
        for part in (loop.init, loop.cond, loop.next):
            if part is not None:
                self.node(part, env)
        inner = dict(env)
        counter = self.counter(loop, env)
        if counter is not None:
            inner[counter[0]] = counter[1]
        if loop.stmt is not None:
            self.node(loop.stmt, inner)

    def counter(self, loop: c_ast.For, env: dict[str, Ival]) -> tuple[str, Ival] | None:
        shape = loop_shape(loop)
        if shape is None:
            return None
        var, _bits, start, bound, cmp, step = shape
        if not isinstance(step, int) or write_counts(loop).get(var) != 2:
            return None  # a literal step, and the loop writes i only in its header
        lo, hi = self.known(start, env), self.known(bound, env)
        if lo is None or hi is None:
            return None
        last = hi[1] - (1 if cmp == "<" else 0)
        if last < lo[0] or last + step > _I32_MAX:
            return None
        return var, (lo[0], last)

    def subscript(self, ref: c_ast.ArrayRef, env: dict[str, Ival]) -> None:
        base, chain = array_chain(ref)
        dims = self.arrays.get(base.name) if isinstance(base, c_ast.ID) else None
        for depth, r in enumerate(chain):
            self.node(r.subscript, env)
            if dims is None or depth >= len(dims) or isinstance(r, UncheckedRef):
                continue
            iv = self.known(r.subscript, env)
            if iv is not None and 0 <= iv[0] and iv[1] < dims[depth]:
                r.__class__ = UncheckedRef
                self.result.proved.append(r)

    # -- expressions ---------------------------------------------------------------
    def known(self, e: c_ast.Node, env: dict[str, Ival]) -> Ival | None:
        try:
            return self.ival(e, env)
        except _Unknown:
            return None

    def ival(self, e: c_ast.Node, env: dict[str, Ival]) -> Ival:
        iv = self._ival(e, env)
        if not (_I32_MIN <= iv[0] <= iv[1] <= _I32_MAX):
            raise _Unknown
        return iv

    def _ival(self, e: c_ast.Node, env: dict[str, Ival]) -> Ival:
        if isinstance(e, c_ast.Constant):
            v = int_literal(e)
            if v is None or "u" in e.value.lower():
                raise _Unknown
            return v, v
        if isinstance(e, c_ast.ID):
            if e.name not in env:
                raise _Unknown
            return env[e.name]
        if isinstance(e, c_ast.FuncCall) and isinstance(e.name, c_ast.ID) \
                and e.name.name in self.builtins and not (e.args and e.args.exprs):
            return self.builtins[e.name.name]
        if isinstance(e, c_ast.Cast):
            names = getattr(getattr(e.to_type, "type", None), "type", None)
            if " ".join(getattr(names, "names", [])) not in INT_TYPES:
                raise _Unknown
            return self.ival(e.expr, env)
        if isinstance(e, c_ast.UnaryOp) and e.op in ("-", "+"):
            lo, hi = self.ival(e.expr, env)
            return (-hi, -lo) if e.op == "-" else (lo, hi)
        if isinstance(e, c_ast.BinaryOp) and e.op in ("+", "-", "*"):
            (a, b), (c, d) = self.ival(e.left, env), self.ival(e.right, env)
            if e.op == "+":
                return a + c, b + d
            if e.op == "-":
                return a - d, b - c
            ps = (a * c, a * d, b * c, b * d)
            return min(ps), max(ps)
        if isinstance(e, c_ast.TernaryOp):  # the hull of the branches, each narrowed
            a = self.ival(e.iftrue, self.narrow(e.cond, env, True))
            b = self.ival(e.iffalse, self.narrow(e.cond, env, False))
            return min(a[0], b[0]), max(a[1], b[1])
        if isinstance(e, c_ast.BinaryOp) and e.op in ("/", "%"):
            k = int_literal(e.right)
            if k is None or k <= 0 or "u" in e.right.value.lower():
                raise _Unknown
            lo, hi = self.ival(e.left, env)
            if e.op == "/":  # truncation toward zero is monotone for k > 0
                return _tdiv(lo, k), _tdiv(hi, k)
            if lo >= 0:  # C's remainder has the dividend's sign
                return (lo, hi) if hi < k else (0, k - 1)
            return -(k - 1), (k - 1 if hi > 0 else 0)
        raise _Unknown


def _narrowed(iv: Ival, op: str, bound: Ival) -> Ival:
    """iv where ``v op w`` holds for some w in bound (possibly empty: lo > hi)."""
    lo, hi = iv
    if op == "<":
        return lo, min(hi, bound[1] - 1)
    if op == "<=":
        return lo, min(hi, bound[1])
    if op == ">":
        return max(lo, bound[0] + 1), hi
    return max(lo, bound[0]), hi


def _tdiv(a: int, k: int) -> int:
    return a // k if a >= 0 else -((-a) // k)

