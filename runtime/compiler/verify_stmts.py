"""Verifier rules for statements and expressions: blocks and case labels, names used,
constants, writes (=, op=, ++, --), subscripts, unary operators, casts, returns, and
where a cap_t may appear."""

from __future__ import annotations

from pycparser import c_ast

from .astutil import INC_DEC, pure_lvalue
from .verify_scope import ASM_NAMES, NOT_SUPPORTED, UNSAFE_CAP_USE, Scope

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


class StmtRules(Scope):
    """Statements and expressions."""

    def visit_Compound(self, node: c_ast.Compound) -> None:
        parent = self._stack[-2] if len(self._stack) >= 2 else None
        if not isinstance(parent, (c_ast.FuncDef, c_ast.Compound, c_ast.If, c_ast.For,
                                   c_ast.While, c_ast.DoWhile, c_ast.Switch, c_ast.Case,
                                   c_ast.Default)) or not self._in_stmt_pos():
            self._fail(node, "statement expression", NOT_SUPPORTED.format(
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

    def visit_ID(self, node: c_ast.ID) -> None:
        name = node.name
        self._check_name(node, name)
        var = self._lookup(name)
        if var is None:
            if self._sig(name) is not None or name in ASM_NAMES:
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

    def visit_Assignment(self, node: c_ast.Assignment) -> None:
        lv = node.lvalue
        if isinstance(lv, c_ast.ID) and self._lookup(lv.name) is None and (
                self._sig(lv.name) is not None):
            self._fail(lv, f"assignment to '{lv.name}'",
                       "function and runtime names are not assignable")
        lcap, rcap = self._is_cap(lv), self._is_cap(node.rvalue)
        if lcap or rcap:
            if node.op != "=":
                self._fail(node, f"cap_t operand of '{node.op}'", UNSAFE_CAP_USE)
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
