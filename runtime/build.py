"""Building and loading cffi extension modules, cached by content hash.

Both the runtime core and every kernel are cffi out-of-line API-mode
modules.  A module's name is derived from the hash of everything that goes
into it (sources, headers, flags, compiler), so a cache hit needs no
compiler and a stale cache can never be loaded.  Builds happen in a private
temporary directory and are published with an atomic rename, so concurrent
processes (test workers, dask workers) never see half-written files.

A kernel's C is compiled in a translation unit of its own (``kernel_source``),
never in cffi's glue: that one includes Python.h and with it errno.h, stdlib.h
and the rest, whose macros would rewrite kernel code.  Its compiler errors come
back as a CompileError with the diagnostics mapped to kernel lines (the
generated C carries ``#line N "kernel"`` directives).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import ModuleType

import cffi

from .compiler.astutil import demangle
from .errors import CompileError

#: The capqr package's root: a wheel's capqr/ folder or a checkout.  The C sources and
#: headers are its package data (pyproject.toml), found here and nowhere else.
PACKAGE_ROOT = Path(str(resources.files(__package__.rpartition(".")[0])))
CAP_INCLUDE = PACKAGE_ROOT / "capabilities"
GC_DIR = PACKAGE_ROOT / "gc"
CSRC = PACKAGE_ROOT / "runtime" / "csrc"

_loaded: dict[str, ModuleType] = {}
#: One lock per module name: different modules build at once (kernels.precompile), a
#: module is built once.  cffi's own compile step changes the process's working
#: directory, so it runs under one lock of its own.
_module_locks: dict[str, threading.Lock] = {}
_module_locks_guard = threading.Lock()
_cffi_lock = threading.Lock()
_announced = False


def _module_lock(modname: str) -> threading.Lock:
    with _module_locks_guard:
        return _module_locks.setdefault(modname, threading.Lock())


def cold_start_said() -> None:
    """The caller announces its own builds (kernels.precompile): no first-use line."""
    global _announced
    _announced = True


def _announce_cold_start() -> None:
    """One line on stderr at a process's first compile (not for a cache hit), so a first
    call that takes seconds says why; $CAPQR_QUIET=1 silences it."""
    global _announced
    if _announced or os.environ.get("CAPQR_QUIET"):
        return
    _announced = True
    print(f"capqr: compiling kernels on first use (seconds each), cached in {cache_dir()}; "
          "`python -m capqr warmup` builds them ahead", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where compiled modules live: $CAPQR_CACHE or ~/.cache/capqr (absolute)."""
    return _cache_dir(os.environ.get("CAPQR_CACHE") or "")


@lru_cache(maxsize=8)
def _cache_dir(setting: str) -> Path:
    # Made absolute once: cffi's compile step changes the working directory while other
    # threads compile kernels (build_module).
    d = Path(setting or Path.home() / ".cache" / "capqr").absolute()
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
    # Whether capqr runs installed or from a checkout: the two never share a module (the
    # contents are hashed too, so checkouts of one commit do share theirs).
    kind = "installed" if {"site-packages", "dist-packages"} & set(PACKAGE_ROOT.parts) \
        else "checkout"
    return f"{cc}|{out.splitlines()[0] if out else '?'}|{sys.version_info[:2]}|{kind}"


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


@lru_cache(maxsize=1)
def _compiler_so() -> tuple[str, ...]:
    """The command distutils (cffi's builder) compiles extension sources with: $CC or
    Python's compiler, Python's CFLAGS ($CFLAGS, $CPPFLAGS) and -fPIC."""
    # the shim imports setuptools before distutils, so this is the distutils cffi uses
    from cffi import _shimmed_dist_utils as dist

    cc = importlib.import_module("distutils.ccompiler").new_compiler()
    dist.sysconfig.customize_compiler(cc)
    return tuple(cc.compiler_so)


#: Diagnostics only (no effect on code): no source excerpts (gcc would read a file
#: named "kernel" from the working directory for them), no colour.
_DIAG_FLAGS = ("-fno-diagnostics-show-caret", "-fdiagnostics-color=never")


def kernel_cc_command(include_dirs: list[str], extra_args: list[str]) -> list[str]:
    """The compiler command of a module's ``kernel_source`` translation unit, without
    the input and output: the flags the cffi build gives every source, then
    ``extra_args`` (so -O3 etc. are those of the kernel, as before the split)."""
    return [*_compiler_so(), *(f"-I{d}" for d in include_dirs), *_DIAG_FLAGS, *extra_args]


_DIAG = re.compile(r"kernel(?::(\d+)(?::\d+)?|\((\d+)\)):\s*(.*)")
#: Lines of the mapped diagnostics a CompileError's message keeps (all are on the
#: exception's ``compiler_output``).
_DIAG_LINES = 40


def compile_error(what: str, output: str, files: dict[str, str] | None = None) -> CompileError:
    """A CompileError for compiler ``output`` (gcc's ``kernel:N:C: ...`` or NVRTC's
    ``kernel(N): ...``): each diagnostic on a kernel line says ``line N``, user names
    are spelled as written, and ``files`` (path -> short name) shortens the paths
    of generated files.  Its ``line`` is the first error's kernel line."""
    mapped: list[str] = []
    first: int | None = None
    for raw in output.splitlines():
        for path, short in (files or {}).items():
            raw = raw.replace(path, short)
        m = _DIAG.match(raw)
        if m is not None:
            n = int(m.group(1) or m.group(2))
            if first is None and "error" in m.group(3).lower():  # NVRTC: "Error:" too
                first = n
            raw = f"line {n}: {m.group(3)}"
        elif raw.startswith("kernel: "):  # "kernel: In function ..."
            raw = raw[len("kernel: "):]
        if raw.strip():
            mapped.append(demangle(raw))
    where = f" at line {first}" if first is not None else ""
    more = len(mapped) - _DIAG_LINES
    text = "\n  ".join(mapped[:_DIAG_LINES] + ([f"... ({more} more lines)"] if more > 0 else []))
    return CompileError(f"the compiler rejected {what}{where} (the source passed the verifier: "
                        f"a capqr bug or an unsupported construct):\n  {text}",
                        line=first, compiler_output=output)


def _compile_kernel(tmp: Path, modname: str, text: str, include_dirs: list[str],
                    extra_args: list[str], what: str) -> Path:
    """Compile ``text`` to an object in ``tmp``; CompileError with its diagnostics."""
    src, obj = tmp / f"{modname}_kernel.c", tmp / f"{modname}_kernel.o"
    src.write_text(text)
    cmd = [*kernel_cc_command(include_dirs, extra_args), "-c", str(src), "-o", str(obj)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           env=dict(os.environ, LC_ALL="C"))  # plain ASCII quotes
    except OSError as e:
        raise CompileError(f"cannot run the C compiler {cmd[0]!r}: {e}") from None
    if r.returncode != 0:
        raise compile_error(what, r.stderr + r.stdout,
                            {str(src): "<generated C>"})
    return obj


def build_module(
    modname: str,
    cdef: str,
    source: str,
    *,
    sources: list[str] | None = None,
    include_dirs: list[str] | None = None,
    extra_compile_args: list[str] | None = None,
    libraries: list[str] | None = None,
    kernel_source: str | None = None,
    what: str | None = None,
) -> ModuleType:
    """Compile (unless cached) and import one cffi API-mode module.

    ``modname`` must already encode the content hash of all inputs.  ``source`` is
    cffi's glue; ``kernel_source``, if given, is C compiled in a translation unit of
    its own with :func:`kernel_cc_command` and linked in (``source`` then only
    declares what ``cdef`` names); ``what`` names it in a CompileError.
    """
    if modname in _loaded:
        return _loaded[modname]
    target = cache_dir() / (modname + _suffix())
    with _module_lock(modname):
        if modname in _loaded:
            return _loaded[modname]
        if not target.exists():
            _announce_cold_start()
            tmp = Path(tempfile.mkdtemp(prefix="build-", dir=cache_dir()))
            try:
                objects = []
                if kernel_source is not None:
                    objects.append(str(_compile_kernel(tmp, modname, kernel_source,
                                                       include_dirs or [],
                                                       extra_compile_args or [],
                                                       what or f"kernel C of {modname}")))
                ffi = cffi.FFI()
                ffi.cdef(cdef)
                ffi.set_source(
                    modname,
                    source,
                    sources=sources or [],
                    include_dirs=include_dirs or [],
                    extra_compile_args=extra_compile_args or [],
                    extra_objects=objects,
                    libraries=libraries or [],
                )
                try:
                    with _cffi_lock:
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
