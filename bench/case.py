"""A benchmark case: one kernel at one size, buildable in each compile mode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .timing import Runner

#: Compile modes compared by the overhead benchmark (runtime.compile's ``mode``).
MODES = ("checked", "raw", "raw_poll")


@dataclass
class Case:
    """``make(mode)`` returns a Runner for that compile mode on identical inputs."""

    family: str  # "micro" or "qr"
    kernel: str
    size: str
    make: Callable[[str], Runner]
    flops: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    #: ``build(mode)`` compiles what ``make(mode)`` would, without buffers, so that a
    #: bench can build every case's kernels on every core before it times one
    #: (overhead.prebuild); cases with the same ``build_key`` share their kernels.
    build: Callable[[str], Any] | None = None
    build_key: str = ""


class LaunchRunner:
    """Launch a compiled kernel ``inner`` times per timed run; restore buffers on reset.

    ``restore`` maps a numpy view of a kernel buffer to its initial contents;
    every mode gets its own buffers filled from the same initial arrays, so
    the inputs are identical and one mode's writes never leak into another's.
    """

    def __init__(self, kernel: Any, caps: list[Any], args: tuple, grid: int,
                 restore: list[tuple[np.ndarray, np.ndarray]] | None = None, inner: int = 1):
        from .. import runtime

        self._launch = runtime.launch
        self.kernel, self.caps, self.args, self.grid = kernel, caps, args, grid
        self.restore = restore or []
        self.inner = inner

    def reset(self) -> None:
        for view, init in self.restore:
            np.copyto(view, init)

    def run(self) -> None:
        for _ in range(self.inner):
            self._launch(self.kernel, self.caps, args=self.args, grid=self.grid)


def calibrate_inner(r: Runner, target_s: float = 0.004, cap: int = 1000) -> int:
    """How many back-to-back launches make one timed run last about ``target_s``.

    Tiny kernels finish in microseconds, below the clock's useful resolution
    and dominated by jitter; repeating them inside one sample fixes that.
    """
    from .timing import time_once

    # min of a few: the first launch pays page faults and worker wake-up
    t = max(min(time_once(r) for _ in range(3)), 1e-7)
    return max(1, min(cap, int(target_s / t)))
