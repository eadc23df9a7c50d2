"""Host driver of the ``parallel`` QR variant (kernels/src/qrt.c).

Batches at least as large as the worker pool run ``qrt`` with one block per
matrix.  Smaller batches of matrices wider than two panels run the same
algorithm as a sequence of ``qrt_step`` launches, one per panel, each with
one block per (matrix, column tile) work item, so one matrix uses every
worker.  Every launch is an ordinary checked launch: a fault stops the
sequence at the launch that made it and is raised as that launch's
CapabilityFault; a deadline covers the whole sequence.

A single matrix from the work of a COOP_MIN_N square on (256 x 256 on 2 to 16 pinned
workers; unpinned 384 x 384 on 2 and 1536 x 1536 on 3 to 16) runs those steps in one
``qrt_coop`` launch instead: a group of the workers (group_workers) doing the same
items step after step, with rt_group_sync between steps where the host would launch
again.

The three give bitwise the same result (tests/test_qr_parallel.py).

A single float32 matrix of at least GROUP_MIN_ROWS rows on a pool of at
least GROUP_MIN_WORKERS runs the steps as ``qrt_gstep`` launches instead:
the look-ahead panel, which is the critical path there, is factored by a
group of GROUP blocks (rt_group_sync, one barrier per column) while the
other blocks update tiles.  Its panel sums in double and in a fixed chunk
order, so its result does not depend on the group size or the worker count,
but it is not bitwise the per-matrix kernel's (rounding differs; both pass
the same checks).

Tall float32 matrices in a batch smaller than the pool (:func:`use_tall`:
65536 x 64, 8192 x 256 on 16 workers) run ``qrt_tall`` instead, one launch per
matrix (kernels/src/qrt_tall.c): the rows, not the columns, are shared out
between every worker (or TALL_MAX_WORKERS of them, :func:`tall_blocks`), panels and
trailing updates alike, so a matrix of one or a few panels keeps every worker busy.
Its result does not depend on the worker count either (chunks of rows sized by m
alone, sums in chunk order) and has the group panel's rounding
(tests/test_qr_tall.py).

Small float32 matrices (:func:`use_small`: at most SMALL_M x SMALL_N, the
contest's 32 x 32 batch) run ``qr_small`` (kernels/src/qr_small.c), one block per
matrix with the whole matrix in a local array; it is xGEQR2 with the column
norms summed in double, so its rounding is its own too (tests/test_qr_small.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from ..capabilities import abi
from . import sources

#: Largest panel width and column tile (qrt.c's local tiles are 64 x 64).
NB_MAX = 64
TW_MAX = 64
#: The narrowest tile step_tile_width balances down to: every tile packs the panel's
#: V once per 64 rows whatever its width.
TW_MIN = 16
#: Group size of the look-ahead panel, and the pool size and panel height from
#: which it is used.  On the 16-core H200 host a group of 4 was fastest at
#: n = 1024 (99 vs 81 GF/s by qrt_step, median) and even with it at 2048 / 4096;
#: with 2 workers a group leaves no worker for the tiles; below 1024 rows it
#: was not measured (bench/results/cpu-gstep-2026-12-03.txt).
GROUP, GROUP_MIN_WORKERS, GROUP_MIN_ROWS = 4, 8, 1024
#: The tall path (qrt_tall: rows shared out between the workers, use_tall): matrices
#: at least TALL_RATIO times as tall as wide and TALL_MIN_ROWS tall, cut into about
#: TALL_CHUNKS chunks of rows (each worker takes whole chunks; more chunks than
#: workers balance better, fewer add fewer shares of W to sum).  On the 2-core VM
#: (2 workers, median of 7, interleaved) it took 37 vs 56 ms at 65536 x 64, 22 vs 34
#: at 16384 x 128, 29 vs 30 at 8192 x 256, and lost at 4096 x 512 (45 vs 37) and
#: 2048 x 256: there the columns make as many tiles as workers, and it is taken only
#: from TALL_ALWAYS_RATIO on.  Panel width TALL_NB: 16 and 32 within 3% there.  Since
#: its panel lost a store-forwarding stall per row (gpanel_qr), against the steps on
#: the VM (2 workers, min of 7, two runs): 8192 x 256 23.3 / 25.1 vs 28.0 / 30.2 ms,
#: 4096 x 256 12.6 / 11.6 vs 14.3 / 13.7 ms; ties at 8 times as tall (2048 x 256 6.7
#: vs 6.5, 4096 x 512 34.3 vs 33.3) and at 8192 x 512; so TALL_ALWAYS_RATIO 64 -> 16.
TALL_RATIO, TALL_ALWAYS_RATIO, TALL_MIN_ROWS, TALL_CHUNKS = 4, 16, 1024, 32
#: On a pool of 2, a matrix that qrt_coop takes (use_coop) goes to the tall path for
#: its panel only from TALL_COOP_RATIO times as tall as wide on: 2-core Xeon VM,
#: parallel.run, tall vs coop alternating in one process, medians of 5-9 (2026-12-07,
#: 74d95e9): 8192 x 256 32.7 / 32.5 / 33.8 / 36.2 / 28.7 / 49.3 vs 31.2 / 29.6 / 29.9 /
#: 30.3 / 26.5 / 32.7 ms (coop ahead in 6 processes of 6), 4096 x 256 even, 16384 x 512
#: 176 / 149 vs 194 / 152; 64 times as tall the tall path wins: 8192 x 128 12.5 / 9.0
#: vs 15.0 / 12.1, 16384 x 256 65.6 / 67.3 vs 80.6 / 77.9, 4096 x 64 2.2 / 2.5 vs 3.0 /
#: 3.4.  Larger pools were not measured against coop and keep TALL_ALWAYS_RATIO.
TALL_COOP_RATIO = 64
TALL_NB = 32
#: Most workers in the tall path's group (None: the pool less TALL_SPARE on pools of
#: at least TALL_SPARE_FROM workers, else the whole pool; run's ``tall_workers``
#: overrides it).  The group meets at a barrier per panel column, so one worker
#: descheduled stalls all of them.  On the H100 host's 16 vCPUs (bench.tall_workers,
#: bench/results/tall-workers-2026-12-07-h100-16cpu-4abe03c.txt, kernel alone, median
#: of 31) 16 workers were in the slow mode in 68% (65536 x 64) and 97% (8192 x 256) of
#: the samples, with ~1000 involuntary context switches each against ~5 in the fast
#: ones: median 34.1 and 51.3 ms; 15 workers: 15.4 and 9.9 ms (6% slow); 14 to 11
#: between (12-18 ms, 3-35% slow); 8: 22.9 and 14.3 ms, never slow.  One core left to
#: the launching thread and the OS is the best of the sweep.  The 2-core VM keeps both
#: workers (untested there without them).  The chunks stay sized by m alone
#: (tall_chunk_rows), so the result does not depend on the group; with TALL_CHUNKS = 32
#: a group of 16 takes 2 chunks a worker, 11 to 15 take 3, 8 to 10 4.
TALL_MAX_WORKERS: int | None = None
TALL_SPARE, TALL_SPARE_FROM = 1, 8
#: The small path (qr_small, use_small): float32 matrices of at most SMALL_M rows and
#: SMALL_N columns (its local array).  Batches of 32 x 32 on the 2-core VM, kernel
#: only, warm: 1.6-2.5 us a matrix on one worker against 12.8 us by qrt.
SMALL_M, SMALL_N = 64, 32


#: What the drivers below take as ``checked``: True (the checked build), False (raw), or
#: one of runtime.compile's mode names (the overhead benchmark's "raw_poll").
Checked = bool | str


def _mode(checked: Checked) -> str:
    """runtime.compile's mode name for ``checked``."""
    return checked if isinstance(checked, str) else ("checked" if checked else "raw")


@cache
def _kernels(dtype: str, mode: str, cflags: tuple[str, ...],
             which: tuple[str, ...] = ("qrt", "qrt_step"), family: str = "qrt"
             ) -> tuple[Any, ...]:
    """The named kernels of ``family``, compiled once per process, mode and flags (each
    its own module: on a cold cache they build at once, one compiler per kernel)."""
    from .. import runtime

    src = sources.source(family, dtype)
    suffix = "f64" if dtype == "float64" else "f32"
    names = [f"{w}_{suffix}" for w in which]
    if len(names) == 1:
        return (runtime.compile(src, names[0], mode=mode),)
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return tuple(pool.map(lambda name: runtime.compile(src, name, mode=mode), names))


def tall_kernel_for(dtype: str, checked: Checked) -> Any:
    """The compiled qrt_tall for ``dtype`` (built on first use only)."""
    from ..runtime.cpu.kernel import cflags

    return _kernels(dtype, _mode(checked), tuple(cflags()), ("qrt_tall",), "qrt_tall")[0]


def kernels_for(dtype: str, checked: Checked) -> tuple[Any, Any]:
    """The compiled (qrt, qrt_step) pair for ``dtype`` ("float32"/"float64")."""
    from ..runtime.cpu.kernel import cflags

    return _kernels(dtype, _mode(checked), tuple(cflags()))  # type: ignore[return-value]


def group_kernel_for(dtype: str, checked: Checked) -> Any:
    """The compiled qrt_gstep for ``dtype`` (built on first use only)."""
    from ..runtime.cpu.kernel import cflags

    return _kernels(dtype, _mode(checked), tuple(cflags()), ("qrt_gstep",), "qrt_group")[0]


def coop_kernel_for(dtype: str, checked: Checked) -> Any:
    """The compiled qrt_coop for ``dtype`` (built on first use only)."""
    from ..runtime.cpu.kernel import cflags

    return _kernels(dtype, _mode(checked), tuple(cflags()), ("qrt_coop",), "qrt_group")[0]


#: One matrix driven by steps on a pool of at least STEPS_NB32_WORKERS takes 32-column
#: panels up to STEPS_NB32_MAX columns: there the panel, not the trailing update, is the
#: critical path.  16 workers of the H100 host (bench.env_ab, 8 pairs of processes,
#: bench/results/env-ab*-2026-12-07-h100-16cpu-16e4aa1.log): n = 1024 took 9.6-12.3 ms
#: by 32-column panels against 12.9-16.4 by 64 (median), every pair; n = 2048 by 32 was
#: ahead in 3 of 4 pairs by about 5%, and n = 4096, 8 x 2048 and 2 x 4096 were even.
STEPS_NB32_WORKERS, STEPS_NB32_MAX = 8, 1024


def default_nb(m: int, n: int, batch: int = 1, threads: int = 1) -> int:
    """Panel width for ``batch`` m x n matrices on ``threads`` workers: 64 halves the
    passes over a large trailing matrix; up to 512 columns the (BLAS-2) panel costs
    more than that saves (bench/qr_parallel.py), and up to STEPS_NB32_MAX for a batch
    smaller than a pool of STEPS_NB32_WORKERS or more (the steps)."""
    k = min(m, n)
    if threads >= STEPS_NB32_WORKERS and batch < threads and k <= STEPS_NB32_MAX:
        return 32
    return 64 if k > 512 else 32


def padded_ld(n: int, itemsize: int) -> int:
    """Row length to factor n columns in: whole lines (abi.PAYLOAD_ALIGN bytes), so
    that two blocks updating neighbouring column tiles of one matrix never write the
    same line (kernels.qr pads its copy to it when a single matrix runs by steps)."""
    per_line = max(1, abi.PAYLOAD_ALIGN // itemsize)
    return -(-n // per_line) * per_line


def working_ld(batch: int, m: int, n: int, nb: int, itemsize: int, threads: int) -> int:
    """Row length for :func:`run`'s matrices: :func:`padded_ld` when one matrix is
    spread over the workers by steps, in launches or in one (its tiles are then updated
    side by side), n otherwise."""
    nb = max(1, min(NB_MAX, nb, m, n))
    side_by_side = use_steps(batch, m, n, nb, threads) or use_coop(batch, m, n, nb, threads)
    return padded_ld(n, itemsize) if side_by_side else n


def _step_parts(m: int, n: int, nb: int, j: int) -> tuple[int, int]:
    """(1 if ``qrt_step(j)`` factors a next panel else 0, the trailing columns its tiles
    update), per matrix, as the kernel derives them."""
    k = min(m, n)
    jb = min(nb, k - j) if j >= 0 else 0
    jn = j + nb if j >= 0 else 0
    jbn = min(nb, k - jn) if jn < k else 0
    cs = jn + jbn if jbn > 0 else j + jb
    return (1 if jbn > 0 else 0), (n - cs if j >= 0 and cs < n else 0)


def step_items(batch: int, m: int, n: int, nb: int, j: int, tw: int) -> int:
    """Work items of ``qrt_step(j)`` (the same count the kernel derives)."""
    npan, cols = _step_parts(m, n, nb, j)
    return batch * (npan + -(-cols // tw))


def step_tile_width(batch: int, m: int, n: int, nb: int, j: int, tw: int,
                    workers: int) -> int:
    """Column-tile width for ``qrt_step(j)`` whose tiles ``workers`` blocks share: the
    tiles of width ``tw`` take some number of rounds of the workers, and the width
    chosen is the narrowest (down to TW_MIN, a multiple of 8) that takes no more, so
    that the last round is not left to a few of them.  A tile's result does not depend
    on its width, so neither does the factorisation."""
    cols = _step_parts(m, n, nb, j)[1]
    if cols == 0 or workers < 2:
        return tw
    slots = -(-batch * -(-cols // tw) // workers) * workers
    width = -(-cols // (slots // batch)) if slots >= batch else tw
    return max(min(tw, TW_MIN), min(tw, -(-width // 8) * 8))


#: The steps drive a matrix on a pool of at most that many workers only when it has at
#: least the work of an n x n one (xGEQRF flops; below it one block factors each
#: matrix: a launch per panel costs more than the workers save).  2 workers, one
#: float32 matrix, interleaved (bench.qr_paths): on the 2-core Xeon VM with the
#: register-blocked tile (2026-12-07, dfbd347, median of 15) one block 0.47 / 0.96 /
#: 3.35 / 6.46 ms at n = 128 / 256 / 384 / 512 against 0.60 / 1.14 / 2.98 / 5.53 by
#: steps (median of 9 in another run: 3.56 vs 2.92 at 384, 6.17 vs 4.26 at 512, 11.2
#: vs 8.6 at 640); on the 2-core EPYC VM with the earlier tile one block was ahead up
#: to 640 (3.88 vs 6.21 ms at 384, 9.09 vs 11.74 at 512, median of 15); tall ones by
#: the same measure (median of 7): 4096 x 256 (0.5 Gflop) 14.5 vs 18.6 ms and 8192 x
#: 256 35.4 vs 43.7 ms by steps, 2048 x 512 a tie.  16 workers, the H100 host's 16
#: Xeon cores (qr-paths-2026-12-06-h100-16cpu-694907c, the samples after each size's
#: first): one block 0.27-0.30 / 0.57-0.63 ms at n = 128 / 192 against steps
#: 0.44-0.88 / 0.73-0.87, a tie at 256 (1.0-1.1 ms), steps ahead from 384.  Pools of 3
#: to 16 workers take that threshold (fewer workers gain less from the steps).
STEPS_MIN_N = ((2, 384), (16, 224))

#: One matrix runs all its steps in one launch (qrt_coop: a group of group_workers,
#: rt_group_sync between steps, no launch per panel) from the work of the COOP_MIN_N
#: square of its pool size on, with tiles COOP_TW wide; block 0 counts the
#: look-ahead panel as COOP_PANEL_TILES tiles when the tiles are shared out.  2-core
#: Xeon VM, one float32 matrix, the checked kernels in one process, alternating (5-9
#: rounds, median, ms): one block / steps / coop at n = 128 0.44 / 0.55 / 0.36, 192
#: 0.42 / 0.57 / 0.38, 256 0.70 / 0.87 / 0.67 (another run 1.05 / 1.19 / 0.77), 384
#: 2.65 / 3.19 / 2.17, 512 5.31 / 5.00 / 3.42, 1024 35.1 / 21.0 / 19.0, 2048 260 / 136
#: / 131; panel weights 2, 3, 5 and 8 within noise of each other, 3 best at 512 and
#: 1024; 32-wide tiles slower than 64 at every size.  Through kernels.qr, coop and the
#: path without it alternating in one process (median; after a 0.25 s pause each / back
#: to back): n = 256 2.34 vs 1.59 ms, coop faster in 0 of 15 / 1.53 vs 1.03, 5 of 25; 512
#: 5.39 vs 5.93, 11 of 15 / 3.44 vs 4.13, 24 of 25; 1024 20.9 vs 25.3, 12 of 15 / 18.8 vs
#: 19.5, 14 of 25.  Below about 384 x 384 a step is a few tens of microseconds of work and
#: a barrier that waits on a descheduled worker costs more than that, so the work of a
#: 384 x 384 square is the least coop takes on 2 workers.  16 workers of the H100 host
#: (bench.qr_paths, group steps vs coop on a group of 15 with tiles narrowed to TW_MIN,
#: median ms, two runs at 5b158b3, load 3-7: qr-paths-2026-12-07-h100-16cpu-5b158b3-a,
#: -b): n = 256 3.2 vs 6.6, 512 6.9 vs 14.0, 1024 17.6 / 23.9 vs 30.3 / 41.9 (coop
#: behind: its one-block look-ahead panel and barriers cost more than the launches it
#: saves), 1536 43.9 / 46.5 vs 36.9 / 40.4, 2048 78.3 / 77.4 vs 72.8 / 64.8, 3072 211.7 vs
#: 158.7, 4096 365 / 490 vs 341 / 396 (coop ahead); pools of 3 to 16 take that threshold
#: (unmeasured between), larger pools keep the steps.  Those were unpinned workers
#: (COOP_MIN_N_UNPINNED, for CAPQR_PIN=0).  Pinned (the default since 2d6107f) coop
#: no longer stalls on a worker that shares a core, and the same host gave coop ahead
#: of the steps and of one block at every size measured (median ms, 7fbd0cf, runs -a
#: and -b): n = 256 1.05 vs 1.56 / 1.30, 384 2.04 vs 2.91 / 4.16, 512 2.83 / 3.12 vs
#: 3.62 / 4.18, 768 7.59 vs 8.71, 1024 10.77 / 12.1 vs 13.53 / 13.9, 2048 58.9 vs 65.6,
#: 4096 340 vs 342; so pinned pools of 3 to 16 take coop from the work of 256 x 256.
#: Pinned pools of 2 too: on the 2-core Xeon VM through kernels.qr, coop against one
#: block alternating in one process (COOP_MIN_N patched; 2026-12-08, a2d4701, load
#: 0.5-1.0), n = 256 after a 0.25 s pause each: coop faster in 44 of 60 (four
#: processes, medians 1.50-1.72 vs 1.69-1.84 ms), back to back in 40 of 50 (0.97-1.03 vs
#: 1.07-1.21 ms); n = 192 even (17 of 30, 1.33-1.35 vs 1.37-1.39 ms).
COOP_TW, COOP_PANEL_TILES = 64, 3
COOP_MIN_N = ((2, 256), (16, 256))
COOP_MIN_N_UNPINNED = ((2, 384), (16, 1536))
#: Groups of at most this many blocks keep every qrt_coop tile COOP_TW wide; larger
#: ones narrow a step's tiles (down to TW_MIN) where that evens out its last round.
COOP_FIXED_TW_BLOCKS = 2


def coop_tile_min(blocks: int) -> int:
    """The narrowest tile qrt_coop balances a step's last round down to on a group of
    ``blocks`` (COOP_TW: every tile COOP_TW wide)."""
    return COOP_TW if blocks <= COOP_FIXED_TW_BLOCKS else TW_MIN


def qr_flops(m: int, n: int) -> float:
    """xGEQRF flops of one m x n matrix (LAPACK's count, either orientation)."""
    k, long = min(m, n), max(m, n)
    return 2.0 * long * k * k - 2.0 * k ** 3 / 3.0


def steps_min_n(threads: int) -> int:
    """The square size whose work is the least use_steps drives by steps on ``threads``
    workers (0: any)."""
    for most, n in STEPS_MIN_N:
        if threads <= most:
            return n
    return 0


def use_steps(batch: int, m: int, n: int, nb: int, threads: int) -> bool:
    """Drive panel by panel when one block per matrix would leave workers idle and the
    matrix has the work (STEPS_MIN_N) for that to pay."""
    least = steps_min_n(threads)
    return (threads > 1 and batch < threads and min(m, n) > 2 * nb
            and qr_flops(m, n) >= qr_flops(least, least))


def coop_min_n(threads: int, pinned: bool | None = None) -> int | None:
    """The square size whose work is the least use_coop runs in one launch on
    ``threads`` workers, pinned or not (None: this process's pool, runtime.pinned());
    None: never."""
    if threads < 2:
        return None
    if pinned is None:
        from .. import runtime

        pinned = runtime.pinned()
    for most, n in COOP_MIN_N if pinned else COOP_MIN_N_UNPINNED:
        if threads <= most:
            return n
    return None


def use_coop(batch: int, m: int, n: int, nb: int, threads: int,
             pinned: bool | None = None) -> bool:
    """Run one matrix's steps in one launch on a group of the pool (qrt_coop): a pool
    that COOP_MIN_N (COOP_MIN_N_UNPINNED for workers not pinned; ``pinned`` None: this
    process's) names, a matrix of at least two panels and the work of its square."""
    least = coop_min_n(threads, pinned)
    return (batch == 1 and least is not None and min(m, n) > nb
            and qr_flops(m, n) >= qr_flops(least, least))


def default_group(batch: int, m: int, dtype: str, threads: int) -> int:
    """Group size of the steps' look-ahead panel for ``batch`` matrices of ``m`` rows
    (0: qrt_step, one block per panel).

    float32 only: the group panel sums squares in double, which cannot
    overflow for float data but could for float64 data."""
    if (batch == 1 and m >= GROUP_MIN_ROWS and dtype == "float32"
            and threads >= GROUP_MIN_WORKERS):
        return min(GROUP, threads)
    return 0


def use_small(m: int, n: int, dtype: str) -> bool:
    """Factor each matrix in one block's local array (qr_small): float32 (its norms
    sum in double, as the group panel's do) of at most SMALL_M x SMALL_N."""
    return dtype == "float32" and m <= SMALL_M and n <= SMALL_N


def small_kernel_for(checked: Checked) -> Any:
    """The compiled qr_small (float32; built on first use only)."""
    from ..runtime.cpu.kernel import cflags

    return _kernels("float32", _mode(checked), tuple(cflags()), ("qr_small",), "qr_small")[0]


def use_tall(batch: int, m: int, n: int, dtype: str, threads: int) -> bool:
    """Share the rows of each matrix out between the workers (qrt_tall) for a batch
    smaller than the pool of float32 matrices at least TALL_RATIO times as tall as
    wide, where the column tiles of the steps would leave workers idle (fewer tiles
    than workers) or the panel, which the steps factor on one block, is most of the
    work (TALL_ALWAYS_RATIO times as tall as wide; TALL_COOP_RATIO where qrt_coop
    would take the matrix on a pool of 2).  float32 only, for the reason
    of :func:`default_group` (the panel's sums in double)."""
    if not (threads > 1 and batch < threads and dtype == "float32" and m >= TALL_MIN_ROWS
            and m >= TALL_RATIO * n):
        return False
    coop = threads == 2 and use_coop(batch, m, n, default_nb(m, n, batch, threads), threads)
    return -(-n // TW_MAX) < threads or m >= (TALL_COOP_RATIO if coop else TALL_ALWAYS_RATIO) * n


#: The launch paths of :func:`run`, as :func:`default_path` names them.
PATHS = ("tall", "small", "coop steps", "one block", "steps", "group steps")


def default_path(batch: int, m: int, n: int, dtype: str, threads: int,
                 nb: int | None = None, pinned: bool | None = None) -> str:
    """The path :func:`run` takes for ``batch`` m x n matrices on ``threads`` workers
    when nothing is forced (one of PATHS), in its order of decisions: the rows shared
    out (:func:`use_tall`), one local array per matrix (:func:`use_small`), the steps in
    one launch (:func:`use_coop`), one block per matrix, or the steps
    (:func:`use_steps`), with a group look-ahead panel where :func:`default_group` gives
    one.  ``nb``: the panel width, None for run's default; ``pinned``: whether the pool's
    workers are pinned, None for this process's (runtime.pinned())."""
    if use_tall(batch, m, n, dtype, threads):
        return "tall"
    if use_small(m, n, dtype):
        return "small"
    nb = default_nb(m, n, batch, threads) if nb is None else max(1, min(NB_MAX, nb, m, n))
    if use_coop(batch, m, n, nb, threads, pinned):
        return "coop steps"
    if not use_steps(batch, m, n, nb, threads):
        return "one block"
    return "group steps" if default_group(batch, m, dtype, threads) else "steps"


def path_kernels(path: str, dtype: str, checked: Checked) -> tuple[Any, ...]:
    """The compiled kernels :func:`run` launches on ``path`` (one of PATHS)."""
    if path == "tall":
        return (tall_kernel_for(dtype, checked),)
    if path == "small":
        return (small_kernel_for(checked),)
    if path == "coop steps":
        return (coop_kernel_for(dtype, checked),)
    if path == "group steps":
        return (*kernels_for(dtype, checked), group_kernel_for(dtype, checked))
    if path in PATHS:
        return kernels_for(dtype, checked)
    raise ValueError(f"unknown path {path!r}; the paths are {PATHS}")


def tall_chunk_rows(m: int) -> int:
    """Rows per chunk of qrt_tall (a multiple of 64 giving about TALL_CHUNKS chunks):
    a function of m alone, so that the result does not depend on the worker count."""
    return 64 * max(1, m // (64 * TALL_CHUNKS))


def group_workers(threads: int) -> int:
    """Blocks of a group launch that meets at a barrier on a pool of ``threads``: the
    pool less TALL_SPARE from TALL_SPARE_FROM workers on, else the whole pool."""
    return threads - TALL_SPARE if threads >= TALL_SPARE_FROM else threads


def tall_blocks(m: int, threads: int, workers: int | None = None) -> int:
    """Blocks (the group) of qrt_tall on a pool of ``threads`` for m rows: ``workers``
    (None: TALL_MAX_WORKERS, None there: the pool less TALL_SPARE from TALL_SPARE_FROM
    workers on), at most the pool and the row chunks, at least 1.  The result does not
    depend on it (the chunks follow m)."""
    if workers is None:
        workers = TALL_MAX_WORKERS
    if workers is not None and (isinstance(workers, bool) or int(workers) != workers
                                or workers < 1):
        raise ValueError(f"tall workers must be a positive int or None, got {workers!r}")
    if workers is None:
        most = group_workers(threads)
    else:
        most = min(threads, int(workers))
    return max(1, min(most, -(-m // tall_chunk_rows(m))))


def tall_work_elems(m: int, n: int, nb: int, ch: int) -> int:
    """qrt_tall's float workspace: T (nb x nb), W (nb x n) and a share of W per chunk."""
    return nb * nb + nb * n + -(-m // ch) * nb * n


def tall_sums_elems(m: int, ch: int) -> int:
    """Doubles of qrt_tall's S (gpanel_qr's chunk sums and pivot rows, two parities)."""
    return 2 * (64 * -(-m // ch) + 64)


def group_work_elems(m: int) -> int:
    """Doubles of qrt_gstep's S (the panel's chunk sums and pivot rows, two parities)."""
    return 2 * (64 * -(-m // 64) + 64)


def work_elems(batch: int, m: int, nb: int, steps: bool, grid: int) -> int:
    """Workspace elements (P, T, a column X): per block (qrt) or per matrix, two slots
    (qrt_step), each rounded up to 16 elements as qrt.c's slot_elems does."""
    slot = -(-(m * nb + nb * nb + m) // 16) * 16
    return batch * 2 * slot if steps else grid * slot


def run(h: np.ndarray, tau: np.ndarray, dtype: str, nb: int | None, tw: int, checked: Checked,
        grid: int | None, timeout: float | None, steps: bool | None = None,
        trace: list[tuple[int, int, float]] | None = None, group: int | None = None,
        n: int | None = None, tall: bool | None = None,
        tall_workers: int | None = None, coop: bool | None = None) -> None:
    """Factor ``h`` (batch x m x ld, C order, ``dtype``) in place; tau receives the scales.

    The matrices are the first ``n`` columns of each row (default: all ``ld``);
    the kernels never touch the others (:func:`padded_ld`).  ``nb``: the panel
    width, None for the path's default (:func:`default_nb`, or TALL_NB).  ``checked``:
    the checked build (True), the raw one (False) or a runtime.compile mode name.

    ``steps`` forces the launch sequence (True) or one block per matrix
    (False); None decides by batch size and worker count.  ``timeout`` covers
    the whole sequence: a launch gets what is left of it, no launch starts
    after it has passed, and the KernelTimeout names the sequence's timeout.
    ``trace``, when given, receives (panel j, blocks, seconds) per launch
    (j = -1: the first panel; one entry with j = -2 for a one-launch run).
    ``group`` forces the group look-ahead panel (qrt_gstep, batch 1) with that
    many blocks (0: qrt_step); None decides by :func:`default_group` (never
    with an explicit ``grid``).  ``tall`` forces the rows-shared path (qrt_tall,
    one launch per matrix on a group of workers; float32) or refuses it; None decides
    by :func:`use_tall` where nothing else (steps, grid, group) is forced.
    ``tall_workers``: the tall path's group size (:func:`tall_blocks`; None:
    TALL_MAX_WORKERS or the pool), for a run that takes the tall path only.
    ``coop`` forces every step of a matrix into one launch on a group of the pool
    (qrt_coop on group_workers blocks, a launch per matrix; bitwise the steps' result)
    or refuses it; None
    decides by :func:`use_coop` where nothing else is forced.
    """
    from .. import runtime

    batch, m, ld = h.shape
    n = ld if n is None else int(n)
    if not 1 <= n <= ld:
        raise ValueError(f"n={n} columns do not fit rows of {ld}")
    tw = max(1, min(TW_MAX, tw))
    if tall is None and steps is None and grid is None and group is None and coop is None:
        # nothing forced: default_path decides, and the columns path follows it
        # (small falls through to its check below; _run_columns gives the steps their
        # group by default_group, as default_path does)
        path = default_path(batch, m, n, dtype, runtime.threads(), nb)
        tall = path == "tall"
        coop = path == "coop steps"
        if path in ("one block", "steps", "group steps"):
            steps = path != "one block"
    if nb is None:
        nb = TALL_NB if tall else default_nb(m, n, batch, runtime.threads())
    # A panel never needs to be wider than the matrix: smaller workspace, same result.
    nb = max(1, min(NB_MAX, nb, min(m, n)))
    if tall:
        if steps or grid is not None or group or coop:
            raise ValueError("tall= runs its own launches: no steps, grid, group or coop "
                             "with it")
        if dtype != "float32":
            raise ValueError("the tall path sums in double and factors float32 only")
        _run_tall(h, tau, dtype, nb, checked, timeout, n, trace, tall_workers)
        return
    if tall_workers is not None:
        raise ValueError("tall_workers= is for the tall path (tall=True, or use_tall's "
                         "shapes)")
    if coop:
        if steps is not None or grid is not None or group:
            raise ValueError("coop= runs the steps in one launch of its own: no steps, grid "
                             "or group with it")
        _run_coop(h, tau, dtype, nb, checked, timeout, n, trace)
        return
    if steps is None and not group and use_small(m, n, dtype):
        run_small(h, tau, checked, grid, timeout, n, trace=trace)
        return
    _run_columns(h, tau, dtype, nb, tw, checked, grid, timeout, steps, trace, group, n)


def _run_tall(h: np.ndarray, tau: np.ndarray, dtype: str, nb: int, checked: Checked,
              timeout: float | None, n: int, trace: list[tuple[int, int, float]] | None,
              workers: int | None = None) -> None:
    """qrt_tall on each matrix of ``h`` in turn, a group of :func:`tall_blocks` workers
    (``workers``: run's ``tall_workers``); ``trace`` gets (matrix, blocks, seconds) per
    launch."""
    from .. import capabilities, runtime

    batch, m, ld = h.shape
    ch = tall_chunk_rows(m)
    blocks = tall_blocks(m, runtime.threads(), workers)
    kern = tall_kernel_for(dtype, checked)
    hc = capabilities.wrap(h, name="qr.a")
    tc = capabilities.wrap(tau, name="qr.tau")
    work = capabilities.alloc((tall_work_elems(m, n, nb, ch),), h.dtype, name="qr.work")
    sums = capabilities.alloc((tall_sums_elems(m, ch),), np.float64, name="qr.sums")
    try:
        _launch_per_matrix(kern, batch, blocks, timeout, trace,
                           lambda b: ([hc, tc, work, sums], (b, m, n, nb, ch, ld)))
    finally:
        work.free()
        sums.free()


def _launch_per_matrix(kern: Any, batch: int, blocks: int, timeout: float | None,
                       trace: list[tuple[int, int, float]] | None,
                       caps_args: Callable[[int], tuple[list[Any], tuple[Any, ...]]]) -> None:
    """A group launch of ``blocks`` per matrix b (its caps and args ``caps_args(b)``), in
    order: ``timeout`` covers them all (a launch gets what is left, none starts after it
    passed, and the KernelTimeout names it); ``trace`` gets (matrix, blocks, seconds)."""
    from .. import runtime

    deadline = None if timeout is None else time.monotonic() + timeout
    for b in range(batch):
        left = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise runtime.KernelTimeout(kern.name, timeout)
        caps, args = caps_args(b)
        t0 = time.perf_counter()
        try:
            runtime.launch(kern, caps, args=args, grid=blocks, timeout=left, group=blocks)
        except runtime.KernelTimeout as e:
            raise runtime.KernelTimeout(e.kernel, timeout, e.blocks_done) from None
        if trace is not None:
            trace.append((b, blocks, time.perf_counter() - t0))


def _run_coop(h: np.ndarray, tau: np.ndarray, dtype: str, nb: int, checked: Checked,
              timeout: float | None, n: int, trace: list[tuple[int, int, float]] | None
              ) -> None:
    """qrt_coop on each matrix of ``h`` in turn, a group of :func:`group_workers`
    blocks; ``trace`` gets (matrix, blocks, seconds) per launch."""
    from .. import capabilities, runtime

    batch, m, ld = h.shape
    kern = coop_kernel_for(dtype, checked)
    blocks = group_workers(runtime.threads())
    tmin = coop_tile_min(blocks)
    work = capabilities.alloc((work_elems(1, m, nb, True, 1),), h.dtype, name="qr.work")
    try:
        _launch_per_matrix(kern, batch, blocks, timeout, trace, lambda b: (
            [capabilities.wrap(h[b], name="qr.a"), capabilities.wrap(tau[b], name="qr.tau"),
             work], (m, n, nb, COOP_TW, tmin, COOP_PANEL_TILES, ld)))
    finally:
        work.free()


def run_small(h: np.ndarray, tau: np.ndarray, checked: Checked, grid: int | None,
              timeout: float | None, n: int | None = None, src: np.ndarray | None = None,
              trace: list[tuple[int, int, float]] | None = None) -> int:
    """qr_small on ``h`` (batch x m x ld, float32; the matrices in its first ``n``
    columns), one block per matrix (``grid`` caps the blocks), one launch.  With
    ``src`` (batch x m x n, C-contiguous float32) the kernel reads the matrices from
    there and writes them to ``h``, which need not be initialised.  Returns the
    number of NaN/Inf elements the input held (the caller decides what that means)."""
    from .. import capabilities, runtime

    batch, m, ld = h.shape
    n = ld if n is None else n
    g = batch if grid is None else max(1, min(int(grid), batch))
    bad = np.zeros(g, np.int64)
    hc = capabilities.wrap(h, name="qr.a")
    if src is None:
        sc, lds = hc, ld
    else:
        sc, lds = capabilities.wrap(src, "r", name="qr.input"), n
    t0 = time.perf_counter()
    runtime.launch(small_kernel_for(checked),
                   [sc, hc, capabilities.wrap(tau, name="qr.tau"),
                    capabilities.wrap(bad, name="qr.bad")],
                   args=(batch, m, n, lds, ld), grid=g, timeout=timeout)
    if trace is not None:
        trace.append((-2, g, time.perf_counter() - t0))
    return int(bad.sum())


def _run_columns(h: np.ndarray, tau: np.ndarray, dtype: str, nb: int, tw: int,
                 checked: Checked, grid: int | None, timeout: float | None, steps: bool | None,
                 trace: list[tuple[int, int, float]] | None, group: int | None, n: int
                 ) -> None:
    """:func:`run` by one block per matrix or by steps of column tiles."""
    from .. import capabilities, runtime

    batch, m, ld = h.shape
    if steps is None:
        steps = use_steps(batch, m, n, nb, runtime.threads())
    if group is None:
        # Only the steps of a single matrix have a look-ahead panel to give a group.
        group = (default_group(batch, m, dtype, runtime.threads())
                 if grid is None and steps and batch == 1 else 0)
    if group and (not steps or batch != 1):
        raise ValueError("the group look-ahead panel is for the steps of a single matrix")
    if group and grid is not None:
        raise ValueError("group= and grid= do not combine: the group steps size their own grid")
    kmat, kstep = kernels_for(dtype, checked)
    kgroup = group_kernel_for(dtype, checked) if group else None
    g = batch if grid is None else max(1, min(int(grid), batch))
    hc = capabilities.wrap(h, name="qr.a")
    tc = capabilities.wrap(tau, name="qr.tau")
    work = capabilities.alloc((work_elems(batch, m, nb, steps, g),), h.dtype, name="qr.work")
    sums = (capabilities.alloc((group_work_elems(m),), np.float64, name="qr.sums")
            if group else None)
    clock = time.perf_counter
    try:
        if not steps:
            t0 = clock()
            runtime.launch(kmat, [hc, tc, work], args=(batch, m, n, nb, ld), grid=g,
                           timeout=timeout)
            if trace is not None:
                trace.append((-2, g, clock() - t0))
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        caps = [hc, tc, work] if sums is None else [hc, tc, work, sums]
        threads = runtime.threads()
        for j in [-1, *range(0, min(m, n), nb)]:
            has_panel = _step_parts(m, n, nb, j)[0]
            tw_j = tw
            if grid is None:  # the tiles share the workers the panels leave them
                tw_j = step_tile_width(batch, m, n, nb, j, tw,
                                       threads - (group if group else batch * has_panel))
            items = step_items(batch, m, n, nb, j, tw_j)
            if items == 0:
                continue
            if group:  # the panel item becomes the group's blocks 0 .. group-1
                items += group - 1 if has_panel else group
            left = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise runtime.KernelTimeout(kstep.name, timeout)
            blocks = items if grid is None else max(1, min(int(grid), items))
            t0 = clock()
            try:
                if group:
                    runtime.launch(kgroup, caps, args=(m, n, nb, j, tw_j, group, ld),
                                   grid=blocks, timeout=left, group=group)
                else:
                    runtime.launch(kstep, caps, args=(batch, m, n, nb, j, tw_j, ld),
                                   grid=blocks, timeout=left)
            except runtime.KernelTimeout as e:
                raise runtime.KernelTimeout(e.kernel, timeout, e.blocks_done) from None
            if trace is not None:
                trace.append((j, blocks, clock() - t0))
    finally:
        work.free()
        if sums is not None:
            sums.free()
