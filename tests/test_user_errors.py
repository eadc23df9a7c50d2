"""Clear errors for what a new user tried: impossible allocation sizes, bad
grids, cap-table type faults, unsupported dtypes and gradients in kernels.qr,
a wrong ``tau`` for householder_product.  Each message names what was wrong
(the size, the parameter, the supported dtypes)."""

from __future__ import annotations

import numpy as np
import pytest

import capabilities
import runtime
from runtime import CapabilityFault

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
