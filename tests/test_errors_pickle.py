"""capqr's errors cross process boundaries whole.

bench.gpu_precompile compiles in a process pool; a CudaError raised in a worker
came back as "TypeError: CudaError.__init__() missing 3 required positional
arguments" and a BrokenProcessPool, hiding the driver's own error (H100 run of
2026-12-06).  pickle rebuilds an exception as ``cls(*args)``, and the
subclasses' constructors take other arguments than their message.
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest
from capqr.runtime.cuda.driver import CudaError, ModuleLoadError
from capqr.runtime.errors import (
    CapabilityFault,
    CompileError,
    DeviceStuck,
    KernelTimeout,
    VerifyError,
)

ERRORS = [
    VerifyError(4, "pointer declarator", "no pointers", kernel="k"),
    CompileError("gcc said no", line=7, compiler_output="k.c:7: error"),
    CapabilityFault("out-of-bounds", kernel="k", block=3, buffer="x", index=17, access="store",
                    line=9, thread=5),
    KernelTimeout("k", 1.5, 12, stuck=True),
    DeviceStuck("k"),
    CudaError("cuInit", 3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    ModuleLoadError(218, "CUDA_ERROR_INVALID_PTX", "bad", "ptxas: line 1"),
]


@pytest.mark.parametrize("err", ERRORS, ids=lambda e: type(e).__name__)
def test_error_pickles_with_its_attributes(err: Exception) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert back.__dict__ == err.__dict__ and back.args == err.args


def _raise_cuda_error(_: int) -> None:
    raise ERRORS[5]


def test_error_raised_in_a_spawned_worker_reaches_the_parent() -> None:
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        with pytest.raises(CudaError) as e:
            list(pool.map(_raise_cuda_error, [0]))
    assert (e.value.call, e.value.code) == ("cuInit", 3)
