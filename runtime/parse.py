"""Kernel source -> pycparser AST, keeping the user's line numbers.

pycparser parses preprocessed C only: no comments, no directives.  Kernel
source never goes through cpp (``#define`` tricks are exactly what we refuse),
so this module strips comments itself, rejects every directive, removes the
``KERNEL`` marker (remembering which functions carried it) and prepends the
dialect's typedefs behind a ``#line 1`` so AST coordinates are user lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pycparser import c_ast, c_parser
from pycparser.c_parser import ParseError

from .errors import VerifyError

#: Names the dialect provides as types.  ``cap_t`` is opaque to the parser.
DIALECT_TYPEDEFS = {
    "int32_t": "int",
    "int64_t": "long",
    "uint32_t": "unsigned int",
    "uint64_t": "unsigned long",
    "cap_t": "struct __capqr_cap",
}

PRELUDE = '#line 1 "prelude"\n' + "".join(
    f"typedef {c} {n};\n" for n, c in DIALECT_TYPEDEFS.items())

_TOKEN = re.compile(
    r"""(?P<line>//[^\n]*)|(?P<block>/\*.*?\*/)|(?P<str>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')""",
    re.S,
)
_KERNEL = re.compile(r"\bKERNEL\b")


@dataclass
class ParsedSource:
    """A parsed kernel source: its AST (user line numbers) and entry points."""

    source: str
    ast: c_ast.FileAST
    kernels: list[str] = field(default_factory=list)
    funcs: dict[str, c_ast.FuncDef] = field(default_factory=dict)


def strip_comments(source: str) -> str:
    """Blank out comments, keeping every newline so line numbers stay put."""

    def repl(m: re.Match) -> str:
        if m.group("str") is not None:
            return m.group("str")
        text = m.group(0)
        return "".join("\n" if ch == "\n" else " " for ch in text)

    return _TOKEN.sub(repl, source)


def parse(source: str) -> ParsedSource:
    """Parse kernel source; raise VerifyError on directives or syntax errors."""
    if not isinstance(source, str):
        raise TypeError(f"kernel source must be str, not {type(source).__name__}")
    if "\x00" in source:
        raise VerifyError(None, "NUL byte", "kernel source must be text")
    text = strip_comments(source)
    lines = text.split("\n")
    kernel_lines: list[int] = []
    for no, line in enumerate(lines, 1):
        stripped = line.lstrip()
        if stripped.startswith("#") or stripped.startswith("%:") or stripped.startswith("??="):
            word = stripped[1:].strip().split(" ")[0] if stripped.startswith("#") else stripped
            raise VerifyError(
                no,
                f"preprocessor directive '#{word}'" if word else "preprocessor directive",
                "kernel source is not preprocessed: #include/#define/#pragma could "
                "pull in or redefine code the verifier never sees",
            )
        if line.rstrip().endswith("\\"):
            raise VerifyError(no, "line continuation", "backslash-newline splices are not "
                              "part of the dialect (they hide tokens from line-based checks)")
        if _KERNEL.search(line):
            kernel_lines.append(no)
            lines[no - 1] = _KERNEL.sub("      ", line)
    body = "\n".join(lines)
    full = PRELUDE + '#line 1 "kernel"\n' + body
    parser = c_parser.CParser()
    try:
        ast = parser.parse(full, filename="kernel")
    except ParseError as e:
        msg = str(e)
        m = re.match(r"kernel:(\d+):(?:\d+:)?\s*(.*)", msg)
        line = int(m.group(1)) if m else None
        detail = m.group(2) if m else msg
        raise VerifyError(line, "syntax error", detail) from None
    except Exception as e:  # pycparser raises assorted errors on odd input
        raise VerifyError(None, "syntax error", str(e)) from None

    funcs: dict[str, c_ast.FuncDef] = {}
    kernels: list[str] = []
    claimed: set[int] = set()
    for ext in ast.ext:
        if isinstance(ext, c_ast.FuncDef):
            name = ext.decl.name
            funcs[name] = ext
            dline = ext.decl.coord.line if ext.decl.coord else 0
            for kl in kernel_lines:
                if kl not in claimed and kl <= dline <= kl + 3:
                    claimed.add(kl)
                    kernels.append(name)
                    break
    for kl in kernel_lines:
        if kl not in claimed:
            raise VerifyError(kl, "KERNEL marker", "KERNEL must directly precede a function "
                              "definition ('KERNEL void name(...) { ... }')")
    return ParsedSource(source=source, ast=ast, kernels=kernels, funcs=funcs)


def is_user_node(node: c_ast.Node) -> bool:
    """True for nodes from the user's source (not the typedef prelude)."""
    return node.coord is not None and node.coord.file == "kernel"
