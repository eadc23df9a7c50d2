"""README.md's examples run as written, and its links lead somewhere."""

from __future__ import annotations

import re

import pytest
from readme_examples import PAGES, ROOT, python_blocks

README = ROOT / "README.md"


@pytest.mark.parametrize("index", range(len(python_blocks(README))))
def test_readme_example_runs(index: int, capsys) -> None:
    exec(compile(python_blocks(README)[index], f"README-{index}", "exec"), {})
    if index == 0:  # the quick start prints the fault it shows
        assert "out-of-bounds: load of 'x'[8], in kernel 'axpy'" in capsys.readouterr().out


def test_readme_is_a_front_door() -> None:
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page) -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def _doc_blocks() -> list[tuple[str, int, str]]:
    return [(p.name, i, b) for p in PAGES[1:] for i, b in enumerate(python_blocks(p))]


@pytest.mark.parametrize("page,index,block", _doc_blocks(),
                         ids=[f"{p}-{i}" for p, i, _ in _doc_blocks()])
def test_docs_example_runs(page: str, index: int, block: str) -> None:
    """Every example of docs/ runs as written; the GPU ones where a GPU (or, for the
    emulated lane's, g++) is there: tests/test_gpu*.py run those against the lanes."""
    if "cuda.isolate()" in block:
        # isolate() must come before the process's first GPU call, which an example
        # before it on the same page may have made
        pytest.skip("runs in a fresh process: tests/test_gpu_reset.py::"
                    "test_gpu_isolated_lane_docs_example_runs")
    if "cuda" in block:
        from capqr.runtime import cuda

        ok, why = cuda.available()
        if not ok and "emulate_cuda" not in block:
            pytest.skip(f"needs a GPU: {why}")
    exec(compile(block, f"{page}-{index}", "exec"), {})
