"""The dialect's runtime calls and their signatures: what a kernel may call, on which
lane, with which argument kinds.

Its own module because the verifier (which checks calls against these tables) and
the passes it runs or that run after it (divergence, hoist, both instrumenters)
all read them; in verifier.py they made verifier and divergence import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...capabilities import abi

_ELEM = abi.SCALAR_SUFFIXES

# name -> (argument kinds, result kind); kinds: "cap", "num", "void".
_API_SIGS: dict[str, tuple[tuple[str, ...], str]] = {}
for _t in _ELEM:
    _API_SIGS[f"cap_load_{_t}"] = (("cap", "num"), "num")
    _API_SIGS[f"cap_store_{_t}"] = (("cap", "num", "num"), "void")
    _API_SIGS[f"cap_len_{_t}"] = (("cap",), "num")
    _API_SIGS[f"cap_offset_{_t}"] = (("cap", "num"), "cap")
for _t in (*_ELEM, "cap"):
    _API_SIGS[f"cap_alloc_{_t}"] = (("num",), "cap")
#: Checked tile copies between a cap and a local array (kind "array": a local
#: array named by a plain identifier, of the element type below).
TILE_ELEM_TYPES = {"f32": "float", "f64": "double"}
_TILE_ARGS = ("cap", "num", "num", "num", "num", "array", "num", "num")
for _t in TILE_ELEM_TYPES:
    _API_SIGS[f"cap_tile_load_{_t}"] = (_TILE_ARGS, "void")
    _API_SIGS[f"cap_tile_store_{_t}"] = (_TILE_ARGS, "void")
_API_SIGS.update({
    "cap_load_cap": (("cap", "num"), "cap"),
    "cap_store_cap": (("cap", "num", "cap"), "void"),
    "cap_to_int": (("cap",), "num"),
    "cap_from_int": (("num",), "cap"),
    "rt_block_idx": ((), "num"),
    "rt_grid_dim": ((), "num"),
    "rt_group_sync": ((), "void"),
})
_CUDA_SIGS: dict[str, tuple[tuple[str, ...], str]] = {
    "rt_thread_idx": ((), "num"),
    "rt_block_dim": ((), "num"),
    "rt_sync_threads": ((), "void"),
    "rt_lane_idx": ((), "num"),
    "rt_block_idx_y": ((), "num"),
    "rt_grid_dim_y": ((), "num"),
    "rt_require_block_dim": (("dim",), "void"),
}
#: Warp shuffles (kind "mask": an integer literal 1, 2, 4, 8 or 16) and reductions.
SHUFFLE_TYPES = ("f32", "f64", "i64")
for _t in SHUFFLE_TYPES:
    _CUDA_SIGS[f"rt_shfl_xor_{_t}"] = (("num", "mask"), "num")
    _CUDA_SIGS[f"rt_shfl_idx_{_t}"] = (("num", "num"), "num")
for _t in ("f32", "f64"):
    _CUDA_SIGS[f"rt_warp_sum_{_t}"] = (("num",), "num")
#: Tensor-core MMA of one warp on shared float tiles (kind "mma": an smem_ float
#: array), row-major, arguments (C, c_off, ldc, A, a_off, lda, B, b_off, ldb[, k]):
#: rt_warp_mma_tf32   C[16x16] += A[16x8] B[8x16], A and B rounded to tf32;
#: rt_warp_mma_f32    C[16x16] += A[16xk] B[kx16] to fp32 accuracy (each operand
#:                    split in two tf32 parts, three MMAs per step of 8), k a
#:                    multiple of 8, the accumulator in registers over k;
#: rt_warp_mma_f32_at the same with A given transposed: A^T[kx16] at a_off, lda.


@dataclass(frozen=True)
class MmaForm:
    """How one warp-MMA builtin reads its operands."""

    fp32: bool      # takes k and splits its operands into two tf32 parts
    a_t: bool       # A is given transposed (A^T, k x 16, row-major)


MMA_FUNCS = {"rt_warp_mma_tf32": MmaForm(False, False), "rt_warp_mma_f32": MmaForm(True, False),
             "rt_warp_mma_f32_at": MmaForm(True, True)}
_MMA_ARGS = ("mma", "num", "num") * 3
#: Positions of the three tile arrays (C, A, B) in a warp-MMA call.
MMA_ARRAY_ARGS = tuple(i for i, k in enumerate(_MMA_ARGS) if k == "mma")
for _n, _f in MMA_FUNCS.items():
    _CUDA_SIGS[_n] = (_MMA_ARGS + (("num",) if _f.fp32 else ()), "void")
_MATH_ARITY = {"sqrt": 1, "fabs": 1, "fma": 3, "copysign": 2, "fmin": 2, "fmax": 2, "exp": 1,
               "log": 1, "pow": 2, "hypot": 2, "floor": 1, "ceil": 1, "sin": 1, "cos": 1,
               "tanh": 1}
_MATH_SIGS: dict[str, tuple[tuple[str, ...], str]] = {}
for _n, _k in _MATH_ARITY.items():
    _MATH_SIGS[_n] = _MATH_SIGS[_n + "f"] = (("num",) * _k, "num")
for _n in ("isnan", "isinf", "isfinite"):
    _MATH_SIGS[_n] = (("num",), "num")

#: The dialect's runtime calls (CPU and GPU).
API_FUNCS: frozenset[str] = frozenset(_API_SIGS)
#: Runtime calls that exist only when compiling for CUDA.
CUDA_API_FUNCS: frozenset[str] = frozenset(_CUDA_SIGS)
#: Tile copies (block barriers on the GPU: see runtime/compiler/hoist/loops.py BARRIERS).
TILE_FUNCS: frozenset[str] = frozenset(n for n in _API_SIGS if n.startswith("cap_tile_"))
#: Warp-collective calls: every lane of the warp must reach them together.
WARP_FUNCS: frozenset[str] = frozenset(n for n in _CUDA_SIGS
                                       if n.startswith(("rt_shfl_", "rt_warp_")))
#: The math whitelist (float and double forms, classification macros).
MATH_FUNCS: frozenset[str] = frozenset(_MATH_SIGS)
