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

from dataclasses import dataclass, field

from pycparser import c_ast

from ...capabilities import abi
from ..errors import VerifyError
from .astutil import CapTyping, callees, reaching
from .dialect_api import API_FUNCS, CUDA_API_FUNCS, MATH_FUNCS
from .divergence import check_uniform_collectives
from .parse import ParsedSource, is_user_node
from .verify_calls import CUDA_MAX_BLOCK, CallRules
from .verify_decls import KERNEL_PARAM_TYPES, DeclRules
from .verify_scope import NOT_SUPPORTED, REJECT, FuncCtx, Var
from .verify_stmts import StmtRules

__all__ = ["API_FUNCS", "CUDA_API_FUNCS", "CUDA_MAX_BLOCK", "MATH_FUNCS", "KernelSig",
           "VerifiedSource", "select_kernel", "verify"]

#: cap_t params + locals per function: one shadow slot each (an rt_frame's slots).
MAX_CAP_LOCALS = abi.FRAME_SLOTS_MAX
_PARAM_C = {kind: c for c, kind in KERNEL_PARAM_TYPES.items()}


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


class _Verifier(CallRules, StmtRules, DeclRules):
    """One pass over the user's AST in source order; raises on the first violation."""

    def __init__(self, parsed: ParsedSource, target: str):
        self.parsed = parsed
        self.target = target
        self.result = VerifiedSource(parsed=parsed)
        self._stack: list[c_ast.Node] = []
        self._fn: FuncCtx | None = None
        self._cap_ok: set[int] = set()  # cap-typed nodes a parent placed in a cap slot
        self._array_ok: set[int] = set()  # array IDs used as subscript base or sizeof operand
        self._init_ok: set[int] = set()  # InitLists that initialise an array
        self._defined: set[str] = set()
        self._sigs: dict[str, tuple[tuple[str, ...], str]] = {}
        self._prepass()

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
            if name in REJECT:
                self._fail(node, *REJECT[name])
            if name not in self._ALLOWED:
                self._fail(node, f"{name} node", NOT_SUPPORTED.format(f"'{name}'"))
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
            self._fail(decl, "function definition", NOT_SUPPORTED.format("this declarator"))
        is_kernel = name in self.parsed.kernels
        params, ret = self._signature(decl.type, is_kernel=is_kernel)
        fn = FuncCtx(name=name, is_kernel=is_kernel, ret=ret, scopes=[{}],
                      top_calls=frozenset(id(s) for s in node.body.block_items or []
                                          if isinstance(s, c_ast.FuncCall)))
        for pname, kind in params:
            if pname in fn.scopes[0]:
                self._fail(decl, f"duplicate parameter '{pname}'", "parameter names are unique")
            self._declare_check(decl, pname, fn)
            fn.scopes[0][pname] = Var("cap" if kind == "cap" else "num")
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
