"""Loop analysis for versioning: counted-loop shapes, names read and written, barriers,
offsets a loop body defines, trip counts."""

from __future__ import annotations

import copy

from pycparser import c_ast

from ....capabilities import abi
from ..astutil import (
    INT_TYPES,
    callees,
    int_literal,
    is_int64,
    node_fields,
    pure_expr,
    reaching,
    write_counts,
)
from ..dialect_api import MATH_FUNCS, TILE_FUNCS, WARP_FUNCS

ACCESS_PREFIX = ("cap_load_", "cap_store_")
ELEM = abi.SCALAR_SUFFIXES
ELEM_SIZE = abi.ELEM_SIZE


#: Block-wide barriers (GPU).  A loop around one is never versioned: the guard
#: may differ between the threads of a warp, which would then wait at two
#: different bar.sync instructions (PTX bar.sync is .aligned: undefined, in
#: practice a hang).  The barrier-free loops inside it are still versioned.
#: Tile copies end in a barrier; warp shuffles synchronise the warp the same way.
BARRIERS = frozenset({"rt_sync_threads"}) | TILE_FUNCS | WARP_FUNCS
#: The GPU lowering's: rt_group_sync starts and ends with a block barrier there (on the
#: CPU, one thread per block, it waits for other blocks only).
GPU_BARRIERS = BARRIERS | {"rt_group_sync"}
#: The GPU lowering's warp vote (``__all_sync`` over the warp's live lanes): it lets a
#: loop with warp collectives (but no block barrier) be versioned, see the module doc.
GPU_WARP_VOTE = "rt_warp_all"
#: The GPU lowering's block vote (``__syncthreads_and``): a loop with block barriers
#: runs its unchecked copy only if every thread's cover guard holds (below).
GPU_BLOCK_VOTE = "rt_block_all"


def has_barrier(node: c_ast.Node | None, waits: frozenset[str] = frozenset(),
                 barriers: frozenset[str] = BARRIERS) -> bool:
    """Does ``node`` call a barrier, or a helper in ``waits`` (one that reaches one)?"""
    if node is None:
        return False
    if isinstance(node, c_ast.FuncCall) and isinstance(node.name, c_ast.ID) \
            and (node.name.name in barriers or node.name.name in waits):
        return True
    return any(has_barrier(c, waits, barriers) for _name, c in node.children())


def waiting_helpers(ast: c_ast.FileAST, barriers: frozenset[str] = BARRIERS) -> frozenset[str]:
    """The source's functions that reach a barrier, directly or through other helpers:
    a call of one counts as a barrier for versioning."""
    funcs = {e.decl.name: e.body for e in ast.ext if isinstance(e, c_ast.FuncDef)}
    graph = {n: callees(body, set(funcs)) for n, body in funcs.items()}
    return frozenset(reaching(graph, {n for n, body in funcs.items()
                                      if has_barrier(body, barriers=barriers)}))


def loop_depth(node: c_ast.Node | None) -> int:
    """Deepest loop nesting under node (0: no loop)."""
    if node is None:
        return 0
    best = 0
    for _attr, val in node_fields(node):
        items = val if isinstance(val, list) else [val]
        for item in items:
            if isinstance(item, (c_ast.For, c_ast.While, c_ast.DoWhile)):
                best = max(best, 1 + loop_depth(item.stmt))
            elif isinstance(item, c_ast.Node):
                best = max(best, loop_depth(item))
    return best


def array_chain(ref: c_ast.ArrayRef) -> tuple[c_ast.Node, list[c_ast.ArrayRef]]:
    """a[i][j][k] -> (a, [a[i], a[i][j], a[i][j][k]]): the base and each subscript level."""
    chain: list[c_ast.ArrayRef] = []
    cur: c_ast.Node = ref
    while isinstance(cur, c_ast.ArrayRef):
        chain.append(cur)
        cur = cur.name
    chain.reverse()
    return cur, chain


def ids_in(node: c_ast.Node | None) -> set[str]:
    out: set[str] = set()

    class V(c_ast.NodeVisitor):
        def visit_ID(self, n: c_ast.ID) -> None:
            out.add(n.name)

        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            if n.args is not None:
                self.visit(n.args)  # the callee name is not a variable

        visit_UncheckedCall = visit_FuncCall

        def visit_StructRef(self, n: c_ast.StructRef) -> None:
            self.visit(n.name)

    if node is not None:
        V().visit(node)
    return out


def assigned(node: c_ast.Node | None) -> set[str]:
    """Names assigned (=, op=, ++, --, through &) or declared anywhere under node:
    astutil.write_counts, the one analysis of names written (it relies on the
    verifier admitting only names and local-array elements as write targets)."""
    return set() if node is None else set(write_counts(node))


def subst(expr: c_ast.Node, var: str, repl: c_ast.Node) -> c_ast.Node:
    """Copy of expr with every ID var replaced by (repl)."""
    expr = copy.deepcopy(expr)
    if isinstance(expr, c_ast.ID) and expr.name == var:
        return copy.deepcopy(repl)

    class T(c_ast.NodeVisitor):
        def generic_visit(self, n: c_ast.Node) -> None:
            for attr, v in node_fields(n):
                if isinstance(v, c_ast.ID) and v.name == var:
                    setattr(n, attr, copy.deepcopy(repl))
                elif isinstance(v, c_ast.Node):
                    self.visit(v)
                elif isinstance(v, list):
                    for k, item in enumerate(v):
                        if isinstance(item, c_ast.ID) and item.name == var:
                            v[k] = copy.deepcopy(repl)
                        elif isinstance(item, c_ast.Node):
                            self.visit(item)

    T().visit(expr)
    return expr


def counter_decl(loop: c_ast.For) -> tuple[c_ast.Decl, int] | None:
    """The loop's one initialised integer counter declaration and its bits, else None."""
    init = loop.init
    if not (isinstance(init, c_ast.DeclList) and len(init.decls) == 1):
        return None
    d = init.decls[0]
    if not (isinstance(d.type, c_ast.TypeDecl) and isinstance(d.type.type, c_ast.IdentifierType)):
        return None
    bits = INT_TYPES.get(" ".join(d.type.type.names))
    if bits is None or d.init is None:
        return None
    return d, bits


def loop_shape(loop: c_ast.For
                ) -> tuple[str, int, c_ast.Node, c_ast.Node, str, int | c_ast.Node] | None:
    """(var, bits, A, B, cmp, step) for a countable loop, else None.

    step is a positive int literal, or a pure loop-invariant expression that the
    guard checks at run time."""
    counter = counter_decl(loop)
    if counter is None:
        return None
    d, bits = counter
    var = d.name
    cond = loop.cond
    if not (isinstance(cond, c_ast.BinaryOp) and cond.op in ("<", "<=")
            and isinstance(cond.left, c_ast.ID) and cond.left.name == var):
        return None
    nxt = loop.next
    step = None
    if isinstance(nxt, c_ast.UnaryOp) and nxt.op in ("p++", "++") and isinstance(
            nxt.expr, c_ast.ID) and nxt.expr.name == var:
        step = 1
    elif (isinstance(nxt, c_ast.Assignment) and nxt.op == "+=" and isinstance(nxt.lvalue, c_ast.ID)
          and nxt.lvalue.name == var):
        step = int_literal(nxt.rvalue)
        if step is None and pure_expr(nxt.rvalue) and var not in ids_in(nxt.rvalue):
            # an invariant step (e.g. a thread stride): the guard requires 0 < step
            return var, bits, d.init, cond.right, cond.op, nxt.rvalue
    if not step or step <= 0 or step > 1 << 20:
        return None
    if not (pure_expr(d.init) and pure_expr(cond.right)):
        return None
    return var, bits, d.init, cond.right, cond.op, step


def exact64(expr: c_ast.Node, types: dict[str, int]) -> bool:
    """Every operation of expr is done in 64-bit arithmetic, so its wrapping int64
    value is the mathematical value mod 2^64 (an int subexpression would wrap
    mod 2^32 first)."""
    if isinstance(expr, c_ast.Constant):
        v = int_literal(expr)
        return v is not None and -(1 << 31) <= v < (1 << 31)
    if isinstance(expr, c_ast.ID):
        return types.get(expr.name, 0) in (32, 64)
    if isinstance(expr, c_ast.Cast):
        return is_int64(expr, types) and exact64(expr.expr, types) and (
            is_int64(expr.expr, types) or isinstance(expr.expr, (c_ast.ID, c_ast.Constant)))
    if isinstance(expr, c_ast.BinaryOp) and expr.op in ("+", "-", "*"):
        return (exact64(expr.left, types) and exact64(expr.right, types)
                and is_int64(expr, types))
    if isinstance(expr, c_ast.UnaryOp) and expr.op in ("-", "+"):
        return is_int64(expr.expr, types) and exact64(expr.expr, types)
    return False


def body_defs(body: c_ast.Node, changed: set[str], types: dict[str, int]
               ) -> dict[str, c_ast.Node]:
    """``int64_t x = E;`` at the top level of a loop body, x never assigned again
    in the body, E pure, computed in 64-bit arithmetic and (after expanding the
    definitions before it) free of every name the body assigns: x equals E
    (mod 2^64) wherever the body uses it.  Maps x to E expanded."""
    if not isinstance(body, c_ast.Compound):
        return {}
    writes = write_counts(body)
    defs: dict[str, c_ast.Node] = {}
    for item in body.block_items or []:
        if not (isinstance(item, c_ast.Decl) and item.init is not None
                and isinstance(item.type, c_ast.TypeDecl)
                and isinstance(item.type.type, c_ast.IdentifierType)
                and item.type.type.names in (["int64_t"], ["long"])
                and writes.get(item.name) == 1 and types.get(item.name) == 64):
            continue
        if not (pure_expr(item.init) and exact64(item.init, types)):
            continue
        init = expand(item.init, defs)
        if not (ids_in(init) & changed):
            defs[item.name] = init
    return defs


def expand(expr: c_ast.Node, defs: dict[str, c_ast.Node]) -> c_ast.Node:
    """expr with every defined name replaced by its (already expanded) definition."""
    for name in ids_in(expr) & set(defs):
        expr = subst(expr, name, defs[name])
    return expr


def replace_node(root: c_ast.Node, old: c_ast.Node, new: c_ast.Node) -> None:
    """Put ``new`` where ``old`` (by identity) is under ``root``."""
    for attr, val in node_fields(root):
        if isinstance(val, list):
            for k, item in enumerate(val):
                if item is old:
                    val[k] = new
                    return
                if isinstance(item, c_ast.Node):
                    replace_node(item, old, new)
        elif val is old:
            setattr(root, attr, new)
            return
        elif isinstance(val, c_ast.Node):
            replace_node(val, old, new)


def leaf_body(node: c_ast.Node) -> bool:
    """Only checked accesses, pure dialect calls and math: nothing that can block."""

    class V(c_ast.NodeVisitor):
        ok = True

        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            name = n.name.name if isinstance(n.name, c_ast.ID) else ""
            leaf = (name in MATH_FUNCS or name in ("cap_to_int", "cap_from_int",
                                                    "rt_block_idx", "rt_grid_dim")
                    or (name.startswith(("cap_load_", "cap_store_", "cap_len_", "cap_offset_"))
                        and not name.endswith("_cap")))
            if not leaf:
                self.ok = False
            self.generic_visit(n)

    v = V()
    v.visit(node)
    return v.ok


def loops_in(node: c_ast.Node) -> list[c_ast.Node]:
    """Every loop statement inside node (node included)."""
    out: list[c_ast.Node] = []

    class V(c_ast.NodeVisitor):
        def generic_visit(self, n: c_ast.Node) -> None:
            if isinstance(n, (c_ast.For, c_ast.While, c_ast.DoWhile)):
                out.append(n)
            for _attr, val in node_fields(n):
                for item in (val if isinstance(val, list) else [val]):
                    if isinstance(item, c_ast.Node):
                        self.visit(item)

    V().visit(node)
    return out


def const_int(node: c_ast.Node) -> int | None:
    if isinstance(node, c_ast.Constant):
        return int_literal(node)
    if isinstance(node, c_ast.UnaryOp) and node.op == "-":
        v = const_int(node.expr)
        return None if v is None else -v
    return None


def const_trips(a: c_ast.Node, b: c_ast.Node, cmp: str, step: int | c_ast.Node) -> int | None:
    """Trip count of a loop with integer-literal bounds and step, else None."""
    lo, hi = const_int(a), const_int(b)
    if lo is None or hi is None or not isinstance(step, int):
        return None
    if cmp == "<=":
        hi += 1
    return max(0, (hi - lo + step - 1) // step)


def down_shape(loop: c_ast.For
                ) -> tuple[str, int, c_ast.Node, c_ast.Node, str, int] | None:
    """(var, bits, A, B, cmp, step) of ``for (T i = A; i >= B (> B); i-- / i -= c)``."""
    counter = counter_decl(loop)
    if counter is None:
        return None
    d, bits = counter
    var, cond, nxt = d.name, loop.cond, loop.next
    if not (isinstance(cond, c_ast.BinaryOp) and cond.op in (">", ">=")
            and isinstance(cond.left, c_ast.ID) and cond.left.name == var):
        return None
    step = None
    if isinstance(nxt, c_ast.UnaryOp) and nxt.op in ("p--", "--") and isinstance(
            nxt.expr, c_ast.ID) and nxt.expr.name == var:
        step = 1
    elif (isinstance(nxt, c_ast.Assignment) and nxt.op == "-=" and isinstance(nxt.lvalue, c_ast.ID)
          and nxt.lvalue.name == var):
        step = int_literal(nxt.rvalue)
    if not step or step <= 0 or step > 1 << 20:
        return None
    if not (pure_expr(d.init) and pure_expr(cond.right)):
        return None
    return var, bits, d.init, cond.right, cond.op, step
