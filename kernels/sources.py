"""Kernel C sources: load the dialect files in ``kernels/src`` (the GPU's in
``kernels/src/gpu``) and compose them.

Each kernel is built from shared helper files plus its own entry-point file;
the float32 text is canonical and the float64 build is derived from it by a
fixed, reviewed substitution (:func:`to_f64`), so both precisions share one
algorithm.  The composed text is what ``runtime.compile`` sees, so fault line
numbers refer to it; :func:`locate` maps them back to (file, line).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SRC_DIR = Path(__file__).with_name("src")

#: Files (in order) making up each kernel family.
FAMILIES: dict[str, tuple[str, ...]] = {
    "geqr2": ("householder.c", "geqr2.c"),
    "geqrf": ("householder.c", "gemm.c", "geqrf.c"),
    "geqrf_f16": ("householder.c", "gemm.c", "geqrf_f16.c"),
    "qrt": ("householder.c", "tile.c", "qrt.c"),
    "qrt_group": ("householder.c", "tile.c", "qrt.c", "qrt_group.c"),
    "qrt_tall": ("householder.c", "tile.c", "qrt.c", "qrt_group.c", "qrt_tall.c"),
    "qr_small": ("qr_small.c",),
    "copy": ("copy.c",),
    # the GPU QR kernels (kernels/gpu): float32 only; gpu_whole's and gpu_panel_reg's kernels are
    # generated (kernels/gpu/gen_whole.py, gen_panel_reg.py) and follow their shared files
    "gpu_panel": ("gpu/reflector.c", "gpu/t_factor.c", "gpu/panel.c"),
    "gpu_panel_small": ("gpu/reflector.c", "gpu/t_factor.c", "gpu/panel_small.c"),
    "gpu_steps": ("gpu/reflector.c", "gpu/t_factor.c", "gpu/panel_steps.c"),
    "gpu_whole": ("gpu/reflector.c",),
    "gpu_panel_reg": ("gpu/reflector.c",),
}

# The half-storage kernel's xLARFB reads and writes the trailing matrix (the
# cap named C in gemm.c) in half precision; V, T and W stay float32.
_F16_C_SUBS: list[tuple[str, str]] = [
    (r"\bcap_load_f32\(C,", "cap_load_f16(C,"),
    (r"\bcap_store_f32\(C,", "cap_store_f16(C,"),
]


def _file_text(family: str, name: str, dtype: str = "float32") -> str:
    if name == "tile.c" and dtype == "float64":
        # the tile update's register blocks hold half as many doubles (kernels/gen_tile.py;
        # imported here so that `python -m capqr.kernels.gen_tile` runs it only once)
        from . import gen_tile

        return gen_tile.source("float64")
    text = read(name)
    if family == "geqrf_f16" and name == "gemm.c":
        for pat, rep in _F16_C_SUBS:
            text = re.sub(pat, rep, text)
    return text

# float32 -> float64: accessors, types, math calls and the two LAPACK machine
# constants (FLT_MIN and the unit roundoff 2^-24 -> DBL_MIN and 2^-53).
_F64_SUBS: list[tuple[str, str]] = [
    (r"\bcap_(load|store|offset|len|alloc)_f32\b", r"cap_\1_f64"),
    (r"\bcap_tile_(load|store)_f32\b", r"cap_tile_\1_f64"),
    (r"\b_f32\b", "_f64"),
    (r"\bgeqr2_f32\b", "geqr2_f64"),
    (r"\bgeqrf_f32\b", "geqrf_f64"),
    (r"\bqrt_f32\b", "qrt_f64"),
    (r"\bqrt_step_f32\b", "qrt_step_f64"),
    (r"\bqrt_gstep_f32\b", "qrt_gstep_f64"),
    (r"\bqrt_coop_f32\b", "qrt_coop_f64"),
    (r"\bqrt_tall_f32\b", "qrt_tall_f64"),
    (r"\bcopy_f32\b", "copy_f64"),
    (r"\bfloat\b", "double"),
    (r"\b(sqrt|fabs|copysign|hypot|fmax|fmin|fma)f\(", r"\1("),
    (r"1\.17549435e-38f", "2.2250738585072014e-308"),
    (r"5\.96046448e-08f", "1.1102230246251565e-16"),
    (r"\b(\d+\.\d*)f\b", r"\1"),
]


@cache
def read(name: str) -> str:
    """Text of one file in ``kernels/src``."""
    return (SRC_DIR / name).read_text()


def to_f64(src: str) -> str:
    """Derive the float64 kernel text from float32 text."""
    for pat, rep in _F64_SUBS:
        src = re.sub(pat, rep, src)
    return src


def files(family: str) -> tuple[str, ...]:
    """The source files of a kernel family, in composition order."""
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown kernel family {family!r}; have {sorted(FAMILIES)}") from None


def source(family: str, dtype: str = "float32") -> str:
    """Composed dialect source of ``family`` for ``dtype`` ("float32"/"float64")."""
    text = "\n".join(_file_text(family, f, dtype) for f in files(family))
    if dtype == "float64":
        if family == "geqrf_f16":
            raise ValueError("geqrf_f16 has no float64 build (it is the half-storage kernel)")
        return to_f64(text)
    if dtype != "float32":
        raise ValueError(f"unsupported kernel dtype {dtype!r}")
    return text


def entry(family: str, dtype: str = "float32") -> str:
    """Name of the KERNEL entry point of ``family`` for ``dtype``."""
    if family == "geqrf_f16":
        return "geqrf_f16"
    return f"{family}_{'f64' if dtype == 'float64' else 'f32'}"


def locate(family: str, line: int, dtype: str = "float32") -> tuple[str, int]:
    """Map a line of the composed source of ``dtype`` back to (file name, line in that
    file; for the float64 tile.c, a line of ``gen_tile.source("float64")``)."""
    for f in files(family):
        count = _file_text(family, f, dtype).count("\n") + 1  # files are joined by one newline
        if line <= count:
            return f, line
        line -= count
    return files(family)[-1], line
