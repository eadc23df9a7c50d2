"""AST facts shared by the verifier, the analyses and both lowerings.

* :func:`int_literal` is the one reader of C integer literals (decimal, hex,
  octal, with u/l suffixes), so the verifier, loop versioning and the CUDA
  lowering agree on what ``0x0`` or ``010`` is.
* :func:`spill_plan` says which call arguments must be evaluated into rooted
  temporaries: a capability held by the compiler while a sibling argument
  runs a safepoint (a call that can poll or allocate) would otherwise be
  invisible to the collector.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pycparser import c_ast, c_generator


def int_literal(node: c_ast.Node | None) -> int | None:
    """Value of a plain C integer literal, else None (character literals included)."""
    if not isinstance(node, c_ast.Constant) or "int" not in node.type or "'" in node.value:
        return None
    text = node.value.rstrip("uUlL")
    try:
        if len(text) > 1 and text[0] == "0" and text[1] not in "xXbB":
            return int(text, 8)  # C octal: 010 == 8
        return int(text, 0)
    except ValueError:
        return None


@dataclass(frozen=True)
class TileCall:
    """A verified ``cap_tile_OP_T(c, off, ld, rows, cols, arr, aoff, ald)`` call, as both
    lowerings need it: the operation, the element type and the array's flat length."""

    op: str       # "load" or "store"
    dtype: str    # "f32" or "f64"
    array: str
    flat_len: int


def tile_call(name: str, args: list[c_ast.Node], arrays: dict[str, Any]) -> TileCall:
    """Split a tile builtin's name and size its array (``arrays``: name -> dimensions)."""
    op, t = name[len("cap_tile_"):].split("_")
    arr = args[5]
    assert isinstance(arr, c_ast.ID), "the verifier admits only array names here"
    n = 1
    for d in arrays[arr.name]:
        n *= d
    return TileCall(op, t, arr.name, n)


#: Builtins whose value is fixed for a thread during a launch.
INDEX_BUILTINS = frozenset({"rt_block_idx", "rt_grid_dim", "rt_thread_idx", "rt_block_dim",
                            "rt_lane_idx", "rt_block_idx_y", "rt_grid_dim_y"})


def pure_expr(node: c_ast.Node) -> bool:
    """No side effects and cannot fault: safe to evaluate early or twice."""
    if isinstance(node, (c_ast.ID, c_ast.Constant)):
        return not (isinstance(node, c_ast.Constant) and node.type in ("string", "char"))
    if isinstance(node, c_ast.BinaryOp):
        if node.op in ("/", "%"):
            # only a non-zero integer literal divisor: the guard must never fault
            divisor = int_literal(node.right)
            return pure_expr(node.left) and divisor is not None and divisor != 0
        return pure_expr(node.left) and pure_expr(node.right)
    if isinstance(node, c_ast.UnaryOp):
        return node.op in ("-", "+", "~", "!") and pure_expr(node.expr)
    if isinstance(node, c_ast.Cast):
        return pure_expr(node.expr)
    if isinstance(node, c_ast.TernaryOp):
        return pure_expr(node.cond) and pure_expr(node.iftrue) and pure_expr(node.iffalse)
    if isinstance(node, c_ast.FuncCall) and isinstance(node.name, c_ast.ID):
        if node.name.name.startswith("cap_len_") or node.name.name in INDEX_BUILTINS:
            return all(pure_expr(a) for a in (node.args.exprs if node.args else []))
    return False


def pure_lvalue(lv: c_ast.Node) -> bool:
    """A variable or an array element with pure subscripts (safe to evaluate twice)."""
    if isinstance(lv, c_ast.ID):
        return True
    if isinstance(lv, c_ast.ArrayRef):
        return pure_lvalue(lv.name) and pure_expr(lv.subscript)
    return False


def conjoin(op: str, terms: list[c_ast.Node]) -> c_ast.Node:
    """``terms`` joined by ``op`` ("&&" or "&") as a balanced tree, left to right, so
    that a guard over thousands of accesses nests log2(n) deep, not n (every pass
    that walks it recurses).  The same value and order of evaluation as a chain."""
    if not terms:
        raise ValueError("conjoin of no terms")
    while len(terms) > 1:
        terms = [c_ast.BinaryOp(op, terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def node_fields(n: c_ast.Node) -> Iterator[tuple[str, Any]]:
    """(attribute, value) for every child slot of a pycparser node."""
    for cls in type(n).__mro__:  # marked subclasses (hoist/) add no slots of their own
        for attr in cls.__dict__.get("__slots__", ()):
            if attr not in ("coord", "__weakref__"):
                yield attr, getattr(n, attr, None)


#: runtime calls whose result is a cap_t
CAP_RESULT_PREFIXES = ("cap_load_cap", "cap_alloc_", "cap_offset_", "cap_from_int")


def _call_name(node: c_ast.Node) -> str | None:
    if isinstance(node, c_ast.FuncCall) and isinstance(node.name, c_ast.ID):
        return node.name.name
    return None


@dataclass(frozen=True)
class CapTyping:
    """What a function body needs to know to classify expressions."""

    cap_vars: frozenset[str]    # cap_t params and locals
    cap_funcs: frozenset[str]   # functions of this source returning cap_t
    user_funcs: frozenset[str]  # functions of this source (calls may poll)

    def is_cap(self, e: c_ast.Node | None) -> bool:
        """Whether an (accepted) expression has type cap_t."""
        if isinstance(e, c_ast.ID):
            return e.name in self.cap_vars
        name = _call_name(e) if e is not None else None
        if name is not None:
            return name in self.cap_funcs or name.startswith(CAP_RESULT_PREFIXES)
        if isinstance(e, c_ast.TernaryOp):
            return self.is_cap(e.iftrue) or self.is_cap(e.iffalse)
        if isinstance(e, c_ast.ExprList):
            return bool(e.exprs) and self.is_cap(e.exprs[-1])
        return False

    def may_safepoint(self, e: c_ast.Node | None) -> bool:
        """Whether evaluating ``e`` can reach a pollcheck or the allocator."""
        if e is None:
            return False
        name = _call_name(e)
        if name is not None and (name in self.user_funcs or name.startswith("cap_alloc_")):
            return True
        return any(self.may_safepoint(c) for _, c in e.children())

    def spill_args(self, call: c_ast.FuncCall) -> list[bool] | None:
        """For a call that must spill: per argument, whether it is a cap held in a root.

        A call spills when one argument may reach a safepoint and another one
        computes a cap (a loaded, allocated or returned cap lives only in a
        compiler temporary; cap variables already sit in their shadow slots).
        All arguments are then evaluated in source order into temporaries.
        """
        args = call.args.exprs if call.args is not None else []
        if len(args) < 2:
            return None
        held = [self.is_cap(a) and not isinstance(a, c_ast.ID) for a in args]
        safe = [self.may_safepoint(a) for a in args]
        if not any(h and any(s for j, s in enumerate(safe) if j != i)
                   for i, h in enumerate(held)):
            return None
        return held

    def spill_slots(self, node: c_ast.Node | None) -> int:
        """Hidden shadow slots the spills under ``node`` need at most at one time."""
        if node is None:
            return 0
        inner = max((self.spill_slots(c) for _, c in node.children()), default=0)
        if isinstance(node, c_ast.FuncCall):
            held = self.spill_args(node)
            if held is not None:
                own = sum(held)
                args = node.args.exprs
                # argument k is evaluated while the roots of arguments < k are live
                live = max(sum(held[:k]) + self.spill_slots(a) for k, a in enumerate(args))
                return max(own, live)
        return inner


class StmtExpr(c_ast.Node):
    """GNU statement expression ``({ decl; ...; expr; })`` (CPU lowering only)."""

    __slots__ = ("decls", "expr", "coord", "__weakref__")
    attr_names = ()

    def __init__(self, decls: list[tuple[str, str, c_ast.Node]], expr: c_ast.Node,
                 coord: Any = None):
        self.decls = decls  # (C type, name, initialiser)
        self.expr = expr
        self.coord = coord

    def children(self) -> tuple:
        out = [(f"decls[{i}]", d[2]) for i, d in enumerate(self.decls)]
        return tuple(out + [("expr", self.expr)])


#: Every name the user declares (parameters, locals, arrays, helpers, kernels) is
#: printed as USER_PREFIX + name in the generated C and CUDA.  The kernel text shares
#: its translation unit with libc, CUDA and C++ headers: a user name spelled like one
#: of their macros (``errno``, ``HUGE_VAL``, ``linux``) or like a C++ keyword
#: (``class``, ``and``) would otherwise be rewritten by the preprocessor or the
#: parser behind the verifier's back.  No macro of either lane starts with this
#: prefix (tests/test_hermetic.py) and the verifier refuses user names starting
#: with "capqr" in any case, so a prefixed name can never meet another name.
USER_PREFIX = "capqr_u_"


def mangle(name: str) -> str:
    """The generated-code spelling of the user name ``name``."""
    return USER_PREFIX + name


def demangle(text: str) -> str:
    """``text`` (a compiler diagnostic) with the user names spelled as the user wrote them."""
    return re.sub(rf"\b{USER_PREFIX}(?=\w)", "", text)


def user_names(ast: c_ast.FileAST) -> frozenset[str]:
    """Every name declared by the user's source: functions, their parameters (also in
    prototypes), locals and local arrays."""
    found: set[str] = set()

    class V(c_ast.NodeVisitor):
        def visit_Decl(self, n: c_ast.Decl) -> None:
            if n.name is not None:
                found.add(n.name)
            self.generic_visit(n)

    for ext in ast.ext:
        if ext.coord is not None and ext.coord.file == "kernel":  # not the typedef prelude
            V().visit(ext)
    return frozenset(found)


def rename_user_names(root: c_ast.Node, names: frozenset[str] | set[str]) -> None:
    """Spell every user name under ``root`` as :func:`mangle` does, in place, just
    before printing (the analyses keep working on the user's names).  The lowerings
    share node objects between places of their output, so each object is renamed
    once; runtime names never collide with user names (the verifier's reserved
    prefixes), and member names (``__rt->block_idx``) are not variables."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, c_ast.ID) and n.name in names:
            n.name = mangle(n.name)
        elif isinstance(n, c_ast.Decl) and n.name in names:
            n.name = mangle(n.name)
        elif isinstance(n, c_ast.TypeDecl) and n.declname in names:
            n.declname = mangle(n.declname)
        for attr, child in n.children():
            if isinstance(n, c_ast.StructRef) and attr == "field":
                continue
            todo.append(child)


_LINE_DIRECTIVE = re.compile(r'#line (\d+) "([^"]*)"\Z')


def squeeze_line_directives(text: str) -> str:
    """Drop each ``#line N "F"`` that states where the compiler already is (the
    statement before it ended on the line above N in F): the C stays readable and
    every remaining directive is needed."""
    out: list[str] = []
    line: int | None = None  # the presumed line of the next physical line, if known
    file: str | None = None
    for phys in text.split("\n"):
        m = _LINE_DIRECTIVE.match(phys.strip())
        if m is not None:
            n, f = int(m.group(1)), m.group(2)
            if (n, f) == (line, file):
                continue
            out.append(phys.strip())
            line, file = n, f
            continue
        out.append(phys)
        if phys.lstrip().startswith("#include"):
            line = file = None  # the included file's lines do not count here
        elif line is not None:
            line += 1
    return "\n".join(out)


def readable(text: str) -> str:
    """Generated C or CUDA with the user's names as written and no ``#line`` lines: what
    a reader (or a test looking for a statement) wants to see."""
    return demangle("\n".join(ln for ln in text.split("\n")
                               if not _LINE_DIRECTIVE.match(ln.strip())))


class Generator(c_generator.CGenerator):
    """CGenerator that also prints :class:`StmtExpr` and loop versioning's marked nodes
    (subclasses of For/While/DoWhile/ArrayRef/FuncCall: printed as their base).

    ``line_directives``: each statement and function from the user's source is
    preceded by ``#line N "kernel"`` (its source line), so the compiler's diagnostics
    name kernel lines (pass the printed text through :func:`squeeze_line_directives`)."""

    def __init__(self, line_directives: bool = False) -> None:
        super().__init__()
        self.line_directives = line_directives

    def _directive(self, n: c_ast.Node) -> str:
        c = n.coord
        if not self.line_directives or c is None or c.file != "kernel" or not c.line:
            return ""
        return f'#line {c.line} "kernel"\n'

    def visit_FuncDef(self, n: c_ast.FuncDef) -> str:
        return self._directive(n) + super().visit_FuncDef(n)

    def visit(self, node: c_ast.Node) -> str:
        method = getattr(self, "visit_" + node.__class__.__name__, None)
        if method is None:
            for base in type(node).__mro__[1:]:
                method = getattr(self, "visit_" + base.__name__, None)
                if method is not None:
                    break
        return method(node) if method is not None else self.generic_visit(node)

    def visit_StmtExpr(self, n: StmtExpr) -> str:
        parts = [f"{ty} {name} = {self.visit(init)};" for ty, name, init in n.decls]
        return "({ " + " ".join(parts) + f" {self.visit(n.expr)}; }})"

    def _generate_stmt(self, n: c_ast.Node, add_indent: bool = False) -> str:
        if isinstance(n, StmtExpr):
            self.indent_level += 2 if add_indent else 0
            indent = self._make_indent()
            self.indent_level -= 2 if add_indent else 0
            return self._directive(n) + indent + self.visit(n) + ";\n"
        return self._directive(n) + super()._generate_stmt(n, add_indent)


def callees(body: c_ast.Node, names: set[str] | frozenset[str]) -> set[str]:
    """Names in ``names`` called (by plain name) anywhere under ``body``."""
    found: set[str] = set()

    class _Calls(c_ast.NodeVisitor):
        def visit_FuncCall(self, node: c_ast.FuncCall) -> None:
            if isinstance(node.name, c_ast.ID) and node.name.name in names:
                found.add(node.name.name)
            self.generic_visit(node)

    _Calls().visit(body)
    return found


def reaching(graph: dict[str, set[str]], targets: set[str]) -> set[str]:
    """Functions of the call ``graph`` that are in ``targets`` or call one, directly or
    through other functions."""
    found = set(targets)
    grew = True
    while grew:
        grew = False
        for f, called in graph.items():
            if f not in found and called & found:
                found.add(f)
                grew = True
    return found


#: The signed integer types of the dialect, by bits (int counters are guarded by
#: rt_loop_span32: the start fits, no wrap past INT32_MAX).
INT_TYPES = {"int64_t": 64, "long": 64, "int": 32, "int32_t": 32}


def int_types(func: c_ast.FuncDef) -> dict[str, int]:
    """Bits of every integer variable of ``func`` (parameters and locals); 0 for a
    name declared with two different types (sibling scopes may reuse a name)."""
    out: dict[str, int] = {}

    class V(c_ast.NodeVisitor):
        def visit_Decl(self, n: c_ast.Decl) -> None:
            t = n.type
            bits = 0
            if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.IdentifierType):
                bits = INT_TYPES.get(" ".join(t.type.names), 0)
            if n.name is not None:
                out[n.name] = bits if out.get(n.name, bits) == bits else 0
            self.generic_visit(n)

    V().visit(func)
    return out


#: Unary operators that write their operand (``&`` is counted apart: see write_counts).
INC_DEC = frozenset({"++", "--", "p++", "p--"})


def write_target(target: c_ast.Node) -> tuple[str, bool]:
    """(name, whole) for the target of ``=``, ``op=``, ``++`` or ``--``: the variable
    written, and whether the write replaces it (a name) or one element (``a[i]``).

    The verifier admits no other target (runtime/compiler/verifier.py _write_target).  C++,
    which the GPU lane compiles, would also take ``c ? a : b``, ``(x, a)``, ``a = b``,
    ``a += b`` and ``++a`` as lvalues, writes this could not attribute to a name:
    every analysis built on it would take the variable as unchanged.  So a tree the
    verifier did not admit fails here rather than being misread (an AssertionError
    raised explicitly, so that ``python -O`` keeps it)."""
    base = target
    while isinstance(base, c_ast.ArrayRef):
        base = base.name
    if not isinstance(base, c_ast.ID):
        raise AssertionError(
            f"a write to a {type(target).__name__}: the verifier admits only a name or an "
            "element of a local array as the target of =, op=, ++ and --")
    return base.name, base is target


def write_counts(node: c_ast.Node) -> dict[str, int]:
    """How often each name is declared or assigned as a whole under node: the one
    analysis of names written, which loop versioning (hoist/), range proofs
    (ranges.py) and the nest guards use to decide that a variable is unchanged.

    It sees every write the verifier admits (write_target): ``=``/``op=``/``++``/``--``
    on a name, and a declaration.  An element write (``a[i] = v``) changes the
    array's contents, not the name, and is not counted: array names appear in no
    index expression these counts vouch for (hoist/ takes an array declared in a
    loop as changed).  An address taken (``&span``, as the guards' rt_loop_span does
    in generated code; the verifier refuses ``&`` in kernels) counts as a write of
    the name."""
    out: dict[str, int] = {}

    def count(name: str) -> None:
        out[name] = out.get(name, 0) + 1

    class V(c_ast.NodeVisitor):
        def visit_Assignment(self, n: c_ast.Assignment) -> None:
            name, whole = write_target(n.lvalue)
            if whole:
                count(name)
            self.generic_visit(n)

        def visit_UnaryOp(self, n: c_ast.UnaryOp) -> None:
            if n.op in INC_DEC:
                name, whole = write_target(n.expr)
                if whole:
                    count(name)
            elif n.op == "&" and isinstance(n.expr, c_ast.ID):
                count(n.expr.name)
            self.generic_visit(n)

        def visit_Decl(self, n: c_ast.Decl) -> None:
            if n.name is not None:
                count(n.name)
            self.generic_visit(n)

    V().visit(node)
    return out


def is_int64(expr: c_ast.Node, types: dict[str, int]) -> bool:
    """expr has a 64-bit integer type (C's usual arithmetic conversions)."""
    if isinstance(expr, c_ast.ID):
        return types.get(expr.name) == 64
    if isinstance(expr, c_ast.Cast):
        names = getattr(getattr(expr.to_type, "type", None), "type", None)
        return getattr(names, "names", []) in (["int64_t"], ["long"])
    if isinstance(expr, c_ast.BinaryOp) and expr.op in ("+", "-", "*", "/"):
        return is_int64(expr.left, types) or is_int64(expr.right, types)
    if isinstance(expr, c_ast.UnaryOp) and expr.op in ("-", "+"):
        return is_int64(expr.expr, types)
    if isinstance(expr, c_ast.TernaryOp):
        return is_int64(expr.iftrue, types) or is_int64(expr.iffalse, types)
    return False


def cast_i64(expr: c_ast.Node) -> c_ast.Cast:
    """(int64_t)(expr)."""
    t = c_ast.TypeDecl(None, [], None, c_ast.IdentifierType(["int64_t"]))
    return c_ast.Cast(c_ast.Typename(None, [], None, t), expr)
