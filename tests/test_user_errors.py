"""Clear errors for what a new user tried: impossible allocation sizes, bad
grids, cap-table type faults, unsupported dtypes and gradients in kernels.qr,
a wrong ``tau`` for householder_product.  Each message names what was wrong
(the size, the parameter, the supported dtypes)."""

from __future__ import annotations

import numpy as np
import pytest
from capqr import capabilities, kernels, runtime
from capqr.runtime import CapabilityFault

# -- capabilities.alloc sizes -------------------------------------------------


@pytest.mark.parametrize("shape", [(1 << 62, 1 << 62), (1 << 61,), (1 << 40, 1 << 10, 1 << 10)])
def test_alloc_of_an_impossible_size_names_it(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"needs \d+ bytes"):
        capabilities.alloc(shape, np.float32)


def test_alloc_negative_and_non_int_shapes() -> None:
    with pytest.raises(ValueError, match="negative dimension"):
        capabilities.alloc((4, -1))
    with pytest.raises(TypeError, match="shape"):
        capabilities.alloc((2.5, 2))
    with pytest.raises(TypeError, match="shape"):
        capabilities.alloc((True, 2))


# -- cap tables: misaligned slots fault "type" (docs/dialect.md, Errors) ---------

TABLE_SRC = """
KERNEL void numbers_as_table(cap_t nums, cap_t out)
{
    cap_t c = cap_load_cap(nums, 0);
    cap_store_f32(out, 0, cap_load_f32(c, 0));
}
KERNEL void misaligned_load(cap_t t, cap_t out)
{
    cap_t m = cap_offset_i64(t, 1);
    cap_t c = cap_load_cap(m, 0);
    cap_store_f32(out, 0, cap_load_f32(c, 0));
}
KERNEL void misaligned_store(cap_t t, cap_t out)
{
    cap_t m = cap_offset_f32(t, 3);
    cap_store_cap(m, 1, out);
}
KERNEL void aligned_offset(cap_t t, cap_t out)
{
    cap_t m = cap_offset_i64(t, 2);
    cap_store_cap(m, 0, out);
    cap_t c = cap_load_cap(t, 1);
    cap_store_f32(c, 0, 5.0f);
}
"""


@pytest.mark.parametrize("name,access", [("numbers_as_table", "load"),
                                         ("misaligned_load", "load"),
                                         ("misaligned_store", "store")])
def test_misaligned_or_numeric_cap_table_slot_faults_type(name: str, access: str) -> None:
    k = runtime.compile(TABLE_SRC, name)
    out = capabilities.alloc(4, np.float32, name="out")
    src = capabilities.alloc(8, np.float32, name="nums") if name == "numbers_as_table" \
        else capabilities.alloc(4, "cap", name="table")
    with pytest.raises(CapabilityFault) as e:
        runtime.launch(k, [src, out])
    assert (e.value.reason, e.value.access, e.value.buffer) == ("type", access, src.name)


def test_cap_offset_by_whole_slots_stays_a_table() -> None:
    k = runtime.compile(TABLE_SRC, "aligned_offset")
    out = capabilities.alloc(4, np.float32, name="out")
    t = capabilities.alloc(4, "cap", name="table")
    runtime.launch(k, [t, out])
    assert out.numpy()[0] == 5.0


# -- kernels.qr -------------------------------------------------------------------

A64 = np.random.default_rng(0).standard_normal((6, 4))


@pytest.mark.parametrize("a", [np.arange(24).reshape(6, 4), A64 > 0,
                               A64.astype(np.complex128), A64.astype(np.int8)],
                         ids=["int64", "bool", "complex", "int8"])
def test_qr_refuses_non_float_input_listing_the_dtypes(a: np.ndarray) -> None:
    with pytest.raises(TypeError, match="float16, float32, float64"):
        kernels.qr(a)


def test_qr_f16_refuses_to_round_float64_to_half() -> None:
    with pytest.raises(TypeError, match="float16"):
        kernels.qr(A64, "f16")


@pytest.mark.parametrize("grid,exc", [(0, ValueError), (-1, ValueError), (True, TypeError),
                                      (2.5, TypeError), ("2", TypeError)])
@pytest.mark.parametrize("variant", ["parallel", "blocked"])
def test_qr_refuses_a_bad_grid(variant: str, grid: object, exc: type) -> None:
    with pytest.raises(exc, match="grid"):
        kernels.qr(A64, variant, grid=grid)


def test_qr_of_a_huge_matrix_names_the_size_before_reading_it() -> None:
    big = np.broadcast_to(np.float32(1), (1 << 24, 1 << 24))  # a view: no memory behind it
    with pytest.raises(ValueError, match=r"needs \d+ bytes"):
        kernels.qr(big)


@pytest.mark.parametrize("cut", [slice(0, 2), slice(None)], ids=["short", "long"])
def test_householder_product_checks_tau_length(cut: slice) -> None:
    H, tau = kernels.qr(A64)
    bad = tau[cut] if cut != slice(None) else np.r_[tau, 1.0]
    with pytest.raises(ValueError, match=f"length {len(bad)}.*expected 4"):
        kernels.householder_product(H, bad)
    with pytest.raises(ValueError, match="tau"):
        kernels.householder_product(H[None], tau)  # batched H, unbatched tau


torch = pytest.importorskip("torch")


def test_qr_of_a_tensor_requiring_grad_says_to_detach() -> None:
    t = torch.tensor(A64, requires_grad=True)
    with pytest.raises(TypeError, match=r"detach\(\)"):
        kernels.qr(t)
    H, tau = kernels.qr(t.detach())
    assert isinstance(H, torch.Tensor) and H.dtype == torch.float64


@pytest.mark.parametrize("dtype", ["bfloat16", "complex64", "int8", "bool", "int64"])
def test_unsupported_torch_dtypes_get_capqr_type_errors(dtype: str) -> None:
    t = torch.zeros(6, 4).to(getattr(torch, dtype))
    with pytest.raises(TypeError, match="float16, float32, float64"):
        kernels.qr(t)
    if dtype != "int64":  # capabilities hold int64 buffers
        with pytest.raises(TypeError, match="capqr buffers hold float16, float32, float64"):
            capabilities.wrap(t)


def test_a_long_name_is_cut_at_a_character_in_the_fault() -> None:
    """The collector keeps NAME_MAX - 1 bytes of a buffer's name; a cut inside a UTF-8
    character made the fault name the buffer with a replacement character."""
    from capqr.capabilities import abi

    name = "a" * (abi.NAME_MAX - 2) + "\u00e9tat"   # the cut falls inside the e-acute
    src = "KERNEL void poke(cap_t x) { cap_store_f32(x, 99, 1.0f); }"
    x = capabilities.alloc(4, name=name)
    with pytest.raises(runtime.CapabilityFault) as e:
        runtime.launch(runtime.compile(src, "poke"), [x])
    assert e.value.buffer == "a" * (abi.NAME_MAX - 2)
    assert name.startswith(e.value.buffer)
