"""Front-end records: what parse -> verify -> lower made of a source, kept on disk.

The front end's result (the entry point's name, its signature, the generated
C or CUDA text) is a pure function of the cache key, which hashes the source,
the options and every module of the front end and of the lane's lowering
(:func:`toolchain_version`).  runtime/pipeline.py keeps it next to each
lane's compiled output, so a process that meets a key built before skips
parse, verify and lowering (seconds for the QR kernels).  A source that
fails to verify never gets a record; a damaged record, or one of another
key, reads as absent.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

from .build import CAP_INCLUDE, content_hash, publish
from .compiler.verifier import KernelSig

RUNTIME = Path(__file__).resolve().parent


@cache
def toolchain_version(lane_dir: str) -> str:
    """Hash of the headers of capabilities/ (cap.h, cap_abi.h, guards.h, checks.h),
    capabilities/abi.py, every module of runtime/ and runtime/compiler/ with its
    subpackages (a list of the passes would miss the next one) and of the lane's
    ``lane_dir`` (relative to runtime/, its device prelude among them), so changing any
    invalidates what was built with it.  Read once per process and lane: compile() runs
    on every kernels.qr call."""
    modules = [*sorted(RUNTIME.glob("*.py")), *sorted((RUNTIME / "compiler").rglob("*.py")),
               *sorted((RUNTIME / lane_dir).glob("*.py"))]
    lane_c = sorted((RUNTIME / lane_dir).glob("*.cuh"))
    return content_hash(*[p.read_text() for p in sorted(CAP_INCLUDE.glob("*.h"))],
                        (CAP_INCLUDE / "abi.py").read_text(),
                        *[p.read_text() for p in modules + lane_c])


def signature_json(sig: KernelSig) -> dict[str, Any]:
    return asdict(sig)


def signature_from_json(d: dict[str, Any]) -> KernelSig:
    return KernelSig(**dict(d, params=[(n, k) for n, k in d["params"]]))


def read(path: Path, key: str) -> dict[str, Any] | None:
    """The record at ``path`` if it is whole and of ``key``, else None."""
    try:
        rec = json.loads(path.read_text())
        return rec if isinstance(rec, dict) and rec.get("key") == key else None
    except (OSError, ValueError):
        return None


def write(path: Path, key: str, payload: dict[str, Any]) -> None:
    """Store ``payload`` under ``key`` at ``path``: readers see a whole record or none."""
    try:
        publish(path, json.dumps(dict(payload, key=key)).encode())
    except OSError:
        pass  # a read-only cache only costs the next process time
