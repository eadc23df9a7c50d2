"""docs/faults.md's examples, run as written: which writes of a faulted launch
landed (each block's writes form a prefix of its program order, the faulting
block's ends right before the fault, nothing lands outside the buffers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "faults.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_faults_doc_has_its_examples() -> None:
    assert len(_blocks()) == 2


@pytest.mark.parametrize("index", [0, 1], ids=["one-block", "several-blocks"])
def test_faults_doc_example(index: int) -> None:
    exec(compile(_blocks()[index], f"docs/faults.md-{index}", "exec"), {})
