"""The kernel verifier: the security boundary between kernel source and the C compiler.

Everything the instrumenter cannot make safe is refused here, with a line number and
a reason (in the style of the Linux eBPF verifier).  The dialect is documented in
docs/dialect.md.  The verifier is an allow-list: every AST node type it does not know
is rejected, every identifier must resolve to a declared variable, a function of this
source, the runtime API or the math whitelist, and ``cap_t`` values may only be
passed, assigned, returned or declared.

Rules beyond the dialect document (all needed to keep capabilities unforgeable):

* ``cap_t`` locals must be initialised, may not be declared where a ``case`` label
  could jump past the initialiser, and a ``cap_t`` function must return on every path
  (otherwise stack garbage would become a capability);
* no initialised declaration of any type where a later ``case``/``default`` label can
  jump past it: the range pass takes a variable's interval from its initialiser;
* no shadowing inside a function, and ``cap_t``/array names are unique per function
  (the instrumenter keys shadow slots and bounds checks by name);
* ``case``/``default`` only directly in the switch body (no Duff's device);
* array sizes are plain integer literals (the instrumenter reads them back);
* a write (=, op=, ++, --) targets a name or a local-array element only: C++, which
  the GPU lane compiles, also writes through ?:, comma, assignment and ++x lvalues,
  which runtime.compiler.astutil.write_target (names written) could not see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn

from pycparser import c_ast

from ...capabilities import abi
from ..errors import VerifyError
from .astutil import INC_DEC, CapTyping, callees, int_literal, pure_lvalue, reaching
from .dialect_api import (
    _API_SIGS,
    _CUDA_SIGS,
    _MATH_SIGS,
    API_FUNCS,
    CUDA_API_FUNCS,
    MATH_FUNCS,
    TILE_ELEM_TYPES,
    TILE_FUNCS,
)
from .divergence import check_uniform_collectives
from .parse import ParsedSource, is_user_node

#: Threads per block on every CUDA device since sm_20 (the lane refuses more).
CUDA_MAX_BLOCK = 1024

#: cap_t params + locals per function: one shadow slot each (an rt_frame's slots).
MAX_CAP_LOCALS = abi.FRAME_SLOTS_MAX
MAX_ARRAY_ELEMS = 1 << 20
MAX_ARRAY_DIMS = 3

KERNEL_PARAM_TYPES = {"cap_t": "cap", "int64_t": "int64", "double": "double", "float": "float"}
_PARAM_C = {kind: c for c, kind in KERNEL_PARAM_TYPES.items()}
_NUM_TYPEDEFS = {"int32_t", "int64_t", "uint32_t", "uint64_t"}
_INT_WORDS = {"int", "long", "unsigned", "signed"}
_ASM = {"asm", "__asm__", "__asm"}
# Names the compiler or libc may call behind our back: a same-named helper in the
# module would capture compiler-emitted calls (struct copies go through memcpy).
_LIBC_NAMES = {
    "main", "memcpy", "memmove", "memset", "memcmp", "bcmp", "bzero", "malloc", "calloc",
    "realloc", "free", "aligned_alloc", "posix_memalign", "alloca", "abort", "exit", "atexit",
    "raise", "signal", "setjmp", "longjmp", "sigsetjmp", "siglongjmp", "system", "syscall",
    "printf", "puts", "strlen", "abs", "labs", "mmap", "munmap", "mprotect", "dlopen", "dlsym",
}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_UNSAFE_CAP_USE = ("cap_t values may only be passed, assigned, returned or declared: arithmetic, "
                   "comparison or conversion of a capability would forge it or leak its bounds "
                   "(use cap_offset_T / cap_to_int)")
_NOT_SUPPORTED = "{} is not part of the kernel dialect"
_CXX_LVALUE = ("only a variable or an element of a local array can be assigned, incremented or "
               "decremented: C++ (the GPU lane's language) also takes ?:, comma, assignment and "
               "++x expressions as lvalues, so such a write could change a variable that loop "
               "versioning and the range proofs take to be unchanged")


def _lvalue_form(e: c_ast.Node) -> str:
    """How a refused write target reads in a message."""
    if isinstance(e, c_ast.TernaryOp):
        return "a ?: expression"
    if isinstance(e, c_ast.ExprList):
        return "a comma expression"
    if isinstance(e, c_ast.Assignment):
        return "an assignment expression"
    if isinstance(e, c_ast.UnaryOp):
        return f"a '{e.op.lstrip('p')}' expression"
    if isinstance(e, c_ast.Cast):
        return "a cast"
    if isinstance(e, c_ast.FuncCall):
        return "a call"
    if isinstance(e, c_ast.Constant):
        return "a constant"
    return f"a {type(e).__name__} expression"


# Node types refused outright: (construct, reason).
_REJECT: dict[str, tuple[str, str]] = {
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
class KernelSig:
    """An entry point: params are (name, kind) with kind cap/int64/double/float."""

    name: str
    params: list[tuple[str, str]]
    line: int = 0
    #: the kernel (or a helper it calls) calls rt_group_sync: launched with group=
    group_sync: bool = False
    #: rt_require_block_dim(N): the kernel runs only with N threads per block
    block_dim: int | None = None

    @property
    def n_caps(self) -> int:
        return sum(1 for _, k in self.params if k == "cap")

    def text(self) -> str:
        """The entry point as C: ``axpy(cap_t x, cap_t y, int64_t n, double a)``."""
        return f"{self.name}({', '.join(f'{_PARAM_C[k]} {n}' for n, k in self.params)})"

    @property
    def n_scalars(self) -> int:
        return len(self.params) - self.n_caps

    @property
    def cap_names(self) -> list[str]:
        return [n for n, k in self.params if k == "cap"]

    @property
    def scalar_params(self) -> list[tuple[str, str]]:
        return [(n, k) for n, k in self.params if k != "cap"]


@dataclass
class VerifiedSource:
    """What the verifier learnt about an accepted source (consumed by the instrumenter)."""

    parsed: ParsedSource
    target: str = "cpu"
    kernels: dict[str, KernelSig] = field(default_factory=dict)
    stack_bytes: dict[str, int] = field(default_factory=dict)  # local arrays per call chain
    helpers: list[str] = field(default_factory=list)
    local_arrays: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    cap_locals: dict[str, list[str]] = field(default_factory=dict)
    returns_cap: dict[str, bool] = field(default_factory=dict)
    call_graph: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class _Var:
    kind: str  # "cap", "num" or "array"
    dims: tuple[int, ...] = ()
    elem: str = ""       # arrays: element type ("float", "double", ...)
    const: bool = False  # arrays: declared const


@dataclass
class _FuncCtx:
    name: str
    is_kernel: bool
    ret: str
    scopes: list[dict[str, _Var]] = field(default_factory=list)
    caps: list[str] = field(default_factory=list)
    arrays: dict[str, tuple[int, ...]] = field(default_factory=dict)
    unique: set[str] = field(default_factory=set)  # cap_t and array names seen anywhere
    block_dim: int | None = None  # rt_require_block_dim(N) of a kernel
    top_calls: frozenset[int] = frozenset()  # ids of the calls that are body statements


def verify(parsed: ParsedSource, *, target: str = "cpu") -> VerifiedSource:
    """Check ``parsed`` against the dialect; raise VerifyError on the first violation.

    ``target`` is ``"cpu"`` or ``"cuda"`` (which also allows the GPU runtime calls and
    ``smem_*`` shared-memory arrays in KERNEL functions).
    """
    if target not in ("cpu", "cuda"):
        raise ValueError(f"target must be 'cpu' or 'cuda', not {target!r}")
    v = _Verifier(parsed, target)
    v.visit(parsed.ast)
    if target == "cuda":
        check_uniform_collectives(parsed.funcs)
    v.result.target = target
    v.result.stack_bytes = _stack_bytes(v.result)
    return v.result


#: Local arrays along any call chain must fit well inside a worker's 16 MiB
#: stack: a stack overflow would kill the host process, not fault.
STACK_BUDGET = 8 << 20


def select_kernel(verified: VerifiedSource, name: str | None) -> str:
    """The entry point to build: ``name``, or the only KERNEL when ``name`` is None."""
    kernels = verified.parsed.kernels
    if name is None:
        if len(kernels) != 1:
            raise VerifyError(None, "kernel name", f"source defines kernels {kernels}; "
                              "pass name= to pick one")
        name = kernels[0]
    if name not in kernels:
        raise VerifyError(None, f"kernel {name!r}",
                          f"no KERNEL function of that name (found {kernels})")
    _check_stack_budget(verified, name)
    return name


def _stack_bytes(result: VerifiedSource) -> dict[str, int]:
    """Bytes of local arrays along the deepest call chain from each kernel."""
    own = {f: sum(8 * _prod(d) for d in arrays.values())
           for f, arrays in result.local_arrays.items()}
    memo: dict[str, int] = {}

    def deepest(f: str) -> int:  # the call graph is acyclic (no recursion)
        if f not in memo:
            memo[f] = own.get(f, 0) + max(
                (deepest(g) for g in result.call_graph.get(f, ())), default=0)
        return memo[f]

    return {k: deepest(k) for k in result.kernels}


def _elem_text(t: c_ast.Node) -> str:
    """Element type of an array declarator ("float", "int64_t", ...)."""
    while not isinstance(t, c_ast.IdentifierType):
        t = t.type
    return " ".join(t.names)


def _check_stack_budget(result: VerifiedSource, kernel: str) -> None:
    """Reject a CPU kernel whose local arrays could overflow a worker stack."""
    need = result.stack_bytes.get(kernel, 0)
    if result.target == "cpu" and need > STACK_BUDGET:
        raise VerifyError(result.parsed.funcs[kernel].decl.coord.line, "local arrays",
                          f"kernel {kernel!r} and its callees need about {need >> 10} "
                          f"KiB of local arrays; the limit is {STACK_BUDGET >> 10} KiB "
                          "(use a buffer from capabilities.alloc or cap_alloc_*)")


def _prod(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def _cycle_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Call edges (f, g) that lie on a cycle, mapped to a path g -> ... -> f."""
    def path(src: str, dst: str) -> list[str] | None:
        prev: dict[str, str | None] = {src: None}
        todo = [src]
        while todo:
            cur = todo.pop()
            if cur == dst:
                out = [cur]
                while prev[out[-1]] is not None:
                    out.append(prev[out[-1]])  # type: ignore[arg-type]
                return out[::-1]
            for nxt in sorted(graph.get(cur, ())):
                if nxt not in prev:
                    prev[nxt] = cur
                    todo.append(nxt)
        return None

    edges = {}
    for f, called in graph.items():
        for g in called:
            p = path(g, f)
            if p is not None:
                edges[(f, g)] = p
    return edges


class _Verifier(c_ast.NodeVisitor):
    """One pass over the user's AST in source order; raises on the first violation."""

    def __init__(self, parsed: ParsedSource, target: str):
        self.parsed = parsed
        self.target = target
        self.result = VerifiedSource(parsed=parsed)
        self._stack: list[c_ast.Node] = []
        self._fn: _FuncCtx | None = None
        self._cap_ok: set[int] = set()  # cap-typed nodes a parent placed in a cap slot
        self._array_ok: set[int] = set()  # array IDs used as subscript base or sizeof operand
        self._init_ok: set[int] = set()  # InitLists that initialise an array
        self._defined: set[str] = set()
        self._sigs: dict[str, tuple[tuple[str, ...], str]] = {}
        self._prepass()

    # -- helpers ----------------------------------------------------------------
    def _line(self, node: c_ast.Node | None) -> int | None:
        for n in ([node] if node is not None else []) + self._stack[::-1]:
            if n is not None and n.coord is not None and n.coord.line:
                return n.coord.line
        return None

    def _fail(self, node: c_ast.Node | None, construct: str, reason: str) -> NoReturn:
        raise VerifyError(self._line(node), construct, reason)

    def _prepass(self) -> None:
        """Collect function signatures and the call graph (calls may precede definitions)."""
        funcs = [e for e in self.parsed.ast.ext
                 if is_user_node(e) and isinstance(e, c_ast.FuncDef)]
        for f in funcs:
            self._sigs.setdefault(f.decl.name, self._loose_sig(f.decl.type))
        graph: dict[str, set[str]] = {}
        names = set(self._sigs)
        for f in funcs:
            graph.setdefault(f.decl.name, set()).update(callees(f.body, names))
        self.result.call_graph = graph
        self._cycles = _cycle_edges(graph)
        self._group_sync = reaching(graph, {f.decl.name for f in funcs
                                             if callees(f.body, {"rt_group_sync"})})

    @staticmethod
    def _loose_sig(fdecl: c_ast.Node) -> tuple[tuple[str, ...], str]:
        """Best-effort (param kinds, return kind); the real checks come in source order."""
        def kind(t: c_ast.Node) -> str:
            if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.IdentifierType):
                if t.type.names == ["cap_t"]:
                    return "cap"
                if t.type.names == ["void"]:
                    return "void"
            return "num"

        if not isinstance(fdecl, c_ast.FuncDecl):
            return (), "num"
        params = []
        for p in (fdecl.args.params if fdecl.args else []):
            if isinstance(p, (c_ast.Decl, c_ast.Typename)) and kind(p.type) != "void":
                params.append(kind(p.type))
        return tuple(params), kind(fdecl.type)

    def _check_name(self, node: c_ast.Node, name: str, *, declaring: str | None = None) -> None:
        """Identifier rules; ``declaring`` is "function"/"variable" for declarations."""
        if not _IDENT.match(name):
            self._fail(node, f"identifier '{name}'", "only ASCII identifiers are supported")
        if name.startswith("__") or (declaring == "function" and name.startswith("_")):
            self._fail(node, f"reserved identifier '{name}'",
                       "names starting with '__' (or '_' at file scope) belong to the compiler, "
                       "libc and the instrumenter's hidden state")
        low = name.lower()
        if low.startswith(("rt_", "cap_", "capqr")) and (
                declaring or name not in API_FUNCS | CUDA_API_FUNCS):
            self._fail(node, f"runtime name '{name}'",
                       "the rt_/cap_ prefixes are reserved for the runtime API and its checked "
                       "implementation; only the documented API names may be used")
        if declaring and name in MATH_FUNCS:
            self._fail(node, f"redefinition of '{name}'",
                       "math whitelist names always refer to the math library")
        if declaring == "function" and name in _LIBC_NAMES:
            self._fail(node, f"function named '{name}'",
                       "libc/compiler-reserved names could capture calls the compiler emits "
                       "(or be mistaken for the program entry point)")

    def _base_type(self, t: c_ast.Node, what: str) -> tuple[str, str, tuple[int, ...] | None]:
        """Walk a declarator: returns (kind, type text, dims or None) or rejects."""
        raw_dims: list[c_ast.Node | None] = []
        while True:
            if isinstance(t, c_ast.PtrDecl):
                inner = t.type
                while isinstance(inner, (c_ast.PtrDecl, c_ast.ArrayDecl)):
                    inner = inner.type
                if isinstance(inner, c_ast.FuncDecl):
                    self._fail(t, "function pointer", "function values are not part of the "
                               "dialect: an indirect call could jump anywhere")
                self._fail(t, "pointer declarator",
                           f"pointer types ({what}) are not part of the dialect: memory is only "
                           "reachable through cap_t and the checked accessors")
            if isinstance(t, c_ast.FuncDecl):
                self._fail(t, "function pointer" if what != "local declaration"
                           else "function declaration inside a function",
                           "functions can only be declared at file scope and called by name; a "
                           "function-typed value could jump anywhere")
            if isinstance(t, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
                kw = type(t).__name__.lower()
                self._fail(t, kw, f"{kw} types are not part of the dialect (a {kw} could overlay "
                           "or expose the fields of a cap_t)")
            if isinstance(t, c_ast.ArrayDecl):
                if t.dim_quals:
                    self._fail(t, "array qualifier", _NOT_SUPPORTED.format("'static'/qualified "
                                                                          "array bounds"))
                raw_dims.append(t.dim)
                t = t.type
                continue
            if isinstance(t, c_ast.TypeDecl):
                for q in t.quals:
                    if q != "const":
                        self._fail(t, f"'{q}' qualifier",
                                   "only 'const' is allowed; other qualifiers change memory "
                                   "semantics the runtime does not model")
                t = t.type
                continue
            if isinstance(t, c_ast.IdentifierType):
                break
            self._fail(t, f"type {type(t).__name__}", _NOT_SUPPORTED.format("this type"))
        kind, text = self._scalar_kind(t)
        if not raw_dims:
            return kind, text, None
        dims = self._array_dims(t, raw_dims)
        return kind, text, dims

    def _scalar_kind(self, it: c_ast.IdentifierType) -> tuple[str, str]:
        names = list(it.names)
        text = " ".join(names)
        if names == ["cap_t"]:
            return "cap", text
        if names == ["void"]:
            return "void", text
        if names in (["float"], ["double"]) or (len(names) == 1 and names[0] in _NUM_TYPEDEFS):
            return "num", text
        if (set(names) <= _INT_WORDS and names.count("long") <= 2 and names.count("int") <= 1
                and not {"signed", "unsigned"} <= set(names)
                and names.count("signed") + names.count("unsigned") <= 1):
            return "num", text
        for bad, why in (("char", "char types (and string data) are not part of the dialect"),
                         ("short", "use int32_t/int64_t"),
                         ("_Bool", "use int"),
                         ("_Complex", "complex arithmetic is not supported"),
                         ("_Imaginary", "complex arithmetic is not supported")):
            if bad in names:
                self._fail(it, f"type '{text}'", why)
        if "long" in names and "double" in names:
            self._fail(it, "type 'long double'", "long double is not supported on every target")
        self._fail(it, f"type '{text}'", "allowed types: void, int, long, unsigned, int32_t, "
                   "int64_t, uint32_t, uint64_t, float, double, cap_t")
        raise AssertionError  # unreachable

    def _array_dims(self, node: c_ast.Node, raw: list[c_ast.Node | None]) -> tuple[int, ...]:
        if len(raw) > MAX_ARRAY_DIMS:
            self._fail(node, "array with more than 3 dimensions",
                       f"local arrays have at most {MAX_ARRAY_DIMS} dimensions")
        dims = []
        for d in raw:
            if d is None:
                self._fail(node, "array without a size",
                           "local arrays need an explicit integer-literal size")
            val = int_literal(d)
            if val is None:
                self._fail(d, "non-constant array size",
                           "array sizes must be decimal or hex integer literals: a runtime "
                           "size (VLA/alloca) could overflow the stack, and the instrumenter "
                           "reads the bounds back from the literal")
            if val <= 0:
                self._fail(d, "non-positive array size", "array sizes must be at least 1")
            dims.append(val)
        total = 1
        for d in dims:
            total *= d
        if total > MAX_ARRAY_ELEMS:
            self._fail(node, "array too large",
                       f"{total} elements exceeds the {MAX_ARRAY_ELEMS}-element limit for "
                       "stack arrays (stack overflow)")
        return tuple(dims)

    def _lookup(self, name: str) -> _Var | None:
        if self._fn is None:
            return None
        for scope in reversed(self._fn.scopes):
            if name in scope:
                return scope[name]
        return None

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

    def _sig(self, name: str) -> tuple[tuple[str, ...], str] | None:
        if self._lookup(name) is not None:
            return None
        if name in _API_SIGS:
            return _API_SIGS[name]
        if name in _CUDA_SIGS:
            return _CUDA_SIGS[name]
        if name in _MATH_SIGS:
            return _MATH_SIGS[name]
        return self._sigs.get(name)

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
        self._fail(node, construct, _UNSAFE_CAP_USE)

    # -- traversal --------------------------------------------------------------
    _ALLOWED = frozenset({
        "FileAST", "FuncDef", "Compound", "Decl", "DeclList", "ID", "Constant", "FuncCall",
        "ExprList", "Assignment", "BinaryOp", "UnaryOp", "TernaryOp", "Cast", "ArrayRef",
        "InitList", "If", "For", "While", "DoWhile", "Switch", "Case", "Default", "Break",
        "Continue", "Return", "EmptyStatement",
    })
    def visit(self, node: c_ast.Node) -> None:
        """Dispatch with a parent stack; unknown node types are rejected."""
        name = type(node).__name__
        self._stack.append(node)
        try:
            if name in _REJECT:
                self._fail(node, *_REJECT[name])
            if name not in self._ALLOWED:
                self._fail(node, f"{name} node", _NOT_SUPPORTED.format(f"'{name}'"))
            getattr(self, "visit_" + name, self.generic_visit)(node)
        finally:
            self._stack.pop()

    def visit_FileAST(self, node: c_ast.FileAST) -> None:
        for ext in node.ext:
            if not is_user_node(ext):
                continue  # the dialect's typedef prelude
            if isinstance(ext, c_ast.Decl):
                self._stack.append(ext)
                try:
                    self._top_decl(ext)
                finally:
                    self._stack.pop()
            else:
                self.visit(ext)
        if not self.parsed.kernels:
            raise VerifyError(None, "missing KERNEL function",
                              "a source needs at least one 'KERNEL void name(...)' entry point")

    def _top_decl(self, decl: c_ast.Decl) -> None:
        if "extern" in decl.storage:
            self._fail(decl, "extern declaration",
                       "external symbols are code and data the verifier never saw")
        if not isinstance(decl.type, c_ast.FuncDecl):
            if decl.name:
                self._check_name(decl, decl.name, declaring="variable")
            self._base_type(decl.type, "file-scope declaration")
            self._fail(decl, "global variable",
                       "file-scope data is shared by all blocks without synchronisation and "
                       "is not tracked by the runtime; use locals or buffers")
        self._check_name(decl, decl.name, declaring="function")
        self._storage(decl, function=True)
        if decl.name not in self._sigs:
            self._fail(decl, f"declaration of '{decl.name}'",
                       "only functions defined in this source may be declared (an external "
                       "function would link to code the verifier never saw)")
        params, ret = self._signature(decl.type, is_kernel=False, prototype=True)
        if (tuple("cap" if k == "cap" else "num" for _, k in params), ret) != (
                self._sigs[decl.name]):
            self._fail(decl, f"prototype of '{decl.name}'",
                       "the prototype does not match the definition (calls would pass "
                       "mistyped arguments)")

    def _storage(self, decl: c_ast.Decl, *, function: bool) -> None:
        for s in decl.storage:
            if not (function and s == "static"):
                what = "extern declaration" if s == "extern" else (
                    f"'{s}' function" if function else f"{s} local variable")
                self._fail(decl, what, "file-scope/static storage and external linkage are not "
                           "part of the dialect (only 'static' helper functions)" if s != "register"
                           else "'register' is not part of the dialect")
        for s in decl.funcspec:
            if s != "inline" or not function:
                self._fail(decl, f"'{s}' specifier", _NOT_SUPPORTED.format(f"'{s}'"))
        if decl.align:
            self._fail(decl, "_Alignas", "over-aligned objects can make huge stack frames")
        if decl.bitsize is not None:
            self._fail(decl, "bitfield", _NOT_SUPPORTED.format("bitfields"))
        for q in decl.quals:
            if q != "const":
                self._fail(decl, f"'{q}' qualifier",
                           "only 'const' is allowed; other qualifiers change memory semantics "
                           "the runtime does not model")

    def _signature(self, fdecl: c_ast.FuncDecl, *, is_kernel: bool, prototype: bool = False,
                   ) -> tuple[list[tuple[str | None, str]], str]:
        """Check a function declarator: [(param name, kind)] and the return kind."""
        params: list[tuple[str | None, str]] = []
        plist = fdecl.args.params if fdecl.args else []
        for p in plist:
            if isinstance(p, c_ast.EllipsisParam):
                self._fail(p, *_REJECT["EllipsisParam"])
            if isinstance(p, c_ast.ID):
                self._fail(p, "K&R function definition",
                           "old-style parameter lists are not type-checked")
            if not isinstance(p, (c_ast.Decl, c_ast.Typename)):
                self._fail(p, f"parameter {type(p).__name__}", _NOT_SUPPORTED.format("this"))
            if isinstance(p, c_ast.Typename) and len(plist) == 1:
                kind, _, dims = self._base_type(p.type, "parameter")
                if kind == "void" and dims is None:
                    break  # f(void)
            if not p.name and not prototype:
                self._fail(p, "unnamed parameter", "every parameter needs a name")
            if p.name:
                self._check_name(p, p.name, declaring="variable")
            for s in getattr(p, "storage", []):
                self._fail(p, f"'{s}' parameter", _NOT_SUPPORTED.format(f"'{s}' parameters"))
            if isinstance(p.type, c_ast.ArrayDecl):
                self._fail(p, "array parameter",
                           "array parameters decay to unchecked pointers; pass a cap_t")
            kind, text, _ = self._base_type(p.type, "parameter")
            if kind == "void":
                self._fail(p, "void parameter", "parameters need a value type")
            if any(q != "const" for q in p.quals):
                self._fail(p, "parameter qualifier", "only 'const' is allowed")
            if is_kernel:
                if text not in KERNEL_PARAM_TYPES:
                    self._fail(p, f"KERNEL parameter type '{text}'",
                               "KERNEL parameters must be cap_t, int64_t, double or float "
                               "(what the launcher can pass)")
                params.append((p.name, KERNEL_PARAM_TYPES[text]))
            else:
                params.append((p.name, kind))
        ret, _, _ = self._base_type(fdecl.type, "return type")
        if is_kernel and ret != "void":
            self._fail(fdecl, "KERNEL return type", "KERNEL functions must return void")
        return params, ret

    def visit_FuncDef(self, node: c_ast.FuncDef) -> None:
        decl = node.decl
        name = decl.name
        if self._fn is not None:
            self._fail(node, "nested function definition",
                       "functions can only be defined at file scope")
        self._check_name(decl, name, declaring="function")
        if name in self._defined:
            self._fail(decl, f"duplicate function '{name}'", "each function is defined once")
        self._defined.add(name)
        self._storage(decl, function=True)
        if node.param_decls:
            self._fail(node, "K&R function definition",
                       "old-style parameter lists are not type-checked")
        if not isinstance(decl.type, c_ast.FuncDecl):
            self._fail(decl, "function definition", _NOT_SUPPORTED.format("this declarator"))
        is_kernel = name in self.parsed.kernels
        params, ret = self._signature(decl.type, is_kernel=is_kernel)
        fn = _FuncCtx(name=name, is_kernel=is_kernel, ret=ret, scopes=[{}],
                      top_calls=frozenset(id(s) for s in node.body.block_items or []
                                          if isinstance(s, c_ast.FuncCall)))
        for pname, kind in params:
            if pname in fn.scopes[0]:
                self._fail(decl, f"duplicate parameter '{pname}'", "parameter names are unique")
            self._declare_check(decl, pname, fn)
            fn.scopes[0][pname] = _Var("cap" if kind == "cap" else "num")
            if kind == "cap":
                fn.caps.append(pname)
                fn.unique.add(pname)
        self._fn = fn
        try:
            self.visit(node.body)
        finally:
            self._fn = None
        if ret == "cap" and not self._returns(node.body):
            self._fail(node.body.block_items[-1] if node.body.block_items else node.body,
                       "missing return",
                       f"'{name}' returns cap_t but can reach its end without a return: the "
                       "caller would receive an uninitialised (forged) capability")
        if len(fn.caps) > MAX_CAP_LOCALS:
            self._fail(decl, "too many cap_t locals",
                       f"'{name}' has {len(fn.caps)} cap_t params/locals; each needs a shadow "
                       f"slot and a frame holds {MAX_CAP_LOCALS}")
        typing = CapTyping(frozenset(fn.caps),
                           frozenset(f for f, sig in self._sigs.items() if sig[1] == "cap"),
                           frozenset(self._sigs))
        spills = typing.spill_slots(node.body)
        if len(fn.caps) + spills > MAX_CAP_LOCALS:
            self._fail(decl, "too many live cap_t temporaries",
                       f"'{name}' needs {len(fn.caps)} cap_t slots plus {spills} for caps held "
                       f"across calls in argument lists; a frame holds {MAX_CAP_LOCALS} "
                       "(move nested calls into cap_t locals)")
        self.result.cap_locals[name] = fn.caps
        self.result.returns_cap[name] = ret == "cap"
        self.result.local_arrays[name] = fn.arrays
        if is_kernel:
            self.result.kernels[name] = KernelSig(
                name, list(params), decl.coord.line if decl.coord else 0,
                group_sync=name in self._group_sync, block_dim=fn.block_dim)
        else:
            self.result.helpers.append(name)

    def _returns(self, stmt: c_ast.Node | None) -> bool:
        """Conservative: does every path through ``stmt`` end in a return?"""
        if isinstance(stmt, c_ast.Return):
            return True
        if isinstance(stmt, c_ast.Compound):
            return any(self._returns(s) for s in stmt.block_items or [])
        if isinstance(stmt, c_ast.If):
            return self._returns(stmt.iftrue) and self._returns(stmt.iffalse)
        return False

    def _declare_check(self, node: c_ast.Node, name: str, fn: _FuncCtx) -> None:
        """No shadowing, no reuse of function names, unique cap_t/array names."""
        if name in self._sigs or name in API_FUNCS | CUDA_API_FUNCS:
            self._fail(node, f"variable '{name}' shadows a function",
                       "a variable with a function's name would make calls ambiguous")
        for scope in fn.scopes:
            if name in scope:
                self._fail(node, f"redeclaration of '{name}'",
                           "shadowing and redeclaring names is not allowed (the instrumenter "
                           "tracks cap_t locals and arrays by name)")
        if name in fn.unique:
            self._fail(node, f"redeclaration of '{name}'",
                       "cap_t and array names must be unique within a function (shadow slots "
                       "and bounds checks are keyed by name)")

    def visit_Compound(self, node: c_ast.Compound) -> None:
        parent = self._stack[-2] if len(self._stack) >= 2 else None
        if not isinstance(parent, (c_ast.FuncDef, c_ast.Compound, c_ast.If, c_ast.For,
                                   c_ast.While, c_ast.DoWhile, c_ast.Switch, c_ast.Case,
                                   c_ast.Default)) or not self._in_stmt_pos():
            self._fail(node, "statement expression", _NOT_SUPPORTED.format(
                "a block used as an expression (GNU statement expression)"))
        assert self._fn is not None
        self._fn.scopes.append({})
        try:
            self.generic_visit(node)
        finally:
            self._fn.scopes.pop()

    def visit_For(self, node: c_ast.For) -> None:
        assert self._fn is not None
        self._fn.scopes.append({})  # the for-init declarations' scope
        try:
            self.generic_visit(node)
        finally:
            self._fn.scopes.pop()

    def visit_Case(self, node: c_ast.Case) -> None:
        self._check_case(node)
        self.generic_visit(node)

    def visit_Default(self, node: c_ast.Default) -> None:
        self._check_case(node)
        self.generic_visit(node)

    def _check_case(self, node: c_ast.Node) -> None:
        # A case label may only sit directly in its switch's body, so the blocks that
        # hold cap_t declarations can only be entered from the top.
        i = len(self._stack) - 2
        while i >= 0 and isinstance(self._stack[i], (c_ast.Case, c_ast.Default)):
            i -= 1
        parent = self._stack[i] if i >= 0 else None
        grand = self._stack[i - 1] if i >= 1 else None
        if not (isinstance(parent, c_ast.Switch) or (
                isinstance(parent, c_ast.Compound) and isinstance(grand, c_ast.Switch)
                and grand.stmt is parent)):
            self._fail(node, "case label inside a nested statement",
                       "case/default must sit directly in the switch body: jumping into a "
                       "nested block could skip a cap_t initialiser")

    def visit_Decl(self, node: c_ast.Decl) -> None:
        fn = self._fn
        assert fn is not None
        if isinstance(node.type, c_ast.FuncDecl):
            self._fail(node, "function declaration inside a function",
                       "functions can only be declared at file scope")
        if not node.name:
            self._base_type(node.type, "local declaration")
            self._fail(node, "declaration without a name", "declarations must name a variable")
        self._check_name(node, node.name, declaring="variable")
        self._storage(node, function=False)
        kind, text, dims = self._base_type(node.type, "local declaration")
        self._declare_check(node, node.name, fn)
        parent = self._stack[-2] if len(self._stack) >= 2 else None
        if kind == "void":
            self._fail(node, "void variable", "variables need a value type")
        if node.init is not None and kind != "cap" and self._label_can_skip():
            # cap_t has its own, stricter rule below (any cap_t in a switch body)
            self._fail(node, f"initialised {text} declaration in a switch body",
                       "a later case label can jump past the initialiser, so the variable "
                       "may be used uninitialised where the compiler's range proofs take its "
                       "initial value (C++, the GPU lane's language, refuses the jump too); "
                       "declare it before the switch or put the case in braces")
        if dims is not None:
            if kind == "cap":
                self._fail(node, "array of cap_t",
                           "cap_t arrays on the stack are not tracked by the collector or "
                           "bounds-checked; use a cap table (cap_alloc_cap)")
            if node.name.startswith("smem_") and self.target == "cuda":
                if not fn.is_kernel:
                    self._fail(node, "shared-memory array in a helper",
                               "smem_ arrays live in shared memory and may only be declared in "
                               "KERNEL functions")
                if node.init is not None:
                    self._fail(node.init, "initialised shared-memory array",
                               "shared memory cannot be statically initialised")
            if node.init is not None:
                if not isinstance(node.init, c_ast.InitList):
                    self._fail(node.init, "array initializer",
                               "arrays are initialised with a brace list")
                self._init_ok.add(id(node.init))
            fn.arrays[node.name] = dims
            fn.unique.add(node.name)
            var = _Var("array", dims, elem=_elem_text(node.type),
                       const="const" in node.quals)
        elif kind == "cap":
            if node.init is None:
                self._fail(node, "uninitialised cap_t",
                           "an uninitialised cap_t holds stack garbage, i.e. a forged "
                           "capability; initialise it (cap_from_int(0) if nothing else)")
            if isinstance(parent, (c_ast.Case, c_ast.Default)) or (
                    isinstance(parent, c_ast.Compound) and len(self._stack) >= 3
                    and isinstance(self._stack[-3], c_ast.Switch)):
                self._fail(node, "cap_t declaration in a switch body",
                           "a case label can jump past its initialiser, leaving a forged "
                           "capability in scope; wrap the case in braces")
            if isinstance(node.init, c_ast.InitList):
                self._fail(node.init, "initializer list for non-array",
                           "brace initialisers are for arrays only")
            if not self._is_cap(node.init):
                self.visit(node.init)  # a misused cap_t inside gets the precise message
                self._fail(node.init, "number assigned to cap_t",
                           "only capabilities initialise a cap_t: integers cannot become "
                           "capabilities (cap_from_int makes one with no bounds)")
            self._cap_ok.add(id(node.init))
            fn.caps.append(node.name)
            fn.unique.add(node.name)
            var = _Var("cap")
        else:
            if isinstance(node.init, c_ast.InitList):
                self._fail(node.init, "initializer list for non-array",
                           "brace initialisers are for arrays only")
            if node.init is not None and self._is_cap(node.init):
                self._fail(node.init, "cap_t stored in a number",
                           "a cap_t cannot be converted to a number (use cap_to_int)")
            var = _Var("num")
        if node.init is not None:
            self.visit(node.init)  # before the name is in scope: `cap_t c = c;` is refused
        fn.scopes[-1][node.name] = var

    def _label_can_skip(self) -> bool:
        """Whether the declaration being visited sits in a switch body with a case or
        default label after it: a jump to that label enters its scope without running
        its initialiser.  pycparser puts the statements after a label in the label's
        node, and labels only sit directly in the switch body (_check_case), so the
        labels that can follow are the later items of that body."""
        i = len(self._stack) - 2
        item = self._stack[-1]
        if i >= 0 and isinstance(self._stack[i], (c_ast.Case, c_ast.Default)):
            item, i = self._stack[i], i - 1
        body = self._stack[i] if i >= 0 else None
        switch = self._stack[i - 1] if i >= 1 else None
        if not (isinstance(body, c_ast.Compound) and isinstance(switch, c_ast.Switch)
                and switch.stmt is body):
            return False  # a nested block, or a switch whose body is one label
        items = body.block_items or []
        at = next(k for k, s in enumerate(items) if s is item)
        return any(isinstance(s, (c_ast.Case, c_ast.Default)) for s in items[at + 1:])

    def visit_InitList(self, node: c_ast.InitList) -> None:
        if id(node) not in self._init_ok:
            self._fail(node, "initializer list", "brace initialisers are for local arrays only")
        for e in node.exprs:
            if isinstance(e, c_ast.InitList):
                self._init_ok.add(id(e))
            elif self._is_cap(e):
                self._fail(e, "cap_t in array initializer", _UNSAFE_CAP_USE)
        self.generic_visit(node)

    def visit_ID(self, node: c_ast.ID) -> None:
        name = node.name
        self._check_name(node, name)
        var = self._lookup(name)
        if var is None:
            if self._sig(name) is not None or name in _ASM:
                self._fail(node, "function pointer",
                           f"'{name}' is used as a value: functions can only be called by name")
            self._fail(node, f"undeclared identifier '{name}'",
                       "every name must be a declared local, parameter or function (macros and "
                       "library globals are not visible to kernels)")
        if var.kind == "array" and id(node) not in self._array_ok:
            self._fail(node, "array used as a value",
                       f"'{name}' would decay to an unchecked pointer; index it element by "
                       "element")
        if var.kind == "cap":
            self._cap_context(node)

    def visit_Constant(self, node: c_ast.Constant) -> None:
        if node.type == "string" or node.value.startswith(('"', 'L"', 'u"', 'U"', 'u8"')):
            self._fail(node, "string literal",
                       "string literals are char pointers into constant memory")
        if node.type == "char" or "'" in node.value:
            self._fail(node, "character literal", "char types are not part of the dialect")
        if "long double" in node.type:
            self._fail(node, "long double constant", "long double is not part of the dialect")

    def visit_FuncCall(self, node: c_ast.FuncCall) -> None:
        fn = self._fn
        assert fn is not None
        if not isinstance(node.name, c_ast.ID):
            self._fail(node, "indirect call", "functions can only be called by plain name")
        name = node.name.name
        if name in _ASM:
            self._fail(node, "asm", "inline assembly bypasses every check")
        if self._lookup(name) is not None:
            self._fail(node, f"call through variable '{name}'",
                       "functions can only be called by name")
        if name in _CUDA_SIGS and self.target != "cuda":
            self._fail(node, f"call to '{name}'",
                       f"'{name}' exists only on the GPU (target is {self.target!r})")
        if self.target == "cuda" and (name.startswith("cap_alloc_")
                                      or name in ("cap_load_cap", "cap_store_cap")):
            self._fail(node, f"call to '{name}'",
                       "not available on the GPU lane: device-side allocation and cap tables "
                       "need the host collector")
        sig = self._sig(name)
        if sig is None:
            if name.startswith("__"):
                why = "compiler builtins and reserved names bypass the capability checks"
            elif name.lower().startswith(("rt_", "cap_")):
                why = "not a runtime API function (the rt_/cap_ prefixes are reserved)"
            else:
                why = ("only the runtime API, the math whitelist and functions defined in this "
                       "source can be called (no libc, builtins or external symbols)")
            self._fail(node, f"call to '{name}'", why)
        if name in self.parsed.kernels:
            # rt_require_block_dim(N) bounds rt_thread_idx() in the kernel's body (range
            # proofs drop checks on it) and the launch enforces N; a call from another
            # kernel runs that body under the caller's launch instead
            self._fail(node, f"call to KERNEL '{name}'",
                       "a KERNEL is an entry point: its launch contract "
                       "(rt_require_block_dim(N), the buffers and group of its launch) holds "
                       "only when it is launched, and the compiler's proofs rely on it; move "
                       "the shared code into a static helper")
        if (fn.name, name) in self._cycles:
            path = " -> ".join([fn.name] + self._cycles[(fn.name, name)])
            self._fail(node, "recursion",
                       f"call cycle {path}: recursion is not allowed (stack depth must be "
                       "bounded)")
        args = node.args.exprs if node.args else []
        want, _ = sig
        if len(args) != len(want):
            self._fail(node, f"call to '{name}'",
                       f"'{name}' takes {len(want)} argument(s), {len(args)} given")
        for i, (a, k) in enumerate(zip(args, want, strict=True)):
            if k == "array":
                self._tile_array_arg(node, name, i, a)
                continue
            if k == "mma":
                self._mma_array_arg(name, i, a)
                continue
            if k == "mask":
                self._shuffle_mask_arg(name, i, a)
            if k == "dim":
                self._block_dim_arg(node, name, i, a)
            if name in TILE_FUNCS and k == "cap" and not isinstance(a, c_ast.ID):
                self._fail(a, f"argument {i + 1} of '{name}'",
                           "the cap of a tile copy must be a cap_t variable: it stays rooted "
                           "while the copy polls (move the expression into a cap_t local)")
            is_cap = self._is_cap(a)
            if k == "cap" and not is_cap:
                self._fail(a, f"argument {i + 1} of '{name}'",
                           "expects a cap_t: integers cannot become capabilities (cap_from_int "
                           "makes one with no bounds)")
            if k != "cap" and is_cap:
                self._fail(a, f"argument {i + 1} of '{name}'",
                           "passes a cap_t where a number is expected (use cap_to_int)")
            if is_cap:
                self._cap_ok.add(id(a))
        if self._is_cap(node):
            self._cap_context(node)
        if node.args is not None:
            self.visit(node.args)

    def _array_operand(self, a: c_ast.Node, what: str, expects: str, shared: bool) -> _Var:
        """The local array a tile builtin's operand names (a plain identifier; an
        smem_ array when ``shared``), or a refusal saying what it ``expects``.  The
        operand is then marked as seen with the call's other arguments."""
        var = self._lookup(a.name) if isinstance(a, c_ast.ID) else None
        if var is None or var.kind != "array" or (shared and not a.name.startswith("smem_")):
            self._fail(a, what, expects)
        self._array_ok.add(id(a))
        return var

    def _tile_array_arg(self, node: c_ast.FuncCall, name: str, i: int, a: c_ast.Node) -> None:
        """The local-array operand of a tile copy: a plain array name of the tile's type."""
        what = f"argument {i + 1} of '{name}'"
        var = self._array_operand(a, what, "expects the name of a local array (the tile's "
                                  "other end); the runtime checks the tile against the "
                                  "array's declared size", shared=False)
        want = TILE_ELEM_TYPES[name.rsplit("_", 1)[1]]
        if var.elem != want:
            self._fail(a, what, f"'{a.name}' holds {var.elem or 'another type'}, the tile "
                       f"copies {want}")
        if var.const and name.startswith("cap_tile_load_"):
            self._fail(a, what, f"'{a.name}' is const: a tile load writes it")
        if self.target == "cuda" and not a.name.startswith("smem_"):
            self._fail(a, what, "on the GPU a tile copy is cooperative (every thread of the "
                       "block copies a part): the array must be a shared smem_ array")

    def _mma_array_arg(self, name: str, i: int, a: c_ast.Node) -> None:
        """A tile operand of a warp MMA: a shared float array named by a plain
        identifier; the accumulator (argument 1) is written, so not const."""
        what = f"argument {i + 1} of '{name}'"
        var = self._array_operand(a, what, "expects the name of a shared smem_ array: the "
                                  "warp's lanes read and write the tile together, and the "
                                  "runtime checks it against the array's declared size",
                                  shared=True)
        if var.elem != "float":
            self._fail(a, what, f"'{a.name}' holds {var.elem or 'another type'}: MMA tiles "
                       "are float (tf32 inputs, fp32 accumulator)")
        if i == 0 and var.const:
            self._fail(a, what, f"'{a.name}' is const: the MMA accumulates into it")

    def _shuffle_mask_arg(self, name: str, i: int, a: c_ast.Node) -> None:
        val = int_literal(a)
        if val not in (1, 2, 4, 8, 16):
            self._fail(a, f"argument {i + 1} of '{name}'",
                       "the lane mask must be an integer literal 1, 2, 4, 8 or 16: the "
                       "butterfly partner lane ^ mask then stays in the warp")

    def _block_dim_arg(self, node: c_ast.FuncCall, name: str, i: int, a: c_ast.Node) -> None:
        """rt_require_block_dim(N): a statement of a kernel's own body, once, N a literal."""
        fn = self._fn
        assert fn is not None
        if not fn.is_kernel or id(node) not in fn.top_calls:
            self._fail(node, f"call to '{name}'",
                       "it states how the kernel is launched, so it is a statement of the "
                       "kernel's own body (not of a helper, a loop or a branch)")
        if fn.block_dim is not None:
            self._fail(node, f"call to '{name}'", "the block size is stated once per kernel")
        val = int_literal(a)
        if val is None or not 1 <= val <= CUDA_MAX_BLOCK:
            self._fail(a, f"argument {i + 1} of '{name}'",
                       f"the block size must be an integer literal in 1..{CUDA_MAX_BLOCK}: "
                       "it bounds rt_thread_idx() at compile time")
        fn.block_dim = val

    def visit_Assignment(self, node: c_ast.Assignment) -> None:
        lv = node.lvalue
        if isinstance(lv, c_ast.ID) and self._lookup(lv.name) is None and (
                self._sig(lv.name) is not None):
            self._fail(lv, f"assignment to '{lv.name}'",
                       "function and runtime names are not assignable")
        lcap, rcap = self._is_cap(lv), self._is_cap(node.rvalue)
        if lcap or rcap:
            if node.op != "=":
                self._fail(node, f"cap_t operand of '{node.op}'", _UNSAFE_CAP_USE)
            if not lcap:
                self._fail(node, "cap_t stored in a number",
                           "a cap_t cannot be converted to a number (use cap_to_int)")
            if not rcap:
                self.visit(node.rvalue)  # a misused cap_t inside gets the precise message
                self._fail(node.rvalue, "number assigned to cap_t",
                           "integers cannot become capabilities (cap_from_int makes one with "
                           "no bounds)")
            if not isinstance(lv, c_ast.ID):
                self._fail(lv, "cap_t assignment target", "only cap_t variables are assignable")
            if not self._in_stmt_pos():
                self._fail(node, "cap_t assignment used as a value",
                           "cap_t assignments must be statements (each one updates a shadow "
                           "slot)")
            self._cap_ok.update((id(lv), id(node.rvalue)))
        elif not isinstance(lv, (c_ast.ID, c_ast.ArrayRef)):
            self._write_target(node, lv, node.op)
        elif node.op in ("/=", "%=") and not pure_lvalue(lv):
            self._fail(node, f"compound '{node.op}' on a complex lvalue",
                       "write it as 'x = x / y' (the checked division needs the target twice)")
        self.generic_visit(node)

    def _write_target(self, node: c_ast.Node, target: c_ast.Node, op: str) -> None:
        """The target of =, op=, ++ or --: a name or an element of a local array (the
        ID and ArrayRef visits check what they name).  runtime.compiler.astutil.write_target,
        the one analysis of names written, relies on this."""
        if isinstance(target, (c_ast.ID, c_ast.ArrayRef)):
            return
        self.visit(target)  # e.g. member access or '*': report the construct itself
        op = op.lstrip("p")  # x++ is UnaryOp 'p++'
        self._fail(node, f"'{op}' on {_lvalue_form(target)}", _CXX_LVALUE)

    def visit_ArrayRef(self, node: c_ast.ArrayRef) -> None:
        subs: list[c_ast.Node] = []
        base: c_ast.Node = node
        while isinstance(base, c_ast.ArrayRef):
            subs.append(base.subscript)
            base = base.name
        subs.reverse()
        var = self._lookup(base.name) if isinstance(base, c_ast.ID) else None
        if var is None or var.kind != "array":
            if self._is_cap(base):
                self._fail(base, "subscript of cap_t",
                           "use cap_load_T/cap_store_T: they check bounds and permissions")
            if not isinstance(base, c_ast.ID):
                self.visit(base)  # report e.g. a compound literal as itself
            self._fail(node, "subscript of a non-array",
                       "only local arrays can be indexed; pointer arithmetic is not part of "
                       "the dialect")
        if len(subs) != len(var.dims):
            self._fail(node, "partial array subscript" if len(subs) < len(var.dims)
                       else "too many subscripts",
                       f"'{base.name}' has {len(var.dims)} dimension(s); index every one "
                       "(a partial subscript is an unchecked pointer)")
        self._array_ok.add(id(base))
        self.visit(base)
        for s in subs:
            self.visit(s)

    def visit_UnaryOp(self, node: c_ast.UnaryOp) -> None:
        if node.op in INC_DEC:
            self._write_target(node, node.expr, node.op)
        if node.op == "*":
            self._fail(node, "pointer dereference ('*')", "pointers are not part of the dialect; "
                       "memory is reached through the checked cap_load_T/cap_store_T")
        if node.op == "&":
            self._fail(node, "address-of ('&')", "taking addresses creates unchecked pointers")
        if node.op in ("sizeof", "_Alignof", "alignof"):
            if isinstance(node.expr, c_ast.Typename):
                kind, _, _ = self._base_type(node.expr.type, "sizeof operand")
                if kind == "cap":
                    self._fail(node, "sizeof(cap_t)", "the layout of a capability is private "
                               "to the runtime")
                return
            if self._is_cap(node.expr):
                self._fail(node, "sizeof of cap_t", "the layout of a capability is private to "
                           "the runtime")
            if isinstance(node.expr, c_ast.ID):
                self._array_ok.add(id(node.expr))
        self.generic_visit(node)

    def visit_Cast(self, node: c_ast.Cast) -> None:
        kind, _, dims = self._base_type(node.to_type.type, "cast")
        if kind == "cap":
            self._fail(node, "cast to cap_t", "capabilities cannot be made from other values "
                       "(cap_from_int makes one with no bounds)")
        if dims is not None:
            self._fail(node, "cast to array type", "casts are for scalar types only")
        if self._is_cap(node.expr):
            self._fail(node, "cast from cap_t", "a capability cannot be converted (use "
                       "cap_to_int for its address)")
        self.visit(node.expr)

    def visit_Return(self, node: c_ast.Return) -> None:
        fn = self._fn
        assert fn is not None
        if fn.ret == "cap":
            if node.expr is None or not self._is_cap(node.expr):
                self._fail(node, "return of a non-cap_t value" if node.expr is not None
                           else "return without a value",
                           f"'{fn.name}' returns cap_t: anything else would be a forged "
                           "capability")
            self._cap_ok.add(id(node.expr))
        elif node.expr is not None and self._is_cap(node.expr):
            self._fail(node.expr, "cap_t returned as a number",
                       f"'{fn.name}' does not return cap_t (use cap_to_int)")
        self.generic_visit(node)

    def visit_TernaryOp(self, node: c_ast.TernaryOp) -> None:
        if self._is_cap(node):
            self._cap_context(node)
        self.generic_visit(node)

    def visit_ExprList(self, node: c_ast.ExprList) -> None:
        if self._is_cap(node) and not isinstance(
                self._stack[-2] if len(self._stack) >= 2 else None, c_ast.FuncCall):
            self._cap_context(node)
        self.generic_visit(node)
