"""What every capability handle offers, on the host and on the device.

``capabilities.handle.Capability`` (collector-owned host buffers) and
``runtime.cuda.DeviceCapability`` (device buffers) both satisfy it, so code
written against it runs on either lane.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class CapabilityProtocol(Protocol):
    """A bounded, permissioned handle on one buffer."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...

    @property
    def perms(self) -> str: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def device(self) -> str: ...

    @property
    def freed(self) -> bool: ...

    def numpy(self) -> Any:
        """The contents as a numpy array (a view on the host, a copy from the device)."""
        ...

    def free(self) -> None:
        """Revoke now; later accesses fault "freed", and so does a second free()."""
        ...


class RecordedAttributes:
    """The handle attributes both lanes record when a handle is made.

    They never read the object header, which free() may release, so they stay
    defined after free().  Subclasses set ``_name``, ``_shape``, ``_dtype``,
    ``_perms``, ``_nbytes``, ``_id`` and ``_freed``.
    """

    __slots__ = ()  # the handles declare their own slots

    _name: str
    _shape: tuple[int, ...]
    _dtype: Any
    _perms: str
    _nbytes: int
    _id: int
    _freed: bool

    @property
    def name(self) -> str:
        return self._name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> Any:
        return self._dtype

    @property
    def perms(self) -> str:
        return self._perms

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def id(self) -> int:
        """The collector's serial number of the object."""
        return self._id

    @property
    def freed(self) -> bool:
        """True after free()."""
        return self._freed
