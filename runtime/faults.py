"""A lane's fault record -> the CapabilityFault it stands for (both lanes).

Each lane's C side records the first refused access of a launch in a record
whose layout is in capabilities/abi.py.  :func:`fault_from_record` reads the
fields every record has (``kind``, ``access``, ``block``, ``thread``, ``index``,
``line``); the buffer's name is the one thing the lanes record differently,
so each names it through its own function here: the CPU record carries the
name (:func:`recorded_buffer`), the GPU record the argument slot or local
array (:func:`slot_buffer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..capabilities import abi
from .errors import CapabilityFault, fault_detail

#: reasons that are about no buffer (the record's name or slot means nothing there)
NO_BUFFER = frozenset({"division-by-zero", "argument"})


def reason(rec: Any) -> str:
    """The CapabilityFault reason of a record's ``kind``."""
    kind = int(rec.kind)
    return abi.FAULT_REASON.get(kind, f"fault-{kind}")


def fault_from_record(rec: Any, kernel: str, buffer: str | None,
                      launch_index: int | None = None) -> CapabilityFault:
    """The CapabilityFault of fault record ``rec`` in ``kernel`` (``buffer``: the name the
    lane read from it; ``launch_index``: the launch's position in a sequence)."""
    why = reason(rec)
    index, thread = int(rec.index), int(rec.thread)
    return CapabilityFault(
        why, kernel=kernel, block=int(rec.block), thread=thread if thread >= 0 else None,
        buffer=None if why in NO_BUFFER else buffer, index=index,
        access=abi.ACCESS.get(int(rec.access)), line=int(rec.line) or None,
        detail=fault_detail(why, index), launch_index=launch_index)


def recorded_buffer(rec: Any, ffi: Any) -> str:
    """The buffer name a CPU record carries (``ffi``: the one the record was made by)."""
    return ffi.string(rec.buffer).decode(errors="replace")


def slot_buffer(rec: Any, names: Sequence[str], local_arrays: Sequence[str]) -> str | None:
    """The buffer a GPU record names by its slot: argument ``names[slot]``, local array
    ``local_arrays[-slot - 1]`` for a negative slot, except that slot -1 of a no-bounds
    fault is a cap made from an integer (no object; the CPU lane's name for it)."""
    slot = int(rec.slot)
    if slot >= 0:
        return names[slot] if slot < len(names) else f"cap#{slot}"
    if slot == -1 and reason(rec) == "no-bounds":
        return "<int-derived>"
    return local_arrays[-slot - 1] if -slot - 1 < len(local_arrays) else None
