"""The dialect's builtins, one table: for each name, its signature (the argument and
result kinds the verifier checks calls against) and how each target lowers a call
(the CPU lane's C spelling, the CUDA spelling, or why the target has none).

The verifier, both lowerings (runtime/cpu/lower.py, runtime/cuda/lower.py) and the
passes between them (divergence, hoist) read it; tests/test_builtins.py checks that
what the verifier admits on a target is exactly what that target's lowering compiles.
Its own module because the verifier and divergence both need it (in verifier.py they
imported each other).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...capabilities import abi

#: Argument kinds: "cap" (a cap_t), "num" (any number), "array" (a local array named by
#: a plain identifier, of the tile's element type), "mma" (an smem_ float array),
#: "mask" (an integer literal 1, 2, 4, 8 or 16), "dim" (an integer literal block size).
#: Result kinds: "cap", "num", "void".
Sig = tuple[tuple[str, ...], str]


@dataclass(frozen=True)
class Lowering:
    """How one target spells a call: ``call`` applied to the block context (``ctx``:
    the CPU lane's hidden ``__rt``), the call's arguments, ``extra`` (constants: an int
    prints as a number, a str as a C name) and the source line (``line``).

    ``unchecked``: the spelling when a loop guard covered the access (hoist/'s
    UncheckedCall: the arguments only).  ``form`` marks the lowerings of another shape:
    "field" (the CPU's ``__rt->call``), "tile" (the local array's flat length and name
    follow its argument), "mma" (runtime/cuda/lower.py: k, the tiles' lengths and ids).
    A lowering whose ``call`` is the builtin's own name and adds nothing keeps the call
    as written."""

    call: str
    ctx: bool = False
    extra: tuple[int | str, ...] = ()
    line: bool = False
    unchecked: str | None = None
    form: str = "call"


@dataclass(frozen=True)
class Absent:
    """A builtin a target does not have: ``why`` is the verifier's reason, with
    ``{name}`` and ``{target}`` filled in."""

    why: str


@dataclass(frozen=True)
class Builtin:
    name: str
    args: tuple[str, ...]
    result: str
    cpu: Lowering | Absent
    cuda: Lowering | Absent
    math: bool = False  # the math whitelist (not a runtime API name)

    @property
    def sig(self) -> Sig:
        return self.args, self.result

    def lowering(self, target: str) -> Lowering | None:
        """The call's lowering on ``target`` ("cpu" or "cuda"), None if it has none."""
        low = self.cpu if target == "cpu" else self.cuda
        return low if isinstance(low, Lowering) else None

    def absent_reason(self, target: str) -> str | None:
        """Why ``target`` has no lowering for this builtin (None: it has one)."""
        low = self.cpu if target == "cpu" else self.cuda
        return low.why.format(name=self.name, target=target) if isinstance(low, Absent) else None


_GPU_ONLY = Absent("'{name}' exists only on the GPU (target is {target!r})")
_HOST_ONLY = Absent("not available on the GPU lane: device-side allocation and cap tables "
                    "need the host collector")

_TABLE: list[Builtin] = []


def _both(name: str, args: tuple[str, ...], result: str, cpu: Lowering,
          cuda: Lowering | None = None) -> None:
    _TABLE.append(Builtin(name, args, result, cpu, cuda or cpu))


def _gpu(name: str, args: tuple[str, ...], result: str, cuda: Lowering | None = None) -> None:
    _TABLE.append(Builtin(name, args, result, _GPU_ONLY, cuda or Lowering(name)))


# ---- cap accessors: element type T of the scalar dtypes (abi.SCALAR_SUFFIXES) ----------
for _t in abi.SCALAR_SUFFIXES:
    _s = abi.ELEM_SIZE[_t]
    _both(f"cap_load_{_t}", ("cap", "num"), "num",
          Lowering(f"rt_load_{_t}", ctx=True, line=True, unchecked=f"rt_uload_{_t}"),
          Lowering(f"rt_load_{_t}", line=True, unchecked=f"rt_uload_{_t}"))
    _both(f"cap_store_{_t}", ("cap", "num", "num"), "void",
          Lowering(f"rt_store_{_t}", ctx=True, line=True, unchecked=f"rt_ustore_{_t}"),
          Lowering(f"rt_store_{_t}", line=True, unchecked=f"rt_ustore_{_t}"))
    _both(f"cap_len_{_t}", ("cap",), "num", Lowering("rt_len", extra=(_s,)))
    _both(f"cap_offset_{_t}", ("cap", "num"), "cap", Lowering("rt_offset", extra=(_s,)))
# ---- allocation and cap tables: the host collector's, so CPU only ----------------------
for _t in (*abi.SCALAR_SUFFIXES, "cap"):
    _TABLE.append(Builtin(f"cap_alloc_{_t}", ("num",), "cap",
                          Lowering("rt_alloc", ctx=True, extra=(f"RT_DT_{_t.upper()}",),
                                   line=True), _HOST_ONLY))
_TABLE.append(Builtin("cap_load_cap", ("cap", "num"), "cap",
                      Lowering("rt_load_cap", ctx=True, line=True), _HOST_ONLY))
_TABLE.append(Builtin("cap_store_cap", ("cap", "num", "cap"), "void",
                      Lowering("rt_store_cap", ctx=True, line=True), _HOST_ONLY))
#: Checked tile copies between a cap and a local array: the array's element type.
TILE_ELEM_TYPES = {"f32": "float", "f64": "double"}
_TILE_ARGS = ("cap", "num", "num", "num", "num", "array", "num", "num")
for _t in TILE_ELEM_TYPES:
    for _op in ("load", "store"):
        _both(f"cap_tile_{_op}_{_t}", _TILE_ARGS, "void",
              Lowering(f"rt_tile_{_op}_{_t}", ctx=True, line=True, form="tile"),
              Lowering(f"rt_tile_{_op}_{_t}", line=True, form="tile"))
_both("cap_to_int", ("cap",), "num", Lowering("rt_cap_to_int"))
_both("cap_from_int", ("num",), "cap", Lowering("rt_cap_from_int"))
# ---- the launch ------------------------------------------------------------------------
_both("rt_block_idx", (), "num", Lowering("block_idx", form="field"), Lowering("rt_block_idx"))
_both("rt_grid_dim", (), "num", Lowering("grid_dim", form="field"), Lowering("rt_grid_dim"))
_both("rt_group_sync", (), "void", Lowering("rt_group_sync", ctx=True, line=True),
      Lowering("rt_group_sync"))
for _n in ("rt_thread_idx", "rt_block_dim", "rt_lane_idx", "rt_block_idx_y", "rt_grid_dim_y"):
    _gpu(_n, (), "num")
_gpu("rt_sync_threads", (), "void")
_gpu("rt_require_block_dim", ("dim",), "void")
# ---- warp shuffles (kind "mask": the butterfly partner stays in the warp), reductions ---
SHUFFLE_TYPES = ("f32", "f64", "i64")
for _t in SHUFFLE_TYPES:
    _gpu(f"rt_shfl_xor_{_t}", ("num", "mask"), "num")
    _gpu(f"rt_shfl_idx_{_t}", ("num", "num"), "num")
for _t in ("f32", "f64"):
    _gpu(f"rt_warp_sum_{_t}", ("num",), "num")


# ---- tensor-core MMA of one warp on shared float tiles ------------------------------------
# row-major tiles, arguments (C, c_off, ldc, A, a_off, lda, B, b_off, ldb[, k]):
# rt_warp_mma_tf32   C[16x16] += A[16x8] B[8x16], A and B rounded to tf32;
# rt_warp_mma_f32    C[16x16] += A[16xk] B[kx16] to fp32 accuracy (each operand
#                    split in two tf32 parts, three MMAs per step of 8), k a
#                    multiple of 8, the accumulator in registers over k;
# rt_warp_mma_f32_at the same with A given transposed: A^T[kx16] at a_off, lda.
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
    # the two forms are template arguments: each call compiles only its own path
    _gpu(_n, _MMA_ARGS + (("num",) if _f.fp32 else ()), "void",
         Lowering(f"rt_mma<{int(_f.fp32)}, {int(_f.a_t)}>", line=True, form="mma"))

# ---- the math whitelist: float and double forms, classification macros ------------------
_MATH_ARITY = {"sqrt": 1, "fabs": 1, "fma": 3, "copysign": 2, "fmin": 2, "fmax": 2, "exp": 1,
               "log": 1, "pow": 2, "hypot": 2, "floor": 1, "ceil": 1, "sin": 1, "cos": 1,
               "tanh": 1}
_MATH = [(n, k) for base, k in _MATH_ARITY.items() for n in (base, base + "f")]
_MATH += [(n, 1) for n in ("isnan", "isinf", "isfinite")]
for _n, _k in _MATH:
    _TABLE.append(Builtin(_n, ("num",) * _k, "num", Lowering(_n), Lowering(_n), math=True))

#: Every builtin by name.
BUILTINS: dict[str, Builtin] = {b.name: b for b in _TABLE}
assert len(BUILTINS) == len(_TABLE), "a builtin is in the table twice"

#: The runtime API names that the CPU lane has (all but cap_alloc_*/cap tables: both).
API_FUNCS: frozenset[str] = frozenset(b.name for b in _TABLE
                                      if not b.math and b.lowering("cpu") is not None)
#: Runtime API names that exist only when compiling for CUDA.
CUDA_API_FUNCS: frozenset[str] = frozenset(b.name for b in _TABLE
                                           if not b.math and b.lowering("cpu") is None)
#: Tile copies (block barriers on the GPU: see runtime/compiler/hoist/loops.py BARRIERS).
TILE_FUNCS: frozenset[str] = frozenset(n for n in BUILTINS if n.startswith("cap_tile_"))
#: Warp-collective calls: every lane of the warp must reach them together.
WARP_FUNCS: frozenset[str] = frozenset(n for n in CUDA_API_FUNCS
                                       if n.startswith(("rt_shfl_", "rt_warp_")))
#: The math whitelist (float and double forms, classification macros).
MATH_FUNCS: frozenset[str] = frozenset(b.name for b in _TABLE if b.math)


def on_target(target: str) -> frozenset[str]:
    """The builtins ``target`` lowers: exactly those the verifier admits there."""
    return frozenset(n for n, b in BUILTINS.items() if b.lowering(target) is not None)
