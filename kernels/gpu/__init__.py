"""GPU QR kernels in the capqr dialect (compiled through runtime.cuda) and their host driver.

Blocked Householder QR with compact WY, driven from the host as a sequence of
checked launches (:func:`launch_plan`): for each panel of ``NB`` columns,

1. the panel is factored and its T factor formed, by one of
   ``gpu_qr_panel_reg`` (kernels/gpu/gen_panel_reg.py: one block per matrix, the
   panel in registers, one barrier per column: by default for panels of at most
   ``REG_ROWS`` rows, with ``reg=True`` up to ``REG_MAX_ROWS``),
   ``gpu_qr_panel_small``
   (kernels/src/gpu/panel_small.c: one block per matrix, the panel in shared memory)
   for at most ``SMALL_ROWS`` rows, ``gpu_qr_panel``
   (kernels/src/gpu/panel.c: one block per matrix) above, or, for panels of more
   than ``tall_rows`` rows, one cooperative launch of ``gpu_qr_steps``
   (kernels/src/gpu/panel_steps.c: blocks of ``STEP_ROWS`` rows and a grid barrier,
   rt_group_sync, between columns, so a batch of two 4096-row panels runs on
   128 blocks, not 2);
2. ``gpu_qr_update_z`` and ``gpu_qr_update_apply`` (kernels/gpu/update.c, one
   block per (matrix, STRIP-column strip, row block)) apply ``I - V T^T V^T`` to
   the trailing columns; the row blocks are cut so that the grid has at least
   ``TARGET_BLOCKS`` blocks where the matrix allows.

A batch of at least ``PER_MATRIX_MIN_BATCH`` matrices of 33 to 1024 rows takes one
launch of ``gpu_qr_matrix`` (kernels/gpu/gen_matrix.py, one source per size class)
with ``per_matrix`` (default PER_MATRIX): one block factors one matrix, panel after
panel, the panel in registers and the trailing update from shared memory.

A batch of matrices that fit one block's shared memory (n <= 232 on H100/H200)
takes one launch instead: ``gpu_qr_whole`` (kernels/gpu/gen_whole.py, one source
per size class) loads each matrix once, factors it there and stores it once
(``whole``, default WHOLE; False forces the blocked plan, for comparison).

With ``mma_update`` (default MMA_UPDATE) the one-panel updates of at least
``MMA_MIN_ROWS`` rows run on the tensor cores instead: ``gpu_qr_update_mma_z`` and
``gpu_qr_update_mma_apply`` (kernels/gpu/update_mma.c, written by gen_update_mma.py),
the same grid, arguments and buffers, every product a warp's fp32-accurate
rt_warp_mma_f32.

With ``two_panel`` (default TWO_PANEL) the columns go in pairs of panels:
panel 1 (its T in the ``work`` buffer), the one-panel update of panel 2's
columns only, panel 2 (its T in ``work2``), then ``gpu_qr_update2_z`` and
``gpu_qr_update2_apply`` apply both panels' 64 reflectors to the trailing
columns in one pass over them (half the passes, twice the work per pass).

With ``lookahead`` (default :func:`use_lookahead`: one-block panels of a batch of at
most LOOKAHEAD_MAX_BATCH matrices of at least LOOKAHEAD_MIN_N columns) the panels and
the update of each next panel's columns run on a second, high-priority stream and the
rest of each update on the launch stream (``Launch.lane`` and ``after``,
runtime/cuda/lanes.py), so a panel can overlap the update before it; T alternates
between work and work2, and lane 1 has its own scratch1 and vt1.

The result is LAPACK's compact form (as ``scipy.linalg.qr(mode='raw')`` in
row-major orientation, like kernels.qr).  The plan runs as one launch sequence
(``runtime.cuda.launch(..., sync=False)`` per step, one ``runtime.cuda.sync``
at the end): no host sync between launches; a fault makes every later kernel
of the sequence exit at entry, and the sync raises it with the launch that
made it (``launch_index``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .. import sources
from . import gen_matrix, gen_panel_reg, gen_whole

_HERE = Path(__file__).parent
#: The panel kernels with the files they share (kernels/sources.py FAMILIES).
PANEL_SOURCE = sources.source("gpu_panel")
PANEL_STEPS_SOURCE = sources.source("gpu_steps")
PANEL_SMALL_SOURCE = sources.source("gpu_panel_small")
UPDATE_SOURCE = (_HERE / "update.c").read_text()
UPDATE_MMA_SOURCE = (_HERE / "update_mma.c").read_text()

NB = 32            #: panel width (one warp lane per panel column)
#: The update kernels' shapes (kernels/gpu/gen_update.py writes them into update.c):
#: trailing columns per block, threads per block, rows per shared-memory chunk, and
#: floats of one block's part of Z.
STRIP, UPDATE_BLOCK, CHUNK = 64, 128, 64
ZP_SIZE = NB * STRIP
SMALL_ROWS = 256   #: panels with at most this many rows go to gpu_qr_panel_small
TARGET_BLOCKS = 528  #: four resident update blocks on each of the H200's 132 SMs
#: Threads of each panel kernel: written into its source as P (constant loop steps).
PANEL_BLOCK, SMALL_BLOCK = 512, 256
#: gpu_qr_steps: 256 threads, 8 warps x 8 rows each (the constants of panel_steps.c).
STEP_BLOCK, STEP_ROWS = 256, 64
T_SIZE = NB * NB   #: floats of the T factor per matrix in the work buffer
#: Register caps of the update kernels, the same for checked and raw builds so the
#: overhead comparison stays like for like.  96 lets five 128-thread blocks share an
#: SM.  update_apply's register tile is proved in range at compile time
#: (rt_require_block_dim, runtime/compiler/ranges.py): at 96 its checked build spills 24 bytes
#: (was 276 with those checks), the raw build needs 91 (ptxas -v, NVRTC 13.0, sm_90);
#: H200, checked: (2,4096) 49.8 -> 44.2 ms, (8,2048) 25.8 -> 23.8 ms against the 128
#: cap's 4 blocks per SM, bitwise the same results
#: (bench/results/gpu-ranges-2026-12-04.txt).
UPDATE_Z_OPTIONS = ("--maxrregcount=96",)
UPDATE_OPTIONS = ("--maxrregcount=96",)
#: The two-panel update kernels: 128 registers (four 128-thread blocks per SM).
UPDATE2_OPTIONS = ("--maxrregcount=128",)
#: Pairs of panels share one trailing update (launch_plan's two_panel).  Off until it
#: has been measured: the pair kernels pass the CPU lowering, ptxas (sm_90: checked 128
#: registers, raw 94 / 127 uncapped) and the numpy model of their algebra, and their GPU
#: tests (tests/test_gpu_qr.py, two_panel) wait for a device run.
TWO_PANEL = False
#: The tensor-core update (launch_plan's mma_update): off until measured on a device
#: (bench/gpu_mma_update_device.sh times both).  Its kernels pass kernels.check on the
#: emulated lane (tests/test_gpu_qr_mma.py); an earlier apply-only trial with bank-
#: conflicting strides ran 2-5% behind the SIMT tile (bench/results/gpu-update-mma-2026-12-04.txt).
MMA_UPDATE = False
#: One-panel updates of at least this many rows (n - k0) take the tensor-core kernels
#: when mma_update is on; smaller ones stay SIMT.  A guess until measured.
MMA_MIN_ROWS = 2 * CHUNK
#: The same cap as the SIMT update kernels, so the two compare at five blocks per SM.
UPDATE_MMA_OPTIONS = ("--maxrregcount=96",)
#: gpu_qr_panel runs 512 threads: at 64 registers two blocks share an SM (the raw
#: build needs 48).  The checked build spills at 64 (nvcc 13.0 ptxas -v, sm_90, 0c74c45:
#: 216 bytes stored, 1060 loaded in the kernel, 224 / 240 in its outlined cover guard;
#: 153 registers uncapped).  At a cap of 128 (one block per SM) the checked panel ran
#: 1.79x raw at (640,512) against 1.48x at 64, but 1.30-1.33x against 1.42-1.45x at
#: (40,352) and (60,1024) (H200, bench/results/gpu-prelude-ab-2026-12-06-h200-86809e7.log,
#: free-regs): one cap for all shapes stays 64.
PANEL_OPTIONS = ("--maxrregcount=64",)
#: gpu_qr_panel_small runs 256 threads: at 64 registers four blocks share an SM, as its
#: 46 KB of shared memory allow (ptxas -v, nvcc 13.0, sm_90, 0c74c45: the checked build
#: spills 48 bytes at 64, 106 registers uncapped; raw 48).
SMALL_OPTIONS = ("--maxrregcount=64",)
#: gpu_qr_steps: 96 registers (no spills in either build, NVRTC 13, sm_90) let two
#: blocks share an SM, so a cooperative grid of 256 blocks ((8,2048)) fits an H200.
STEPS_OPTIONS = ("--maxrregcount=96",)


#: One launch per problem (gpu_qr_whole) where the matrix fits one block's shared
#: memory; False: the blocked plan for every shape (launch_plan's ``whole``).  Off by
#: default: on an H100 (bench/results/gpu-bench-2026-12-06-h100-whole.txt) it lost to
#: the blocked plan, checked (20,32) 0.213 vs 0.148 ms and (40,176) 1.489 vs 0.889 ms,
#: raw 0.127 vs 0.116 and 0.736 vs 0.601 ms: one block per matrix leaves most SMs idle
#: and its per-column barriers and shared-memory checks dominate.
WHOLE = False
#: Panels in registers, gpu_qr_panel_reg (launch_plan's ``reg``): by default those
#: of at most REG_ROWS rows (0: none); with reg=True every panel of at most
#: REG_MAX_ROWS rows (its largest class); reg=False: none (gpu_qr_panel_small and
#: gpu_qr_panel).  On an H100 (bench/results/gpu-reg-2026-12-06-h100-e83e5a0.txt,
#: checked ms, plan before vs reg=True) it won only on 32-row panels, (20,32) 0.207 ->
#: 0.123, and lost from 176 rows on: (40,176) 0.884 -> 0.943, (40,352) 2.223 ->
#: 2.623, (640,512) 21.1 -> 30.6 (panels 8.6 -> 17.8 ms), (60,1024) 19.7 -> 29.4.
#: A class of 8 rows per thread or more holds the panel in too many registers
#: (preg128 195, preg256 255 checked) for one column per barrier to pay.
REG_ROWS = 32
REG_MAX_ROWS = max(gen_panel_reg.capacity(*c) for c in gen_panel_reg.CLASSES)
#: One launch of gpu_qr_matrix, one block per matrix (launch_plan's ``per_matrix``),
#: for batches of at least PER_MATRIX_MIN_BATCH matrices of NB + 1 to PER_MATRIX_MAX_N
#: rows; smaller batches leave most SMs idle that way.  Off: on an H100
#: (bench/results/gpu-reg-2026-12-06-h100-e83e5a0-new.txt, checked ms, plan before vs
#: per_matrix and reg) it lost on every shape it takes, (40,176) 0.879 -> 1.641,
#: (40,352) 2.443 -> 9.073, (640,512) 21.2 -> 69.7: one block per matrix runs each
#: panel and update on 256 threads, where the blocked plan spreads the updates over
#: every SM.
PER_MATRIX = False
PER_MATRIX_MIN_BATCH = 16
PER_MATRIX_MAX_N = gen_matrix.CLASSES[-1][0]
#: Shared memory a block may opt into, assumed by launch_plan when not told (H100 and
#: H200: 227 KB); qr_launch passes the device's own limit.
WHOLE_SMEM = 232448


def whole_class(n: int, smem: int | None = None) -> tuple[int, int] | None:
    """(capacity, threads) of the smallest gpu_qr_whole class that holds an n x n
    matrix within ``smem`` bytes of shared memory (None: WHOLE_SMEM); None if none."""
    from ...runtime.cuda.lower import PRELUDE_SMEM  # the prelude's __shared__

    limit = WHOLE_SMEM if smem is None else smem
    for cap, threads in gen_whole.CLASSES:
        if n <= cap and gen_whole.shared_bytes(cap, threads) + PRELUDE_SMEM <= limit:
            return cap, threads
    return None


@dataclass(frozen=True)
class Launch:
    """One step of the launch sequence: kernel name, grid, block and scalar args."""

    kernel: str  # "panel", "panel_small", "preg<cap>", "steps", "update_*",
    #              "update2_*", "update_mma_*", "whole<cap>"
    grid: int
    block: int
    args: tuple[int, ...]
    group: int | None = None  # cooperative launches (rt_group_sync): the whole grid
    #: panels: T goes to work (0) or work2 (1: the second of a pair, or with the
    #: look-ahead every other panel); one-panel updates: the T they apply
    slot: int = 0
    #: runtime.cuda.launch_many's lanes (look-ahead): 0 the launch stream, 1 the
    #: high-priority stream of the panels; ``after``: plan indices of launches on the
    #: other lane this one waits for
    lane: int = 0
    after: tuple[int, ...] = ()


#: The look-ahead (launch_plan's ``lookahead``): the panels and each next panel's
#: update on a second, high-priority stream (runtime/cuda/lanes.py), the rest of each
#: update on the launch stream, so a panel may overlap the update before it.  None (the
#: default): :func:`use_lookahead`'s rule; True or False: every plan.  On an H100
#: (bench/results/gpu-lookahead-2026-12-07-h100-4abe03c.txt, checked ms, off vs on) it
#: lost on every contest shape but one, geomean 0.939x: (40,176) 1.038 -> 1.170,
#: (40,352) 2.384 -> 2.791, (640,512) 18.87 -> 21.21, (8,2048) 25.17 -> 26.87, (2,4096)
#: 46.7 -> 50.7 (49.7 as a CUDA graph, so not the host's enqueueing).  Each panel step
#: has two updates (four launches) instead of one, and the split updates cost more
#: (profile, serialised: update 11.9 -> 14.7 ms at (8,2048)) than the overlap gave
#: back: the cooperative panels of small batches need most SMs at once and those of
#: batch 640 fill the GPU themselves.  It won at (60,1024), whose 60 one-block panels
#: leave most SMs to a large update: 18.62 -> 17.43 there, and again 17.85 -> 17.11
#: (raw 14.89 -> 14.47) at 5655234 (gpu-lookahead-2026-12-07-h100-5655234.txt, where
#: (40,352) lost again, 2.004 -> 2.279).  The emulated lane checks its algebra
#: (tests/test_gpu_emulated.py), the plan test its ordering (tests/test_gpu_qr.py).
LOOKAHEAD: bool | None = None
#: use_lookahead's rule: one-block panels (no steps), a batch of at most
#: LOOKAHEAD_MAX_BATCH matrices (60 measured) of at least LOOKAHEAD_MIN_N columns.
LOOKAHEAD_MIN_N, LOOKAHEAD_MAX_BATCH = 1024, 64


#: Batches up to this size factor panels of more than STEPS_ROWS rows over row blocks
#: (H200: one launch per column at first, bench/results/gpuprof-steps-2026-12-03.json:
#: kernel time of the panels of (2,4096) 64 ms that way vs 126 ms one block per matrix, a
#: tie at (8,2048); one block per matrix wins from batch 60 on, where the batch alone
#: fills the GPU).  One cooperative launch per panel (gpu_qr_steps) gives bitwise the
#: same results: (2,4096) 86 -> 61 ms, (8,2048) 42.7 -> 30.7 ms, (4,1024) 11.8 -> 7.5 ms
#: (bench/results/gpu-coop-2026-12-03.txt).
STEPS_MAX_BATCH, STEPS_ROWS = 8, 256


def default_tall_rows(batch: int) -> int | None:
    """The panel height above which the plan uses gpu_qr_steps (None: never)."""
    return STEPS_ROWS if batch <= STEPS_MAX_BATCH else None


#: Blocks of gpu_qr_steps the plan assumes the device runs at once when it is not
#: told (H200: 2 per SM of 132 at STEP_OPTIONS' register cap).
STEPS_MAX_GROUP = 264


def use_lookahead(batch: int, n: int, tall_rows: int | None | str = "auto") -> bool:
    """Whether the plan of ``batch`` n x n matrices runs the look-ahead by default
    (LOOKAHEAD, or where it is None the rule it describes: panels of one block per
    matrix, so no column steps, for a batch of at most LOOKAHEAD_MAX_BATCH matrices of at
    least LOOKAHEAD_MIN_N columns)."""
    if LOOKAHEAD is not None:
        return LOOKAHEAD
    steps = default_tall_rows(batch) if tall_rows == "auto" else tall_rows
    return steps is None and batch <= LOOKAHEAD_MAX_BATCH and n >= LOOKAHEAD_MIN_N


def launch_plan(batch: int, n: int, tall_rows: int | None | str = "auto",
                max_group: int = STEPS_MAX_GROUP, two_panel: bool | None = None,
                whole: bool | None = None, smem: int | None = None,
                mma_update: bool | None = None, reg: bool | None = None,
                per_matrix: bool | None = None, lookahead: bool | None = None) -> list[Launch]:
    """The launch sequence that factors ``batch`` n x n matrices (pure: no GPU).

    ``whole`` (None: WHOLE): one launch of gpu_qr_whole, one block per matrix, where
    :func:`whole_class` finds a class for n within ``smem`` bytes of shared memory
    per block; else (or with whole False) the blocked plan:

    Panels of more than ``tall_rows`` rows are factored over row blocks of
    STEP_ROWS rows (kernels/src/gpu/panel_steps.c) by one cooperative launch of
    gpu_qr_steps, where its grid (batch x row blocks) fits in ``max_group``
    blocks, else by one block per matrix; tall_rows None: never; "auto":
    :func:`default_tall_rows`.  ``two_panel`` (None: TWO_PANEL): one trailing
    update per pair of panels (module doc).  ``mma_update`` (None: MMA_UPDATE): the
    one-panel updates of at least MMA_MIN_ROWS rows on the tensor cores.  ``reg``
    puts the other panels in registers (gpu_qr_panel_reg, the smallest class that
    holds them): None, those of at most REG_ROWS rows; True, of at most
    REG_MAX_ROWS; False, none.  ``per_matrix`` (None:
    PER_MATRIX): one launch of gpu_qr_matrix where the batch and n allow (module doc).
    ``lookahead`` (None: :func:`use_lookahead`; not with two_panel): the panels and the
    update of the next panel's columns on lane 1, the rest of each update on lane 0, so
    a panel runs while the update before it finishes the columns after it (module doc).
    """
    if batch < 1 or n < 1:
        raise ValueError(f"need batch >= 1 and n >= 1, got ({batch}, {n})")
    if tall_rows == "auto":
        tall_rows = default_tall_rows(batch)
    if two_panel is None:
        two_panel = TWO_PANEL
    if mma_update is None:
        mma_update = MMA_UPDATE
    reg_rows = REG_ROWS if reg is None else (REG_MAX_ROWS if reg else 0)
    cls = whole_class(n, smem) if (WHOLE if whole is None else whole) else None
    if cls is not None:
        return [Launch(f"whole{cls[0]}", batch, cls[1], (n, batch))]
    if ((PER_MATRIX if per_matrix is None else per_matrix) and batch >= PER_MATRIX_MIN_BATCH
            and NB < n <= PER_MATRIX_MAX_N):
        mc = gen_matrix.find_class(n)
        return [Launch(f"matrix{mc[0]}", batch, gen_matrix.threads(mc), (n, batch))]
    plan: list[Launch] = []

    def panel(k0: int, nb: int, slot: int, lane: int = 0) -> None:
        m = n - k0
        nrb = -(-m // STEP_ROWS)
        if tall_rows is not None and m > tall_rows and batch * nrb <= max_group:
            plan.append(Launch("steps", batch * nrb, STEP_BLOCK, (n, k0, nb, batch, nrb),
                               batch * nrb, slot, lane))
        elif m <= reg_rows:
            cls = gen_panel_reg.find_class(m)
            plan.append(Launch(f"preg{gen_panel_reg.capacity(*cls)}", batch,
                               gen_panel_reg.threads(*cls), (n, k0, nb), slot=slot, lane=lane))
        elif m <= SMALL_ROWS:
            plan.append(Launch("panel_small", batch, SMALL_BLOCK, (n, k0, nb), slot=slot,
                               lane=lane))
        else:
            plan.append(Launch("panel", batch, PANEL_BLOCK, (n, k0, nb), slot=slot, lane=lane))

    def update(kind: str, k0: int, nb: int, ce: int, c0: int | None = None, slot: int = 0,
               lane: int = 0, after: tuple[int, ...] = ()) -> None:
        """Reflectors k0 .. k0+nb-1 (their T in ``slot``) applied to columns c0 .. ce-1
        (c0 None: k0+nb); the first launch waits for ``after``."""
        c0 = k0 + nb if c0 is None else c0
        m = n - k0
        strips = -(-(ce - c0) // STRIP)
        chunks = -(-m // CHUNK)
        want = max(1, -(-TARGET_BLOCKS // (batch * strips)))
        rb = CHUNK * -(-chunks // min(chunks, want))
        nrb = -(-m // rb)
        args = (n, k0, nb, ce, strips, nrb, rb)
        if kind != "update2":
            args += (c0,)
        grid = batch * strips * nrb
        if kind == "update" and mma_update and m >= MMA_MIN_ROWS:
            kind = "update_mma"  # same grid, arguments and buffers
        plan.append(Launch(kind + "_z", grid, UPDATE_BLOCK, args, slot=slot, lane=lane,
                           after=after))
        plan.append(Launch(kind + "_apply", grid, UPDATE_BLOCK, args, slot=slot, lane=lane))

    if lookahead is None:
        lookahead = use_lookahead(batch, n, tall_rows)
    if lookahead and not two_panel:
        # lane 1: P0, then per panel j the update of panel j+1's columns by panel j
        # (after lane 0's update by panel j-1, which reached them) and panel j+1;
        # lane 0: the update of the columns after panel j+1 by panel j (after P_j).
        # T alternates between work and work2, each update reading its panel's.
        panel(0, min(NB, n), 0, lane=1)
        k0, j, rest = 0, 0, ()
        while k0 + NB < n:
            pj = len(plan) - 1  # panel j
            k1 = k0 + NB
            nb1 = min(NB, n - k1)
            after_next = rest
            if k1 + nb1 < n:
                update("update", k0, NB, n, c0=k1 + nb1, slot=j % 2, lane=0, after=(pj,))
                rest = (len(plan) - 1,)
            update("update", k0, NB, k1 + nb1, c0=k1, slot=j % 2, lane=1, after=after_next)
            panel(k1, nb1, (j + 1) % 2, lane=1)
            k0, j = k1, j + 1
        return plan

    k0 = 0
    while k0 < n:
        nb = min(NB, n - k0)
        if two_panel and n - k0 > NB:
            nb2 = min(NB, n - k0 - NB)
            panel(k0, NB, 0)
            update("update", k0, NB, k0 + NB + nb2)
            panel(k0 + NB, nb2, 1)
            if k0 + NB + nb2 < n:
                update("update2", k0, NB + nb2, n)
            k0 += NB + nb2
        else:
            panel(k0, nb, 0)
            if k0 + nb < n:
                update("update", k0, nb, n)
            k0 += nb
    return plan


#: Every launch kind _kernel_spec builds, the whole-matrix kernel once per size class
#: (runtime/cuda/census.py counts each one's checks: tests/test_gpu_checks.py).
LAUNCH_KINDS = ("panel", "panel_small", "steps", "update_z", "update_apply", "update2_z",
                "update2_apply", "update_mma_z", "update_mma_apply",
                *(f"whole{cap}" for cap, _threads in gen_whole.CLASSES),
                *(f"preg{gen_panel_reg.capacity(*c)}" for c in gen_panel_reg.CLASSES),
                *(f"matrix{c[0]}" for c in gen_matrix.CLASSES))


def one_launch(kind: str) -> bool:
    """Whether a launch kind factors the whole matrix (a plan of that one launch, with
    no workspace)."""
    return kind.startswith(("whole", "matrix"))


def _kernel_spec(kind: str) -> tuple[str, str, tuple[str, ...]]:
    """(source, kernel name, NVRTC options) of one launch kind, read when compiled."""
    if kind.startswith("whole"):
        threads = dict(gen_whole.CLASSES)[int(kind[5:])]
        # a block of 1024 threads runs only if each takes at most 64 registers
        return (gen_whole.source(int(kind[5:]), threads), "gpu_qr_whole",
                gen_panel_reg.one_block_options(threads))
    if kind.startswith("matrix"):
        mc = gen_matrix.by_capacity(int(kind[6:]))
        return gen_matrix.source(mc), "gpu_qr_matrix", gen_matrix.options(mc)
    if kind.startswith("preg"):
        cls = gen_panel_reg.by_capacity(int(kind[4:]))
        return gen_panel_reg.source(*cls), "gpu_qr_panel_reg", gen_panel_reg.options(*cls)
    return {"panel": (PANEL_SOURCE, "gpu_qr_panel", PANEL_OPTIONS),
            "panel_small": (PANEL_SMALL_SOURCE, "gpu_qr_panel_small", SMALL_OPTIONS),
            "steps": (PANEL_STEPS_SOURCE, "gpu_qr_steps", STEPS_OPTIONS),
            "update_z": (UPDATE_SOURCE, "gpu_qr_update_z", UPDATE_Z_OPTIONS),
            "update_apply": (UPDATE_SOURCE, "gpu_qr_update_apply", UPDATE_OPTIONS),
            "update2_z": (UPDATE_SOURCE, "gpu_qr_update2_z", UPDATE2_OPTIONS),
            "update2_apply": (UPDATE_SOURCE, "gpu_qr_update2_apply", UPDATE2_OPTIONS),
            "update_mma_z": (UPDATE_MMA_SOURCE, "gpu_qr_update_mma_z", UPDATE_MMA_OPTIONS),
            "update_mma_apply": (UPDATE_MMA_SOURCE, "gpu_qr_update_mma_apply",
                                 UPDATE_MMA_OPTIONS)}[kind]


class _Compiled(dict):
    """Launch kind -> compiled kernel, each compiled on first use (a plan without
    pairs of panels never builds the two-panel kernels)."""

    def __init__(self, checked: bool):
        super().__init__()
        self.checked = checked

    def __missing__(self, kind: str) -> Any:
        from ...runtime import cuda

        source, name, options = _kernel_spec(kind)
        kernel = self[kind] = cuda.compile(source, name, checked=self.checked, options=options)
        return kernel


@cache
def blocked_kernels(checked: bool = True) -> dict[str, Any]:
    """The panel and update kernels (checked or raw build) by launch kind, compiled on
    first use and cached per process."""
    return _Compiled(checked)


def work_size(batch: int) -> int:
    """Floats of one T buffer (the T factor of a panel, per matrix); there are two."""
    return batch * T_SIZE


@cache
def _updates(batch: int, n: int) -> tuple[Launch, ...]:
    """The update launches of the plans (one and two panels per update, with and without
    the look-ahead), so one workspace serves any; their sizes do not depend on tall_rows,
    and the tensor-core update (mma_update) has the one-panel update's grids and sizes.
    Built once per shape: scratch_size and gram_size both read them."""
    return tuple(s for two, ahead in ((False, False), (True, False), (False, True))
                 for s in launch_plan(batch, n, None, two_panel=two, whole=False,
                                      mma_update=False, lookahead=ahead)
                 if s.kernel.endswith("_z"))


def scratch_size(batch: int, n: int) -> int:
    """Floats of the scratch buffer: the updates' parts of Z (ZP_SIZE per block, twice
    that for the two-panel update)."""
    z = max((s.grid * ZP_SIZE * (2 if s.kernel == "update2_z" else 1)
             for s in _updates(batch, n)), default=0)
    return max(1, z)


def gram_size(batch: int, n: int) -> int:
    """Floats of the two-panel update's parts of G = V1^T V2 (32 x 32 per row block)."""
    g = max((batch * s.args[5] * 1024 for s in _updates(batch, n) if s.kernel == "update2_z"),
            default=0)
    return max(1, g)


def steps_size(batch: int, n: int) -> int:
    """Doubles of gpu_qr_steps' buffer: two pivot rows and two sets of row-block
    sums (double buffered by column parity) per matrix."""
    return 2 * batch * 32 * (1 + -(-n // STEP_ROWS))


def vt_size(batch: int, n: int) -> int:
    """Floats of the V^T buffer: the current update's reflectors, up to 2 NB x n per
    matrix."""
    return batch * 2 * NB * n


@dataclass
class Workspace:
    """The device buffers a factorization needs besides A and tau: ``work`` and
    ``work2`` (the T of the first and second panel of a pair, or of every other panel
    with the look-ahead), ``scratch`` (the updates' parts of Z), ``gram`` (the
    two-panel update's parts of V1^T V2), ``steps`` (gpu_qr_steps' pivot rows and
    sums), ``vt`` (the reflectors' V^T, from the Z kernel to the apply kernel), and
    for the look-ahead's lane 1 its own ``scratch1`` and ``vt1`` (its updates run
    beside lane 0's), made when a plan first needs them (:meth:`for_plan`)."""

    work: Any
    work2: Any
    scratch: Any
    gram: Any
    steps: Any
    vt: Any
    scratch1: Any = None
    vt1: Any = None
    #: how lane 1's buffers are made: (alloc, prefix, batch, n) of :meth:`alloc`
    made_by: tuple | None = field(default=None, repr=False)

    @classmethod
    def alloc(cls, batch: int, n: int, prefix: str = "qr.",
              alloc: Callable[..., Any] | None = None,
              lookahead: bool = False) -> Workspace:
        """Device buffers (``alloc(size, dtype, name=...)``, default
        runtime.cuda.alloc_device) sized for any plan.  Lane 1's are made now with
        ``lookahead``, else by :meth:`for_plan` (qr_launch calls it) for the first plan
        that runs on two lanes: the plan alone decides, so the buffers cannot miss it."""
        if alloc is None:
            from ...runtime import cuda

            alloc = cuda.alloc_device
        f32 = np.float32
        ws = cls(alloc(work_size(batch), f32, name=prefix + "work"),
                 alloc(work_size(batch), f32, name=prefix + "work2"),
                 alloc(scratch_size(batch, n), f32, name=prefix + "scratch"),
                 alloc(gram_size(batch, n), f32, name=prefix + "gram"),
                 alloc(steps_size(batch, n), np.float64, name=prefix + "steps"),
                 alloc(vt_size(batch, n), f32, name=prefix + "vt"),
                 made_by=(alloc, prefix, batch, n))
        if lookahead:
            ws.add_lane1()
        return ws

    def add_lane1(self) -> None:
        """Make lane 1's scratch and V^T (once)."""
        if self.scratch1 is not None:
            return
        if self.made_by is None:
            raise ValueError("this Workspace was not made by Workspace.alloc: give it "
                             "scratch1 and vt1 for a look-ahead plan")
        alloc, prefix, batch, n = self.made_by
        scratch1 = alloc(scratch_size(batch, n), np.float32, name=prefix + "scratch1")
        try:
            vt1 = alloc(batch * NB * n, np.float32, name=prefix + "vt1")
        except BaseException:
            if hasattr(scratch1, "free"):
                scratch1.free()
            raise
        self.scratch1, self.vt1 = scratch1, vt1  # both or neither

    def for_plan(self, plan: list[Launch]) -> None:
        """Make the buffers ``plan`` needs that are not there yet (lane 1's)."""
        if any(step.lane for step in plan):
            self.add_lane1()

    def caps(self, step: Launch, A: Any, tau: Any) -> list[Any]:
        """The capability arguments of one launch of the plan."""
        if one_launch(step.kernel):
            return [A, tau]
        w = (self.work, self.work2)[step.slot]
        if step.kernel.startswith("preg"):
            return [A, tau, w]
        z, v = (self.scratch, self.vt) if step.lane == 0 else (self.scratch1, self.vt1)
        if z is None and step.kernel.startswith("update"):
            raise ValueError("a look-ahead plan's updates need lane 1's buffers "
                             "(Workspace.for_plan)")
        return {"panel": [A, tau, w], "panel_small": [A, tau, w],
                "steps": [A, tau, w, self.steps],
                "update_z": [A, z, v], "update_apply": [A, w, z, v],
                "update2_z": [A, z, self.gram, v],
                "update2_apply": [A, self.work, self.work2, z, self.gram, v],
                "update_mma_z": [A, z, v], "update_mma_apply": [A, w, z, v]}[step.kernel]

    def free(self) -> None:
        for c in (self.work, self.work2, self.scratch, self.gram, self.steps, self.vt,
                  self.scratch1, self.vt1):
            if c is not None:
                c.free()


def device_smem() -> int:
    """Shared memory one block of the current device may opt into (bytes)."""
    from ...runtime.cuda import driver as drv

    return int(drv.device().max_smem_optin)


def needs_workspace(batch: int, n: int, whole: bool | None = None,
                    smem: int | None = None, per_matrix: bool | None = None) -> bool:
    """Whether the plan of this shape uses the workspace (not a single whole-matrix
    launch)."""
    return not one_launch(launch_plan(batch, n, None, whole=whole, smem=smem,
                                      per_matrix=per_matrix)[0].kernel)


def qr_launch(A: Any, tau: Any, ws: Workspace | None, n: int, *, checked: bool = True,
              timeout: float | None = None, tall_rows: int | None | str = "auto",
              two_panel: bool | None = None, whole: bool | None = None,
              mma_update: bool | None = None, reg: bool | None = None,
              per_matrix: bool | None = None, lookahead: bool | None = None,
              graphs: dict | None = None) -> None:
    """Factor the batch in place: A (batch, n, n) float32 device cap -> compact (H, tau).

    ``tau`` holds batch * n floats; ``ws`` comes from :meth:`Workspace.alloc` (None
    where :func:`needs_workspace` says the plan has no use for it).
    One launch sequence, synced at the end (``timeout``: for the whole sequence;
    a sequence the caller left pending is synced with it).

    ``graphs``: a dict the caller keeps for repeated calls on the same buffers: the
    sequence is recorded there as a CUDA graph on first use (runtime/cuda/graphs.py,
    keyed by the plan, the build and the buffers) and replayed by one launch after,
    with the same checks, faults and results.  The caller closes its graphs
    (``LaunchGraph.close``) when done with the buffers.
    """
    from ...runtime import cuda

    batch = A.nbytes // (4 * n * n)
    ks = blocked_kernels(checked)
    smem = device_smem()
    plan = launch_plan(batch, n, tall_rows, two_panel=two_panel, whole=whole, smem=smem,
                       mma_update=mma_update, reg=reg, per_matrix=per_matrix,
                       lookahead=lookahead)
    if not one_launch(plan[0].kernel):  # the steps kernel only when it may run
        plan = launch_plan(batch, n, tall_rows, ks["steps"].max_group(STEP_BLOCK), two_panel,
                           whole, smem, mma_update, reg, per_matrix, lookahead)
    if ws is None and not one_launch(plan[0].kernel):
        raise ValueError(f"the plan of ({batch}, {n}) needs a Workspace")
    if ws is not None:
        ws.for_plan(plan)
    caps = ws.caps if ws is not None else (lambda step, A, tau: [A, tau])
    launches = [(ks[step.kernel], caps(step, A, tau), step.args, step.grid, step.block,
                 step.group) for step in plan]
    lanes = ([(step.lane, step.after) for step in plan]
             if any(step.lane or step.after for step in plan) else None)
    if graphs is None:
        # one batch: the host enqueues (2,4096)'s 4222 launches faster than one call each
        cuda.launch_many(launches, lanes)
    else:
        # the graph holds these buffers, so their ids name them while it is kept
        key = (checked, tuple(plan), *dict.fromkeys(id(c) for launch in launches
                                                    for c in launch[1]))
        if key not in graphs:
            graphs[key] = cuda.record_graph(launches, lanes)
        graphs[key].launch()
    cuda.sync(timeout)


def qr(a: np.ndarray, *, checked: bool = True, timeout: float | None = None,
       tall_rows: int | None | str = "auto", two_panel: bool | None = None,
       whole: bool | None = None, mma_update: bool | None = None, reg: bool | None = None,
       per_matrix: bool | None = None,
       lookahead: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Householder QR of a (batch, n, n) float32 host array on the GPU -> (H, tau).

    H[b] holds R on/above the diagonal and the Householder vectors below it in
    the same orientation as ``scipy.linalg.qr(a[b], mode='raw')[0]``.
    """
    from ...runtime import cuda

    a = np.ascontiguousarray(a, dtype=np.float32)
    batch, n, _ = a.shape
    A = cuda.to_device(a, name="A")
    tau = cuda.alloc_device((batch, n), np.float32, name="tau")
    ws = (Workspace.alloc(batch, n, prefix="")
          if needs_workspace(batch, n, whole, device_smem(), per_matrix) else None)
    try:
        qr_launch(A, tau, ws, n, checked=checked, timeout=timeout, tall_rows=tall_rows,
                  two_panel=two_panel, whole=whole, mma_update=mma_update, reg=reg,
                  per_matrix=per_matrix, lookahead=lookahead)
        return A.numpy(), tau.numpy()
    finally:
        if ws is not None:
            ws.free()
        A.free()
        tau.free()


def on_device(x: Any) -> bool:
    """True for a device capability or a CUDA torch tensor (kernels.qr's GPU route)."""
    if getattr(x, "device", None) == "cuda" and hasattr(x, "cap_value"):
        return True
    return type(x).__module__.startswith("torch") and bool(getattr(x, "is_cuda", False))


def qr_device(A: Any, *, checked: bool = True, timeout: float | None = None) -> tuple[Any, Any]:
    """QR of a device-resident (n, n) or (batch, n, n) matrix; results stay on the device.

    ``A`` is a DeviceCapability (float32) or a CUDA torch tensor (any real
    dtype, factored in float32).  Returns ``(H, tau)`` of the same kind
    (new buffers; ``A`` is not modified).
    """
    from ...runtime import cuda

    is_torch = type(A).__module__.startswith("torch")
    shape = tuple(A.shape)
    if len(shape) not in (2, 3) or shape[-1] != shape[-2] or shape[-1] == 0:
        raise ValueError(f"the GPU QR takes square (n, n) or (batch, n, n) matrices, "
                         f"got shape {shape}")
    n = shape[-1]
    batch = 1 if len(shape) == 2 else shape[0]
    if is_torch:
        import torch

        h = A.detach().to(torch.float32).contiguous().clone()
        t = torch.zeros(shape[:-1], dtype=torch.float32, device=h.device)
        H, T = cuda.wrap_device(h, name="qr.a"), cuda.wrap_device(t, name="qr.tau")
    else:
        if np.dtype(A.dtype) != np.float32:
            raise TypeError(f"device QR needs float32, got {A.dtype}")
        if A.freed:
            from ...runtime.errors import CapabilityFault

            raise CapabilityFault("freed", buffer=A.name, access="load")
        H = cuda.alloc_device(shape, np.float32, name="qr.a")
        from ...runtime.cuda import driver as drv

        drv.check(drv.lib().cuMemcpyDtoD_v2(H.ptr, A.ptr, A.nbytes), "cuMemcpyDtoD")
        T = cuda.alloc_device(shape[:-1], np.float32, name="qr.tau")
    ws = Workspace.alloc(batch, n) if needs_workspace(batch, n, None, device_smem()) else None
    try:
        qr_launch(H, T, ws, n, checked=checked, timeout=timeout)
    finally:
        if ws is not None:
            ws.free()
    if is_torch:
        H.free()
        T.free()
        return h, t
    return H, T
