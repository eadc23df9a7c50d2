"""Where benchmark results go by default: outside the tracked tree.

``$CAPQR_BENCH_OUT`` if set, else ``./bench-results`` in the current directory.
Writing into bench/results/ (committed results) or the docs happens only when
asked for (``--out bench/results``, ``python -m capqr.bench --update-docs``).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "CAPQR_BENCH_OUT"


def default_out() -> Path:
    """The default results directory (not created here)."""
    return Path(os.environ.get(ENV) or "bench-results")
