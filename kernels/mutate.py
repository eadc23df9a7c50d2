"""Text mutations of kernel sources: the bugs an autogenerator makes.

Each mutator yields :class:`Mutant` objects (one per site it can change):
off-by-one loop bounds (``<`` -> ``<=``), swapped strides (``i * ld + j`` ->
``j * ld + i``), a wrong leading dimension (``* n +`` -> ``* m +`` and
friends), dropping the clamp of the last panel (the panel width no longer
divides n: ``k - j < nb ? k - j : nb`` -> ``nb``) and skewed batch offsets.
The safety fuzz runs mutants under the checked runtime (each must pass the
checker, be flagged by it, or fault, with canaries intact); issue 7's search
loop reuses the same mutators.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One mutated source: which mutator, where (1-based line), and the text."""

    kind: str
    line: int
    description: str
    source: str


def _line_of(src: str, pos: int) -> int:
    return src.count("\n", 0, pos) + 1


def _sub_at(src: str, m: re.Match, new: str) -> str:
    return src[:m.start()] + new + src[m.end():]


_FOR_LT = re.compile(r"(for \([^;]*;\s*\w+\s*)<(\s*[^;=][^;]*;)")


def off_by_one(src: str) -> Iterator[Mutant]:
    """``for (...; i < bound; ...)`` -> ``i <= bound`` (one mutant per loop)."""
    for m in _FOR_LT.finditer(src):
        new = m.group(1) + "<=" + m.group(2)
        yield Mutant("off_by_one", _line_of(src, m.start()),
                     f"loop bound '<' -> '<=': {m.group(0).strip()[:60]}", _sub_at(src, m, new))


_STRIDE = re.compile(r"\((\w+(?: \+ \w+)?)\) \* (\w+) \+ (\w+) \+ (\w+)"
                     r"|\b(\w+) \* (\w+) \+ (\w+)\b")


def swapped_strides(src: str) -> Iterator[Mutant]:
    """``i * ld + j`` -> ``j * ld + i`` and ``(a + t) * ld + c + p`` -> ``(a + p) * ld + c + t``."""
    for m in _STRIDE.finditer(src):
        if m.group(1) is not None:
            row, ld, c, p = m.group(1), m.group(2), m.group(3), m.group(4)
            parts = row.split(" + ")
            if len(parts) != 2:
                continue
            new = f"({parts[0]} + {p}) * {ld} + {c} + {parts[1]}"
        else:
            i, ld, j = m.group(5), m.group(6), m.group(7)
            if i.isdigit() or j.isdigit() or i == j:
                continue
            new = f"{j} * {ld} + {i}"
        if new == m.group(0):
            continue
        yield Mutant("swapped_strides", _line_of(src, m.start()),
                     f"swapped strides: {m.group(0)} -> {new}", _sub_at(src, m, new))


_LD_NAMES = ("n", "m", "nb", "ld", "ldt", "ldv", "ldc")
_LD = re.compile(r"\* (" + "|".join(_LD_NAMES) + r") \+")


def wrong_leading_dimension(src: str) -> Iterator[Mutant]:
    """``* n +`` -> ``* m +`` (and n<->m, nb->n, ld->ld+1 ...): a wrong leading dimension."""
    swap = {"n": "m", "m": "n", "nb": "n", "ld": "(ld + 1)", "ldt": "(ldt + 1)",
            "ldv": "(ldv + 1)", "ldc": "(ldc + 1)"}
    for m in _LD.finditer(src):
        new = f"* {swap[m.group(1)]} +"
        yield Mutant("wrong_leading_dimension", _line_of(src, m.start()),
                     f"leading dimension {m.group(1)} -> {swap[m.group(1)]}", _sub_at(src, m, new))


_CLAMP = re.compile(r"(\w+) - (\w+) < (\w+) \? \1 - \2 : \3")


def panel_not_dividing(src: str) -> Iterator[Mutant]:
    """Drop the last-panel clamp ``jb = min(nb, k - j)`` -> ``jb = nb``."""
    for m in _CLAMP.finditer(src):
        yield Mutant("panel_not_dividing", _line_of(src, m.start()),
                     f"last panel not clamped: {m.group(0)} -> {m.group(3)}",
                     _sub_at(src, m, m.group(3)))


_BATCH = re.compile(r"\bb \* m \* n\b|\bb \* k\b")


def batch_offset(src: str) -> Iterator[Mutant]:
    """Skew a per-matrix offset by one matrix row (``b * m * n`` -> ``(b + 1) * m * n - 1``)."""
    for m in _BATCH.finditer(src):
        new = "((b + 1) * m * n - 1)" if "m * n" in m.group(0) else "(b * k + 1)"
        yield Mutant("batch_offset", _line_of(src, m.start()),
                     f"batch offset {m.group(0)} -> {new}", _sub_at(src, m, new))


MUTATORS: dict[str, Callable[[str], Iterator[Mutant]]] = {
    "off_by_one": off_by_one,
    "swapped_strides": swapped_strides,
    "wrong_leading_dimension": wrong_leading_dimension,
    "panel_not_dividing": panel_not_dividing,
    "batch_offset": batch_offset,
}


def mutants(src: str, kinds: tuple[str, ...] | None = None) -> list[Mutant]:
    """All single-site mutants of ``src`` from the chosen mutators (default: all)."""
    out: list[Mutant] = []
    for kind in kinds or tuple(MUTATORS):
        out.extend(MUTATORS[kind](src))
    return out


def sample(src: str, k: int, seed: int = 0, kinds: tuple[str, ...] | None = None) -> list[Mutant]:
    """``k`` mutants drawn without replacement, at least one per mutator kind if possible."""
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutant]] = {}
    for mu in mutants(src, kinds):
        by_kind.setdefault(mu.kind, []).append(mu)
    picked: list[Mutant] = []
    for kind in sorted(by_kind):
        picked.append(rng.choice(by_kind[kind]))
    rest = [mu for ms in by_kind.values() for mu in ms if mu not in picked]
    rng.shuffle(rest)
    return (picked + rest)[:max(k, 0)] if k < len(picked) else picked + rest[:k - len(picked)]
