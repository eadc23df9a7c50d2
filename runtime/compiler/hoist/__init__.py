"""Loop versioning and poll placement, one pass for both lowerings.

By job: ``versioning`` (the pass: which loops, nests and bodies get a guard, and
their two copies), ``nest_guard`` (the interval guard of a whole nest), ``affine``
(affine indices and the range checks over a loop's span or a nest's box),
``loops`` (loop shapes, names read and written, barriers), ``polls`` (where
pollchecks go) and ``marks`` (the node types the lowerings read).
"""

from .loops import (
    BARRIERS,
    GPU_BARRIERS,
    GPU_BLOCK_VOTE,
    GPU_WARP_VOTE,
    array_chain,
    loop_shape,
    waiting_helpers,
)
from .marks import (
    QUIET_LOOPS,
    LoopPlan,
    PollPoint,
    UncheckedCall,
    UncheckedRef,
    Versioned,
    Versioning,
)
from .polls import INNER_CONST_TRIP, OUTER_SHORT_TRIP, SHORT_TRIP, entry_polls
from .versioning import hoist_function

__all__ = [
    "BARRIERS",
    "GPU_BARRIERS",
    "GPU_BLOCK_VOTE",
    "GPU_WARP_VOTE",
    "INNER_CONST_TRIP",
    "OUTER_SHORT_TRIP",
    "QUIET_LOOPS",
    "SHORT_TRIP",
    "LoopPlan",
    "PollPoint",
    "UncheckedCall",
    "UncheckedRef",
    "Versioned",
    "Versioning",
    "array_chain",
    "entry_polls",
    "hoist_function",
    "loop_shape",
    "waiting_helpers",
]
