"""The package's layers, from the import statements themselves (ast, nothing imported).

capabilities is the bottom (the ABI and the handles), runtime sits on it, kernels on
runtime, bench on top.  A module may import from its own layer and the ones below at
module level; an import of a higher layer must sit inside a function, where it runs
only when called (and says why).  No module-level import cycle either: in a cycle,
whichever module loads first sees the other half-initialised.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PKG = "capqr"
LAYERS = ("capabilities", "runtime", "kernels", "bench")
SKIP_DIRS = {"tests", "docs", ".pkgpath", ".git", "build", "dist"}

#: Module-level imports of a higher layer that are still there, each with its reason
#: (none: capabilities.handle binds to the runtime core on first use).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    # a virtual environment made inside the checkout (`python -m venv venv`) holds
    # installed packages, not capqr's modules
    venvs = {cfg.parent for cfg in REPO.rglob("pyvenv.cfg")}
    mods = {}
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if SKIP_DIRS & set(rel.parts[:-1]) or any(p.startswith(".") for p in rel.parts):
            continue
        if venvs.intersection(path.parents):
            continue
        parts = [PKG, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _top_level(body: list[ast.stmt]):
    """Statements that run when the module loads: not function bodies, not
    `if TYPE_CHECKING:` blocks."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _top_level(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from _top_level(getattr(node, field, None) or [])
        for handler in getattr(node, "handlers", None) or []:
            yield from _top_level(handler.body)


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """capqr modules `name` imports at module level (a.b.c counts a.b and a.b.c, the
    packages whose __init__ the import runs, but not name's own packages)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in _top_level(ast.parse(path.read_text()).body):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t in mods or t.split(".")[0] == PKG:
                parts = t.split(".")
                for k in range(2, len(parts) + 1):
                    m = ".".join(parts[:k])
                    if m in mods and not name.startswith(m + ".") and m != name:
                        found.add(m)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {n: _imports(n, p, mods) for n, p in mods.items()}


def _layer(mod: str) -> int | None:
    parts = mod.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_graph_sees_the_package() -> None:
    g = _graph()
    assert "capqr.runtime.compiler.verifier" in g and "capqr.capabilities.abi" in g
    assert "capqr.capabilities.abi" in g["capqr.runtime.compiler.verifier"]


def test_no_module_imports_a_higher_layer_at_load() -> None:
    bad = []
    for mod, deps in _graph().items():
        lo = _layer(mod)
        for d in deps:
            hi = _layer(d)
            if lo is not None and hi is not None and hi > lo:
                layer_pkg = ".".join(d.split(".")[:2])
                if (mod, layer_pkg) not in KNOWN_UPWARD:
                    bad.append(f"{mod} -> {d}")
    assert bad == []


def test_no_module_level_import_cycle() -> None:
    g = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(g.get(n, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)
    assert cycles == []


#: What the target-independent front end may import from the rest of runtime: the error
#: types.  A lane (runtime.cpu, runtime.cuda), the launch path or the built core
#: imported there would make the compiler depend on a backend.
COMPILER_MAY_USE = {"capqr.runtime", "capqr.runtime.errors"}


def test_the_compiler_imports_no_lane() -> None:
    bad = []
    for mod, deps in _graph().items():
        if not mod.startswith("capqr.runtime.compiler"):
            continue
        for d in deps:
            if (d.startswith("capqr.runtime") and not d.startswith("capqr.runtime.compiler")
                    and d not in COMPILER_MAY_USE):
                bad.append(f"{mod} -> {d}")
    assert bad == []


def test_the_lanes_import_each_other_only_through_launch() -> None:
    """runtime.cpu and runtime.cuda are peers: neither imports the other at load."""
    bad = [f"{m} -> {d}" for m, deps in _graph().items() for d in deps
           for a, b in (("cpu", "cuda"), ("cuda", "cpu"))
           if m.startswith(f"capqr.runtime.{a}") and d.startswith(f"capqr.runtime.{b}")]
    assert bad == []


def test_every_relative_import_names_a_module_that_exists() -> None:
    """Function-level imports included: a module moved without its importers updated
    fails only when that function first runs (kernels.parallel once imported
    runtime.kernel after it had moved to runtime.cpu.kernel)."""
    mods = _modules()
    bad = []
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(here[: len(here) - node.level + 1]
                                + ([node.module] if node.module else []))
                if base not in mods:
                    bad.append(f"{name}:{node.lineno} imports missing {base}")
    assert bad == []


def test_every_package_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages by hand (the root is the package): a folder of
    modules left off the list installs without them, and only its first import fails."""
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages == listed
