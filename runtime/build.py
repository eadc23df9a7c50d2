"""Building and loading cffi extension modules, cached by content hash.

Both the runtime core and every kernel are cffi out-of-line API-mode
modules.  A module's name is derived from the hash of everything that goes
into it (sources, headers, flags, compiler), so a cache hit needs no
compiler and a stale cache can never be loaded.  Builds happen in a private
temporary directory and are published with an atomic rename, so concurrent
processes (test workers, dask workers) never see half-written files.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import cffi

from .errors import CompileError

REPO = Path(__file__).resolve().parent.parent
CAP_INCLUDE = REPO / "capabilities"
GC_DIR = REPO / "gc"
CSRC = Path(__file__).resolve().parent / "csrc"

_build_lock = threading.Lock()
_loaded: dict[str, ModuleType] = {}


def cache_dir() -> Path:
    """Where compiled modules live: $CAPQR_CACHE or ~/.cache/capqr."""
    d = Path(os.environ.get("CAPQR_CACHE") or Path.home() / ".cache" / "capqr")
    d.mkdir(parents=True, exist_ok=True)
    return d


@lru_cache(maxsize=1)
def compiler_id() -> str:
    """Compiler identity, part of every cache key."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    try:
        out = subprocess.run(cc.split()[:1] + ["--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return f"{cc}|{out.splitlines()[0] if out else '?'}|{sys.version_info[:2]}"


def content_hash(*parts: str | bytes) -> str:
    """sha256 over the given parts (length-prefixed, so no two splits collide)."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def publish(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary beside it and a rename, so a
    concurrent reader (another test worker or process) sees the whole file or none;
    OSError (after removing the temporary) if it cannot be written."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def _import_path(modname: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:
        raise CompileError(f"cannot load compiled module {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_module(
    modname: str,
    cdef: str,
    source: str,
    *,
    sources: list[str] | None = None,
    include_dirs: list[str] | None = None,
    extra_compile_args: list[str] | None = None,
    libraries: list[str] | None = None,
) -> ModuleType:
    """Compile (unless cached) and import one cffi API-mode module.

    ``modname`` must already encode the content hash of all inputs.
    """
    if modname in _loaded:
        return _loaded[modname]
    target = cache_dir() / (modname + _suffix())
    with _build_lock:
        if modname in _loaded:
            return _loaded[modname]
        if not target.exists():
            ffi = cffi.FFI()
            ffi.cdef(cdef)
            ffi.set_source(
                modname,
                source,
                sources=sources or [],
                include_dirs=include_dirs or [],
                extra_compile_args=extra_compile_args or [],
                libraries=libraries or [],
            )
            tmp = Path(tempfile.mkdtemp(prefix="build-", dir=cache_dir()))
            try:
                try:
                    built = ffi.compile(tmpdir=str(tmp), verbose=False)
                except Exception as e:  # distutils raises CompileError/LinkError variants
                    log = getattr(e, "args", [""])
                    raise CompileError(f"C compiler failed for {modname}: {log}") from None
                os.replace(built, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        mod = _import_path(modname, target)
        _loaded[modname] = mod
        return mod
