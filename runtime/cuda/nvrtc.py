"""Run-time compilation of CUDA C to cubin through NVRTC (cffi ABI mode), cached on disk.

The cache key is a hash of (source, options, NVRTC version, target arch), so a
toolkit upgrade or a changed option never reuses a stale binary.  When
``libnvrtc`` cannot be found but ``nvcc`` is on PATH, ``nvcc -cubin`` is used
instead (same cache, key marked "nvcc"): that also lets the code generator be
tested on machines that have the compiler but no GPU.

A verified source the compiler still refuses raises ``CompileError`` on kernel
lines (:func:`cuda_compile_error`): the front end's diagnostics carry them through
the lowering's ``#line`` directives; ptxas's (too much shared or local memory, a
parameter space overflowed) and the module loader's name an entry function
instead, which is put on its kernel's line.  The message keeps the errors (the
runtime prelude's warnings stay in ``compiler_output``).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from ..build import cache_dir as build_cache_dir
from ..build import compile_error, publish
from ..errors import CompileError

try:
    import cffi
except ImportError:  # pragma: no cover
    cffi = None

CDEF = """
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
const char *nvrtcGetErrorString(nvrtcResult r);
nvrtcResult nvrtcVersion(int *major, int *minor);
nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                               int numHeaders, const char *const *headers,
                               const char *const *includeNames);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char *const *options);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
"""

_lock = threading.Lock()
_state: dict = {}


def _candidates() -> list[str]:
    """Places libnvrtc may live: env override, loader path, CUDA toolkit, pip wheels."""
    out = []
    if os.environ.get("CAPQR_LIBNVRTC"):
        out.append(os.environ["CAPQR_LIBNVRTC"])
    out += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    for r in roots:
        if r:
            out += sorted(glob.glob(os.path.join(r, "lib64", "libnvrtc.so*")), reverse=True)
    # nvidia-cuda-nvrtc wheels (what PyTorch pulls in): site-packages/nvidia/*/lib
    for p in sys.path:
        out += sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib", "libnvrtc.so*")),
                      reverse=True)
    return [c for c in out if "builtins" not in c and "alt" not in os.path.basename(c)]


def _load():
    """Open libnvrtc once; returns (ffi, lib) or (None, None) when absent."""
    with _lock:
        if "lib" in _state:
            return _state["ffi"], _state["lib"]
        if cffi is None:
            _state["ffi"] = _state["lib"] = None
            return None, None
        f = cffi.FFI()
        f.cdef(CDEF)
        L = None
        for c in _candidates():
            try:
                L = f.dlopen(c)
                _state["path"] = c
                break
            except OSError:
                continue
        _state["ffi"], _state["lib"] = f, L
        return f, L


def version() -> str:
    """"nvrtc-MAJOR.MINOR", or "nvcc-<version line>" when falling back, or "none"."""
    f, L = _load()
    if L is not None:
        a, b = f.new("int *"), f.new("int *")
        L.nvrtcVersion(a, b)
        return f"nvrtc-{a[0]}.{b[0]}"
    nvcc = shutil.which("nvcc")
    if nvcc:
        if "nvcc_version" not in _state:
            r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
            _state["nvcc_version"] = "nvcc-" + r.stdout.strip().splitlines()[-1]
        return _state["nvcc_version"]
    return "none"


def cache_dir() -> Path:
    """Directory of cached cubins and CUDA front-end records: runtime.build.cache_dir()
    (``$CAPQR_CACHE``, as for CPU modules) / cuda."""
    p = build_cache_dir() / "cuda"
    p.mkdir(parents=True, exist_ok=True)
    return p


def compile_cubin(source: str, *, arch: str = "sm_90", options: tuple[str, ...] = (),
                  name: str = "kernel.cu",
                  entries: Mapping[str, tuple[str, int]] | None = None) -> bytes:
    """Compile CUDA C source to a cubin for ``arch``; cached by content hash.

    Raises CompileError with the compiler log when compilation fails, its
    diagnostics on kernel lines (``entries``: entry symbol -> (kernel, line), for
    those that name a function: :func:`cuda_compile_error`).
    """
    opts = (f"--gpu-architecture={arch}", "--std=c++17", *options)
    ver = version()
    if ver == "none":
        raise CompileError("neither libnvrtc nor nvcc is available to compile CUDA C")
    key = hashlib.sha256("\0".join([ver, arch, *opts, source]).encode()).hexdigest()[:32]
    path = cache_dir() / f"{key}.cubin"
    if path.exists():
        return path.read_bytes()
    f, L = _load()
    if L is not None:
        cubin = _nvrtc(f, L, source, opts, name, entries or {})
    else:
        cubin = _nvcc(source, arch, options, entries or {})
    publish(path, cubin)   # concurrent compilers never see a torn file
    return cubin


def _nvrtc(f, L, source: str, opts: tuple[str, ...], name: str,
           entries: Mapping[str, tuple[str, int]]) -> bytes:
    prog = f.new("nvrtcProgram *")
    rc = L.nvrtcCreateProgram(prog, source.encode(), name.encode(), 0, f.NULL, f.NULL)
    if rc != 0:
        raise CompileError(f"nvrtcCreateProgram: {f.string(L.nvrtcGetErrorString(rc)).decode()}")
    try:
        keep = [f.new("char[]", o.encode()) for o in opts]
        arr = f.new("const char *[]", keep)
        rc = L.nvrtcCompileProgram(prog[0], len(keep), arr)
        n = f.new("size_t *")
        L.nvrtcGetProgramLogSize(prog[0], n)
        log_buf = f.new("char[]", max(n[0], 1))
        L.nvrtcGetProgramLog(prog[0], log_buf)
        log = f.string(log_buf).decode(errors="replace")
        if rc != 0:
            raise cuda_compile_error(f"the CUDA C of {name} (NVRTC: "
                                     f"{f.string(L.nvrtcGetErrorString(rc)).decode()})", log,
                                     entries)
        L.nvrtcGetCUBINSize(prog[0], n)
        buf = f.new("char[]", n[0])
        L.nvrtcGetCUBIN(prog[0], buf)
        return bytes(f.buffer(buf, n[0]))
    finally:
        L.nvrtcDestroyProgram(prog)


def _nvcc(source: str, arch: str, options: tuple[str, ...],
          entries: Mapping[str, tuple[str, int]]) -> bytes:
    nvcc = shutil.which("nvcc")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.cu")
        out = os.path.join(d, "k.cubin")
        Path(src).write_text(source)
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-std=c++17", *options, "-o", out, src]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise cuda_compile_error("the CUDA C (nvcc)", r.stderr + r.stdout, entries,
                                     {src: "<generated CUDA>"})
        return Path(out).read_bytes()


#: A diagnostic's first line (the lines after it, indented or blank, are its excerpt).
_HEADER = re.compile(r"^(?:\S.*\(\d+\)|kernel:\d+|(?:ptxas|nvcc|nvlink)\b).*?:", re.IGNORECASE)
_PTXAS = re.compile(r"^ptxas\s+(error|fatal|warning)\s*:\s*(.*)$", re.IGNORECASE)
_SEVERE = re.compile(r"\b(error|fatal)\b", re.IGNORECASE)
_ON_LINE = re.compile(r"^kernel\(\d+\):")


def cuda_compile_error(what: str, log: str, entries: Mapping[str, tuple[str, int]],
                       files: dict[str, str] | None = None) -> CompileError:
    """The CompileError for a compiler's (or the module loader's) ``log``: each
    diagnostic that names an entry symbol of ``entries`` (symbol -> (kernel, line)),
    ptxas's or the front end's about the function as a whole, goes onto that kernel's
    line, symbols read as kernel names, and the message keeps the diagnostics that are
    errors (all of them when none is); its ``compiler_output`` is the whole log,
    unmapped."""
    symbols = re.compile("|".join(rf"'?\b{re.escape(s)}\b'?" for s in entries) or "(?!)")

    def named(m: re.Match) -> str:  # the symbol as its kernel's name, quoted once
        return f"'{entries[m.group(0).strip(chr(39))][0]}'"

    blocks: list[list[str]] = []
    for raw in log.splitlines():
        found = symbols.search(raw)
        if found is not None:  # about the function as a whole: on its KERNEL line
            line = entries[found.group(0).strip("'")][1]
            m = _PTXAS.match(raw.strip())
            if m is not None:
                raw = f"kernel({line}): ptxas {m.group(1).lower()}: {m.group(2)}"
            else:  # (the __global__ wrapper follows the body without a #line of its own)
                raw = _ON_LINE.sub(f"kernel({line}):", raw, count=1)
        raw = symbols.sub(named, raw)
        if not blocks or _HEADER.match(raw):
            blocks.append([raw])
        else:
            blocks[-1].append(raw)
    errors = [b for b in blocks if _SEVERE.search(b[0])]
    err = compile_error(what, "\n".join(line for b in errors or blocks for line in b), files)
    err.compiler_output = log
    return err
