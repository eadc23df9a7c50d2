"""capabilities: bounded, permissioned handles on collector-owned buffers.

The C side of a capability is ``cap_t`` in ``capabilities/cap.h`` (the one C
ABI header of capqr).
"""

from pathlib import Path

from .handle import CAP_DTYPE, Capability, NoBoundsCap, alloc, from_int, wrap

#: Directory holding cap.h (the header kernels are compiled against).
INCLUDE_DIR = Path(__file__).resolve().parent

__all__ = ["CAP_DTYPE", "Capability", "NoBoundsCap", "alloc", "from_int", "wrap", "INCLUDE_DIR"]
