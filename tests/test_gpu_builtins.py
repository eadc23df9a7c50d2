"""Device behaviour of the tile copies and warp collectives (GPU only; skipped cleanly
where there is no usable GPU).  Lane-independent behaviour (element-loop
semantics, exact faults with one thread, verifier rules) is in
tests/test_conformance.py; this file covers what needs a whole block: the
cooperative copy with its barriers, float4/double2 and scalar paths, a planted
out-of-range last row with many threads, and shuffles over full and partial warps.
"""

from __future__ import annotations

import numpy as np
import pytest
from capqr.runtime import cuda
from capqr.runtime.errors import CapabilityFault

_OK, _WHY = cuda.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=f"no usable GPU: {_WHY}")]

ROUND_TRIP = """
KERNEL void round_trip(cap_t a, cap_t out, cap_t sums, int64_t off, int64_t ld, int64_t rows,
                       int64_t cols)
{
    float smem_t[4096];
    cap_tile_load_f32(a, off, ld, rows, cols, smem_t, 0, cols);
    int64_t t = rt_thread_idx();
    if (t < rows) {
        float s = 0.0f;
        for (int64_t k = 0; k < cols; k++)
            s += smem_t[t * cols + k];
        cap_store_f32(sums, t, s);
    }
    cap_tile_store_f32(out, 0, cols, rows, cols, smem_t, 0, cols);
}
"""
TILE_LINE = 6  # the cap_tile_load_f32 of ROUND_TRIP

ROUND_TRIP_F64 = """
KERNEL void round_trip(cap_t a, cap_t out, int64_t off, int64_t ld, int64_t rows, int64_t cols)
{
    double smem_t[2048];
    cap_tile_load_f64(a, off, ld, rows, cols, smem_t, 0, cols);
    cap_tile_store_f64(out, 0, cols, rows, cols, smem_t, 0, cols);
}
"""


@pytest.mark.parametrize("off,ld,rows,cols", [
    (0, 100, 64, 64),     # float4 path: aligned origin, ld and cols multiples of 4
    (1, 101, 63, 61),     # scalar path
    (400, 100, 64, 12),   # several rows per pass of the block
    (9999, 0, 1, 1),      # one element, the last one
], ids=["vector", "scalar", "short-rows", "last-element"])
def test_tile_round_trip_equals_numpy(off, ld, rows, cols) -> None:
    rng = np.random.default_rng(3)
    a_host = rng.standard_normal(10000).astype(np.float32)
    k = cuda.compile(ROUND_TRIP, "round_trip")
    a = cuda.to_device(a_host, perms="r", name="a")
    out = cuda.alloc_device(rows * cols, np.float32, name="out")
    sums = cuda.alloc_device(64, np.float32, name="sums")
    cuda.launch(k, [a, out, sums], args=(off, ld, rows, cols), grid=1, block=128, timeout=20)
    idx = off + np.arange(rows)[:, None] * ld + np.arange(cols)[None, :]
    want = a_host[idx]
    assert np.array_equal(out.numpy().reshape(rows, cols), want)
    # every thread reads rows other threads copied: the trailing barrier held
    np.testing.assert_allclose(sums.numpy()[:rows], want.sum(axis=1, dtype=np.float64),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("off,ld", [(0, 64), (1, 63)], ids=["vector", "scalar"])
def test_tile_round_trip_f64(off, ld) -> None:
    a_host = np.arange(5000, dtype=np.float64) * 0.5
    k = cuda.compile(ROUND_TRIP_F64, "round_trip")
    a = cuda.to_device(a_host, perms="r", name="a")
    out = cuda.alloc_device(32 * 64, np.float64, name="out")
    cuda.launch(k, [a, out], args=(off, ld, 32, 62), grid=1, block=96, timeout=20)
    idx = off + np.arange(32)[:, None] * ld + np.arange(62)[None, :]
    assert np.array_equal(out.numpy()[:32 * 62].reshape(32, 62), a_host[idx])


@pytest.mark.parametrize("block", [128, 40, 1])
def test_planted_oob_last_row_faults_exactly_and_writes_nothing(block) -> None:
    """Row 63 of a 64 x 64 tile starting at row 37 of a 100 x 100 matrix is row 100:
    the fault names its first element, and neither the tile store nor the sums ran."""
    k = cuda.compile(ROUND_TRIP, "round_trip")
    before = cuda.to_device(np.full(256, 3.0, np.float32), name="before")
    a = cuda.to_device(np.ones(10000, np.float32), perms="r", name="a")
    out = cuda.alloc_device(4096, np.float32, name="out")
    sums = cuda.alloc_device(64, np.float32, name="sums")
    after = cuda.to_device(np.full(256, 5.0, np.float32), name="after")
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, [a, out, sums], args=(3700, 100, 64, 64), grid=1, block=block,
                    timeout=20)
    e = ei.value
    assert (e.reason, e.index, e.access, e.buffer, e.line, e.block) == (
        "out-of-bounds", 10000, "load", "a", TILE_LINE, 0)
    assert np.all(out.numpy() == 0.0) and np.all(sums.numpy() == 0.0)
    assert np.all(before.numpy() == 3.0) and np.all(after.numpy() == 5.0)


def test_tile_destination_overflow_faults_on_the_shared_array() -> None:
    k = cuda.compile(ROUND_TRIP, "round_trip")
    a = cuda.to_device(np.ones(10000, np.float32), perms="r", name="a")
    out = cuda.alloc_device(8192, np.float32, name="out")
    sums = cuda.alloc_device(64, np.float32, name="sums")
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, [a, out, sums], args=(0, 100, 65, 64), grid=1, block=128, timeout=20)
    e = ei.value
    assert (e.reason, e.index, e.buffer, e.line) == ("local-array", 4096, "smem_t", TILE_LINE)
    assert np.all(out.numpy() == 0.0)


def _warp_oracle(v: np.ndarray) -> np.ndarray:
    """What WARP_SRC (tests/test_conformance.py) stores, for a block of len(v) threads."""
    n = len(v)
    out = np.zeros(4 * n, np.float64)
    for t in range(n):
        base = t & ~31
        live = min(32, n - base)

        def partner(m: int, vals, t=t, base=base, live=live):
            p = t ^ m
            return vals[p] if p - base < live else vals[t]

        s = v[base:base + live].astype(np.float64).sum()
        out[4 * t] = s
        out[4 * t + 1] = partner(1, v)
        out[4 * t + 2] = s + partner(16, v)
        out[4 * t + 3] = partner(8, np.arange(n)) + (t & 31)
    return out


@pytest.mark.parametrize("block", [128, 40, 7])
def test_warp_shuffles_and_sums_equal_numpy(block) -> None:
    from test_conformance import WARP_SRC  # tests/ is on sys.path (rootdir conftest-less)

    v = np.random.default_rng(block).standard_normal(block).astype(np.float32)
    k = cuda.compile(WARP_SRC, "warp")
    x = cuda.to_device(v, perms="r", name="x")
    out = cuda.alloc_device(4 * block, np.float32, name="out")
    cuda.launch(k, [x, out], grid=1, block=block, timeout=20)
    got = out.numpy().astype(np.float64).reshape(block, 4)
    want = _warp_oracle(v).reshape(block, 4)
    np.testing.assert_allclose(got[:, 0], want[:, 0], rtol=1e-5, atol=1e-5)  # f32 sum order
    assert np.array_equal(got[:, 1], want[:, 1])
    np.testing.assert_allclose(got[:, 2], want[:, 2], rtol=1e-6, atol=1e-6)
    assert np.array_equal(got[:, 3], want[:, 3])
    # every lane of a warp holds the same sum, bit for bit
    for w in range(0, block, 32):
        assert len(set(got[w:w + 32, 0].tolist())) == 1


def test_one_dimensional_launch_has_grid_y_one() -> None:
    """rt_block_idx_y()/rt_grid_dim_y() read the second grid dimension; a launch with an
    int grid is (grid, 1): every block reports y = 0 of 1."""
    from test_conformance import GRID_Y_SRC

    k = cuda.compile(GRID_Y_SRC, "grid_y")
    out = cuda.alloc_device(6, np.int64, name="out")
    cuda.launch(k, [out], grid=6, block=32, timeout=20)
    assert out.numpy().tolist() == [1000] * 6


STATED_BLOCK = """
KERNEL void stated(cap_t x)
{
    rt_require_block_dim(128);
    float smem_a[512];
    int64_t t = rt_thread_idx();
    int64_t rg = t / 16;
    int64_t cg = t % 16;
    smem_a[rg * 64 + cg] = (float)t;
    cap_store_f32(x, t, smem_a[rg * 64 + cg] + 1.0f);
}
"""


def test_a_stated_block_size_is_enforced_at_launch() -> None:
    k = cuda.compile(STATED_BLOCK, "stated")
    assert k.info.block_dim == 128
    x = cuda.alloc_device(256, np.float32, name="x")
    for block in (64, 256):
        with pytest.raises(ValueError, match="rt_require_block_dim\\(128\\)"):
            cuda.launch(k, [x], grid=1, block=block)
        with pytest.raises(ValueError, match="rt_require_block_dim\\(128\\)"):
            cuda.time_launch(k, [x], grid=1, block=block)
    assert not x.numpy().any()  # nothing ran
    cuda.launch(k, [x], grid=1, block=128)
    assert np.array_equal(x.numpy()[:128], np.arange(1, 129, dtype=np.float32))
    x.free()


# ---- rt_warp_mma_tf32 -------------------------------------------------------

MMA_SRC = """
KERNEL void mma(cap_t a, cap_t b, cap_t c, int64_t c_off, int64_t ldc, int64_t a_off,
                int64_t lda, int64_t b_off, int64_t ldb, int64_t bad_lane)
{
    float smem_a[512];
    float smem_b[512];
    float smem_c[1024];
    int64_t t = rt_thread_idx();
    for (int64_t i = t; i < 512; i += rt_block_dim()) {
        smem_a[i] = cap_load_f32(a, i);
        smem_b[i] = cap_load_f32(b, i);
    }
    for (int64_t i = t; i < 1024; i += rt_block_dim())
        smem_c[i] = cap_load_f32(c, i);
    rt_sync_threads();
    int64_t w = t / 32;
    int64_t co = c_off + w * 512 + (t % 32 == bad_lane ? 8 : 0);
    rt_warp_mma_tf32(smem_c, co, ldc, smem_a, a_off, lda, smem_b, b_off, ldb);
    rt_sync_threads();
    for (int64_t i = t; i < 1024; i += rt_block_dim())
        cap_store_f32(c, i, smem_c[i]);
}
"""
MMA_LINE = 18  # the rt_warp_mma_tf32 call of MMA_SRC


def _tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 to tf32 (10 mantissa bits), to nearest, ties away from zero."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def mma_hosts(n_ab: int, n_c: int, seed: int | None = None) -> list[np.ndarray]:
    """The MMA test kernels' a and b (n_ab floats, read-only) and c (n_c floats): standard
    normal from ``seed``, or ones, ones and twos (seed None: the fault cases)."""
    if seed is None:
        return [np.ones(n_ab, np.float32), np.ones(n_ab, np.float32),
                np.full(n_c, 2.0, np.float32)]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(m).astype(np.float32) for m in (n_ab, n_ab, n_c)]


def _mma_buffers(n_ab: int, n_c: int, seed: int | None = None) -> tuple[list, list]:
    """mma_hosts and their device copies."""
    hosts = mma_hosts(n_ab, n_c, seed)
    caps = [cuda.to_device(h, perms=p, name=nm) for h, p, nm in zip(hosts, ("r", "r", "rw"),
                                                                      "abc", strict=True)]
    return hosts, caps


def _mma_launch(src: str, name: str, n_ab: int, n_c: int, args: tuple, seed: int,
                checked: bool = True):
    """Run an MMA test kernel (two warps) on random inputs: (a, b, c as given, c
    afterwards)."""
    (a_h, b_h, c_h), caps = _mma_buffers(n_ab, n_c, seed)
    cuda.launch(cuda.compile(src, name, checked=checked), caps, args=args, grid=1, block=64,
                timeout=20)
    return a_h, b_h, c_h, caps[2].numpy()


def _mma_fault(src: str, name: str, n_ab: int, n_c: int, args: tuple, block: int = 64):
    """The fault an MMA test kernel raises on ones and twos, and c after it."""
    _, caps = _mma_buffers(n_ab, n_c)
    k = cuda.compile(src, name)
    with pytest.raises(CapabilityFault) as ei:
        cuda.launch(k, caps, args=args, grid=1, block=block, timeout=20)
    return ei.value, caps[2].numpy()


def _mma_run(checked: bool, args: tuple):
    return _mma_launch(MMA_SRC, "mma", 512, 1024, args, 7, checked)


# The MMA cases, shared with tests/test_gpu_emulated.py (the same kernels on the CPU
# model of the device): tile placements, then faults (args, expected fields).
MMA_TILES = [
    (0, 16, 0, 8, 0, 16),
    (8, 16, 128, 12, 64, 20),      # offsets from the arrays' starts, wider strides
    (0, 24, 8, 32, 8, 24),
]
MMA_RANGE_FAULTS = [
    ((600, 16, 0, 8, 0, 16, -1), "smem_c", 1112),   # warp 1's tile starts past the array
    ((0, 16, -8, 8, 0, 16, -1), "smem_a", -8),      # A's origin before the array
    ((0, 16, 0, 8, 448, 16, -1), "smem_b", 512),     # B's row 4
]
MMA_RANGE_IDS = ["acc-past-end", "a-before-start", "b-past-end"]
MMA_CONTRACT_FAULTS = [
    ((4, 16, 0, 8, 0, 16, -1), 64, 2),      # accumulator origin not 32-byte aligned
    ((0, 18, 0, 8, 0, 16, -1), 64, 3),      # stride not a multiple of 4
    ((0, 16, 0, 4, 0, 16, -1), 64, 6),      # A's stride narrower than its 8 columns
    ((0, 16, 0, 8, 0, 16, 5), 64, 2),       # lane 5 passes another accumulator origin
    ((0, 16, 0, 8, 0, 16, -1), 48, 0),      # the second warp has 16 lanes
]
MMA_CONTRACT_IDS = ["misaligned-offset", "odd-stride", "narrow-stride", "lanes-disagree",
                    "partial-warp"]


def mma_tf32_want(a_h, b_h, c_h, c_off, ldc, a_off, lda, b_off, ldb) -> np.ndarray:
    """C after two warps' rt_warp_mma_tf32 (warp w on C at c_off + 512 w), in double
    from the tf32-rounded inputs."""
    A = _tf32(a_h[a_off + np.arange(16)[:, None] * lda + np.arange(8)]).astype(np.float64)
    B = _tf32(b_h[b_off + np.arange(8)[:, None] * ldb + np.arange(16)]).astype(np.float64)
    want = c_h.astype(np.float64).copy()
    for w in range(2):
        idx = c_off + 512 * w + np.arange(16)[:, None] * ldc + np.arange(16)
        want[idx] += A @ B
    return want


@pytest.mark.parametrize("c_off,ldc,a_off,lda,b_off,ldb", MMA_TILES)
def test_warp_mma_equals_tf32_matmul(c_off, ldc, a_off, lda, b_off, ldb) -> None:
    """Two warps, each on its own 16 x 16 accumulator tile (warp w at c_off + 512 w):
    C += tf32(A) tf32(B) in fp32, against numpy in double on the tf32-rounded inputs;
    the raw build gives the same bits."""
    args = (c_off, ldc, a_off, lda, b_off, ldb, -1)
    a_h, b_h, c_h, got = _mma_run(True, args)
    want = mma_tf32_want(a_h, b_h, c_h, c_off, ldc, a_off, lda, b_off, ldb)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    untouched = np.ones(1024, bool)
    for w in range(2):
        untouched[c_off + 512 * w + np.arange(16)[:, None] * ldc + np.arange(16)] = False
    assert np.array_equal(got[untouched], c_h[untouched])
    assert np.array_equal(_mma_run(False, args)[3], got)


@pytest.mark.parametrize("args,buffer,index", MMA_RANGE_FAULTS, ids=MMA_RANGE_IDS)
def test_warp_mma_out_of_range_tile_faults_exactly(args, buffer, index) -> None:
    """A tile that leaves its shared array faults before the MMA, at the tile's first
    element outside (rows, then columns), and the block writes nothing back."""
    e, c = _mma_fault(MMA_SRC, "mma", 512, 1024, args)
    assert (e.reason, e.buffer, e.index, e.line) == ("local-array", buffer, index, MMA_LINE)
    assert np.all(c == 2.0)


@pytest.mark.parametrize("args,block,position", MMA_CONTRACT_FAULTS, ids=MMA_CONTRACT_IDS)
def test_warp_mma_contract_faults_with_the_argument(args, block, position) -> None:
    e, _ = _mma_fault(MMA_SRC, "mma", 512, 1024, args, block)
    assert (e.reason, e.index, e.buffer, e.line) == ("argument", position, None, MMA_LINE)
    assert "rt_warp_mma_tf32" in str(e)


def test_readme_tensor_core_example_runs() -> None:
    from readme_examples import run_readme_example

    run_readme_example("Tensor cores: `rt_warp_mma_tf32`")


MMA_F32_SRC = """
KERNEL void mma32(cap_t a, cap_t b, cap_t c, int64_t lda, int64_t ldb, int64_t k,
                  int64_t bad_lane)
{
    float smem_a[2048];
    float smem_b[2048];
    float smem_c[512];
    int64_t t = rt_thread_idx();
    for (int64_t i = t; i < 2048; i += rt_block_dim()) {
        smem_a[i] = cap_load_f32(a, i);
        smem_b[i] = cap_load_f32(b, i);
    }
    for (int64_t i = t; i < 512; i += rt_block_dim())
        smem_c[i] = cap_load_f32(c, i);
    rt_sync_threads();
    int64_t kk = k + (t % 32 == bad_lane ? 8 : 0);
    rt_warp_mma_f32(smem_c, (t / 32) * 256, 16, smem_a, 0, lda, smem_b, 0, ldb, kk);
    rt_sync_threads();
    for (int64_t i = t; i < 512; i += rt_block_dim())
        cap_store_f32(c, i, smem_c[i]);
}
"""
MMA_F32_LINE = 17  # the rt_warp_mma_f32 call of MMA_F32_SRC


def _mma32(args: tuple, checked: bool = True):
    return _mma_launch(MMA_F32_SRC, "mma32", 2048, 512, args, 11, checked)


MMA_F32_SHAPES = [(64, 16, 64), (40, 20, 32), (128, 16, 128)]
MMA_F32_FAULTS = [
    ((64, 16, 12, -1), "argument", None, 10),        # k not a multiple of 8
    ((64, 16, 0, -1), "argument", None, 10),         # k = 0
    ((64, 16, 64, 3), "argument", None, 10),         # lane 3 passes another k
    ((32, 16, 64, -1), "argument", None, 6),         # lda narrower than k
    ((128, 16, 136, -1), "local-array", "smem_a", 2048),   # row 15 of A runs past the end
]
MMA_F32_FAULT_IDS = ["k-12", "k-0", "lanes-disagree-on-k", "lda-below-k", "a-past-end"]


def mma_f32_error(a_h, b_h, c_h, got, lda, ldb, k, a_t: bool = False) -> tuple[float, float]:
    """Largest error of two warps' fp32-accurate MMA (warp w on C[256 w:], 16 x 16,
    stride 16) relative to |A||B| + 1, against double; and the same for a tf32-only
    product (what the split is for)."""
    if a_t:
        A = a_h[np.arange(k)[:, None] * lda + np.arange(16)].T
    else:
        A = a_h[np.arange(16)[:, None] * lda + np.arange(k)]
    B = b_h[np.arange(k)[:, None] * ldb + np.arange(16)]
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    scale = np.abs(A64) @ np.abs(B64) + 1.0
    tf32 = _tf32(A).astype(np.float64) @ _tf32(B).astype(np.float64)
    err = tf32_err = 0.0
    for w in range(2):
        tile = c_h[256 * w:256 * w + 256].reshape(16, 16).astype(np.float64)
        want = tile + A64 @ B64
        err = max(err, (np.abs(got[256 * w:256 * w + 256].reshape(16, 16) - want)
                        / scale).max())
        tf32_err = max(tf32_err, (np.abs(tile + tf32 - want) / scale).max())
    return err, tf32_err


@pytest.mark.parametrize("lda,ldb,k", MMA_F32_SHAPES)
def test_warp_mma_f32_is_fp32_accurate(lda, ldb, k) -> None:
    """C += A B over k, each operand split into two tf32 parts: the error against double
    is at fp32 level (a tf32-only product is off by ~1e-4 of |A||B| here), two warps
    on their own tiles, the raw build bitwise the same."""
    a_h, b_h, c_h, got = _mma32((lda, ldb, k, -1))
    err, tf32_err = mma_f32_error(a_h, b_h, c_h, got, lda, ldb, k)
    assert err < 2e-6, err
    assert tf32_err > 20 * err
    assert np.array_equal(_mma32((lda, ldb, k, -1), checked=False)[3], got)


@pytest.mark.parametrize("args,reason,buffer,index", MMA_F32_FAULTS, ids=MMA_F32_FAULT_IDS)
def test_warp_mma_f32_faults_name_the_argument_or_element(args, reason, buffer, index) -> None:
    e, c = _mma_fault(MMA_F32_SRC, "mma32", 2048, 512, args)
    assert (e.reason, e.buffer, e.index, e.line) == (reason, buffer, index, MMA_F32_LINE)
    assert np.all(c == 2.0)


MMA_AT_SRC = MMA_F32_SRC.replace("mma32", "mma_at").replace("rt_warp_mma_f32(",
                                                              "rt_warp_mma_f32_at(")


MMA_AT_SHAPES = [(16, 16, 64), (40, 20, 32)]


@pytest.mark.parametrize("lda,ldb,k", MMA_AT_SHAPES)
def test_warp_mma_f32_at_reads_a_transposed(lda, ldb, k) -> None:
    """rt_warp_mma_f32_at takes A^T (k x 16, row-major): the same fp32-level error."""
    a_h, b_h, c_h, got = _mma_launch(MMA_AT_SRC, "mma_at", 2048, 512, (lda, ldb, k, -1), 5)
    err, _ = mma_f32_error(a_h, b_h, c_h, got, lda, ldb, k, a_t=True)
    assert err < 2e-6, err


def test_warp_mma_f32_at_checks_the_transposed_tile() -> None:
    """A^T is k x 16: with k = 128 and lda = 16 its last row starts at 2032 (in range);
    k = 136 reaches row 128, index 2048: a local-array fault there."""
    e, c = _mma_fault(MMA_AT_SRC, "mma_at", 2048, 512, (16, 8, 136, -1))
    assert (e.reason, e.buffer, e.index, e.line) == ("local-array", "smem_a", 2048,
                                                     MMA_F32_LINE)
    assert np.all(c == 2.0)


def _rot_oracle(x: np.ndarray, n: int) -> np.ndarray:
    s = np.zeros(32, np.float32)
    for i in range(n):
        s += x[i * 32 + (np.arange(32) + 1) % 32]
    return s


@pytest.mark.parametrize("far", [0, 10_000])
def test_versioned_shuffle_loop_runs_one_copy_per_warp(far) -> None:
    """tests/test_hoist.py WARP_LOOP: lane 7's guard covers an access (under a
    condition that never holds) 10000 elements past the buffer, the other lanes'
    do not; the warp votes for the checked copy and every lane's shuffle sees its
    partner's value.  A planted huge value makes lane 7 take that access: it
    faults at its exact index."""
    from test_hoist import WARP_LOOP

    n = 16
    x_host = np.random.default_rng(far).standard_normal(n * 32).astype(np.float32)
    k = cuda.compile(WARP_LOOP, "rot")
    x = cuda.to_device(x_host, perms="r", name="x")
    out = cuda.alloc_device(32, np.float32, name="out")
    cuda.launch(k, [x, out], args=(n, far), grid=1, block=32, timeout=20)
    np.testing.assert_allclose(out.numpy(), _rot_oracle(x_host, n), rtol=1e-6, atol=1e-6)
    if far:
        x_host[3 * 32 + 7] = 1e31
        x.copy_from(x_host)
        with pytest.raises(CapabilityFault) as ei:
            cuda.launch(k, [x, out], args=(n, far), grid=1, block=32, timeout=20)
        assert ei.value.buffer == "x" and ei.value.index == 3 * 32 + 7 + far
        assert ei.value.access == "load"
