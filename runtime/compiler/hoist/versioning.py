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

Beyond boxes, interval guards (nest_guard.py) cover a whole
function body at entry, or a nest of depth >= 2: triangular bounds, bounds
computed in the body (min/max ternaries), accesses narrowed by a condition.
Order: whole body first; if it cannot be bounded, nests top-down; then the
per-loop versioning above, in every copy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

from pycparser import c_ast, c_generator

from ..astutil import conjoin, int_types, node_fields, pure_expr
from ..dialect_api import WARP_FUNCS
from .affine import (
    Span,
    Term,
    affine,
    affine_in,
    box_terms,
    const,
    corner,
    ibox_term,
    irange_term,
    narrow_parts,
    range_terms,
    rt_is_int,
)
from .loops import (
    ACCESS_PREFIX,
    BARRIERS,
    ELEM,
    ELEM_SIZE,
    array_chain,
    assigned,
    body_defs,
    const_trips,
    expand,
    has_barrier,
    ids_in,
    leaf_body,
    loop_depth,
    loop_shape,
    loops_in,
    replace_node,
)
from .marks import (
    QUIET_LOOPS,
    LoopPlan,
    UncheckedCall,
    UncheckedRef,
    Versioned,
    Versioning,
    mark_nopoll,
)
from .nest_guard import NestGuard, NoBound
from .polls import (
    OUTER_SHORT_TRIP,
    SHORT_TRIP,
    iteration_work,
    nest_work_below,
    quiet_limit,
    short_nest,
    silence,
    span_below,
    then_poll,
)


@dataclass
class Ctx:
    """Per-function state of one hoisting pass (no module globals: compiles may run
    on several threads)."""

    arrays: dict[str, tuple[int, ...]]  # local array name -> dims (from the verifier)
    types: dict[str, int] = field(default_factory=dict)  # integer variable -> bits (0: mixed)
    counter: int = 0                    # numbers the guard variables __h<k>_*
    table: Versioning = field(default_factory=Versioning)
    inner: dict[int, Inner] = field(default_factory=dict)  # versioned innermost loops by id
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
    ctx = Ctx(arrays, int_types(func), waits=waits, one_thread_blocks=one_thread_blocks,
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


def _walk(node: c_ast.Node, ctx: Ctx, in_loop: bool = False) -> None:
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


def _maybe_version(loop: c_ast.For, ctx: Ctx, nested: bool = False) -> c_ast.Node | None:
    """Version innermost loops and the loops directly around them (depth <= 1).

    Deeper nests are left alone: each level doubles the code.  ``nested``: the
    loop sits inside another loop of the function.
    """
    if isinstance(loop, QUIET_LOOPS):
        return None  # quiet already (a covered copy's short loop: _short_loops)
    depth = loop_depth(loop.stmt)
    # with a warp vote, warp collectives do not stop versioning (block barriers do)
    blocking = ctx.barriers - WARP_FUNCS if ctx.warp_vote else ctx.barriers
    if depth > 1 or has_barrier(loop.stmt, ctx.waits, blocking):
        return None
    return _version(loop, ctx, innermost=depth == 0, nested=nested)


def _version(loop: c_ast.For, ctx: Ctx, innermost: bool = True, nested: bool = False
             ) -> c_ast.Node | None:
    shape = loop_shape(loop)
    if shape is None or loop.stmt is None:
        return None
    var, bits, a_expr, b_expr, cmp, step = shape
    if not isinstance(step, int) and not (pure_expr(a_expr) and pure_expr(b_expr)):
        return None
    changed = assigned(loop.stmt)
    step_ids = set() if isinstance(step, int) else ids_in(step)
    if var in changed or changed & (ids_in(b_expr) | ids_in(a_expr) | step_ids):
        return None
    # Offsets the body computes from the counter (int64_t a0 = (r + 4*q) * ld;)
    # are expanded into the indices that use them, so those stay affine in var.
    defs = body_defs(loop.stmt, changed, ctx.types)
    narrow = {var} if bits == 32 else set()
    # Candidate accesses anywhere in the body (conditional ones too: the guard
    # only selects the copy, it never faults).
    accesses: list[tuple[c_ast.FuncCall, c_ast.Node]] = []  # (access, expanded index)

    class V(c_ast.NodeVisitor):
        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            self.generic_visit(n)
            if not (isinstance(n.name, c_ast.ID) and n.name.name.startswith(ACCESS_PREFIX)):
                return
            t = n.name.name.rsplit("_", 1)[1]
            if t not in ELEM or n.args is None or len(n.args.exprs) < 2:
                return
            cap, idx = n.args.exprs[0], n.args.exprs[1]
            if not isinstance(cap, c_ast.ID) or cap.name in changed or not pure_expr(idx):
                return
            idx = expand(idx, defs)
            if not affine(idx, var) or (ids_in(idx) - {var}) & changed:
                return
            if narrow_parts(idx, narrow, ctx.types) is None:
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
                    continue  # (UncheckedRef: proved in range by runtime/compiler/ranges.py)
                idx = expand(idx, defs)
                if (affine(idx, var) and not ((ids_in(idx) - {var}) & changed)
                        and narrow_parts(idx, narrow, ctx.types) is not None):
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
    span = Span(f"__h{k}_a", f"__h{k}_b", f"__h{k}_span", f"__h{k}_ok", bits, a_expr, b_expr,
                 cmp, step)
    # The checked copy is taken before any access is renamed, so it keeps
    # whatever the inner loops' own versioning did.
    slow = copy.deepcopy(loop)
    guard_terms: list[c_ast.Node] = []
    covered: list[c_ast.Node] = []
    terms: list[Term] = []
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
            terms.append(Term(copy.deepcopy(idx), cap.name, ELEM_SIZE[t], store))
        n.__class__ = UncheckedCall
        covered.append(n)
    for ref, idx, dim in subs:
        terms.append(Term(copy.deepcopy(idx), None, dim, 0))
        ref.__class__ = UncheckedRef
        covered.append(ref)
    guard_terms = range_terms(terms, var, span, ctx.types)
    wrap_terms = [irange_term(part, var, span) for term in terms
                  for part in narrow_parts(term.idx, narrow, ctx.types)]
    # Fast copy only if bounds and indices are signed integers (so the loop
    # runs exactly over [A, last]) and the span is computable (it is set by
    # rt_loop_span in its own statement, before any guard reads it), and every
    # guard holds.  The guards are joined with '&', not '&&': they are pure
    # and cheap, and evaluated unconditionally gcc can hoist the ones that do
    # not change in an enclosing loop.  A loop that does not run has span 0;
    # if a guard fails for it, the checked copy runs zero iterations.
    is_int = conjoin("&&", [span.is_int(), *(rt_is_int(corner(term.idx, var, span))
                                             for term in terms)])
    conds: list[c_ast.Node] = [c_ast.ID(span.hok), *guard_terms, *wrap_terms]
    # Inner loops folded into this loop's guard (bounds invariant here): their
    # span is computed once before this loop, one box check per access covers
    # every iteration of the nest, and this loop's fast copy runs their fast
    # copies with no guard of their own.  Their checked copies stay in `slow`.
    hoisted: list[c_ast.Node] = []
    for box, inner, inner_terms in folds:
        hoisted += inner.span.decls(inner.span.is_int())
        box_ints: list[c_ast.Node] = [c_ast.ID(inner.span.hok)]
        inner_oks: list[c_ast.Node] = [const(1)]
        box_narrow = narrow | ({inner.var} if inner.span.bits == 32 else set())
        for g in box_terms(inner_terms, var, span, inner.var, inner.span, ctx.types):
            guard_terms.append(g)
            inner_oks.append(g)
        for term in inner_terms:
            box_ints.append(rt_is_int(corner(term.idx, var, span, inner.var, inner.span)))
            for part in narrow_parts(term.idx, box_narrow, ctx.types) or []:
                inner_oks.append(ibox_term(part, var, span, inner.var, inner.span))
        # an inner loop that never runs makes no access
        box_ok = c_ast.BinaryOp("&&", conjoin("&&", box_ints), c_ast.BinaryOp(
            "||", c_ast.UnaryOp("!", inner.span.runs()), conjoin("&", inner_oks)))
        conds.append(box_ok)
        replace_node(loop, box, inner.fast)
        covered += inner.covered
    cond = conjoin("&", conds)
    if ctx.warp_vote and has_barrier(loop.stmt, barriers=WARP_FUNCS):
        # every lane takes the copy the whole warp voted for (module doc)
        cond = c_ast.FuncCall(c_ast.ID(ctx.warp_vote), c_ast.ExprList([cond]))
    fast = loop
    fast_block: c_ast.Node = fast
    # iterations the quiet copy may run: short, and little work in all (polls.QUIET_WORK)
    leaf_limit = quiet_limit(SHORT_TRIP, iteration_work(loop)) if innermost else 0
    leaf = leaf_limit > 1 and leaf_body(loop.stmt)
    nest = None if innermost else short_nest(loop.stmt, folds)
    if innermost and not leaf and not accesses and not subs:
        return None  # nothing to hoist, and the pollchecks must stay (see below)
    if leaf:
        # A short fast loop (< leaf_limit iterations) answers handshakes once
        # after it instead of at every back-edge: a call in the loop body would
        # stop gcc from vectorising it.  Latency stays bounded.  Bodies that
        # call anything able to wait for the collector (allocation, cap tables,
        # helpers) keep the per-iteration pollcheck, or a handshake could wait
        # on a thread that waits on the collector.
        quiet = copy.deepcopy(loop)
        mark_nopoll(quiet)  # structurally, so enclosing copies keep it
        # Inside another loop the short loop needs no poll after itself: the
        # loop around it polls every iteration (or, if quiet too, after itself),
        # so each quiet loop of its body runs < leaf_limit iterations between
        # two polls.
        quiet_block = c_ast.Compound([quiet]) if nested else then_poll(quiet)
        trips = const_trips(a_expr, b_expr, cmp, step)
        if trips is not None and trips < leaf_limit:
            # constant short loop: the polling copy could never run
            if not accesses and not subs:
                # and nothing to guard: the span test that picks the checked copy holds
                # at compile time too, so that copy would be dead code as well (the
                # CPU tile update's register blocks compiled 4 times each)
                return quiet_block
            fast_block = quiet_block
        else:
            fast_block = c_ast.If(span_below(span.hs, step, leaf_limit), quiet_block, fast)
    elif nest is not None and quiet_limit(OUTER_SHORT_TRIP, iteration_work(loop, nest.fixed)) > 1:
        # Few outer iterations over short inner loops (constant trip counts, or
        # folded loops whose span, known before the nest, is short this time), and
        # little work in all: poll once after the whole nest, so gcc may
        # unroll-and-jam it like raw code.
        quiet = copy.deepcopy(fast)
        silence(quiet)
        short = conjoin("&&", [span_below(span.hs, step, OUTER_SHORT_TRIP), *nest.conds,
                               nest_work_below(loop, span, nest)])
        fast_block = c_ast.If(short, then_poll(quiet), fast)
    ctx.table.loops.append(LoopPlan(loop.coord.line if loop.coord else 0, guard_terms, covered,
                                    fast_block is not fast))
    fast_then = c_ast.Compound([fast_block])
    guarded = Versioned(cond, fast_then, slow, loop.coord)
    out = c_ast.Compound(span.decls(is_int) + hoisted + [guarded])
    if innermost:
        ctx.inner[id(out)] = Inner(out, var, span, terms, fast_then, covered)
    return out


@dataclass
class Inner:
    """A versioned innermost loop, as an enclosing loop may fold it."""

    node: c_ast.Compound        # what _version returned (kept alive: ctx.inner is keyed by id)
    var: str
    span: Span
    terms: list[Term]
    fast: c_ast.Compound        # its fast copy (unchecked accesses, polling as decided)
    covered: list[c_ast.Node]


def _foldable(body: c_ast.Node, var: str, bits: int, changed: set[str],
              defs: dict[str, c_ast.Node], ctx: Ctx
              ) -> list[tuple[c_ast.Compound, Inner, list[Term]]]:
    """Versioned innermost loops in ``body`` whose guard can move before the loop
    over ``var``: bounds and step invariant here (so the nest is a box), every
    index affine in both counters jointly, caps, arrays and coefficients not
    assigned in ``body`` (after expanding the body's offset definitions ``defs``,
    which the inner loop sees as invariants)."""
    out: list[tuple[c_ast.Compound, Inner, list[Term]]] = []

    def invariant(node: c_ast.Node | int) -> bool:
        if isinstance(node, int):
            return True
        ids = ids_in(node)
        return var not in ids and not (ids & changed)

    def visit(node: c_ast.Node) -> None:
        inner = ctx.inner.get(id(node))
        if inner is not None and inner.node is node:
            sp = inner.span
            terms = [Term(expand(t.idx, defs), t.cap, t.size, t.store) for t in inner.terms]
            # (distinct counters: the verifier refuses shadowing, E(i, j) relies on it)
            narrow = {v for v, b in ((var, bits), (inner.var, sp.bits)) if b == 32}
            if (inner.var != var and invariant(sp.a_expr) and invariant(sp.b_expr)
                    and invariant(sp.step)
                    and all(_foldable_term(t, var, inner.var, changed)
                            and narrow_parts(t.idx, narrow, ctx.types) is not None
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


def _foldable_term(term: Term, var: str, ivar: str, changed: set[str]) -> bool:
    if term.cap is not None and term.cap in changed:
        return False
    return affine_in(term.idx, {var, ivar}) and not ((ids_in(term.idx) - {var, ivar}) & changed)


def _nest_walk(node: c_ast.Node, ctx: Ctx) -> None:
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


def _nest_version(loop: c_ast.For, ctx: Ctx) -> c_ast.Node | None:
    # the loop and at least two levels inside it
    if _levels(loop) < 3 or has_barrier(loop.stmt, ctx.waits, ctx.barriers):
        return None
    return _guarded(loop, [], ctx)


def _body_version(body: c_ast.Compound, ctx: Ctx) -> tuple[c_ast.Compound, c_ast.Node] | None:
    """A function body with loops whose every access interval bounds cover gets
    one guard at entry (helpers called once per column: their loops are short).
    The local arrays it declares at its top level move before the guard, so the
    two copies share them.  Returns (new body, checked copy) or None."""
    if _levels(body) < 1 or (has_barrier(body, ctx.waits, ctx.barriers)
                             and not ctx.one_thread_blocks):
        return None
    arrays = [d for d in body.block_items or [] if isinstance(d, c_ast.Decl)
              and isinstance(d.type, c_ast.ArrayDecl) and d.init is None]
    rest = c_ast.Compound([d for d in body.block_items or [] if not any(d is a for a in arrays)])
    new = _guarded(rest, arrays, ctx)
    return None if new is None else (new, rest)


def _interval_guard(node: c_ast.Node, ctx: Ctx) -> tuple[NestGuard, c_ast.Node] | None:
    """The interval guard of every access under ``node`` (its guard variables and
    its condition), or None if some access has no bound (or there is none)."""
    ctx.counter += 1
    g = NestGuard(node, ctx, ctx.counter)
    g.ok = f"__n{ctx.counter}_ok"
    try:
        g.stmt(node, {})
    except NoBound:
        return None
    if not g.terms:
        return None
    terms = conjoin("&", [const(1), *g.terms])
    # conditions first (&&): the range terms read bounds the conditions vouch for
    return g, c_ast.BinaryOp("&&", c_ast.ID(g.ok), terms)


def _int_decl(name: str, init: c_ast.Node) -> c_ast.Decl:
    return c_ast.Decl(name, [], [], [], [], c_ast.TypeDecl(name, [], None, c_ast.IdentifierType(
        ["int"])), init, None)


def _guarded(node: c_ast.Node, pre: list[c_ast.Node], ctx: Ctx, vote: str | None = None
             ) -> c_ast.Compound | None:
    """``if (intervals of every access of node in range) fast copy else node``; with
    ``vote``, the condition is that call of it (the whole block's vote), computed by
    a function of its own where it can be (_outline)."""
    built = _interval_guard(node, ctx)
    if built is None:
        return None
    g, cond = built
    # under a block vote, the covered copy runs its short loops' quiet copies alone
    quiet = _short_loops(node, g) if vote is not None else []
    compute = [_int_decl(g.ok, const(1))] + g.decls
    if vote is not None:
        call = _outline(g, compute, cond, ctx)
        if call is not None:
            cond, compute = call, []
        cond = c_ast.FuncCall(c_ast.ID(vote), c_ast.ExprList([cond]))
    fast = copy.deepcopy(node)
    if quiet:
        twins = {id(a): b for a, b in _twins(node, fast)}
        for loop in quiet:
            mark_nopoll(twins[id(loop)])
    covered = _mark_unchecked(fast, ctx)
    ctx.table.loops.append(LoopPlan(node.coord.line if node.coord else 0, list(g.terms), covered,
                                    False))
    guarded = Versioned(cond, c_ast.Compound([fast]), node, node.coord)
    return c_ast.Compound(pre + compute + [guarded])


def _short_loops(node: c_ast.Node, g: NestGuard) -> list[c_ast.For]:
    """The innermost leaf loops under ``node`` that the covered copy runs quiet, each
    one's trip bound required by ``g`` (NestGuard.short_loop).

    In the covered copy every access is unchecked already, so per-loop versioning
    (_walk, after this) gave each such loop three copies (quiet, polling, and the
    polling one again where its span cannot be computed) and, on every entry, its span
    and whether that is short: a decision the cover guard makes once for all entries
    from the counter's interval.  A loop that can run longer makes the guard fail, and
    the checked copy decides per loop as before.  Liveness is the quiet copy's
    (polls.py): at most its limit of iterations, and no poll after it because it sits
    in the covered loop, which polls every iteration.  (H200, gpu_prelude_ab: the
    panels' per-loop decisions cost 0.2-0.37 of their raw time.)"""
    out = []
    for loop in loops_in(node):
        if (type(loop) is not c_ast.For or loop is node or loop_depth(loop.stmt) != 0
                or not leaf_body(loop.stmt)):
            continue
        limit = quiet_limit(SHORT_TRIP, iteration_work(loop))
        if limit > 1 and g.short_loop(loop, limit):
            out.append(loop)
    return out


def _twins(a: c_ast.Node, b: c_ast.Node) -> Iterator[tuple[c_ast.Node, c_ast.Node]]:
    """Corresponding nodes of a tree and its deep copy."""
    yield a, b
    for (_x, va), (_y, vb) in zip(node_fields(a), node_fields(b), strict=True):
        if isinstance(va, list):
            for ia, ib in zip(va, vb, strict=True):
                if isinstance(ia, c_ast.Node):
                    yield from _twins(ia, ib)
        elif isinstance(va, c_ast.Node):
            yield from _twins(va, vb)


#: Outlined guards keep each bound in a register where they compute it
#: (runtime/cuda/prelude.cuh: an empty asm on the GPU, nothing elsewhere).
GUARD_PINS = {"int": "rt_pin_i32", "int64_t": "rt_pin_i64"}


def _outline(g: NestGuard, compute: list[c_ast.Node], cond: c_ast.Node, ctx: Ctx
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
    free = sorted(ids_in(c_ast.Compound(body)) - own)
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


def _cover_version(loop: c_ast.For, ctx: Ctx) -> c_ast.Compound | None:
    """``if (block_vote(intervals of every access of loop in range)) fast copy else
    loop``, for a loop that waits at a block barrier on a lane with a block vote."""
    # (a loop that reaches only warp collectives is versioned itself, under a warp vote)
    blocking = ctx.barriers - WARP_FUNCS if ctx.warp_vote else ctx.barriers
    if ctx.block_vote is None or not has_barrier(loop.stmt, ctx.waits, blocking):
        return None
    return _guarded(loop, [], ctx, vote=ctx.block_vote)


def _levels(node: c_ast.Node) -> int:
    """Loop levels of the deepest chain at node, node itself included (a loop whose
    body is a loop without braces counts twice)."""
    here = 1 if isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)) else 0
    return here + max((_levels(c) for _n, c in node.children()), default=0)


def _mark_unchecked(node: c_ast.Node, ctx: Ctx) -> list[c_ast.Node]:
    """Mark every scalar access and local-array subscript under node as covered."""
    out: list[c_ast.Node] = []

    class V(c_ast.NodeVisitor):
        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            self.generic_visit(n)
            if isinstance(n.name, c_ast.ID) and n.name.name.startswith(ACCESS_PREFIX) \
                    and n.name.name.rsplit("_", 1)[1] in ELEM:
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
