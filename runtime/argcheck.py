"""Launch argument rules shared by both lanes (one behaviour for CPU and GPU)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: dialect scalar kind -> rt_arg field (and the GPU parameter's C type)
SCALAR_FIELD = {"int64": "i64", "double": "f64", "float": "f32"}


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def plain_int64(value: Any) -> bool:
    """An int (not a bool, not a numpy integer) in int64_t range: the argument both
    lanes store directly, without :func:`scalar_arg`'s general path."""
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def scalar_arg(kind: str, value: Any, pname: str, kernel: str) -> tuple[str, int | float]:
    """(rt_arg field, value) for one scalar argument, or TypeError/OverflowError.

    int64_t takes ints and numpy integers (operator.index: floats are never
    truncated, bools are refused); double/float take real numbers.
    """
    if kind == "int64":
        try:
            if isinstance(value, bool):
                raise TypeError
            v = operator.index(value)
        except TypeError:
            raise TypeError(f"kernel {kernel!r}: argument {pname!r} is int64_t, "
                            f"got {type(value).__name__}") from None
        if not INT64_MIN <= v <= INT64_MAX:
            raise OverflowError(f"kernel {kernel!r}: argument {pname!r}={v} does not fit int64_t")
        return "i64", v
    if isinstance(value, bool) or not (isinstance(value, (int, float))
                                       or hasattr(value, "__float__")):
        raise TypeError(f"kernel {kernel!r}: argument {pname!r} is {kind}, "
                        f"got {type(value).__name__}")
    return SCALAR_FIELD[kind], float(value)


def check_counts(sig: Any, n_caps: int, n_args: int, kernel: str) -> None:
    """TypeError unless the caps and scalar args match the signature."""
    if n_caps != sig.n_caps:
        raise TypeError(f"kernel {kernel!r} takes {sig.n_caps} capabilities "
                        f"({', '.join(sig.cap_names) or 'none'}), got {n_caps}")
    if n_args != sig.n_scalars:
        names = ", ".join(f"{k} {n}" for n, k in sig.scalar_params) or "none"
        raise TypeError(f"kernel {kernel!r} takes {sig.n_scalars} scalar args "
                        f"({names}), got {n_args}")


def check_grid(grid: Any, timeout: Any) -> None:
    """grid: a positive int (the blocks to run); timeout: None or positive seconds."""
    if isinstance(grid, bool) or not isinstance(grid, int):
        raise TypeError(f"grid must be a positive int, got {grid!r}")
    if grid < 1:
        raise ValueError(f"grid must be at least 1 (the number of blocks to run), got {grid}")
    check_timeout(timeout)


def check_timeout(timeout: Any) -> None:
    """timeout: None or positive seconds."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")


def check_perms(perms: Any) -> str:
    """The only permission strings: "r" and "rw"."""
    if perms not in ("r", "rw"):
        raise ValueError(f"perms must be 'r' or 'rw', not {perms!r}")
    return perms


@dataclass(frozen=True)
class GroupRules:
    """How a lane runs a group launch (``group=``, for kernels that call rt_group_sync).
    Message templates, formatted with ``name``, ``grid``, ``group``, ``blocks`` (the
    blocks that must run at once), ``at_once`` and the caller's own words."""

    wanted: str                   # the group= a launch needs, said when it is missing
    whole_grid: str | None        # the refusal when the group must be the whole grid
    too_many: str                 # the refusal when more blocks than at_once must run at once


def check_group(name: str, uses: bool, group: Any, grid: int, rules: GroupRules,
                at_once: Callable[[], int], **words: Any) -> int:
    """0 for a launch without a group (``group`` None and kernel ``name`` does not call
    rt_group_sync: ``uses``); else ``group`` as an int, or ValueError unless it is in
    1 .. grid (the whole grid where ``rules.whole_grid``) and its blocks fit at once:
    no more than ``at_once()`` (the lane's limit, asked only here), or they would
    wait forever for blocks that cannot start."""
    if group is None and not uses:
        return 0
    if not uses:
        raise ValueError(f"group= is for kernels that call rt_group_sync; {name!r} does not")
    if group is None:
        raise ValueError(f"kernel {name!r} calls rt_group_sync: launch it with "
                         + rules.wanted.format(grid=grid))
    try:
        g = operator.index(group) if not isinstance(group, bool) else None
    except TypeError:
        g = None
    if g is None or not 1 <= g <= max(grid, 1):
        raise ValueError(f"group must be an int in 1 .. grid ({grid})")
    if rules.whole_grid is not None and grid and g != grid:
        raise ValueError(rules.whole_grid.format(name=name, grid=grid, group=g))
    blocks = grid if rules.whole_grid is not None else g
    most = at_once()
    if blocks > most:
        raise ValueError(rules.too_many.format(name=name, grid=grid, group=g, blocks=blocks,
                                               at_once=most, **words))
    return g
