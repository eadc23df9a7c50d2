"""The README's runnable examples, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def run_readme_example(heading: str, index: int = 0) -> None:
    """Execute the ``index``-th ```python block of the README section whose heading
    starts with ``## heading`` (AssertionError if the section or block is missing)."""
    parts = README.read_text().split(f"## {heading}", 1)
    assert len(parts) == 2, f"README has no section '## {heading}'"
    section = parts[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) > index, f"README section '{heading}' has {len(blocks)} python blocks"
    exec(compile(blocks[index], f"README-{heading}-{index}", "exec"), {})
