"""The register-resident GPU panel kernel, gpu_qr_panel_reg, for each size class.

``python -m capqr.kernels.gpu.gen_panel_reg`` writes kernels/gpu/panel_reg.c (one
class's kernel, for reading and review); :func:`source` gives the text of any class
with the files it shares (kernels/sources.py, gpu_panel_reg), which is what
kernels.gpu compiles.  Edit this file, not panel_reg.c.

Why registers: gpu_qr_panel_small and gpu_qr_panel walk the panel in shared or global
memory and wait at four or five barriers per column, so a column costs microseconds
of latency whatever its size.  Here each thread keeps its rows of the panel in
registers from the first column to the last, and a column costs one barrier.  The
dialect's local arrays are memory, so a class's rows are named registers a0, a1, ...
(the code is unrolled here), and each class is its own source.
"""

from __future__ import annotations

from pathlib import Path

#: (warps, rows per thread) of each class, smallest first: capacity warps * rows panel
#: rows, 32 * warps threads.
CLASSES = ((8, 4), (8, 8), (8, 16), (8, 32), (16, 32), (16, 64))


def capacity(warps: int, rows: int) -> int:
    """Panel rows a class holds."""
    return warps * rows


def threads(warps: int, rows: int) -> int:
    """Threads per block of a class."""
    return 32 * warps


def find_class(m: int) -> tuple[int, int] | None:
    """The smallest class that holds a panel of ``m`` rows, or None."""
    for w, r in CLASSES:
        if m <= capacity(w, r):
            return w, r
    return None


def by_capacity(cap: int) -> tuple[int, int]:
    """The class of capacity ``cap``."""
    return next(c for c in CLASSES if capacity(*c) == cap)


#: Classes of at most this many rows per thread keep column p + 1 of their rows (the
#: shuffle that feeds the sums) in registers for step p + 1, one shuffle per row and
#: column instead of two; the largest class would spill the second copy.
KEEP_MAX_ROWS = 32


def keeps_column(rows: int) -> bool:
    """Whether a class keeps the next column's values (see KEEP_MAX_ROWS)."""
    return rows <= KEEP_MAX_ROWS


def one_block_options(block: int) -> tuple[str, ...]:
    """NVRTC options capping registers so that one block of ``block`` threads fits an
    SM's 65536 registers (every one-block-per-matrix kernel: register panel, per-matrix
    kernel, whole-matrix kernel)."""
    return (f"--maxrregcount={min(255, 65536 // block)}",)


def options(warps: int, rows: int) -> tuple[str, ...]:
    """NVRTC options: the register cap that keeps one block resident per SM."""
    return one_block_options(threads(warps, rows))


def source(warps: int, rows: int) -> str:
    """The dialect source of gpu_qr_panel_reg for the class: the files it shares with
    the other GPU panels (kernels/sources.py, gpu_panel_reg), then :func:`kernel_text`."""
    from .. import sources

    return sources.source("gpu_panel_reg") + "\n" + kernel_text(warps, rows)


def _rows(rows: int, line: str, per_line: int = 1) -> str:
    """``line`` (with {i} for the register) once per row, ``per_line`` to a line."""
    return "\n".join(" ".join(line.format(i=i) for i in range(k, min(k + per_line, rows)))
                     for k in range(0, rows, per_line))


def _off(i: int) -> str:
    """Row offset of register i from the thread's first row r0."""
    return f" + {i} * W" if i else ""


def smem_decls(warps: int) -> str:
    """The panel's shared arrays: the double-buffered parts of the sums and pivot rows,
    y (then T) and tau."""
    return (f"double smem_red[{2 * warps * 32}];\n"
            "double smem_pv[64];\n"
            f"float smem_y[{32 * 33}];\n"
            "float smem_tau[32];")


def panel_code(warps: int, rows: int, t_out: str, v_out: bool = False) -> str:
    """The statements that factor columns k0 .. k0+nb-1 of rows k0 .. n-1 of M (in
    scope: W, t, lane, warp, n, k0, nb, M, tb and :func:`smem_decls`'s arrays), write
    the panel back to M and tau to tb, and form T (when an update follows, k0 + nb < n)
    in smem_y's upper triangle, T[i][j] at smem_y[i * 33 + j + 1] (j >= i).
    ``t_out`` "global": T is also stored zero-padded to TT (in scope); "shared": it
    stays in shared memory only.  ``v_out``: V (unit diagonal, zeros above it) goes to
    smem_v[(r - k0) * 32 + c] for the rows r < n."""
    R = rows
    keep = keeps_column(R)
    out = [_rows(R, "float a{i} = 0.0f;", 4)]
    if keep:
        out.append(_rows(R, "float y{i} = 0.0f;", 4))
    out.append("int64_t r0 = k0 + warp;\nif (lane < nb) {")
    out += [f"    if (r0{_off(i)} < n) a{i} = cap_load_f32(M, (r0{_off(i)}) * n + k0 + lane);"
            for i in range(R)]
    out.append("}")
    update = []
    for i in range(R):
        o = _off(i)
        update += ["        {",
                   f"            float x = y{i};" if keep else
                   f"            float x = rt_shfl_idx_f32(a{i}, p);",
                   f"            a{i} = lane == p ? (r0{o} > kp ? x * scalef"
                   f" : (r0{o} == kp ? (float)beta : a{i}))",
                   f"                 : lane <= p ? a{i}",
                   f"                 : (r0{o} > kp ? fmaf(-(x * scalef), wc, a{i})"
                   f" : (r0{o} == kp ? a{i} - wc : a{i}));",
                   "        }"]
    sums = []
    for g0 in range(0, R, 4):
        terms = []
        for i in range(g0, min(g0 + 4, R)):
            sums.append(f"        {'' if keep else 'float '}y{i} = rt_shfl_idx_f32(a{i}, p + 1);")
            terms.append(f"(r0{_off(i)} > kn ? (double)y{i} * (double)a{i} : 0.0)")
        sums.append("        q += " + "\n             + ".join(terms) + ";")
    pivot = [f"        if (r0{_off(i)} == kn) smem_pv[nxt * 32 + lane] = (double)a{i};"
             for i in range(R)]
    out.append("""/* p = -1 sets up column 0 the way step p sets up column p + 1 */
for (int64_t p = -1; p < nb; p++) {
    int64_t kp = k0 + p;
    if (p >= 0) {
        int64_t par = p % 2;
        double sl = 0.0;
        double sp = 0.0;
        for (int64_t w = 0; w < W; w++) {
            sl += smem_red[(par * W + w) * 32 + lane];
            sp += smem_red[(par * W + w) * 32 + p];
        }
        double alpha = smem_pv[par * 32 + p];
        double pl = smem_pv[par * 32 + lane];
        double beta = reflector_beta(alpha, sp);
        double tk = reflector_tau(alpha, beta, sp);
        double scale = reflector_scale(alpha, beta, sp);
        float scalef = (float)scale;
        float wc = lane > p && lane < nb ? (float)(tk * (pl + sl * scale)) : 0.0f;""")
    out += update
    out.append("""        if (warp == 0) {
            if (lane < p)
                smem_y[p * 33 + lane] = (float)(pl + sl * scale);
            if (lane == 0) {
                smem_tau[p] = (float)tk;
                cap_store_f32(tb, k0 + p, (float)tk);
            }
        }
    }
    if (p + 1 < nb) {
        int64_t nxt = (p + 1) % 2;
        int64_t kn = kp + 1;
        double q = 0.0;""")
    out += sums
    out.append("        smem_red[(nxt * W + warp) * 32 + lane] = lane < nb ? q : 0.0;")
    out += pivot
    out.append("        rt_sync_threads();\n    }\n}\nif (lane < nb) {")
    out += [f"    if (r0{_off(i)} < n) cap_store_f32(M, (r0{_off(i)}) * n + k0 + lane, a{i});"
            for i in range(R)]
    out.append("}")
    if v_out:
        out.append("/* V for the update: unit diagonal, zeros above it */")
        out += [f"if (r0{_off(i)} < n) smem_v[(r0{_off(i)} - k0) * 32 + lane] = "
                f"r0{_off(i)} > k0 + lane ? a{i} : (r0{_off(i)} == k0 + lane ? 1.0f : 0.0f);"
                for i in range(R)]
    store_t = ("""
        for (int64_t j = 0; j < 32; j++)
            cap_store_f32(TT, lane * 32 + j, j >= lane ? smem_y[lane * 33 + j + 1] : 0.0f);"""
               if t_out == "global" else "")
    out.append(f"""/* T, the compact-WY factor of the panel (t_factor.c's recurrence, from y and tau
 * in shared memory: lane i of warp 0 forms row i in smem_y's upper triangle, where no
 * y lives); the last panel has no trailing update to use it. */
if (k0 + nb < n) {{
    rt_sync_threads();
    if (warp == 0) {{
        for (int64_t j = lane; j < 32; j++) {{
            float v = j < nb ? smem_tau[j] : 0.0f;
            if (j > lane && j < nb) {{
                float s = 0.0f;
                for (int64_t l = lane; l < j; l++)
                    s = fmaf(smem_y[lane * 33 + l + 1], smem_y[j * 33 + l], s);
                v = -v * s;
            }}
            smem_y[lane * 33 + j + 1] = v;
        }}{store_t}
    }}
}}""")
    return "\n".join(out)


def indent(text: str, spaces: int) -> str:
    """``text`` with every non-empty line indented by ``spaces``."""
    return "\n".join(" " * spaces + line if line else line for line in text.split("\n"))


def kernel_text(warps: int, rows: int) -> str:
    """gpu_qr_panel_reg itself for the class (panel_reg.c holds one class's)."""
    W, R = warps, rows
    P = threads(W, R)
    column = "kept from the sums of step p - 1" if keeps_column(R) else "a shuffle"
    return f"""/*
 * Blocked Householder QR on the GPU, part 1: the panel in registers (one block per
 * matrix).  Generated by kernels/gpu/gen_panel_reg.py (class: {W} warps, {R} rows per
 * thread, panels of at most {W * R} rows): edit that file, not this one.
 *
 * Same contract and arithmetic as gpu_qr_panel (panel.c; the same reflector.c,
 * composed by kernels/sources.py: gpu_panel_reg): factor columns k0 .. k0+nb-1
 * (nb <= 32) of rows k0 .. n-1 with LAPACK's slarfg formulas, write R, the
 * reflectors, tau[b*n + k0 + j] and, when an update follows (k0 + nb < n), the
 * 32 x 32 T factor in Tw[b*1024 ...].  A launch for a panel of more than {W * R}
 * rows factors only its first {W * R} rows (every access stays checked).
 *
 * Lane t % 32 is the panel column; warp w = t / 32 holds rows k0 + w, k0 + w + W, ...
 * (W = {W}) in a0 .. a{R - 1} from the first column to the last, read once and
 * written once.  Step p (column p):
 *   after the barrier, every thread adds the warps' parts of the sums
 *   s_c = sum over rows r > k0+p of A[r][k0+p] A[r][k0+c] (double: graded, huge and
 *   tiny inputs neither overflow nor underflow) for its lane c and for c = p, reads
 *   the pivot row, derives beta, tau and 1 / (alpha - beta) (reflector.c) and
 *   w_c = tau (A[k0+p][k0+c] + s_c / (alpha - beta)), and updates its rows, with
 *   column p of its rows from lane p ({column});
 *   warp 0 writes tau, and y_cp = v_c . v_p (c < p) into row p of smem_y;
 *   then it writes its warp's part of column p + 1's sums and (the thread holding row
 *   k0+p+1) the next pivot row, and waits at the barrier.
 * The parts and the pivot row are double buffered by the parity of p, so one barrier
 * per column separates every write from the reads of the same buffer.  Launched with
 * {P} threads.
 */
KERNEL void gpu_qr_panel_reg(cap_t A, cap_t tau, cap_t Tw, int64_t n, int64_t k0, int64_t nb)
{{
{indent(smem_decls(W), 4)}
    rt_require_block_dim({P});
    int64_t W = {W};
    int64_t b = rt_block_idx();
    int64_t t = rt_thread_idx();
    int64_t lane = t % 32;
    int64_t warp = t / 32;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t tb = cap_offset_f32(tau, b * n);
    cap_t TT = cap_offset_f32(Tw, b * 1024);
{indent(panel_code(W, R, "global"), 4)}
}}
"""


if __name__ == "__main__":
    Path(__file__).with_name("panel_reg.c").write_text(kernel_text(*CLASSES[0]))
