"""Check hoisting for affine accesses in counted loops (placeholder: no-op)."""

from __future__ import annotations

from pycparser import c_ast


def hoist_function(func: c_ast.FuncDef) -> None:
    """Rewrite provably in-range accesses to unchecked ones (not yet)."""
    return None
