"""Verifier rules for names, types and declarations: identifiers, the dialect's types,
array sizes, storage classes, function signatures and local declarations."""

from __future__ import annotations

import re

from pycparser import c_ast

from .astutil import int_literal
from .dialect_api import API_FUNCS, CUDA_API_FUNCS, MATH_FUNCS
from .verify_scope import NOT_SUPPORTED, REJECT, UNSAFE_CAP_USE, FuncCtx, Scope, Var

MAX_ARRAY_ELEMS = 1 << 20
MAX_ARRAY_DIMS = 3

KERNEL_PARAM_TYPES = {"cap_t": "cap", "int64_t": "int64", "double": "double", "float": "float"}
_NUM_TYPEDEFS = {"int32_t", "int64_t", "uint32_t", "uint64_t"}
_INT_WORDS = {"int", "long", "unsigned", "signed"}
# Names the compiler or libc may call behind our back: a same-named helper in the
# module would capture compiler-emitted calls (struct copies go through memcpy).
_LIBC_NAMES = {
    "main", "memcpy", "memmove", "memset", "memcmp", "bcmp", "bzero", "malloc", "calloc",
    "realloc", "free", "aligned_alloc", "posix_memalign", "alloca", "abort", "exit", "atexit",
    "raise", "signal", "setjmp", "longjmp", "sigsetjmp", "siglongjmp", "system", "syscall",
    "printf", "puts", "strlen", "abs", "labs", "mmap", "munmap", "mprotect", "dlopen", "dlsym",
}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The runtime API's names (the rt_/cap_ prefixes are reserved for them).
_API_NAMES = API_FUNCS | CUDA_API_FUNCS


def _elem_text(t: c_ast.Node) -> str:
    """Element type of an array declarator ("float", "int64_t", ...)."""
    while not isinstance(t, c_ast.IdentifierType):
        t = t.type
    return " ".join(t.names)


class DeclRules(Scope):
    """Names, types, storage, signatures and local declarations."""

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
                declaring or name not in _API_NAMES):
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
                    self._fail(t, "array qualifier", NOT_SUPPORTED.format("'static'/qualified "
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
            self._fail(t, f"type {type(t).__name__}", NOT_SUPPORTED.format("this type"))
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
                self._fail(decl, f"'{s}' specifier", NOT_SUPPORTED.format(f"'{s}'"))
        if decl.align:
            self._fail(decl, "_Alignas", "over-aligned objects can make huge stack frames")
        if decl.bitsize is not None:
            self._fail(decl, "bitfield", NOT_SUPPORTED.format("bitfields"))
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
                self._fail(p, *REJECT["EllipsisParam"])
            if isinstance(p, c_ast.ID):
                self._fail(p, "K&R function definition",
                           "old-style parameter lists are not type-checked")
            if not isinstance(p, (c_ast.Decl, c_ast.Typename)):
                self._fail(p, f"parameter {type(p).__name__}", NOT_SUPPORTED.format("this"))
            if isinstance(p, c_ast.Typename) and len(plist) == 1:
                kind, _, dims = self._base_type(p.type, "parameter")
                if kind == "void" and dims is None:
                    break  # f(void)
            if not p.name and not prototype:
                self._fail(p, "unnamed parameter", "every parameter needs a name")
            if p.name:
                self._check_name(p, p.name, declaring="variable")
            for s in getattr(p, "storage", []):
                self._fail(p, f"'{s}' parameter", NOT_SUPPORTED.format(f"'{s}' parameters"))
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

    def _declare_check(self, node: c_ast.Node, name: str, fn: FuncCtx) -> None:
        """No shadowing, no reuse of function names, unique cap_t/array names."""
        if name in self._sigs or name in _API_NAMES:
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
            var = Var("array", dims, elem=_elem_text(node.type),
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
            var = Var("cap")
        else:
            if isinstance(node.init, c_ast.InitList):
                self._fail(node.init, "initializer list for non-array",
                           "brace initialisers are for arrays only")
            if node.init is not None and self._is_cap(node.init):
                self._fail(node.init, "cap_t stored in a number",
                           "a cap_t cannot be converted to a number (use cap_to_int)")
            var = Var("num")
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
                self._fail(e, "cap_t in array initializer", UNSAFE_CAP_USE)
        self.generic_visit(node)
