"""Verifier rules for calls: the callee (a function of this source, or a builtin the
target has: runtime.compiler.dialect_api), recursion, and each argument against the
callee's signature, with the builtins' special argument kinds (tile arrays, MMA tiles,
shuffle masks, the block size)."""

from __future__ import annotations

from pycparser import c_ast

from .astutil import int_literal
from .dialect_api import BUILTINS, TILE_ELEM_TYPES, TILE_FUNCS
from .verify_scope import ASM_NAMES, Scope, Var

#: Threads per block on every CUDA device since sm_20 (the lane refuses more).
CUDA_MAX_BLOCK = 1024


class CallRules(Scope):
    """Calls and their arguments."""

    def visit_FuncCall(self, node: c_ast.FuncCall) -> None:
        fn = self._fn
        assert fn is not None
        if not isinstance(node.name, c_ast.ID):
            self._fail(node, "indirect call", "functions can only be called by plain name")
        name = node.name.name
        if name in ASM_NAMES:
            self._fail(node, "asm", "inline assembly bypasses every check")
        if self._lookup(name) is not None:
            self._fail(node, f"call through variable '{name}'",
                       "functions can only be called by name")
        absent = BUILTINS[name].absent_reason(self.target) if name in BUILTINS else None
        if absent is not None:
            self._fail(node, f"call to '{name}'", absent)
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

    def _array_operand(self, a: c_ast.Node, what: str, expects: str, shared: bool) -> Var:
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
