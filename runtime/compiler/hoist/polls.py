"""Where pollchecks go: entry polls of callers, quiet loops and nests (no poll per
iteration, one after them), and the thresholds that bound the work between two polls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pycparser import c_ast

from ..astutil import callees, node_fields
from ..dialect_api import MATH_FUNCS
from .affine import Span, Term, const, step_node
from .loops import const_trips, leaf_body, loop_shape, loops_in
from .marks import PollPoint, mark_nopoll

if TYPE_CHECKING:
    from .versioning import Inner


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
    site in it) statements, each a bounded amount of work (a quiet loop or nest at
    most QUIET_WORK of estimated work, a tile copy at most one row of a fixed-size
    local array between its per-row polls on the CPU, at most the whole array,
    which lives in shared memory, on the GPU).  A call-free function needs no
    entry poll: its one pass is counted in its caller's stretch.  Polling at every
    function's entry would be as sound and polls more: 2.2-2.7x as many entry polls
    on the QR kernels (e.g. 1299 -> 3457 per n=1024 factorisation), neither
    measurable in time.
    Without entry polls a DAG of loop-free helpers (h1 calls h0 twice, h2 calls
    h1 twice, ...) ran 2^depth calls with no poll: no timeout, cancel or
    collector handshake was answered.  On the GPU a poll reads the thread's clock
    and the sequence record once RT_POLL_CYCLES have passed since its last read
    (runtime/cuda/lower.py), so the bound there is this one plus that interval.
    """
    funcs = {e.decl.name: e.body for e in ast.ext if isinstance(e, c_ast.FuncDef)}
    return frozenset(n for n, body in funcs.items() if callees(body, set(funcs)))


#: A loop nest polls once after itself when the outer loop has fewer than
#: OUTER_SHORT_TRIP iterations and every inner loop at most INNER_CONST_TRIP (a
#: constant trip count, or a folded loop's span, tested before the nest runs):
#: at most 2^20 iterations of each inner loop between pollchecks.
OUTER_SHORT_TRIP = 1 << 12
INNER_CONST_TRIP = 256

#: Trip count under which the fast copy polls once after the loop.
SHORT_TRIP = 1 << 16

#: Estimated work a quiet loop or nest may do between two pollchecks (:func:`work`'s
#: units, about one operation each), besides the trip counts above: a short loop with
#: a large unrolled body, or calling sin() a thousand times, still answers a timeout,
#: a cancel or a fault of another block within milliseconds.  A quiet loop's limit is
#: fixed at compile time (its iterations cost the same); a nest's is tested before it
#: runs, with its inner loops' spans of this time (:func:`nest_work_below`).
QUIET_WORK = 1 << 25
#: Math calls that run a library routine (tens of operations), not an instruction or two.
LIBM_CALLS = frozenset(n + s for n in ("exp", "log", "pow", "hypot", "sin", "cos", "tanh")
                       for s in ("", "f"))
LIBM_WORK = 16
assert LIBM_CALLS <= MATH_FUNCS


def work(node: c_ast.Node | None, trips: dict[int, int] | None = None) -> int:
    """Estimated work of one pass over ``node``: a unit per AST node, LIBM_WORK more per
    LIBM_CALLS call, the larger branch of an ``if`` or ``?:``, and a loop its trip bound
    (``trips``, by the loop's id; 1 if it has none) times one iteration.  Quiet bodies
    call no same-source function (loops.leaf_body), so no callee's work enters."""
    if node is None:
        return 0
    if isinstance(node, (c_ast.If, c_ast.TernaryOp)):
        return 1 + work(node.cond, trips) + max(work(node.iftrue, trips),
                                                work(node.iffalse, trips))
    own = sum(work(child, trips) for _name, child in node.children())
    if isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)):
        return 1 + (trips or {}).get(id(node), 1) * own
    if isinstance(node, c_ast.FuncCall) and isinstance(node.name, c_ast.ID) \
            and node.name.name in LIBM_CALLS:
        own += LIBM_WORK
    return 1 + own


def iteration_work(loop: c_ast.Node, body: int | None = None) -> int:
    """One iteration of ``loop``: its condition, its step and its body (``body``: the
    body's work where the caller counted its inner loops, :class:`ShortNest`)."""
    step = loop.next if isinstance(loop, c_ast.For) else None
    return 1 + work(loop.cond) + work(step) + (work(loop.stmt) if body is None else body)


def quiet_limit(limit: int, iteration: int) -> int:
    """How many iterations of ``iteration`` work a quiet loop may run before its poll: at
    most ``limit``, and at most QUIET_WORK in all (below 2, no quiet copy is worth it)."""
    return min(limit, QUIET_WORK // max(1, iteration))


def span_below(hs: str, step: int | c_ast.Node, limit: int) -> c_ast.BinaryOp:
    """span / step < limit: the loop has fewer than limit + 1 iterations."""
    return c_ast.BinaryOp("<", c_ast.BinaryOp("/", c_ast.ID(hs), step_node(step)),
                          const(limit))


def then_poll(quiet: c_ast.Node) -> c_ast.Compound:
    """The quiet copy followed by one pollcheck."""
    return c_ast.Compound([quiet, PollPoint(quiet.coord)])


@dataclass
class ShortNest:
    """What makes a nest short (:func:`short_nest`): the run-time conditions its folded
    inner loops add (span short enough), the work of one pass over its body with those
    loops left out (constant ones at their trip counts), and each folded loop's span
    with the work of one of its iterations."""

    conds: list[c_ast.Node]
    fixed: int
    folded: list[tuple[Span, int]]


def short_nest(body: c_ast.Node, folds: list[tuple[c_ast.Compound, Inner, list[Term]]]
               ) -> ShortNest | None:
    """Whether body is leaf code plus inner for-loops of at most INNER_CONST_TRIP
    iterations each: a constant trip count, or a loop folded into the enclosing
    guard, whose span is computed before the nest.  None if not short."""
    folded: dict[int, Span] = {}
    for _box, inner, _terms in folds:
        for n in loops_in(inner.fast):
            folded[id(n)] = inner.span
    conds: list[c_ast.Node] = []
    bounds: dict[int, int] = {}
    spans: dict[str, tuple[Span, int]] = {}
    allowed = {"rt_loop_span", "rt_loop_span32", "rt_lrange_ok", "rt_range_ok", "rt_lrange2_ok",
               "rt_range2_ok", "rt_irange_ok", "rt_irange2_ok", "RT_IS_INT"}

    class V(c_ast.NodeVisitor):
        ok = True

        def visit_While(self, n: c_ast.Node) -> None:
            self.ok = False

        visit_DoWhile = visit_QuietWhile = visit_QuietDoWhile = visit_While

        def visit_For(self, n: c_ast.For) -> None:
            shape = loop_shape(n)
            trips = const_trips(shape[2], shape[3], shape[4], shape[5]) if shape else None
            sp = folded.get(id(n))
            if sp is not None and trips is None:
                if sp.hs not in spans:
                    conds.append(span_below(sp.hs, sp.step, INNER_CONST_TRIP))
                # counted apart, with the span it has when the nest runs (copies of one
                # loop share its span: the costlier counts)
                w = max(iteration_work(n), spans.get(sp.hs, (sp, 0))[1])
                spans[sp.hs] = (sp, w)
                bounds[id(n)] = 0
            elif trips is None or trips > INNER_CONST_TRIP:
                self.ok = False
            else:
                bounds[id(n)] = trips
            self.generic_visit(n)

        visit_QuietFor = visit_For

        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            name = n.name.name if isinstance(n.name, c_ast.ID) else ""
            if name not in allowed and not leaf_body(n):
                self.ok = False
            if n.args is not None:
                self.visit(n.args)

    v = V()
    v.visit(body)
    return ShortNest(conds, work(body, bounds), list(spans.values())) if v.ok else None


def nest_work_below(loop: c_ast.For, span: Span, nest: ShortNest) -> c_ast.Node:
    """The run-time test that the nest's estimated work, with the spans of this run, stays
    under QUIET_WORK: (trips) * (one iteration + sum of folded trips * their iteration).
    It follows the span tests with ``&&``: trips < OUTER_SHORT_TRIP, each folded loop's
    < INNER_CONST_TRIP, so the product stays far from overflowing 64 bits."""
    def trips(sp: Span) -> c_ast.Node:
        return c_ast.BinaryOp("+", c_ast.BinaryOp("/", c_ast.ID(sp.hs), step_node(sp.step)),
                              const(1))

    per: c_ast.Node = const(iteration_work(loop, nest.fixed))
    for sp, w in nest.folded:
        per = c_ast.BinaryOp("+", per, c_ast.BinaryOp("*", trips(sp), const(w)))
    return c_ast.BinaryOp("<=", c_ast.BinaryOp("*", trips(span), per), const(QUIET_WORK))


def silence(node: c_ast.Node) -> None:
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
                mark_nopoll(n)

    V().visit(node)
