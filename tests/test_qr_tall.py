"""The tall path of the parallel QR variant (kernels/src/qrt_tall.c: the rows of one
matrix shared out between the workers, one launch per matrix).

It must pass the checker on shapes with partial chunks and panels, give bitwise
the same result whatever the worker count (chunk sizes follow m alone, sums run in
chunk order), be what kernels.qr runs on a tall float32 matrix, leave padding
columns alone, and stop with an exact CapabilityFault, not a hang, when a block
reads past the matrix while the others wait at a barrier.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import capqr
import numpy as np
import pytest
from capqr import runtime
from capqr.kernels import check, parallel, sources

ROOT = Path(__file__).resolve().parents[1]
#: Where this process imported capqr from (its parent folder): the subprocesses must
#: import the same copy, which the checkout's root (itself the package) is not.
IMPORT_ROOT = str(Path(capqr.__file__).parent.parent)

#: (batch, m, n, nb): a partial last chunk (m % 64), a partial last panel, a panel
#: wider than n, trailing columns of one partial tile, a batch.
SHAPES = ((1, 1100, 40, 16), (1, 2000, 130, 32), (1, 1500, 64, 64), (1, 1030, 17, 16),
          (1, 3000, 200, 16), (2, 1200, 70, 32))


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _tall(a3: np.ndarray, nb: int, ld: int | None = None, fill: float = 0.0
          ) -> tuple[np.ndarray, np.ndarray]:
    batch, m, n = a3.shape
    h = np.full((batch, m, ld or n), fill, np.float32)
    h[:, :, :n] = a3
    tau = np.zeros((batch, min(m, n)), np.float32)
    parallel.run(h, tau, "float32", nb, 64, True, None, None, n=n, tall=True)
    return h, tau


def _digest(h: np.ndarray, tau: np.ndarray) -> str:
    return hashlib.sha256(h.tobytes() + tau.tobytes()).hexdigest()


_HASH_SCRIPT = """
import hashlib
import numpy as np
from capqr.kernels import parallel
for batch, m, n, nb in {shapes!r}:
    a = np.random.default_rng(m + n).standard_normal((batch, m, n)).astype(np.float32)
    t = np.zeros((batch, min(m, n)), np.float32)
    parallel.run(a, t, "float32", nb, 64, True, None, None, tall=True,
                 tall_workers={workers!r})
    print(hashlib.sha256(a.tobytes() + t.tobytes()).hexdigest())
"""


def test_tall_passes_the_checker_and_ignores_the_worker_count():
    """Each shape passes the checker and is close to the one-block kernel's result;
    pools of 1, 3 and 16 workers (2, 3, 16 blocks meeting at the barriers; 16 more
    than the cores here), and a group of 2 on the pool of 3 (tall_workers: a worker
    left idle), give bitwise this pool's result."""
    want = []
    for batch, m, n, nb in SHAPES:
        a3 = _rand((batch, m, n), seed=m + n)
        h, tau = _tall(a3, nb)
        rep = check(a3, h, tau)
        assert rep.ok, ((batch, m, n, nb), str(rep))
        h1, t1 = np.array(a3), np.zeros_like(tau)
        parallel.run(h1, t1, "float32", nb, 64, True, None, None, steps=False)
        assert np.allclose(h, h1, rtol=1e-3, atol=1e-3 * np.abs(h1).max())
        want.append(_digest(h, tau))
    for threads, workers in (("1", None), ("3", None), ("3", 2), ("16", None)):
        script = _HASH_SCRIPT.format(shapes=SHAPES, workers=workers)
        env = dict(os.environ, CAPQR_THREADS=threads, PYTHONPATH=IMPORT_ROOT)
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == want, f"CAPQR_THREADS={threads}, tall_workers={workers}"


def test_tall_group_smaller_than_the_pool(monkeypatch):
    """A tall group of fewer workers than the pool (run's tall_workers, or
    TALL_MAX_WORKERS when it is None) launches that many blocks and gives bitwise the
    whole pool's result; counts above the pool or the chunks are capped."""
    threads = runtime.threads()
    for batch, m, n, nb in SHAPES:
        a3 = _rand((batch, m, n), seed=m + n)
        want, wtau = _tall(a3, nb)
        nck = -(-m // parallel.tall_chunk_rows(m))
        for w in (*range(1, threads), threads + 5, nck + 1):
            h, tau, trace = np.array(a3), np.zeros_like(wtau), []
            parallel.run(h, tau, "float32", nb, 64, True, None, None, tall=True,
                         trace=trace, tall_workers=w)
            assert [t[1] for t in trace] == [min(w, threads, nck)] * batch, (m, n, w)
            assert h.tobytes() == want.tobytes() and tau.tobytes() == wtau.tobytes(), (m, w)
    a3 = _rand((1, 1100, 40), seed=2)
    want, wtau = _tall(a3, 16)
    monkeypatch.setattr(parallel, "TALL_MAX_WORKERS", 1)
    h, tau, trace = np.array(a3), np.zeros_like(wtau), []
    parallel.run(h, tau, "float32", 16, 64, True, None, None, n=40, tall=True, trace=trace)
    assert [t[1] for t in trace] == [1]
    assert h.tobytes() == want.tobytes() and tau.tobytes() == wtau.tobytes()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tall workers"):
            parallel.run(np.array(a3), np.zeros_like(wtau), "float32", 16, 64, True, None,
                         None, tall=True, tall_workers=bad)
    with pytest.raises(ValueError, match="for the tall path"):
        parallel.run(np.array(a3), np.zeros_like(wtau), "float32", 16, 64, True, None,
                     None, tall=False, tall_workers=1)


def test_tall_default_group_spares_a_core_on_large_pools(monkeypatch):
    """Without TALL_MAX_WORKERS the tall group is the pool less TALL_SPARE from
    TALL_SPARE_FROM workers on (bench.tall_workers on 16 vCPUs: 16 workers mostly in the
    slow mode, 15 rarely), the whole pool below; never more than the row chunks."""
    monkeypatch.setattr(parallel, "TALL_MAX_WORKERS", None)
    m = 65536
    nck = -(-m // parallel.tall_chunk_rows(m))
    assert (parallel.TALL_SPARE, parallel.TALL_SPARE_FROM) == (1, 8)
    assert [parallel.tall_blocks(m, t) for t in (1, 2, 7, 8, 16, 64)] == [
        1, 2, 7, 7, 15, min(63, nck)]
    assert parallel.tall_blocks(m, 16, 16) == 16  # an explicit count is taken as it is
    monkeypatch.setattr(parallel, "TALL_MAX_WORKERS", 12)
    assert parallel.tall_blocks(m, 16) == 12


def test_tall_rows_longer_than_the_matrix():
    """Rows of ld > n elements: the first n columns get bitwise the unpadded result
    and the padding keeps its sentinel."""
    a3 = _rand((1, 1300, 90), seed=3)
    want, wtau = _tall(a3, 32)
    h, tau = _tall(a3, 32, ld=96, fill=7.0)
    assert h[:, :, :90].tobytes() == want.tobytes() and tau.tobytes() == wtau.tobytes()
    assert (h[:, :, 90:] == 7.0).all()


def test_tall_side_paths():
    """Tiny and huge values (squares summed in double), a zero column (tau = 0) and a
    triangular matrix (nothing to do)."""
    tri = np.zeros((1, 1100, 50), np.float32)
    tri[0, :50] = np.triu(_rand((50, 50), seed=6))
    zero_col = _rand((1, 1100, 50), seed=7)
    zero_col[0, :, 20] = 0.0
    for a, what in ((_rand((1, 1100, 50), seed=4) * np.float32(1e-36), "tiny"),
                    (_rand((1, 1100, 50), seed=5) * np.float32(1e30), "huge"),
                    (zero_col, "zero column"), (tri, "triangular")):
        h, tau = _tall(a, 16)
        assert check(a, h, tau).ok, what
        if what == "triangular":
            assert not tau.any() and h.tobytes() == a.tobytes()
        elif what == "zero column":
            assert tau[0, 20] == 0.0 and np.abs(np.diag(h[0])[:20]).min() > 0
        else:
            assert np.abs(np.diag(h[0])).min() > 0, what


def test_tall_choice():
    """use_tall: tall float32 matrices whose trailing columns make fewer tiles than
    there are workers, a batch smaller than the pool."""
    assert parallel.use_tall(1, 65536, 64, "float32", 16)
    assert parallel.use_tall(1, 8192, 256, "float32", 16)
    assert parallel.use_tall(1, 4096, 64, "float32", 2)
    assert not parallel.use_tall(1, 2048, 256, "float32", 2)    # 4 tiles for 2 workers
    assert parallel.use_tall(1, 4096, 256, "float32", 3)        # but 16 times as tall
    # on a pool of 2, where qrt_coop takes the matrix, from 64 times as tall
    assert not parallel.use_tall(1, 8192, 256, "float32", 2)
    assert parallel.use_tall(1, 16384, 256, "float32", 2)
    assert parallel.use_tall(1, 2048, 64, "float32", 2)         # no coop: 16 times
    assert not parallel.use_tall(1, 65536, 64, "float64", 16)   # squares could overflow
    assert not parallel.use_tall(1, 65536, 64, "float32", 1)
    assert not parallel.use_tall(16, 65536, 64, "float32", 16)  # a matrix per worker
    assert not parallel.use_tall(1, 2048, 1024, "float32", 16)  # not 4 times as tall
    assert not parallel.use_tall(1, 512, 64, "float32", 16)     # too short
    assert parallel.tall_chunk_rows(65536) == 2048 and parallel.tall_chunk_rows(1100) == 64


_QR_SCRIPT = """
import hashlib
import numpy as np
from capqr import kernels
from capqr.kernels import parallel
a = np.random.default_rng(8).standard_normal((4096, 64)).astype(np.float32)
assert parallel.use_tall(1, 4096, 64, "float32", 3)
H, tau = kernels.qr(a)
h, t = a[None].copy(), np.zeros((1, 64), np.float32)
parallel.run(h, t, "float32", parallel.TALL_NB, 64, True, None, None, tall=True)
print(H.tobytes() == h[0].tobytes() and tau.tobytes() == t[0].tobytes(),
      kernels.check(a, H, tau).ok)
"""


def test_kernels_qr_runs_the_tall_path():
    env = dict(os.environ, CAPQR_THREADS="3", PYTHONPATH=IMPORT_ROOT)
    out = subprocess.run([sys.executable, "-c", _QR_SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]


def test_tall_refusals():
    h, tau = _rand((1, 1100, 40)), np.zeros((1, 40), np.float32)
    with pytest.raises(ValueError, match="float32 only"):
        parallel.run(h.astype(np.float64), tau.astype(np.float64), "float64", 16, 64, True,
                     None, None, tall=True)
    for kw in ({"steps": True}, {"group": 2}):
        with pytest.raises(ValueError, match="its own launches"):
            parallel.run(h, tau, "float32", 16, 64, True, None, None, tall=True, **kw)
    with pytest.raises(ValueError, match="its own launches"):
        parallel.run(h, tau, "float32", 16, 64, True, 2, None, tall=True)


# Each chunk's upper row bound without the clamp to the panel's rows: the block
# owning the last (partial) chunk reads past the matrix in its first update.
_ROW_END = "            int64_t t_hi = mr < kk * ch + ch ? mr : kk * ch + ch;\n"
_ROW_END_PLANTED = "            int64_t t_hi = kk * ch + ch;\n"


@pytest.fixture
def planted_row_end(monkeypatch):
    real = sources.source

    def mutated(family: str, dtype: str = "float32") -> str:
        text = real(family, dtype)
        if family == "qrt_tall":
            assert text.count(_ROW_END) == 2
            text = text.replace(_ROW_END, _ROW_END_PLANTED)
        return text

    parallel._kernels.cache_clear()
    monkeypatch.setattr(sources, "source", mutated)
    yield
    monkeypatch.undo()
    parallel._kernels.cache_clear()


def test_planted_read_past_the_matrix_while_the_group_waits(planted_row_end):
    """The last chunk's owner loads row m of the first update's tile (column nb) and
    faults; the other blocks, waiting at the barrier after the update, stop."""
    m, n, nb = 1100, 40, 16
    a3 = _rand((1, m, n), seed=11)
    blocks = parallel.tall_blocks(m, runtime.threads())
    trace: list = []
    with pytest.raises(runtime.CapabilityFault) as ei:
        parallel.run(np.array(a3), np.zeros((1, n), np.float32), "float32", nb, 64, True,
                     None, 60.0, tall=True, trace=trace)
    f = ei.value
    assert (f.reason, f.access, f.buffer, f.kernel, f.block) == (
        "out-of-bounds", "load", "qr.a", "qrt_tall_f32", blocks - 1)
    assert f.index == m * n + nb   # row m, the first trailing column
    assert sources.locate("qrt_tall", f.line)[0] == "tile.c"
    assert trace == []
