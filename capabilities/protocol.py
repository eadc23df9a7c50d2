"""What every capability handle offers, on the host and on the device.

``capabilities.handle.Capability`` (collector-owned host buffers) and
``runtime.cuda.DeviceCapability`` (device buffers) both satisfy it, so code
written against it runs on either lane.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


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
