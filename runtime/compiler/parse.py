"""Kernel source -> pycparser AST, keeping the user's line numbers.

pycparser parses preprocessed C only: no comments, no directives.  Kernel
source never goes through cpp (``#define`` tricks are exactly what we refuse),
so this module strips comments itself, rejects every directive, removes the
``KERNEL`` marker (remembering which functions carried it) and prepends the
dialect's typedefs behind a ``#line 1`` so AST coordinates are user lines.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from pycparser import c_ast, c_parser
from pycparser.c_parser import ParseError

from ..errors import VerifyError

#: The deepest nesting of syntax (expressions within expressions, statements within
#: statements) a kernel may have.  Verification, analyses and C generation walk the
#: tree recursively, a few Python frames per level: RECURSION_LIMIT leaves room for
#: this depth in every pass on both lanes (tests/test_nesting.py).  Deeper source is
#: refused with a reason instead of failing inside a pass; no kernel needs it (a
#: long sum can be split into statements).
MAX_NESTING = 400
RECURSION_LIMIT = 12000
_TOO_DEEP = f"nesting deeper than {MAX_NESTING} levels"
_TOO_DEEP_REASON = (f"expressions and statements may nest at most {MAX_NESTING} levels deep "
                    "(a sum of that many terms nests as deep): split the expression into "
                    "statements")

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
_GENERIC = re.compile(r"\b_Generic\b")


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
    code = _blank_literals("\n".join(lines)).split("\n")
    for no, line in enumerate(code, 1):
        if _GENERIC.search(line):
            # pycparser has no _Generic and reports a bare "Invalid expression"
            raise VerifyError(no, "_Generic", "C11 generic selections are not part of the "
                              "kernel dialect (the GPU lane compiles C++, which has none)")
    body = "\n".join(lines)
    full = PRELUDE + '#line 1 "kernel"\n' + body
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        # raised, never lowered: lowering it back could cut short a pass running
        # in another thread
        sys.setrecursionlimit(RECURSION_LIMIT)
    parser = c_parser.CParser()
    try:
        ast = parser.parse(full, filename="kernel")
    except RecursionError:
        raise VerifyError(None, _TOO_DEEP, _TOO_DEEP_REASON) from None
    except ParseError as e:
        line, reason = _parse_error(str(e), parser, code)
        raise VerifyError(line, "syntax error", reason) from None
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
    _check_nesting(ast)
    return ParsedSource(source=source, ast=ast, kernels=kernels, funcs=funcs)


def _check_nesting(ast: c_ast.FileAST) -> None:
    """VerifyError if any node lies more than MAX_NESTING levels deep (walked without
    recursion, so that the check itself holds for any depth)."""
    stack: list[tuple[c_ast.Node, int]] = [(ext, 1) for ext in ast.ext]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            line = node.coord.line if node.coord is not None else None
            raise VerifyError(line, _TOO_DEEP, _TOO_DEEP_REASON)
        stack.extend((child, depth + 1) for _, child in node.children())


def _blank_literals(text: str) -> str:
    """``text`` with the insides of string and character literals blanked, so that
    scanning for braces or keywords sees code only (line breaks stay put)."""
    def repl(m: re.Match) -> str:
        lit = m.group("str")
        if lit is None:
            return m.group(0)
        return lit[0] + " " * (len(lit) - 2) + lit[-1]

    return _TOKEN.sub(repl, text)


def _parse_error(msg: str, parser: c_parser.CParser, code: list[str]) -> tuple[int | None, str]:
    """(line, reason) for a pycparser ParseError message ``msg``; ``code`` holds the
    source lines with comments and literals blanked.

    pycparser names the token it could not use, so a missing ';' is reported on the
    line after the one that lacks it, and some errors (the end of the input, an
    invalid expression) come without a line.  Those are mapped back here."""
    m = re.match(r"kernel:(\d+)(?::(\d+))?:\s*(.*)", msg, re.S)
    line = int(m.group(1)) if m else None
    col = int(m.group(2)) if m and m.group(2) else None
    detail = m.group(3) if m else re.sub(r"^kernel:\s*", "", msg)
    if detail.startswith("At end of input"):
        return _end_of_input(code)
    if line is None:
        # pycparser 3 leaves the offending token next in its stream (a private API:
        # without it the error keeps no line)
        tok = getattr(parser, "_peek", lambda: None)()
        if tok is not None and getattr(tok, "lineno", None):
            line, col = tok.lineno, getattr(tok, "column", None)
            detail = f"{detail} before: {tok.value}"
    if line is not None and col is not None and 1 <= line <= len(code) and \
            not code[line - 1][:col - 1].strip():
        prev = line - 1
        while prev >= 1 and not code[prev - 1].strip():
            prev -= 1
        if prev >= 1 and _MAY_END_STATEMENT.search(code[prev - 1].rstrip()):
            return prev, (f"';' may be missing at the end of this line (the parser stopped "
                          f"at the start of line {line}: {detail})")
    return line, detail


# A line that ends like a finished expression (a name, a number, ']', x++ / x--), so
# that a parse error at the start of the next line most likely means a missing ';'.
# Lines ending in ')' are excluded: `if (c)` and `for (...)` end that way.
_MAY_END_STATEMENT = re.compile(r"(?:[A-Za-z0-9_\].]|\+\+|--)\Z")


def _end_of_input(code: list[str]) -> tuple[int | None, str]:
    """The last line of a source the parser ran out of, and the innermost block
    left open there (its '{' line), if any."""
    last = max((no for no, ln in enumerate(code, 1) if ln.strip()), default=None)
    opened: list[int] = []
    for no, ln in enumerate(code, 1):
        for ch in ln:
            if ch == "{":
                opened.append(no)
            elif ch == "}" and opened:
                opened.pop()
    if opened:
        return last, (f"the source ends inside a block: a closing '}}' is missing (the "
                      f"block opened at line {opened[-1]} is never closed)")
    return last, "the source ends in the middle of a declaration or statement"


def is_user_node(node: c_ast.Node) -> bool:
    """True for nodes from the user's source (not the typedef prelude)."""
    return node.coord is not None and node.coord.file == "kernel"
