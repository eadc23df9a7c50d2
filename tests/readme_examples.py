"""The runnable examples of README.md and docs/*.md, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(page: Path) -> list[str]:
    """Every ```python block of ``page``, in order."""
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def run_readme_example(heading: str, index: int = 0) -> None:
    """Execute the ``index``-th ```python block of the section (of README.md or a docs
    page) whose heading starts with ``## heading`` (AssertionError if it is missing)."""
    for page in PAGES:
        parts = re.split(rf"(?m)^#+ {re.escape(heading)}", page.read_text(), maxsplit=1)
        if len(parts) == 2:
            break
    else:
        raise AssertionError(f"no page has a section '{heading}'")
    section = re.split(r"(?m)^#{1,2} ", parts[1], maxsplit=1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) > index, f"section '{heading}' of {page.name} has {len(blocks)} blocks"
    exec(compile(blocks[index], f"{page.name}-{heading}-{index}", "exec"), {})
