"""The runnable examples of README.md and docs/*.md, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(page: Path) -> list[str]:
    """Every ```python block of ``page``, in order."""
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def example_source(heading: str, index: int = 0) -> str:
    """The ``index``-th ```python block of the first section (of README.md or a docs page)
    whose heading starts with ``heading`` and that has that many blocks (AssertionError if
    there is none).  A section runs to the next ``## `` heading."""
    found = []
    for page in PAGES:
        for part in re.split(rf"(?m)^#+ {re.escape(heading)}", page.read_text())[1:]:
            blocks = re.findall(r"```python\n(.*?)```", part.split("\n## ", 1)[0], re.S)
            found.append(f"{page.name}: {len(blocks)}")
            if len(blocks) > index:
                return blocks[index]
    raise AssertionError(f"no section '{heading}' with {index + 1} python blocks ({found})")


def run_readme_example(heading: str, index: int = 0) -> None:
    """Execute :func:`example_source` ``(heading, index)`` as written."""
    exec(compile(example_source(heading, index), f"{heading}-{index}", "exec"), {})
