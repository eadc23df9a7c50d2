"""Loop versioning: one range check before a loop instead of one per access.

Applied to innermost counted loops and to the loops directly around them
(for the accesses in their own body; inner loops are versioned first).
For a counted loop ``for (T i = A; i < B; i += s)`` (``<=``, ``i++``
and ``++i`` too) whose body does not assign ``i``, every access
``cap_load_T(c, E)`` / ``cap_store_T(c, E, v)`` with ``c`` a loop-invariant cap
variable and ``E`` affine in ``i`` with loop-invariant, side-effect-free
coefficients takes every index value between E(first) and E(last).  So::

    if (loop runs zero times || every such access is in range at both ends
                                 and the index sequence cannot wrap)
        fast copy of the loop: those accesses unchecked
    else
        original loop: every access checked

The guard never faults: when it fails, the fully checked loop runs and faults
at the exact access (right index, right moment, same partial effects) - or not
at all, for an access under a condition that never held.  Pollchecks stay in
both copies.  Wrap-around: in wrapping int64 arithmetic E(i) = E(A) + d*(i-A)
(mod 2^64) with d = E(A+1) - E(A), so the guard also requires |d|*(last-A) and
E(A) + d*(last-A) not to overflow; then the computed sequence is exactly the
mathematical one and lies between its two checked ends.

Warp collectives (GPU): a loop that calls a shuffle, warp sum or warp MMA is
versioned only when the lane has a warp vote (``warp_vote``): the copy is then
chosen by the vote over the warp's guards (fast only if every lane's guard
holds), so all lanes run the same copy and meet at the same collective.  That
is sound where the verifier admitted the collective: only under block-uniform
control, so every lane of the warp reaches the loop, and its bounds, together.

Rectangular nests: when the inner loop's bounds and step are invariant in the
loop around it and every index of its accesses is affine in both counters
jointly, E(i, j) = E00 + di*(i - i0) + dj*(j - j0) (mod 2^64), the inner
guard is folded into the outer one: the inner span is computed once before
the outer loop, rt_range2_ok / rt_lrange2_ok check E over the iteration box
(an affine function takes its extremes at the corners; if no corner value
overflows, every value in the box is exact and lies between the smallest and
largest corner), and the outer fast copy runs the inner fast copy directly.
The outer checked copy keeps the inner loop's own versioning, so a failing
guard still ends in the exact fault.

Offsets the body computes from the counter (``int64_t a0 = (r + 4*q) * ld;``,
defined once at the top of the body in 64-bit arithmetic) are expanded into
the indices that use them, so those stay affine.

Beyond boxes, interval guards (see "Nest guards" below) cover a whole
function body at entry, or a nest of depth >= 2: triangular bounds, bounds
computed in the body (min/max ternaries), accesses narrowed by a condition.
Order: whole body first; if it cannot be bounded, nests top-down; then the
per-loop versioning above, in every copy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pycparser import c_ast, c_generator

from ..capabilities import abi
from .astutil import (
    INDEX_BUILTINS,
    INT_TYPES,
    callees,
    cast_i64,
    int_literal,
    int_types,
    is_int64,
    node_fields,
    pure_expr,
    reaching,
    write_counts,
)
from .dialect_api import MATH_FUNCS, TILE_FUNCS, WARP_FUNCS
from .lines import line_hull

_ACCESS_PREFIX = ("cap_load_", "cap_store_")
_ELEM = abi.SCALAR_SUFFIXES
ELEM_SIZE = abi.ELEM_SIZE


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


def entry_polls(ast: c_ast.FileAST) -> frozenset[str]:
    """The source's functions that poll at their entry: every one that calls a
    same-source function.  Both lowerings use this rule.

    Liveness: the work between two pollchecks is bounded by the source, for every
    accepted kernel, whatever its loops.  Loops poll at every back-edge, except
    quiet ones (below), whose bodies call no helper and which run fewer than
    SHORT_TRIP iterations (a quiet nest: OUTER_SHORT_TRIP x INNER_CONST_TRIP)
    before a poll.  Take a stretch of execution with no poll in it:
    * no function that calls another is entered in it (it would poll at entry),
      so every call made in the stretch is of a call-free function, which makes
      one forward pass over its body (its own polling loops end the stretch);
    * no frame goes round a polling loop in it, so each frame runs each of its
      statements, call sites included, at most once (quiet loops aside);
    * the frames on the stack at its start are at most the call graph's depth
      (no recursion).
    So a stretch runs at most depth x (a body, plus one call-free body per call
    site in it) statements, each a bounded amount of work (a quiet loop at most
    2^20 iterations, a tile copy one row of a fixed-size local array between its
    per-row polls).  A call-free function needs no entry poll: its one pass is
    counted in its caller's stretch.  Polling at every function's entry would be
    as sound and polls more: 2.2-2.7x as many entry polls on the QR kernels
    (e.g. 1299 -> 3457 per n=1024 factorisation), neither measurable in time.
    Without entry polls a DAG of loop-free helpers (h1 calls h0 twice, h2 calls
    h1 twice, ...) ran 2^depth calls with no poll: no timeout, cancel or
    collector handshake was answered.  On the GPU a poll is one tick of the
    thread's amortised counter (the record is read every 1024th tick), so the
    bound there is 1024 times this one.
    """
    funcs = {e.decl.name: e.body for e in ast.ext if isinstance(e, c_ast.FuncDef)}
    return frozenset(n for n, body in funcs.items() if callees(body, set(funcs)))


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
    #: cover guards computed by functions of their own (GPU, see _outline): the
    #: lowering emits them, not inlined, before the function that calls them
    guards: list[c_ast.FuncDef] = field(default_factory=list)

#: A loop nest polls once after itself when the outer loop has fewer than
#: OUTER_SHORT_TRIP iterations and every inner loop at most INNER_CONST_TRIP (a
#: constant trip count, or a folded loop's span, tested before the nest runs):
#: at most 2^20 iterations of each inner loop between pollchecks.
OUTER_SHORT_TRIP = 1 << 12
INNER_CONST_TRIP = 256

#: Trip count under which the fast copy polls once after the loop.
SHORT_TRIP = 1 << 16


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


@dataclass
class _Ctx:
    """Per-function state of one hoisting pass (no module globals: compiles may run
    on several threads)."""

    arrays: dict[str, tuple[int, ...]]  # local array name -> dims (from the verifier)
    types: dict[str, int] = field(default_factory=dict)  # integer variable -> bits (0: mixed)
    counter: int = 0                    # numbers the guard variables __h<k>_*
    table: Versioning = field(default_factory=Versioning)
    inner: dict[int, _Inner] = field(default_factory=dict)  # versioned innermost loops by id
    waits: frozenset[str] = frozenset()  # helpers that reach a barrier (waiting_helpers)
    one_thread_blocks: bool = False      # barriers never wait (see hoist_function)
    barriers: frozenset[str] = BARRIERS  # the lane's barrier calls
    warp_vote: str | None = None         # the lane's warp vote (GPU_WARP_VOTE), if any
    block_vote: str | None = None        # the lane's block vote (GPU_BLOCK_VOTE), if any
    name: str = ""                       # the function's name (its outlined guards')
    decl_types: dict[str, list[str]] = field(default_factory=dict)  # scalar name -> type


def hoist_function(func: c_ast.FuncDef, arrays: dict[str, tuple[int, ...]],
                   waits: frozenset[str] = frozenset(), one_thread_blocks: bool = False,
                   barriers: frozenset[str] = BARRIERS, warp_vote: str | None = None,
                   block_vote: str | None = None) -> Versioning:
    """Version every eligible loop of ``func`` in place; return the side table.

    ``arrays`` maps the function's local arrays to their dimensions
    (``VerifiedSource.local_arrays[name]``).  Both lowerings consume the
    result: covered accesses are UncheckedCall/UncheckedRef nodes, quiet
    loops are Quiet* nodes followed by a PollPoint, guards are calls of the
    runtime's rt_range_ok/rt_lrange_ok/rt_loop_span (defined in cap_abi.h
    for both lanes).  ``waits``: the source's :func:`waiting_helpers`; ``barriers``:
    the lane's barrier calls (BARRIERS, GPU_BARRIERS); ``warp_vote``: the lane's
    warp vote (GPU_WARP_VOTE), which admits loops with warp collectives;
    ``block_vote``: the lane's block vote (GPU_BLOCK_VOTE), which admits loops with
    block barriers behind one cover guard.
    ``one_thread_blocks``: the lane runs one thread per block (the CPU), so a
    barrier never waits for another thread and a whole-body guard may enclose
    tile copies.  (On the GPU a per-thread guard around a barrier would split
    the block; one taken by the whole block at entry, __syncthreads_and, was
    measured slower than none: bench/results/gpuprof-wholebody-guard-2026-12-03.txt.)
    """
    ctx = _Ctx(arrays, int_types(func), waits=waits, one_thread_blocks=one_thread_blocks,
               barriers=barriers, warp_vote=warp_vote, block_vote=block_vote,
               name=func.decl.name, decl_types=_scalar_types(func))
    whole = _body_version(func.body, ctx)
    if whole is not None:
        func.body, checked = whole
        _nest_walk(checked, ctx)  # the checked copy: nests and loops as usual
    else:
        _nest_walk(func.body, ctx)
    _walk(func.body, ctx)
    return ctx.table


def _walk(node: c_ast.Node, ctx: _Ctx, in_loop: bool = False) -> None:
    """Post-order: inner loops are versioned before the loops around them.
    ``in_loop``: node sits inside a loop of the function."""
    inside = in_loop or isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile))
    for attr, val in node_fields(node):
        if isinstance(val, list):
            for idx, item in enumerate(val):
                if isinstance(item, c_ast.Node):
                    _walk(item, ctx, inside)
                if isinstance(item, c_ast.For):
                    new = _maybe_version(item, ctx, inside)
                    if new is not None:
                        val[idx] = new
        elif isinstance(val, c_ast.Node):
            _walk(val, ctx, inside)
            if isinstance(val, c_ast.For):
                new = _maybe_version(val, ctx, inside)
                if new is not None:
                    setattr(node, attr, new)


def _maybe_version(loop: c_ast.For, ctx: _Ctx, nested: bool = False) -> c_ast.Node | None:
    """Version innermost loops and the loops directly around them (depth <= 1).

    Deeper nests are left alone: each level doubles the code.  ``nested``: the
    loop sits inside another loop of the function.
    """
    depth = _loop_depth(loop.stmt)
    # with a warp vote, warp collectives do not stop versioning (block barriers do)
    blocking = ctx.barriers - WARP_FUNCS if ctx.warp_vote else ctx.barriers
    if depth > 1 or _has_barrier(loop.stmt, ctx.waits, blocking):
        return None
    return _version(loop, ctx, innermost=depth == 0, nested=nested)


def _has_barrier(node: c_ast.Node | None, waits: frozenset[str] = frozenset(),
                 barriers: frozenset[str] = BARRIERS) -> bool:
    """Does ``node`` call a barrier, or a helper in ``waits`` (one that reaches one)?"""
    if node is None:
        return False
    if isinstance(node, c_ast.FuncCall) and isinstance(node.name, c_ast.ID) \
            and (node.name.name in barriers or node.name.name in waits):
        return True
    return any(_has_barrier(c, waits, barriers) for _name, c in node.children())


def waiting_helpers(ast: c_ast.FileAST, barriers: frozenset[str] = BARRIERS) -> frozenset[str]:
    """The source's functions that reach a barrier, directly or through other helpers:
    a call of one counts as a barrier for versioning."""
    funcs = {e.decl.name: e.body for e in ast.ext if isinstance(e, c_ast.FuncDef)}
    graph = {n: callees(body, set(funcs)) for n, body in funcs.items()}
    return frozenset(reaching(graph, {n for n, body in funcs.items()
                                      if _has_barrier(body, barriers=barriers)}))


def _loop_depth(node: c_ast.Node | None) -> int:
    """Deepest loop nesting under node (0: no loop)."""
    if node is None:
        return 0
    best = 0
    for _attr, val in node_fields(node):
        items = val if isinstance(val, list) else [val]
        for item in items:
            if isinstance(item, (c_ast.For, c_ast.While, c_ast.DoWhile)):
                best = max(best, 1 + _loop_depth(item.stmt))
            elif isinstance(item, c_ast.Node):
                best = max(best, _loop_depth(item))
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


def _ids(node: c_ast.Node | None) -> set[str]:
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


def _assigned(node: c_ast.Node | None) -> set[str]:
    """Names assigned (=, op=, ++, --, through &) or declared anywhere under node:
    astutil.write_counts, the one analysis of names written (it relies on the
    verifier admitting only names and local-array elements as write targets)."""
    return set() if node is None else set(write_counts(node))


def _subst(expr: c_ast.Node, var: str, repl: c_ast.Node) -> c_ast.Node:
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


def _affine(expr: c_ast.Node, var: str) -> bool:
    """True if expr is a*var + b with a, b free of var (no /, %, calls on var)."""
    return _affine_in(expr, {var})


def _affine_in(expr: c_ast.Node, vs: set[str]) -> bool:
    """True if expr is affine in the variables vs jointly: c + sum a_k*v_k with
    coefficients free of vs (so no v*w product of two of them)."""
    if not (vs & _ids(expr)):
        return True
    if isinstance(expr, c_ast.ID):
        return True
    if isinstance(expr, c_ast.BinaryOp):
        if expr.op in ("+", "-"):
            return _affine_in(expr.left, vs) and _affine_in(expr.right, vs)
        if expr.op == "*":
            lv, rv = bool(vs & _ids(expr.left)), bool(vs & _ids(expr.right))
            if lv and rv:
                return False
            return _affine_in(expr.left if lv else expr.right, vs)
        return False
    if isinstance(expr, c_ast.UnaryOp) and expr.op in ("-", "+"):
        return _affine_in(expr.expr, vs)
    if isinstance(expr, c_ast.Cast):
        tn = getattr(getattr(expr.to_type, "type", None), "type", None)
        names = getattr(tn, "names", [])
        return names in (["int64_t"], ["long"]) and _affine_in(expr.expr, vs)
    return False


def _counter_decl(loop: c_ast.For) -> tuple[c_ast.Decl, int] | None:
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
    counter = _counter_decl(loop)
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
        if step is None and pure_expr(nxt.rvalue) and var not in _ids(nxt.rvalue):
            # an invariant step (e.g. a thread stride): the guard requires 0 < step
            return var, bits, d.init, cond.right, cond.op, nxt.rvalue
    if not step or step <= 0 or step > 1 << 20:
        return None
    if not (pure_expr(d.init) and pure_expr(cond.right)):
        return None
    return var, bits, d.init, cond.right, cond.op, step


def _step_node(step: int | c_ast.Node) -> c_ast.Node:
    return _const(step) if isinstance(step, int) else copy.deepcopy(step)


def _const(v: int) -> c_ast.Constant:
    return c_ast.Constant("int", str(v))


def _decl64(name: str, init: c_ast.Node) -> c_ast.Decl:
    t = c_ast.TypeDecl(name, [], None, c_ast.IdentifierType(["int64_t"]))
    return c_ast.Decl(name, [], [], [], [], t, init, None)


def _version(loop: c_ast.For, ctx: _Ctx, innermost: bool = True, nested: bool = False
             ) -> c_ast.Node | None:
    shape = loop_shape(loop)
    if shape is None or loop.stmt is None:
        return None
    var, bits, a_expr, b_expr, cmp, step = shape
    if not isinstance(step, int) and not (pure_expr(a_expr) and pure_expr(b_expr)):
        return None
    changed = _assigned(loop.stmt)
    step_ids = set() if isinstance(step, int) else _ids(step)
    if var in changed or changed & (_ids(b_expr) | _ids(a_expr) | step_ids):
        return None
    # Offsets the body computes from the counter (int64_t a0 = (r + 4*q) * ld;)
    # are expanded into the indices that use them, so those stay affine in var.
    defs = _body_defs(loop.stmt, changed, ctx.types)
    narrow = {var} if bits == 32 else set()
    # Candidate accesses anywhere in the body (conditional ones too: the guard
    # only selects the copy, it never faults).
    accesses: list[tuple[c_ast.FuncCall, c_ast.Node]] = []  # (access, expanded index)

    class V(c_ast.NodeVisitor):
        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            self.generic_visit(n)
            if not (isinstance(n.name, c_ast.ID) and n.name.name.startswith(_ACCESS_PREFIX)):
                return
            t = n.name.name.rsplit("_", 1)[1]
            if t not in _ELEM or n.args is None or len(n.args.exprs) < 2:
                return
            cap, idx = n.args.exprs[0], n.args.exprs[1]
            if not isinstance(cap, c_ast.ID) or cap.name in changed or not pure_expr(idx):
                return
            idx = _expand(idx, defs)
            if not _affine(idx, var) or (_ids(idx) - {var}) & changed:
                return
            if _narrow_parts(idx, narrow, ctx.types) is None:
                return
            accesses.append((n, idx))

        def visit_For(self, n: c_ast.Node) -> None:
            return None  # accesses in inner loops belong to their own versioning

        visit_While = visit_DoWhile = visit_For
        visit_QuietFor = visit_QuietWhile = visit_QuietDoWhile = visit_For

    V().visit(loop.stmt)
    # Local-array subscripts: a[E1][E2]... where every E is pure and affine.
    subs: list[tuple[c_ast.ArrayRef, c_ast.Node, int]] = []

    class A(c_ast.NodeVisitor):
        def visit_ArrayRef(self, n: c_ast.ArrayRef) -> None:
            cur, chain = array_chain(n)
            dims = ctx.arrays.get(cur.name) if isinstance(cur, c_ast.ID) else None
            for depth, ref in enumerate(chain):
                self.visit(ref.subscript)
                idx = ref.subscript
                if not (dims is not None and depth < len(dims) and cur.name not in changed
                        and pure_expr(idx)) or isinstance(ref, UncheckedRef):
                    continue  # (UncheckedRef: proved in range by runtime/ranges.py)
                idx = _expand(idx, defs)
                if (_affine(idx, var) and not ((_ids(idx) - {var}) & changed)
                        and _narrow_parts(idx, narrow, ctx.types) is not None):
                    subs.append((ref, idx, dims[depth]))

        def visit_For(self, n: c_ast.Node) -> None:
            return None

        visit_While = visit_DoWhile = visit_For
        visit_QuietFor = visit_QuietWhile = visit_QuietDoWhile = visit_For

    A().visit(loop.stmt)
    folds = [] if innermost else _foldable(loop.stmt, var, bits, changed, defs, ctx)
    if not innermost and not accesses and not subs and not folds:
        return None
    # Even with nothing to hoist, a countable innermost loop gets the
    # short-trip copy without per-iteration pollchecks.
    ctx.counter += 1
    k = ctx.counter
    span = _Span(f"__h{k}_a", f"__h{k}_b", f"__h{k}_span", f"__h{k}_ok", bits, a_expr, b_expr,
                 cmp, step)
    # The checked copy is taken before any access is renamed, so it keeps
    # whatever the inner loops' own versioning did.
    slow = copy.deepcopy(loop)
    guard_terms: list[c_ast.Node] = []
    covered: list[c_ast.Node] = []
    terms: list[_Term] = []
    seen: set[str] = set()
    gen = c_generator.CGenerator()
    for n, idx in accesses:
        name = n.name.name
        store = 1 if name.startswith("cap_store_") else 0
        t = name.rsplit("_", 1)[1]
        cap = n.args.exprs[0]
        key = f"{store}|{t}|{cap.name}|{gen.visit(idx)}"
        if key not in seen:
            seen.add(key)
            terms.append(_Term(copy.deepcopy(idx), cap.name, ELEM_SIZE[t], store))
        n.__class__ = UncheckedCall
        covered.append(n)
    for ref, idx, dim in subs:
        terms.append(_Term(copy.deepcopy(idx), None, dim, 0))
        ref.__class__ = UncheckedRef
        covered.append(ref)
    guard_terms = _range_terms(terms, var, span, ctx.types)
    wrap_terms = [_irange_term(part, var, span) for term in terms
                  for part in _narrow_parts(term.idx, narrow, ctx.types)]
    # Fast copy only if bounds and indices are signed integers (so the loop
    # runs exactly over [A, last]) and the span is computable (it is set by
    # rt_loop_span in its own statement, before any guard reads it), and every
    # guard holds.  The guards are joined with '&', not '&&': they are pure
    # and cheap, and evaluated unconditionally gcc can hoist the ones that do
    # not change in an enclosing loop.  A loop that does not run has span 0;
    # if a guard fails for it, the checked copy runs zero iterations.
    is_int = span.is_int()
    for term in terms:
        is_int = c_ast.BinaryOp("&&", is_int, _is_int(_corner(term.idx, var, span)))
    cond: c_ast.Node = c_ast.ID(span.hok)
    for g in guard_terms + wrap_terms:
        cond = c_ast.BinaryOp("&", cond, g)
    # Inner loops folded into this loop's guard (bounds invariant here): their
    # span is computed once before this loop, one box check per access covers
    # every iteration of the nest, and this loop's fast copy runs their fast
    # copies with no guard of their own.  Their checked copies stay in `slow`.
    hoisted: list[c_ast.Node] = []
    for box, inner, inner_terms in folds:
        hoisted += inner.span.decls(inner.span.is_int())
        box_ok: c_ast.Node = c_ast.ID(inner.span.hok)
        inner_ok: c_ast.Node = _const(1)
        box_narrow = narrow | ({inner.var} if inner.span.bits == 32 else set())
        for g in _box_terms(inner_terms, var, span, inner.var, inner.span, ctx.types):
            guard_terms.append(g)
            inner_ok = c_ast.BinaryOp("&", inner_ok, g)
        for term in inner_terms:
            box_ok = c_ast.BinaryOp("&&", box_ok, _is_int(_corner(term.idx, var, span, inner.var,
                                                                   inner.span)))
            for part in _narrow_parts(term.idx, box_narrow, ctx.types) or []:
                inner_ok = c_ast.BinaryOp("&", inner_ok, _ibox_term(part, var, span, inner.var,
                                                                  inner.span))
        # an inner loop that never runs makes no access
        box_ok = c_ast.BinaryOp("&&", box_ok, c_ast.BinaryOp(
            "||", c_ast.UnaryOp("!", inner.span.runs()), inner_ok))
        cond = c_ast.BinaryOp("&", cond, box_ok)
        _replace(loop, box, inner.fast)
        covered += inner.covered
    if ctx.warp_vote and _has_barrier(loop.stmt, barriers=WARP_FUNCS):
        # every lane takes the copy the whole warp voted for (module doc)
        cond = c_ast.FuncCall(c_ast.ID(ctx.warp_vote), c_ast.ExprList([cond]))
    fast = loop
    fast_block: c_ast.Node = fast
    leaf = innermost and _leaf_body(loop.stmt)
    if innermost and not leaf and not accesses and not subs:
        return None  # nothing to hoist, and the pollchecks must stay (see below)
    if leaf:
        # A short fast loop (< SHORT_TRIP iterations) answers handshakes once
        # after it instead of at every back-edge: a call in the loop body would
        # stop gcc from vectorising it.  Latency stays bounded.  Bodies that
        # call anything able to wait for the collector (allocation, cap tables,
        # helpers) keep the per-iteration pollcheck, or a handshake could wait
        # on a thread that waits on the collector.
        quiet = copy.deepcopy(loop)
        _mark_nopoll(quiet)  # structurally, so enclosing copies keep it
        # Inside another loop the short loop needs no poll after itself: the
        # loop around it polls every iteration (or, if quiet too, after itself),
        # so each quiet loop of its body runs < SHORT_TRIP iterations between
        # two polls (on the GPU a loop's poll is counted: x1024).
        quiet_block = c_ast.Compound([quiet]) if nested else _then_poll(quiet)
        trips = _const_trips(a_expr, b_expr, cmp, step)
        if trips is not None and trips < SHORT_TRIP:
            # constant short loop: the polling copy could never run
            fast_block = quiet_block
        else:
            fast_block = c_ast.If(_span_below(span.hs, step, SHORT_TRIP), quiet_block, fast)
    elif not innermost and (inner_short := _short_nest(loop.stmt, folds)) is not None:
        # Few outer iterations over short inner loops (constant trip counts, or
        # folded loops whose span, known before the nest, is short this time):
        # poll once after the whole nest, so gcc may unroll-and-jam it like raw code.
        quiet = copy.deepcopy(fast)
        _silence(quiet)
        short: c_ast.Node = _span_below(span.hs, step, OUTER_SHORT_TRIP)
        for term in inner_short:
            short = c_ast.BinaryOp("&&", short, term)
        fast_block = c_ast.If(short, _then_poll(quiet), fast)
    ctx.table.loops.append(LoopPlan(loop.coord.line if loop.coord else 0, guard_terms, covered,
                                    fast_block is not fast))
    fast_then = c_ast.Compound([fast_block])
    guarded = Versioned(cond, fast_then, slow, loop.coord)
    out = c_ast.Compound(span.decls(is_int) + hoisted + [guarded])
    if innermost:
        ctx.inner[id(out)] = _Inner(out, var, span, terms, fast_then, covered)
    return out


@dataclass
class _Term:
    """One range fact a guard checks: index expression, cap (None: a local array
    subscript), element size (or the array dimension), store or load."""

    idx: c_ast.Node
    cap: str | None
    size: int
    store: int


@dataclass
class _Span:
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
        out: c_ast.Node = c_ast.BinaryOp("&&", _is_int(self.a_expr), _is_int(self.b_expr))
        if not isinstance(self.step, int):
            # tested before rt_loop_span divides by it
            out = c_ast.BinaryOp("&&", out, c_ast.BinaryOp("&&", _is_int(self.step), c_ast.BinaryOp(
                "&&", c_ast.BinaryOp(">", _step_node(self.step), _const(0)),
                c_ast.BinaryOp("<=", _step_node(self.step), _const(1 << 20)))))
        return out

    def decls(self, is_int: c_ast.Node) -> list[c_ast.Node]:
        span_fn = "rt_loop_span" if self.bits == 64 else "rt_loop_span32"
        span_ok = c_ast.FuncCall(c_ast.ID(span_fn), c_ast.ExprList([
            c_ast.ID(self.h0), c_ast.ID(self.hb), _step_node(self.step),
            _const(1 if self.cmp == "<=" else 0), c_ast.UnaryOp("&", c_ast.ID(self.hs))]))
        ok_init = c_ast.BinaryOp("&&", is_int,
                                 c_ast.BinaryOp("||", c_ast.UnaryOp("!", self.runs()), span_ok))
        return [_decl64(self.h0, copy.deepcopy(self.a_expr)),
                _decl64(self.hb, copy.deepcopy(self.b_expr)),
                _decl64(self.hs, _const(0)),
                _decl64(self.hok, ok_init)]


@dataclass
class _Inner:
    """A versioned innermost loop, as an enclosing loop may fold it."""

    node: c_ast.Compound        # what _version returned (kept alive: ctx.inner is keyed by id)
    var: str
    span: _Span
    terms: list[_Term]
    fast: c_ast.Compound        # its fast copy (unchecked accesses, polling as decided)
    covered: list[c_ast.Node]


def _coef(expr: c_ast.Node, var: str) -> c_ast.Node:
    """The coefficient of var in an expression :func:`_affine` accepts, in int64
    arithmetic: equal mod 2^64 to the guard's E(first + 1) - E(first), where the
    counter is an int64 (every subexpression holding it is int64; one without it
    keeps its own type, as in E), without evaluating E twice."""
    if var not in _ids(expr):
        return _const(0)
    if isinstance(expr, c_ast.ID):
        return cast_i64(_const(1))
    if isinstance(expr, c_ast.BinaryOp) and expr.op in ("+", "-"):
        left, right = _coef(expr.left, var), _coef(expr.right, var)
        if _is_zero(right):
            return left
        if _is_zero(left):
            return right if expr.op == "+" else c_ast.UnaryOp("-", right)
        return c_ast.BinaryOp(expr.op, left, right)
    if isinstance(expr, c_ast.BinaryOp) and expr.op == "*":
        on_left = var in _ids(expr.left)
        inner = _coef(expr.left if on_left else expr.right, var)
        other = copy.deepcopy(expr.right if on_left else expr.left)
        if _is_zero(inner):
            return inner
        if _is_unit(inner):  # (int64_t)1 * x: x promoted
            return cast_i64(other)
        return c_ast.BinaryOp("*", inner, other) if on_left else c_ast.BinaryOp("*", other, inner)
    if isinstance(expr, c_ast.UnaryOp):
        inner = _coef(expr.expr, var)
        return c_ast.UnaryOp("-", inner) if expr.op == "-" and not _is_zero(inner) else inner
    if isinstance(expr, c_ast.Cast):  # to int64_t (_affine_in): the inner part is int64 already
        return _coef(expr.expr, var)
    raise ValueError(f"not affine in {var}: {type(expr).__name__}")


def _is_zero(node: c_ast.Node) -> bool:
    return int_literal(node) == 0


def _is_unit(node: c_ast.Node) -> bool:
    return isinstance(node, c_ast.Cast) and int_literal(node.expr) == 1


def _corner(idx: c_ast.Node, var: str, span: _Span, ivar: str | None = None,
            ispan: _Span | None = None) -> c_ast.Node:
    """The index at the first iteration (of the nest, with an inner counter)."""
    e0 = _subst(idx, var, c_ast.ID(span.h0))
    return e0 if ivar is None or ispan is None else _subst(e0, ivar, c_ast.ID(ispan.h0))


def _hull(firsts: list[c_ast.Node]) -> tuple[c_ast.Node, c_ast.Node]:
    """rt_min64 / rt_max64 chains over the first indices of a group."""
    lo, hi = firsts[0], copy.deepcopy(firsts[0])
    for e in firsts[1:]:
        lo = c_ast.FuncCall(c_ast.ID("rt_min64"), c_ast.ExprList([lo, e]))
        hi = c_ast.FuncCall(c_ast.ID("rt_max64"), c_ast.ExprList([hi, copy.deepcopy(e)]))
    return lo, hi


def _groups(terms: list[_Term], strides: list[tuple[c_ast.Node, ...]]
            ) -> list[tuple[_Term, tuple[c_ast.Node, ...], list[int]]]:
    """Terms that differ only in their first index: same cap (or local array),
    element size, access and strides.  Their index sets are translates of one
    another, so the hull [min first, max first] + stride * [0, span] holds them
    all, and it is in range exactly when each is (the in-range indices of an
    object form an interval): one check per group, with the same answer."""
    gen = c_generator.CGenerator()
    out: dict[str, tuple[_Term, tuple[c_ast.Node, ...], list[int]]] = {}
    seen: set[str] = set()
    for k, (term, d) in enumerate(zip(terms, strides, strict=True)):
        key = f"{term.cap}|{term.size}|{term.store}|" + "|".join(gen.visit(x) for x in d)
        index = gen.visit(term.idx)
        if key + "|" + index in seen:
            continue  # the same index again (a local array read and written back)
        seen.add(key + "|" + index)
        out.setdefault(key, (term, d, []))[2].append(k)
    return list(out.values())


def _range_terms(terms: list[_Term], var: str, span: _Span, types: dict[str, int]
                 ) -> list[c_ast.Node]:
    """One range check per group of terms (:func:`_groups`) over [first, first + span]:
    rt_range_ok / rt_lrange_ok for a single term, the *_hull_ok forms for more."""
    strides = [(_coef(t.idx, var),) for t in terms]
    return [_group_check("range", term, [_corner(terms[k].idx, var, span) for k in members],
                         [copy.deepcopy(d), c_ast.ID(span.hs)], types)
            for term, (d,), members in _groups(terms, strides)]


def _box_terms(terms: list[_Term], var: str, span: _Span, ivar: str, ispan: _Span,
               types: dict[str, int]) -> list[c_ast.Node]:
    """rt_range2_ok/rt_lrange2_ok (rt_*range2_hull_ok for a group) over the nest's
    iteration box: the index at the first corner and its strides along each
    counter (exact for an index affine in both: E(i, j) = E00 + di*(i - i0) +
    dj*(j - j0) mod 2^64)."""
    strides = [(_coef(t.idx, var), _coef(t.idx, ivar)) for t in terms]
    return [_group_check("range2", term,
                         [_corner(terms[k].idx, var, span, ivar, ispan) for k in members],
                         [copy.deepcopy(di), c_ast.ID(span.hs), copy.deepcopy(dj),
                          c_ast.ID(ispan.hs)], types)
            for term, (di, dj), members in _groups(terms, strides)]


def _group_check(kind: str, term: _Term, firsts: list[c_ast.Node], strides: list[c_ast.Node],
                 types: dict[str, int]) -> c_ast.Node:
    """rt_<kind>_ok (one first index) or rt_<kind>_hull_ok (min and max of several), with
    an l prefix for a local array: (cap,) first(s), strides and spans, size (, store).
    Firsts on a line (runtime/lines.py) enter the hull by their two extremes."""
    firsts, conds = line_hull(firsts, types) if len(firsts) > 1 else (firsts, [])
    name, lead = (f"{kind}_ok", firsts) if len(firsts) == 1 else \
        (f"{kind}_hull_ok", list(_hull(firsts)))
    args = lead + strides + [_const(term.size)]
    if term.cap is None:
        out: c_ast.Node = c_ast.FuncCall(c_ast.ID("rt_l" + name), c_ast.ExprList(args))
    else:
        out = c_ast.FuncCall(c_ast.ID("rt_" + name), c_ast.ExprList(
            [c_ast.ID(term.cap)] + args + [_const(term.store)]))
    for cond in conds:
        out = c_ast.BinaryOp("&", cond, out)
    return out


def _irange_term(part: c_ast.Node, var: str, span: _Span) -> c_ast.FuncCall:
    """rt_irange_ok for an int part of an index over [first, first + span]."""
    return c_ast.FuncCall(c_ast.ID("rt_irange_ok"), c_ast.ExprList(
        [_corner(part, var, span), _coef(part, var), c_ast.ID(span.hs)]))


def _ibox_term(part: c_ast.Node, var: str, span: _Span, ivar: str, ispan: _Span
               ) -> c_ast.FuncCall:
    """rt_irange2_ok for an int part of an index over a nest's iteration box."""
    return c_ast.FuncCall(c_ast.ID("rt_irange2_ok"), c_ast.ExprList(
        [_corner(part, var, span, ivar, ispan), _coef(part, var), c_ast.ID(span.hs),
         _coef(part, ivar), c_ast.ID(ispan.hs)]))


def _narrow_parts(expr: c_ast.Node, narrow: set[str], types: dict[str, int]
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
        if isinstance(e, c_ast.ID) or not (narrow & _ids(e)):
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


def _foldable(body: c_ast.Node, var: str, bits: int, changed: set[str],
              defs: dict[str, c_ast.Node], ctx: _Ctx
              ) -> list[tuple[c_ast.Compound, _Inner, list[_Term]]]:
    """Versioned innermost loops in ``body`` whose guard can move before the loop
    over ``var``: bounds and step invariant here (so the nest is a box), every
    index affine in both counters jointly, caps, arrays and coefficients not
    assigned in ``body`` (after expanding the body's offset definitions ``defs``,
    which the inner loop sees as invariants)."""
    out: list[tuple[c_ast.Compound, _Inner, list[_Term]]] = []

    def invariant(node: c_ast.Node | int) -> bool:
        if isinstance(node, int):
            return True
        ids = _ids(node)
        return var not in ids and not (ids & changed)

    def visit(node: c_ast.Node) -> None:
        inner = ctx.inner.get(id(node))
        if inner is not None and inner.node is node:
            sp = inner.span
            terms = [_Term(_expand(t.idx, defs), t.cap, t.size, t.store) for t in inner.terms]
            # (distinct counters: the verifier refuses shadowing, E(i, j) relies on it)
            narrow = {v for v, b in ((var, bits), (inner.var, sp.bits)) if b == 32}
            if (inner.var != var and invariant(sp.a_expr) and invariant(sp.b_expr)
                    and invariant(sp.step)
                    and all(_foldable_term(t, var, inner.var, changed)
                            and _narrow_parts(t.idx, narrow, ctx.types) is not None
                            for t in terms)):
                out.append((node, inner, terms))
            return
        if isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)):
            return  # an unversioned inner loop: its accesses are checked in place
        for _attr, val in node_fields(node):
            for item in (val if isinstance(val, list) else [val]):
                if isinstance(item, c_ast.Node):
                    visit(item)

    visit(body)
    return out


def _foldable_term(term: _Term, var: str, ivar: str, changed: set[str]) -> bool:
    if term.cap is not None and term.cap in changed:
        return False
    return _affine_in(term.idx, {var, ivar}) and not ((_ids(term.idx) - {var, ivar}) & changed)


def _exact64(expr: c_ast.Node, types: dict[str, int]) -> bool:
    """Every operation of expr is done in 64-bit arithmetic, so its wrapping int64
    value is the mathematical value mod 2^64 (an int subexpression would wrap
    mod 2^32 first)."""
    if isinstance(expr, c_ast.Constant):
        v = int_literal(expr)
        return v is not None and -(1 << 31) <= v < (1 << 31)
    if isinstance(expr, c_ast.ID):
        return types.get(expr.name, 0) in (32, 64)
    if isinstance(expr, c_ast.Cast):
        return is_int64(expr, types) and _exact64(expr.expr, types) and (
            is_int64(expr.expr, types) or isinstance(expr.expr, (c_ast.ID, c_ast.Constant)))
    if isinstance(expr, c_ast.BinaryOp) and expr.op in ("+", "-", "*"):
        return (_exact64(expr.left, types) and _exact64(expr.right, types)
                and is_int64(expr, types))
    if isinstance(expr, c_ast.UnaryOp) and expr.op in ("-", "+"):
        return is_int64(expr.expr, types) and _exact64(expr.expr, types)
    return False


def _body_defs(body: c_ast.Node, changed: set[str], types: dict[str, int]
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
        if not (pure_expr(item.init) and _exact64(item.init, types)):
            continue
        init = _expand(item.init, defs)
        if not (_ids(init) & changed):
            defs[item.name] = init
    return defs


def _expand(expr: c_ast.Node, defs: dict[str, c_ast.Node]) -> c_ast.Node:
    """expr with every defined name replaced by its (already expanded) definition."""
    for name in _ids(expr) & set(defs):
        expr = _subst(expr, name, defs[name])
    return expr


def _replace(root: c_ast.Node, old: c_ast.Node, new: c_ast.Node) -> None:
    """Put ``new`` where ``old`` (by identity) is under ``root``."""
    for attr, val in node_fields(root):
        if isinstance(val, list):
            for k, item in enumerate(val):
                if item is old:
                    val[k] = new
                    return
                if isinstance(item, c_ast.Node):
                    _replace(item, old, new)
        elif val is old:
            setattr(root, attr, new)
            return
        elif isinstance(val, c_ast.Node):
            _replace(val, old, new)


def _span_below(hs: str, step: int | c_ast.Node, limit: int) -> c_ast.BinaryOp:
    """span / step < limit: the loop has fewer than limit + 1 iterations."""
    return c_ast.BinaryOp("<", c_ast.BinaryOp("/", c_ast.ID(hs), _step_node(step)),
                          _const(limit))


def _then_poll(quiet: c_ast.Node) -> c_ast.Compound:
    """The quiet copy followed by one pollcheck."""
    return c_ast.Compound([quiet, PollPoint(quiet.coord)])


def _leaf_body(node: c_ast.Node) -> bool:
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


def _short_nest(body: c_ast.Node, folds: list[tuple[c_ast.Compound, _Inner, list[_Term]]]
                ) -> list[c_ast.Node] | None:
    """Whether body is leaf code plus inner for-loops of at most INNER_CONST_TRIP
    iterations each: a constant trip count, or a loop folded into the enclosing
    guard, whose span is computed before the nest.  Returns the run-time
    conditions the folded loops add (span short enough), None if not short."""
    folded: dict[int, _Span] = {}
    for _box, inner, _terms in folds:
        for n in _loops_in(inner.fast):
            folded[id(n)] = inner.span
    conds: list[c_ast.Node] = []
    seen: set[str] = set()
    allowed = {"rt_loop_span", "rt_loop_span32", "rt_lrange_ok", "rt_range_ok", "rt_lrange2_ok",
               "rt_range2_ok", "rt_irange_ok", "rt_irange2_ok", "RT_IS_INT"}

    class V(c_ast.NodeVisitor):
        ok = True

        def visit_While(self, n: c_ast.Node) -> None:
            self.ok = False

        visit_DoWhile = visit_QuietWhile = visit_QuietDoWhile = visit_While

        def visit_For(self, n: c_ast.For) -> None:
            shape = loop_shape(n)
            trips = _const_trips(shape[2], shape[3], shape[4], shape[5]) if shape else None
            sp = folded.get(id(n))
            if sp is not None and trips is None:
                if sp.hs not in seen:
                    seen.add(sp.hs)
                    conds.append(_span_below(sp.hs, sp.step, INNER_CONST_TRIP))
            elif trips is None or trips > INNER_CONST_TRIP:
                self.ok = False
            self.generic_visit(n)

        visit_QuietFor = visit_For

        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            name = n.name.name if isinstance(n.name, c_ast.ID) else ""
            if name not in allowed and not _leaf_body(n):
                self.ok = False
            if n.args is not None:
                self.visit(n.args)

    v = V()
    v.visit(body)
    return conds if v.ok else None


def _loops_in(node: c_ast.Node) -> list[c_ast.Node]:
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


def _silence(node: c_ast.Node) -> None:
    """Drop PollPoints and mark every loop inside as quiet."""

    class V(c_ast.NodeVisitor):
        def generic_visit(self, n: c_ast.Node) -> None:
            for attr, val in node_fields(n):
                if isinstance(val, list):
                    setattr(n, attr, [x for x in val if not isinstance(x, PollPoint)])
                    for x in getattr(n, attr):
                        if isinstance(x, c_ast.Node):
                            self.visit(x)
                elif isinstance(val, c_ast.Node):
                    self.visit(val)
            if isinstance(n, (c_ast.For, c_ast.While, c_ast.DoWhile)):
                _mark_nopoll(n)

    V().visit(node)


def _mark_nopoll(loop: c_ast.Node) -> None:
    cls = _QUIET.get(type(loop))
    if cls is not None:
        loop.__class__ = cls


def _const_int(node: c_ast.Node) -> int | None:
    if isinstance(node, c_ast.Constant):
        return int_literal(node)
    if isinstance(node, c_ast.UnaryOp) and node.op == "-":
        v = _const_int(node.expr)
        return None if v is None else -v
    return None


def _const_trips(a: c_ast.Node, b: c_ast.Node, cmp: str, step: int | c_ast.Node) -> int | None:
    """Trip count of a loop with integer-literal bounds and step, else None."""
    lo, hi = _const_int(a), _const_int(b)
    if lo is None or hi is None or not isinstance(step, int):
        return None
    if cmp == "<=":
        hi += 1
    return max(0, (hi - lo + step - 1) // step)


def _is_int(expr: c_ast.Node) -> c_ast.FuncCall:
    return c_ast.FuncCall(c_ast.ID("RT_IS_INT"), c_ast.ExprList([copy.deepcopy(expr)]))


# ---------------------------------------------------------------------------
# Nest guards: one interval check before a whole loop nest.
#
# The versioning above needs indices affine in the counters and inner bounds
# invariant in the loop around them (a box).  Deeper nests, triangular inner
# bounds (q < p), bounds computed in the body (pe = t < jb ? t : jb) and
# accesses under a condition (if (t < jb) w[t][l] ...) are covered by interval
# arithmetic instead: walking the nest in source order, every integer the
# indices depend on gets an interval [lo, hi] computed once before the nest:
#
#   invariant names      [x, x]   (not assigned anywhere in the nest)
#   for counters         [lo(A), hi(B) - 1] (or hi(B) for <=; downward loops
#                        mirrored); the counter is not assigned in its body
#                        and the guard checks that the last step cannot wrap
#   T x = E;             [lo(E), hi(E)] when x is not assigned again in its scope
#   +, -, *, / by a positive literal, casts, min/max ternaries (t < jb ? t : jb)
#   if (v < E) / c ? :   v narrowed to [lo(v), min(hi(v), hi(E) - 1)] inside;
#                        v + e < E (v - e, e + v) narrows v to E - e, when the
#                        interval of v + e says the sum cannot wrap
#
# Every bound is computed with overflow-checked arithmetic (a bound that
# overflows fails the guard), and a subexpression of int (32-bit) type must stay
# in int range, so the value the nest computes (wrapping arithmetic) is the
# mathematical one and lies in its interval.  An access whose index interval is
# inside the buffer (rt_range_ok at both ends: every index between two
# in-bounds ones is in bounds) or the local array is covered.  All or nothing:
# if any scalar access of the nest cannot be bounded, the nest is not guarded
# here and the loops inside it are considered in turn.  An interval that comes
# out empty belongs to code that never runs (every interval encloses its value
# whenever the code runs): a counter's, or a name narrowed by a condition that
# fails for this thread.  The code after it carries that as a guard variable
# (0 where it cannot run), and its accesses leave the hulls alone there, so a
# thread whose rows end above the matrix is not held to bounds of rows it never
# touches; a hull that stays empty holds.  The fast copy is the
# nest with every access unchecked; the checked copy is the nest as the
# versioning above leaves it, so a failing guard still ends in the exact fault.

_I64_MAX = (1 << 63) - 1
_I64_MIN = -(1 << 63)
_I32_MAX = (1 << 31) - 1
_I32_MIN = -(1 << 31)
_Bound = int | str          # a Python constant or the name of a guard variable
_Ival = tuple[_Bound, _Bound]
#: The environments' entry (no C name) for where their code can run: (r, r), r 1, 0 or
#: a guard variable that is 0 where an interval on the way there came out empty.
_REACH = "#reach"


class _NoBound(Exception):
    """The nest has a scalar access or a counter no interval covers."""


class _NestGuard:
    """Builds the guard of one nest: guard variables, conditions, covered accesses."""

    def __init__(self, loop: c_ast.Node, ctx: _Ctx, k: int):
        self.ctx = ctx
        self.prefix = f"__n{k}_"
        self.count = 0
        self.decls: list[c_ast.Node] = []   # int64_t guard variables, in order
        self.written = _assigned(loop)      # names the nest declares or assigns
        # one hull per buffer (cap, element size, store) or local-array extent: the
        # indices between two in-bounds ones are in bounds, so checking the
        # smallest and the largest of a group is the same as checking each
        self.hulls: dict[tuple, tuple[_Bound, _Bound]] = {}
        self.memo: dict[tuple, _Bound] = {}
        # caps the nest derives once (cap_t M = cap_offset_T(A, e), e one value at
        # the guard): the guard checks their accesses through the same expression
        self.cap_exprs: dict[str, c_ast.Node] = {}
        self.writes = write_counts(loop)

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
                cap_node, self._node(lo), d, _const(1), _const(size), _const(store)]))
        else:
            check = c_ast.FuncCall(c_ast.ID("rt_lrange_ok"), c_ast.ExprList([
                self._node(lo), d, _const(1), _const(key[1])]))
        if isinstance(lo, int) and isinstance(hi, int):
            return _const(1) if lo > hi else check
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
        self.decls.append(_decl64(name, init if init is not None else _const(0)))
        return name

    @staticmethod
    def _node(b: _Bound) -> c_ast.Node:
        if isinstance(b, int):
            if b == _I64_MIN:  # -2^63 has no literal of its own
                return c_ast.BinaryOp("-", c_ast.UnaryOp("-", _const(_I64_MAX)), _const(1))
            return _const(b) if b >= 0 else c_ast.UnaryOp("-", _const(-b))
        return c_ast.ID(b)

    def _ovf(self, fn: str, a: _Bound, b: _Bound) -> _Bound:
        """a op b, the guard failing if it overflows (constants fold here)."""
        if isinstance(a, int) and isinstance(b, int):
            v = {"rt_add_ovf": a + b, "rt_sub_ovf": a - b, "rt_mul_ovf": a * b}[fn]
            if not _I64_MIN <= v <= _I64_MAX:
                raise _NoBound
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
                raise _NoBound
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
                raise _NoBound
            return v, v
        if isinstance(e, c_ast.ID):
            if e.name in env:
                iv = env[e.name]
                if iv is None:
                    raise _NoBound
                return iv
            if e.name in self.written or self.ctx.types.get(e.name, 0) not in (32, 64):
                raise _NoBound
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
            raise _NoBound
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
            nonneg = c_ast.BinaryOp(">=", c_ast.ID(lo), _const(0))
            return (self._new(c_ast.TernaryOp(nonneg, _const(0),
                                              self._node(self._ovf("rt_sub_ovf", 1, c1)))),
                    self._new(c_ast.TernaryOp(copy.deepcopy(nonneg),
                                              self._node(self._pick("<", hi, top)),
                                              self._node(top))))
        if isinstance(e, c_ast.TernaryOp):
            if not pure_expr(e.cond):
                raise _NoBound
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
        raise _NoBound

    def _divisor(self, e: c_ast.Node, env: dict[str, _Ival | None]) -> _Ival:
        """A divisor's interval, positive at the guard: a literal, or bounds the
        guard requires > 0 (one value, or a range: n - j over a loop's columns)."""
        c = int_literal(e)
        if c is not None:
            if c <= 0:
                raise _NoBound
            return c, c
        lo, hi = self.ival(e, env)
        if isinstance(lo, int):
            if lo <= 0:
                raise _NoBound
        else:
            self._require(c_ast.BinaryOp(">", self._node(lo), _const(0)))
        return lo, hi

    def _div(self, b: _Bound, c: _Bound) -> _Bound:
        if isinstance(b, int) and isinstance(c, int):
            return b // c if b >= 0 else -((-b) // c)  # C truncates toward zero
        if ("/", b, c) not in self.memo:
            q = c_ast.BinaryOp("/", self._node(b), self._node(c))
            if not isinstance(c, int):  # guard variables are computed before the
                # conditions are tested: never divide by a divisor they refuse
                q = c_ast.TernaryOp(c_ast.BinaryOp(">", self._node(c), _const(0)), q, _const(0))
            self.memo[("/", b, c)] = self._new(q)
        return self.memo[("/", b, c)]

    def _mod(self, b: _Bound, c: _Bound) -> _Bound:
        if isinstance(b, int) and isinstance(c, int):
            return b - c * self._div(b, c)
        if ("%", b, c) not in self.memo:
            r = c_ast.BinaryOp("%", self._node(b), self._node(c))
            if not isinstance(c, int):  # as in _div
                r = c_ast.TernaryOp(c_ast.BinaryOp(">", self._node(c), _const(0)), r, _const(0))
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
            except _NoBound:
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
            raise _NoBound
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
                and not any(d.name in _assigned(r) for r in rest)):
            # (ival accepts only side-effect-free arithmetic and guards its own
            # divisions, so the init need not be safe to evaluate early itself)
            try:
                iv = self.ival(d.init, env)
                if INT_TYPES[" ".join(d.type.type.names)] == 32:
                    self._in_int(iv)
                env[d.name] = iv
            except _NoBound:
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
        except _NoBound:
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
        shape = loop_shape(f) or _down_shape(f)
        if shape is None or f.stmt is None:
            raise _NoBound
        var, bits, a_expr, b_expr, cmp, step = shape
        if var in _assigned(f.stmt):
            raise _NoBound
        s: _Bound
        if isinstance(step, int):
            s = step
        elif pure_expr(step) and not (_ids(step) & self.written):
            s = self._new(copy.deepcopy(step))
        else:
            # a step the nest computes (int64_t nw = P / 32;), one value or a range
            # (a column's row groups): the counter's interval does not depend on it,
            # the guard requires it positive and checks the last step with its top
            lo_s, s = self.ival(step, env)
            if lo_s != s:
                if isinstance(lo_s, int):
                    if lo_s <= 0:
                        raise _NoBound
                else:
                    self._require(c_ast.BinaryOp(">", c_ast.ID(lo_s), _const(0)))
        if isinstance(s, int):
            if not 0 < s <= 1 << 20:
                raise _NoBound
        else:
            self._require(c_ast.BinaryOp("&&", c_ast.BinaryOp(">", c_ast.ID(s), _const(0)),
                                         c_ast.BinaryOp("<=", c_ast.ID(s), _const(1 << 20))))
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
        body = dict(env)
        body[var] = iv
        self._narrowed(body, *iv)  # an empty counter interval: the body never runs
        self.stmt(f.stmt, body)

    def _le(self, b: _Bound, limit: int) -> None:
        if isinstance(b, int):
            if b > limit:
                raise _NoBound
        else:
            self._require(c_ast.BinaryOp("<=", c_ast.ID(b), self._node(limit)))

    def _ge(self, b: _Bound, limit: int) -> None:
        if isinstance(b, int):
            if b < limit:
                raise _NoBound
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
                and e.name.name.startswith(_ACCESS_PREFIX):
            t = e.name.name.rsplit("_", 1)[1]
            if t in _ELEM and e.args is not None and len(e.args.exprs) >= 2:
                for a in e.args.exprs[1:]:
                    self.expr(a, env)
                cap, idx = e.args.exprs[0], e.args.exprs[1]
                # (idx need not be pure_expr: ival accepts only side-effect-free
                # arithmetic and guards its own divisions)
                if not isinstance(cap, c_ast.ID) or (
                        cap.name in self.written and cap.name not in self.cap_exprs):
                    raise _NoBound
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


def _down_shape(loop: c_ast.For
                ) -> tuple[str, int, c_ast.Node, c_ast.Node, str, int] | None:
    """(var, bits, A, B, cmp, step) of ``for (T i = A; i >= B (> B); i-- / i -= c)``."""
    counter = _counter_decl(loop)
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


def _nest_walk(node: c_ast.Node, ctx: _Ctx) -> None:
    """Top-down: guard the outermost nests (depth >= 2) that interval bounds cover;
    the loops inside a nest that is not covered are tried in turn."""
    for attr, val in node_fields(node):
        items = val if isinstance(val, list) else [val]
        for idx, item in enumerate(items):
            if not isinstance(item, c_ast.Node):
                continue
            if isinstance(item, c_ast.For) and not isinstance(item, QUIET_LOOPS):
                new = _nest_version(item, ctx) or _cover_version(item, ctx)
                if new is not None:
                    if isinstance(val, list):
                        val[idx] = new
                    else:
                        setattr(node, attr, new)
                    continue
            _nest_walk(item, ctx)


def _nest_version(loop: c_ast.For, ctx: _Ctx) -> c_ast.Node | None:
    # the loop and at least two levels inside it
    if _levels(loop) < 3 or _has_barrier(loop.stmt, ctx.waits, ctx.barriers):
        return None
    return _guarded(loop, [], ctx)


def _body_version(body: c_ast.Compound, ctx: _Ctx) -> tuple[c_ast.Compound, c_ast.Node] | None:
    """A function body with loops whose every access interval bounds cover gets
    one guard at entry (helpers called once per column: their loops are short).
    The local arrays it declares at its top level move before the guard, so the
    two copies share them.  Returns (new body, checked copy) or None."""
    if _levels(body) < 1 or (_has_barrier(body, ctx.waits, ctx.barriers)
                             and not ctx.one_thread_blocks):
        return None
    arrays = [d for d in body.block_items or [] if isinstance(d, c_ast.Decl)
              and isinstance(d.type, c_ast.ArrayDecl) and d.init is None]
    rest = c_ast.Compound([d for d in body.block_items or [] if not any(d is a for a in arrays)])
    new = _guarded(rest, arrays, ctx)
    return None if new is None else (new, rest)


def _interval_guard(node: c_ast.Node, ctx: _Ctx) -> tuple[_NestGuard, c_ast.Node] | None:
    """The interval guard of every access under ``node`` (its guard variables and
    its condition), or None if some access has no bound (or there is none)."""
    ctx.counter += 1
    g = _NestGuard(node, ctx, ctx.counter)
    g.ok = f"__n{ctx.counter}_ok"
    try:
        g.stmt(node, {})
    except _NoBound:
        return None
    if not g.terms:
        return None
    terms: c_ast.Node = _const(1)
    for t in g.terms:
        terms = c_ast.BinaryOp("&", terms, t)
    # conditions first (&&): the range terms read bounds the conditions vouch for
    return g, c_ast.BinaryOp("&&", c_ast.ID(g.ok), terms)


def _int_decl(name: str, init: c_ast.Node) -> c_ast.Decl:
    return c_ast.Decl(name, [], [], [], [], c_ast.TypeDecl(name, [], None, c_ast.IdentifierType(
        ["int"])), init, None)


def _guarded(node: c_ast.Node, pre: list[c_ast.Node], ctx: _Ctx, vote: str | None = None
             ) -> c_ast.Compound | None:
    """``if (intervals of every access of node in range) fast copy else node``; with
    ``vote``, the condition is that call of it (the whole block's vote), computed by
    a function of its own where it can be (_outline)."""
    built = _interval_guard(node, ctx)
    if built is None:
        return None
    g, cond = built
    compute = [_int_decl(g.ok, _const(1))] + g.decls
    if vote is not None:
        call = _outline(g, compute, cond, ctx)
        if call is not None:
            cond, compute = call, []
        cond = c_ast.FuncCall(c_ast.ID(vote), c_ast.ExprList([cond]))
    fast = copy.deepcopy(node)
    covered = _mark_unchecked(fast, ctx)
    ctx.table.loops.append(LoopPlan(node.coord.line if node.coord else 0, list(g.terms), covered,
                                    False))
    guarded = Versioned(cond, c_ast.Compound([fast]), node, node.coord)
    return c_ast.Compound(pre + compute + [guarded])


#: Outlined guards keep each bound in a register where they compute it
#: (instrument_cuda's prelude: an empty asm on the GPU, nothing elsewhere).
GUARD_PINS = {"int": "rt_pin_i32", "int64_t": "rt_pin_i64"}


def _outline(g: _NestGuard, compute: list[c_ast.Node], cond: c_ast.Node, ctx: _Ctx
             ) -> c_ast.FuncCall | None:
    """A cover guard as a function of its own, ``int __rtg<k>_<f>(free names)``, added to
    the side table; the call, or None where a free name's type is not one known scalar.

    A loop's cover guard computes hundreds of bounds once.  Inlined, NVVM interleaves
    them with each other and with the loop (ptxas -v, sm_90, gpu_qr_panel at 64
    registers: 1.1 KB of spills per thread, none without the guard); in a function
    of its own, each bound pinned where it is computed, they are a sequence that
    needs few registers at a time and leave the loop's own allocation alone."""
    body: list[c_ast.Node] = []
    for item in compute:
        body.append(item)
        if isinstance(item, c_ast.Decl):
            ty = " ".join(item.type.type.names)
            item.init = c_ast.FuncCall(c_ast.ID(GUARD_PINS[ty]), c_ast.ExprList([item.init]))
        else:  # ok &= (a condition): kept in order too
            body.append(c_ast.Assignment("=", c_ast.ID(g.ok), c_ast.FuncCall(
                c_ast.ID(GUARD_PINS["int"]), c_ast.ExprList([c_ast.ID(g.ok)]))))
    body.append(c_ast.Return(cond))
    own = {g.ok} | {d.name for d in compute if isinstance(d, c_ast.Decl)}
    free = sorted(_ids(c_ast.Compound(body)) - own)
    if any(ctx.decl_types.get(n) is None for n in free):
        return None
    params = [c_ast.Decl(n, [], [], [], [], c_ast.TypeDecl(n, [], None, c_ast.IdentifierType(
        list(ctx.decl_types[n]))), None, None) for n in free]
    name = f"__rtg{len(ctx.table.guards) + 1}_{ctx.name}"
    fdecl = c_ast.FuncDecl(c_ast.ParamList(params), c_ast.TypeDecl(
        name, [], None, c_ast.IdentifierType(["int"])))
    ctx.table.guards.append(c_ast.FuncDef(c_ast.Decl(name, [], [], ["static"], [], fdecl, None,
                                                     None), None, c_ast.Compound(body)))
    return c_ast.FuncCall(c_ast.ID(name), c_ast.ExprList([c_ast.ID(n) for n in free]))


def _scalar_types(func: c_ast.FuncDef) -> dict[str, list[str]]:
    """Names of func's scalar parameters and locals -> their type names, where every
    declaration of the name agrees (else None: a guard over it stays inline)."""
    out: dict[str, list[str] | None] = {}

    class V(c_ast.NodeVisitor):
        def visit_Decl(self, d: c_ast.Decl) -> None:
            if isinstance(d.type, c_ast.TypeDecl) and isinstance(d.type.type,
                                                                 c_ast.IdentifierType):
                names = list(d.type.type.names)
                out[d.name] = names if out.get(d.name, names) == names else None
            self.generic_visit(d)

    V().visit(func.decl)
    V().visit(func.body)
    return {k: v for k, v in out.items() if v is not None}


# ---------------------------------------------------------------------------
# Cover guards (GPU): one interval guard before a loop that waits at a barrier.
#
# Per thread, such a loop is never duplicated: threads whose guards differ would
# wait at two different barriers.  So its inner loops were versioned one by one,
# each guard evaluated on every iteration of it (the QR panels: six to eight per
# column).  A cover guard bounds every access of the whole loop, all iterations,
# with the nest guards' intervals, once, and the whole block votes on it
# (GPU_BLOCK_VOTE: __syncthreads_and): every thread runs the unchecked copy of the
# loop, or every thread the checked one (versioned as before, so a failing cover
# still ends in the exact fault), and each barrier is met by the whole block.  The
# vote is itself a barrier; the loop, which waits at one, is entered by the whole
# block (the verifier admits barriers only under block-uniform control), and a
# thread that faulted before it has set the block's fault flag, which the vote
# reads as the barriers do.  One more barrier per loop, not per iteration.


def _cover_version(loop: c_ast.For, ctx: _Ctx) -> c_ast.Compound | None:
    """``if (block_vote(intervals of every access of loop in range)) fast copy else
    loop``, for a loop that waits at a block barrier on a lane with a block vote."""
    # (a loop that reaches only warp collectives is versioned itself, under a warp vote)
    blocking = ctx.barriers - WARP_FUNCS if ctx.warp_vote else ctx.barriers
    if ctx.block_vote is None or not _has_barrier(loop.stmt, ctx.waits, blocking):
        return None
    return _guarded(loop, [], ctx, vote=ctx.block_vote)


def _levels(node: c_ast.Node) -> int:
    """Loop levels of the deepest chain at node, node itself included (a loop whose
    body is a loop without braces counts twice)."""
    here = 1 if isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)) else 0
    return here + max((_levels(c) for _n, c in node.children()), default=0)


def _mark_unchecked(node: c_ast.Node, ctx: _Ctx) -> list[c_ast.Node]:
    """Mark every scalar access and local-array subscript under node as covered."""
    out: list[c_ast.Node] = []

    class V(c_ast.NodeVisitor):
        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            self.generic_visit(n)
            if isinstance(n.name, c_ast.ID) and n.name.name.startswith(_ACCESS_PREFIX) \
                    and n.name.name.rsplit("_", 1)[1] in _ELEM:
                n.__class__ = UncheckedCall
                out.append(n)

        def visit_ArrayRef(self, n: c_ast.ArrayRef) -> None:
            base, chain = array_chain(n)
            dims = ctx.arrays.get(base.name) if isinstance(base, c_ast.ID) else None
            for depth, ref in enumerate(chain):
                self.visit(ref.subscript)
                if dims is not None and depth < len(dims):
                    ref.__class__ = UncheckedRef
                    out.append(ref)

    V().visit(node)
    return out
