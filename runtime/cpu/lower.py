"""Verified kernel AST -> instrumented C for the cffi compiler.

What the instrumenter adds (the verifier has already refused everything it
cannot make safe):

* a hidden first parameter ``rt_block *__rt`` on every function, passed on
  at every call of a same-source function;
* every dialect call rewritten to its checked form in cap.h, with the
  source line (``cap_load_f32(c, i)`` -> ``rt_load_f32(__rt, c, i, LINE)``);
* a pollcheck at the top of every loop body (= every back-edge, also after
  ``continue``) and at the entry of every function that calls a same-source
  function (after its shadow frame roots its cap parameters), for soft
  handshakes, timeouts and stop requests: together they bound the work between
  two polls whatever the kernel's loops (hoist.entry_polls says why; a call DAG
  of loop-free helpers made 2^depth calls with no poll when only loops
  polled).  Quiet loops (hoist/) poll once after themselves instead.  Raw
  builds have none; raw_poll builds have exactly these;
* a bounds check on every subscript of a local array;
* shadow frames for ``cap_t`` locals when the source can create objects
  (``cap_alloc_*``/``cap_load_cap``): without those, every cap derives from
  launch arguments, which the launch itself holds;
* hoisted range checks (see hoist/) for affine accesses in ``for`` loops.

The result is the same AST printed by pycparser's CGenerator behind
``#include "cap.h"``, plus one exported entry function per kernel.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from pycparser import c_ast

from ..compiler.astutil import (
    CapTyping,
    Generator,
    StmtExpr,
    mangle,
    node_fields,
    pure_lvalue,
    rename_user_names,
    squeeze_line_directives,
    tile_call,
    user_names,
)
from ..compiler.dialect_api import BUILTINS
from ..compiler.hoist import (
    QUIET_LOOPS,
    PollPoint,
    UncheckedCall,
    UncheckedRef,
    array_chain,
    entry_polls,
    hoist_function,
    waiting_helpers,
)
from ..compiler.parse import is_user_node
from ..compiler.ranges import builtin_ranges, prove_subscripts
from ..compiler.verifier import KernelSig, VerifiedSource

ARG_FIELD = {"cap": "cap", "int64": "i64", "double": "f64", "float": "f32"}

MODES = ("checked", "raw", "raw_poll")


def _id(name: str) -> c_ast.ID:
    return c_ast.ID(name)


def _const(v: int) -> c_ast.Constant:
    return c_ast.Constant("int", str(v))


def _call(name: str, *args: c_ast.Node) -> c_ast.FuncCall:
    return c_ast.FuncCall(_id(name), c_ast.ExprList(list(args)))


def _rt_param() -> c_ast.Decl:
    tdecl = c_ast.TypeDecl("__rt", [], None, c_ast.IdentifierType(["rt_block"]))
    return c_ast.Decl("__rt", [], [], [], [], c_ast.PtrDecl([], tdecl), None, None)


def _pollcheck() -> c_ast.FuncCall:
    return _call("rt_pollcheck", _id("__rt"))


def _line(node: c_ast.Node) -> c_ast.Constant:
    return _const(node.coord.line if node.coord else 0)


class _FuncInstrumenter(c_ast.NodeVisitor):
    """Rewrites one function body in place."""

    def __init__(self, funcs: set[str], frames: bool, mode: str):
        self.funcs = funcs
        self.frames = frames
        self.mode = mode
        self.arrays: dict[str, tuple[int, ...]] = {}  # local arrays (from the verifier)
        self.cap_slots: dict[str, int] = {}
        self.typing: CapTyping | None = None  # set when frames are on
        self.spill_top = 0   # hidden slots in use by the spills being rewritten
        self.spill_max = 0
        self.spill_count = 0  # temporaries named so far

    # -- expression rewriting --------------------------------------------
    def rewrite(self, node: c_ast.Node | None) -> c_ast.Node | None:
        """Return the instrumented form of an expression/statement node."""
        if node is None:
            return None
        if isinstance(node, c_ast.FuncCall):
            return self._rewrite_call(node)
        if isinstance(node, c_ast.ArrayRef):
            return self._rewrite_arrayref(node)
        if isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)):
            self._rewrite_children(node)
            # a quiet loop (hoist/) polls once after itself instead
            node.stmt = self._with_pollcheck(node.stmt, poll=not isinstance(node, QUIET_LOOPS))
            return node
        if isinstance(node, PollPoint):
            return _pollcheck()
        if isinstance(node, c_ast.Decl):
            return self._rewrite_decl(node)
        if isinstance(node, c_ast.BinaryOp) and node.op in ("/", "%"):
            left, right = self.rewrite(node.left), self.rewrite(node.right)
            macro = "RT_DIV" if node.op == "/" else "RT_MOD"
            return _call(macro, _id("__rt"), left, right, _line(node))
        if isinstance(node, c_ast.Assignment) and node.op in ("/=", "%="):
            # x /= y  ->  x = RT_DIV(x, y): the lvalue is evaluated twice, so it
            # must be side-effect free (a variable or a pure subscript).
            assert pure_lvalue(node.lvalue), "the verifier admits only pure /= targets"
            op = node.op[0]
            node.rvalue = c_ast.BinaryOp(op, copy.deepcopy(node.lvalue), node.rvalue,
                                         node.coord)
            node.op = "="
            return self.rewrite(node)
        if isinstance(node, c_ast.Assignment):
            node.rvalue = self.rewrite(node.rvalue)
            node.lvalue = self.rewrite(node.lvalue)
            if (self.frames and isinstance(node.lvalue, c_ast.ID)
                    and node.lvalue.name in self.cap_slots):
                node.rvalue = self._root(node.lvalue.name, node.rvalue)
            return node
        self._rewrite_children(node)
        return node

    def _rewrite_children(self, node: c_ast.Node) -> None:
        for attr, val in node_fields(node):
            if isinstance(val, c_ast.Node):
                setattr(node, attr, self.rewrite(val))
            elif isinstance(val, list):
                setattr(node, attr, [self.rewrite(v) if isinstance(v, c_ast.Node) else v
                                     for v in val])

    def _with_pollcheck(self, stmt: c_ast.Node | None, poll: bool = True) -> c_ast.Compound:
        if self.mode == "raw" or not poll:
            if isinstance(stmt, c_ast.Compound):
                return stmt
            return c_ast.Compound([stmt] if stmt is not None else [])
        items = [_pollcheck()]
        if isinstance(stmt, c_ast.Compound):
            items += stmt.block_items or []
        elif stmt is not None:
            items.append(stmt)
        return c_ast.Compound(items)

    def _root(self, name: str, expr: c_ast.Node) -> c_ast.Node:
        return _call("rt_root", c_ast.UnaryOp("&", _id("__fr")), _const(self.cap_slots[name]),
                     expr)

    def _rewrite_decl(self, node: c_ast.Decl) -> c_ast.Decl:
        if node.init is not None:
            node.init = self.rewrite(node.init)
            if self.frames and node.name in self.cap_slots:
                node.init = self._root(node.name, node.init)
        return node

    def _rewrite_arrayref(self, node: c_ast.ArrayRef) -> c_ast.Node:
        base, subs = array_chain(node)
        dims = self.arrays.get(base.name) if isinstance(base, c_ast.ID) else None
        for depth, ref in enumerate(subs):
            ref.subscript = self.rewrite(ref.subscript)
            if isinstance(ref, UncheckedRef):
                continue  # covered by a loop guard (hoist/)
            if dims is not None and depth < len(dims) and self.mode == "checked":
                ref.subscript = _call(
                    "rt_local_idx", _id("__rt"), ref.subscript, _const(dims[depth]),
                    c_ast.Constant("string", f'"{base.name}"'), _line(ref))
        return node

    def _rewrite_call(self, node: c_ast.FuncCall) -> c_ast.Node:
        held = self.typing.spill_args(node) if self.typing is not None else None
        if held is None:
            args = [self.rewrite(a) for a in (node.args.exprs if node.args else [])]
            return self._lower_call(node, args)
        # A cap computed by one argument would sit in a compiler temporary
        # while another argument polls or allocates: evaluate the arguments in
        # source order into temporaries, caps into hidden shadow slots.
        base = self.spill_top
        decls: list[tuple[str, str, c_ast.Node]] = []
        temps: list[c_ast.Node] = []
        for a, is_held in zip(node.args.exprs, held, strict=True):
            val = self.rewrite(a)
            tmp = f"__sp{self.spill_count}"
            self.spill_count += 1
            if is_held:
                slot = len(self.cap_slots) + self.spill_top
                self.spill_top += 1
                self.spill_max = max(self.spill_max, self.spill_top)
                val = _call("rt_root", c_ast.UnaryOp("&", _id("__fr")), _const(slot), val)
                decls.append(("cap_t", tmp, val))
            else:
                decls.append(("__auto_type", tmp, val))
            temps.append(_id(tmp))
        self.spill_top = base
        return StmtExpr(decls, self._lower_call(node, temps), node.coord)

    def _lower_call(self, node: c_ast.FuncCall, args: list[c_ast.Node]) -> c_ast.Node:
        name = node.name.name if isinstance(node.name, c_ast.ID) else None
        if name is None:
            return node
        if name in self.funcs:
            return c_ast.FuncCall(_id(name), c_ast.ExprList([_id("__rt")] + args), node.coord)
        builtin = BUILTINS.get(name)
        if builtin is None:  # a loop guard's helper (hoist/), as guards.h spells it
            node.args = c_ast.ExprList(args) if node.args else None
            return node
        low = builtin.lowering("cpu")
        assert low is not None, f"the verifier refuses {name} for target cpu"
        if isinstance(node, UncheckedCall):  # covered by a loop guard (hoist/)
            assert low.unchecked is not None
            return _call(low.unchecked, *args)
        if low.form == "field":
            return c_ast.StructRef(_id("__rt"), "->", _id(low.call))
        if low.form == "tile":
            # the array's flat length and name (its bounds check and fault report)
            tc = tile_call(name, args, self.arrays)
            args = args[:6] + [_const(tc.flat_len), c_ast.Constant("string", f'"{tc.array}"')
                               ] + args[6:]
        if low.call == name and not (low.ctx or low.extra or low.line):
            node.args = c_ast.ExprList(args) if node.args else None
            return node
        extra = [_const(x) if isinstance(x, int) else _id(x) for x in low.extra]
        return _call(low.call, *([_id("__rt")] if low.ctx else []), *args, *extra,
                     *([_line(node)] if low.line else []))


def _creates_objects(ast: c_ast.FileAST) -> bool:
    class V(c_ast.NodeVisitor):
        found = False

        def visit_FuncCall(self, node: c_ast.FuncCall) -> None:
            if isinstance(node.name, c_ast.ID) and (
                    node.name.name.startswith("cap_alloc_") or node.name.name == "cap_load_cap"):
                self.found = True
            self.generic_visit(node)

    v = V()
    v.visit(ast)
    return v.found


PREAMBLE = """\
#include "cap.h"
#include <math.h>
#define RT_FRAME(K) rt_frame __fr __attribute__((cleanup(rt_frame_cleanup))); \\
    rt_frame_push(__rt, &__fr, K)
"""


@dataclass
class Instrumented:
    """Generated C for one kernel module."""

    c_source: str
    signature: KernelSig
    mode: str


def instrument(verified: VerifiedSource, kernel: str, mode: str = "checked",
               hoist: bool = True) -> Instrumented:
    """Produce the C source of a module exporting ``capqr_entry`` for ``kernel``.

    Signatures, cap_t variables and local arrays come from the verifier.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if kernel not in verified.kernels:
        raise KeyError(kernel)
    sig = verified.kernels[kernel]
    ast = copy.deepcopy(verified.parsed.ast)
    user = [e for e in ast.ext if is_user_node(e)]
    funcs = {e.decl.name for e in user if isinstance(e, c_ast.FuncDef)}
    frames = _creates_objects(ast)
    waits = waiting_helpers(ast)
    polls_at_entry = entry_polls(ast) if mode != "raw" else frozenset()
    cap_funcs = {e.decl.name for e in user if isinstance(e, c_ast.FuncDef)
                 and verified.returns_cap.get(e.decl.name, False)}
    out_ext: list[c_ast.Node] = []
    for ext in user:
        if isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.FuncDecl):
            _add_rt_param(ext.type)  # prototype of a helper
            out_ext.append(ext)
            continue
        if not isinstance(ext, c_ast.FuncDef):
            out_ext.append(ext)
            continue
        name = ext.decl.name
        fi = _FuncInstrumenter(funcs, frames, mode)
        fi.arrays = dict(verified.local_arrays.get(name, {}))
        caps = list(verified.cap_locals.get(name, [])) if frames else []
        fi.cap_slots = {n: k for k, n in enumerate(caps)}
        if frames:
            fi.typing = CapTyping(frozenset(verified.cap_locals.get(name, [])),
                                  frozenset(cap_funcs), frozenset(funcs))
        if hoist and mode in ("checked", "raw_poll"):  # raw_poll: same poll placement
            prove_subscripts(ext, fi.arrays, builtin_ranges("cpu", None))
            hoist_function(ext, fi.arrays, waits, one_thread_blocks=True)
        ext.body = fi.rewrite(ext.body)
        _add_rt_param(ext.decl.type)
        if "static" not in ext.decl.storage:
            ext.decl.storage = ["static"] + list(ext.decl.storage)
        pre: list[c_ast.Node] = []
        if caps or fi.spill_max:
            pre.append(_call("RT_FRAME", _const(len(caps) + fi.spill_max)))
            args = ext.decl.type.args
            for p in (args.params if args else []):
                if isinstance(p, c_ast.Decl) and p.name in fi.cap_slots:
                    pre.append(fi._root(p.name, _id(p.name)))
        if name in polls_at_entry:
            # a caller of helpers polls at entry (hoist.entry_polls: why that bounds
            # the work between polls), once its cap parameters are rooted: a cap the
            # caller computed in the call's argument is held by nothing else
            pre.append(_pollcheck())
        if pre:
            ext.body.block_items = pre + list(ext.body.block_items or [])
        out_ext.append(ext)
    # user names get their reserved spelling only now: every analysis above (and
    # the fault messages' array names) worked on the names the user wrote
    out = c_ast.FileAST(out_ext)
    rename_user_names(out, user_names(verified.parsed.ast))
    body = Generator(line_directives=True).visit(out)
    call_args = ", ".join(f"a[{i}].{ARG_FIELD[k]}" for i, (_, k) in enumerate(sig.params))
    sep = ", " if call_args else ""
    entry = (
        '#line 1 "capqr-entry"\n'  # not a kernel line: a diagnostic here is capqr's own
        "void capqr_entry(void *b_, const void *a_)\n{\n"
        "    rt_block *b = (rt_block *)b_;\n"
        "    const rt_arg *a = (const rt_arg *)a_;\n"
        "    (void)a;\n"
        f"    {mangle(kernel)}(b{sep}{call_args});\n}}\n"
    )
    defines = {"checked": "", "raw": "#define RT_RAW 1\n", "raw_poll": "#define RT_RAW_POLL 1\n"}
    src = defines[mode] + PREAMBLE + "\n" + body + "\n" + entry
    return Instrumented(squeeze_line_directives(src), sig, mode)


def _add_rt_param(fdecl: c_ast.FuncDecl) -> None:
    args = fdecl.args
    if args is None or not args.params:
        fdecl.args = c_ast.ParamList([_rt_param()])
        return
    params = list(args.params)
    if len(params) == 1 and isinstance(params[0], c_ast.Typename):  # f(void)
        params = []
    fdecl.args = c_ast.ParamList([_rt_param()] + params)
