"""Every fault kind the CPU lane can report, on the GPU lane: recorded by the device,
or shown here to be unable to arise there.

Both lanes classify a refused cap access with one function, rt_fault_kind
(capabilities/checks.h): runtime/csrc/launch.c from the object header, the device
prelude's rt_fault_cap from the cap's tag.  The emulated runs compile the generated
CUDA with g++ (tests/emulate_cuda.py): no GPU needed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from capqr import capabilities, runtime
from capqr.capabilities import abi
from capqr.runtime.compiler.dialect_api import BUILTINS, TILE_ELEM_TYPES
from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.verifier import verify
from capqr.runtime.errors import CapabilityFault, VerifyError

TESTS = Path(__file__).resolve().parent

#: Where each fault kind is shown on the GPU lane: (test file, test function).
DEVICE_EVIDENCE = {
    "OOB": ("test_gpu_faults.py", "test_cap_faults_are_classified_as_on_the_cpu"),
    "READONLY": ("test_gpu_faults.py", "test_cap_faults_are_classified_as_on_the_cpu"),
    "FREED": ("test_gpu_faults.py", "test_cap_faults_are_classified_as_on_the_cpu"),
    "NOBOUNDS": ("test_gpu_emulated.py", "test_emulated_gpu_faults_match_the_conformance_table"),
    "LOCAL": ("test_gpu_emulated.py", "test_emulated_gpu_faults_match_the_conformance_table"),
    "DIVZERO": ("test_gpu_emulated.py", "test_emulated_gpu_faults_match_the_conformance_table"),
    "ARG": ("test_gpu_emulated.py", "test_emulated_mma_contract_faults_name_the_argument"),
    "TIMEOUT": ("test_liveness.py", "test_emulated_gpu_call_dag_stops_at_cancel"),
    "TYPE": ("test_gpu_faults.py", "test_type_faults_cannot_arise_on_the_device"),
    "ALLOC": ("test_gpu_faults.py", "test_allocation_faults_cannot_arise_on_the_device"),
    "GROUP": ("test_gpu_faults.py", "test_group_faults_cannot_arise_on_the_device"),
    "CANCELLED": ("test_gpu_faults.py", "test_the_device_never_records_a_cancel"),
}


def test_every_fault_kind_is_accounted_for_on_the_device() -> None:
    assert set(DEVICE_EVIDENCE) == {f.name for f in abi.FAULTS}
    for kind, (path, test) in DEVICE_EVIDENCE.items():
        assert f"def {test}(" in (TESTS / path).read_text(), (kind, path, test)


STORE = "KERNEL void k(cap_t x, int64_t i)\n{\n    cap_store_f32(x, i, 1.0f);\n}\n"
#: (perms of x, index) -> the fault both lanes report
CAP_CASES = [("rw", 8, "out-of-bounds"), ("rw", -1, "out-of-bounds"), ("r", 0, "read-only"),
             ("r", 8, "out-of-bounds"), ("freed", 0, "freed")]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_cap_faults_are_classified_as_on_the_cpu(tmp_path: Path) -> None:
    """The emulated device's record names the CPU lane's fault for the same access: a
    store past the end, before the start, to a read-only buffer in and out of range,
    and through a cap whose buffer was freed while the launch was packed (the tag's
    freed bit).  The CPU refuses a freed buffer before the launch (its own test),
    so FREED is checked against its reason only."""
    from emulate_cuda import build

    k = build(STORE, workdir=tmp_path)["k"]
    cpu = runtime.compile(STORE, "k")
    for perms, i, reason in CAP_CASES:
        x = np.zeros(8, np.float32)
        fault = k.launch([(x, perms), i], 1, 1)
        assert fault is not None and abi.FAULT_REASON[fault["kind"]] == reason, (perms, i)
        assert fault["slot"] == 0 and fault["index"] == i and not x.any()
        if perms == "freed":
            continue
        buf = capabilities.wrap(np.zeros(8, np.float32), perms=perms, name="x")
        with pytest.raises(CapabilityFault) as err:
            runtime.launch(cpu, [buf], args=(i,))
        assert (err.value.reason, err.value.index) == (reason, i)


def _refused_on_the_device(name: str) -> str:
    """The verifier's reason for refusing a call of ``name`` for target cuda."""
    b = BUILTINS[name]
    args = ", ".join("x" if k == "cap" else "n" for k in b.args)
    src = f"KERNEL void k(cap_t x, int64_t n)\n{{\n    {name}({args});\n}}\n"
    verify(parse(src), target="cpu")  # the CPU has it
    with pytest.raises(VerifyError) as err:
        verify(parse(src), target="cuda")
    return err.value.reason


def test_type_faults_cannot_arise_on_the_device() -> None:
    """A TYPE fault is a slot access (element size RT_SLOT_BYTES) to a number buffer, a
    number access to a cap table, or a slot access off a slot boundary
    (rt_wrong_type).  On the device no builtin accesses slots, every access it lowers
    has a number's element size, and no device buffer is a cap table: the device's
    rt_fault_cap passes rt_wrong_type a 0 for "cap table" and one of those sizes."""
    slot = abi.DT_BY_SUFFIX["cap"].size
    for name in ("cap_load_cap", "cap_store_cap", "cap_alloc_cap"):
        assert "cap tables" in _refused_on_the_device(name)
    sizes = {abi.ELEM_SIZE[t] for t in (*abi.SCALAR_SUFFIXES, *TILE_ELEM_TYPES)}
    assert slot not in sizes
    from capqr.runtime.cuda import memory

    assert abi.CAP_DT_CODE not in memory._DT_CODES.values()


def test_allocation_faults_cannot_arise_on_the_device() -> None:
    """ALLOC is a cap_alloc_T that the collector cannot serve; the device has no
    cap_alloc_T."""
    for t in (*abi.SCALAR_SUFFIXES, "cap"):
        assert "device-side allocation" in _refused_on_the_device(f"cap_alloc_{t}")


def test_group_faults_cannot_arise_on_the_device() -> None:
    """GROUP is a block outside the launch's group calling rt_group_sync (CPU lane:
    group < grid, or no group).  On the GPU a kernel that calls it is launched with the
    whole grid as its group, cooperatively, or not at all."""
    from types import SimpleNamespace

    from capqr.runtime.cuda.launches import check_cooperative

    k = SimpleNamespace(name="k", info=SimpleNamespace(group_sync=True),
                        max_group=lambda block, shared: 1 << 20)
    assert check_cooperative(k, 4, 4, 32)
    for group in (None, 1, 3):
        with pytest.raises(ValueError):
            check_cooperative(k, group, 4, 32)


def test_the_device_never_records_a_cancel() -> None:
    """CANCELLED is the CPU host's own stop (Ctrl-C in runtime.launch).  The host sets
    the device record's cancel word only at a deadline, and the device records that
    as TIMEOUT; nothing on the device writes CANCELLED."""
    from capqr.runtime.cuda.lower import device_prelude

    text = device_prelude()
    assert "rt_record(RT_FAULT_TIMEOUT" in text and "RT_FAULT_CANCELLED" not in text.replace(
        "RT_FAULT_CANCELLED = ", "")


DIVIDE = """
KERNEL void k(cap_t x, int64_t n)
{
    int64_t m = -9223372036854775807 - 1;
    int a = -2147483647 - 1;
    int b = (int)n;
    cap_store_i64(x, 0, m / n);
    cap_store_i64(x, 1, m % n);
    cap_store_i64(x, 2, a / b);
    cap_store_i64(x, 3, a % b);
    cap_store_i64(x, 4, 7 / n);
    cap_store_i64(x, 5, (7 - 2 * n) % b);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_integer_division_is_defined_alike_on_both_lanes(tmp_path: Path) -> None:
    """Both lanes divide through checks.h's one rule: a zero divisor faults, -1 negates
    with wrapping, so INT64_MIN / -1 (and INT_MIN / -1) is INT64_MIN (INT_MIN) and the
    remainder 0 on both.  Seen failing before the device shared the rule: the emulated
    device divided directly, and x86 raised SIGFPE (on a GPU the result was undefined)."""
    from emulate_cuda import build

    want = [-(2**63), 0, -(2**31), 0, -7, 0]
    k = build(DIVIDE, workdir=tmp_path)["k"]
    dev = np.zeros(6, np.int64)
    assert k.launch([dev, -1], 1, 1) is None
    host = capabilities.wrap(np.zeros(6, np.int64))
    runtime.launch(runtime.compile(DIVIDE, "k"), [host], args=(-1,))
    assert dev.tolist() == want and host.numpy().tolist() == want
