"""The verifier's shared state and the questions every rule asks of it: where a node
is (its line, whether it is a statement), what a name is (variable, function, builtin)
and whether an expression is a cap_t; with the refusals the traversal itself makes.

The rules are subclasses by job: verify_decls (names, types, declarations),
verify_stmts (statements and expressions), verify_calls (calls against the builtin
table); runtime.compiler.verifier's _Verifier joins them and drives the traversal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NoReturn

from pycparser import c_ast

from ..errors import VerifyError
from .dialect_api import BUILTINS, Sig
from .parse import ParsedSource

ASM_NAMES = {"asm", "__asm__", "__asm"}
UNSAFE_CAP_USE = ("cap_t values may only be passed, assigned, returned or declared: arithmetic, "
                   "comparison or conversion of a capability would forge it or leak its bounds "
                   "(use cap_offset_T / cap_to_int)")
NOT_SUPPORTED = "{} is not part of the kernel dialect"


# Node types refused outright: (construct, reason).
REJECT: dict[str, tuple[str, str]] = {
    "Goto": ("goto", "unstructured jumps could skip initialisers and pollchecks"),
    "Label": ("label", "labels exist only for goto, which is not supported"),
    "StructRef": ("member access",
                  "member access is not part of the dialect (cap_t fields are private)"),
    "CompoundLiteral": ("compound literal",
                        "compound literals create unnamed objects the runtime does not track"),
    "Pragma": ("pragma", "pragmas change code generation behind the verifier's back"),
    "StaticAssert": ("_Static_assert", "_Static_assert is not part of the kernel dialect"),
    "Typedef": ("typedef",
                "user typedefs could hide a pointer or struct; the dialect's types are fixed"),
    "Struct": ("struct", "struct types are not part of the dialect"),
    "Union": ("union", "union types could overlay a cap_t with plain data"),
    "Enum": ("enum", "enum is not part of the kernel dialect"),
    "NamedInitializer": ("designated initializer",
                         "designated initializers are not part of the kernel dialect"),
    "EllipsisParam": ("variadic function",
                      "variadic arguments are read without type or bounds checks"),
    "Alignas": ("_Alignas", "over-aligned objects can make huge stack frames"),
    "PtrDecl": ("pointer declarator", "pointer types are not part of the dialect"),
    "FuncDecl": ("function pointer", "function values are not part of the dialect"),
}


@dataclass
class Var:
    kind: str  # "cap", "num" or "array"
    dims: tuple[int, ...] = ()
    elem: str = ""       # arrays: element type ("float", "double", ...)
    const: bool = False  # arrays: declared const


@dataclass
class FuncCtx:
    name: str
    is_kernel: bool
    ret: str
    scopes: list[dict[str, Var]] = field(default_factory=list)
    caps: list[str] = field(default_factory=list)
    arrays: dict[str, tuple[int, ...]] = field(default_factory=dict)
    unique: set[str] = field(default_factory=set)  # cap_t and array names seen anywhere
    block_dim: int | None = None  # rt_require_block_dim(N) of a kernel
    top_calls: frozenset[int] = frozenset()  # ids of the calls that are body statements


class Scope(c_ast.NodeVisitor):
    """What the rules share (set up by runtime.compiler.verifier._Verifier)."""

    parsed: ParsedSource
    target: str
    _stack: list[c_ast.Node]  # the nodes being visited, outermost first
    _fn: FuncCtx | None  # the function being visited
    _cap_ok: set[int]  # cap-typed nodes a parent placed in a cap slot
    _array_ok: set[int]  # array IDs used as subscript base or sizeof operand
    _init_ok: set[int]  # InitLists that initialise an array
    _sigs: dict[str, Sig]  # this source's functions

    def _line(self, node: c_ast.Node | None) -> int | None:
        for n in ([node] if node is not None else []) + self._stack[::-1]:
            if n is not None and n.coord is not None and n.coord.line:
                return n.coord.line
        return None

    def _fail(self, node: c_ast.Node | None, construct: str, reason: str) -> NoReturn:
        raise VerifyError(self._line(node), construct, reason)

    def _lookup(self, name: str) -> Var | None:
        if self._fn is None:
            return None
        for scope in reversed(self._fn.scopes):
            if name in scope:
                return scope[name]
        return None

    def _sig(self, name: str) -> Sig | None:
        if self._lookup(name) is not None:
            return None
        if name in BUILTINS:
            return BUILTINS[name].sig
        return self._sigs.get(name)

    def _is_cap(self, e: c_ast.Node | None) -> bool:
        """Whether an expression has type cap_t (as far as the dialect allows)."""
        if isinstance(e, c_ast.ID):
            var = self._lookup(e.name)
            return var is not None and var.kind == "cap"
        if isinstance(e, c_ast.FuncCall) and isinstance(e.name, c_ast.ID):
            sig = self._sig(e.name.name)
            return sig is not None and sig[1] == "cap"
        if isinstance(e, c_ast.Assignment):
            return self._is_cap(e.lvalue) or self._is_cap(e.rvalue)
        if isinstance(e, c_ast.TernaryOp):
            return self._is_cap(e.iftrue) or self._is_cap(e.iffalse)
        if isinstance(e, c_ast.ExprList):
            return bool(e.exprs) and self._is_cap(e.exprs[-1])
        if isinstance(e, c_ast.Cast):
            return self._is_cap_type(e.to_type)
        return False

    @staticmethod
    def _is_cap_type(t: c_ast.Node) -> bool:
        while not isinstance(t, c_ast.IdentifierType):
            t = getattr(t, "type", None)
            if t is None:
                return False
        return "cap_t" in t.names

    def _in_stmt_pos(self) -> bool:
        """Whether the node being visited is a statement (its value, if any, is discarded)."""
        i = len(self._stack) - 1
        while i >= 1:
            child, parent = self._stack[i], self._stack[i - 1]
            if isinstance(parent, c_ast.Case):
                return child is not parent.expr
            if isinstance(parent, (c_ast.Compound, c_ast.Default, c_ast.FuncDef)):
                return True
            if isinstance(parent, (c_ast.If, c_ast.For)):
                return child is not parent.cond
            if isinstance(parent, (c_ast.While, c_ast.DoWhile, c_ast.Switch)):
                return child is parent.stmt
            if isinstance(parent, c_ast.ExprList) and i >= 2 and not isinstance(
                    self._stack[i - 2], c_ast.FuncCall):
                i -= 1  # comma expression: look at where the whole list sits
                continue
            return False
        return False

    def _cap_context(self, node: c_ast.Node) -> None:
        """Reject a cap-typed node that no parent placed in a cap slot."""
        if id(node) in self._cap_ok or self._in_stmt_pos():
            return
        parent = self._stack[-2] if len(self._stack) >= 2 else None
        if isinstance(parent, (c_ast.BinaryOp, c_ast.UnaryOp)):
            construct = f"cap_t operand of '{parent.op}'"
        elif isinstance(parent, c_ast.TernaryOp):
            construct = ("cap_t as condition" if node is parent.cond
                         else "cap_t in conditional expression")
        elif isinstance(parent, (c_ast.If, c_ast.For, c_ast.While, c_ast.DoWhile, c_ast.Switch)):
            construct = "cap_t as condition"
        elif isinstance(parent, c_ast.ArrayRef):
            construct = "cap_t as array subscript"
        else:
            construct = "cap_t used as a value"
        self._fail(node, construct, UNSAFE_CAP_USE)
