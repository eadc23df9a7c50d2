/*
 * Blocked Householder QR on the GPU, part 1 for tall panels: one cooperative launch
 * per panel, many blocks per matrix.
 *
 * Same contract as gpu_qr_panel (panel.c; reflector.c and t_factor.c composed with it by
 * kernels/sources.py: gpu_steps): factor columns k0 .. k0+nb-1
 * (nb <= 32) of rows k0 .. n-1 with LAPACK's slarfg formulas, write R, the
 * reflectors, tau and the 32 x 32 T factor (Tw[b*1024 ...], zero-padded).  A
 * single block per matrix leaves a batch of two 4096-row panels on two SMs, so
 * here the panel's rows are cut into blocks of RB = 64 rows, the grid is
 * (matrix, row block), and rt_group_sync() (a grid barrier: the host launches
 * the kernel cooperatively, every block resident) separates the columns.  Each
 * block holds its 64 x nb part of the panel in registers from the first column
 * to the last (lane t % 32 is the panel column, warp w = t / 32 holds rows w,
 * w + 8, ..., w + 56 of the block), so a column costs one grid barrier, not a
 * launch and a reload of the block's rows.
 *
 * Step j needs, for every panel column c, s_c = sum over rows r > k0+j of
 * A[r][k0+j] * A[r][k0+c] (double) and the pivot row A[k0+j][k0 .. k0+nb-1].
 * Each block writes its part of the sums to Pp and (the block holding the
 * pivot) the pivot row to Pv before the barrier; after it, every block adds
 * the parts in row-block order (so every block, and every run, gets the same
 * bits), derives beta, tau and w_c = tau (A[k0+j][k0+c] + s_c / (alpha - beta)),
 * updates its rows, and writes its part for column j+1.  Pp and Pv are double
 * buffered by the parity of j (a slow block may still read step j's parts
 * while a fast one writes step j+1's).  Block 0 of each matrix (it holds the
 * panel's first 64 rows, so every pivot row) also writes tau and the column
 * y_cj = v_c . v_j of V^T V into the strictly lower triangle of Tw, and at the
 * end forms T there (gpu_t_factor).  Launched with 256 threads.
 *
 * Layout of the float64 buffer D: the pivot rows Pv first, then the parts Pp:
 *   Pv[(par * nbatch + b) * 32 + c],  Pp[((par * nbatch + b) * nrb + rbi) * 32 + c].
 */
KERNEL void gpu_qr_steps(cap_t A, cap_t tau, cap_t Tw, cap_t D, int64_t n, int64_t k0,
                         int64_t nb, int64_t nbatch, int64_t nrb)
{
    double smem_red[256];
    double smem_s[32];
    double smem_pv[32];
    int64_t t = rt_thread_idx();
    int64_t lane = t % 32;
    int64_t warp = t / 32;
    int64_t bid = rt_block_idx();
    int64_t b = bid / nrb;
    int64_t rbi = bid % nrb;
    int64_t rlo = k0 + rbi * 64;
    int64_t r0 = rlo + warp;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t Pv = D;
    cap_t Pp = cap_offset_f64(D, 2 * nbatch * 32);
    cap_t TT = cap_offset_f32(Tw, b * 1024);
    float a0 = 0.0f; float a1 = 0.0f; float a2 = 0.0f; float a3 = 0.0f;
    float a4 = 0.0f; float a5 = 0.0f; float a6 = 0.0f; float a7 = 0.0f;
    if (lane < nb) {
        if (r0 < n) a0 = cap_load_f32(M, r0 * n + k0 + lane);
        if (r0 + 8 < n) a1 = cap_load_f32(M, (r0 + 8) * n + k0 + lane);
        if (r0 + 16 < n) a2 = cap_load_f32(M, (r0 + 16) * n + k0 + lane);
        if (r0 + 24 < n) a3 = cap_load_f32(M, (r0 + 24) * n + k0 + lane);
        if (r0 + 32 < n) a4 = cap_load_f32(M, (r0 + 32) * n + k0 + lane);
        if (r0 + 40 < n) a5 = cap_load_f32(M, (r0 + 40) * n + k0 + lane);
        if (r0 + 48 < n) a6 = cap_load_f32(M, (r0 + 48) * n + k0 + lane);
        if (r0 + 56 < n) a7 = cap_load_f32(M, (r0 + 56) * n + k0 + lane);
    }
    /* p = -1 sets up column 0 the way step p sets up column p + 1: this block's part
     * of the sums s_c over rows below the pivot, and the pivot row */
    for (int64_t p = -1; p < nb; p++) {
        int64_t kp = k0 + p;
        if (p >= 0) {
            int64_t par = p % 2;
            int64_t pb = (par * nbatch + b) * nrb;
            double q = 0.0;
            for (int64_t i = warp; i < nrb; i += 32) {
                double p0 = cap_load_f64(Pp, (pb + i) * 32 + lane);
                double p1 = i + 8 < nrb ? cap_load_f64(Pp, (pb + i + 8) * 32 + lane) : 0.0;
                double p2 = i + 16 < nrb ? cap_load_f64(Pp, (pb + i + 16) * 32 + lane) : 0.0;
                double p3 = i + 24 < nrb ? cap_load_f64(Pp, (pb + i + 24) * 32 + lane) : 0.0;
                q += (p0 + p1) + (p2 + p3);
            }
            smem_red[t] = q;
            if (t < 32)
                smem_pv[t] = cap_load_f64(Pv, (par * nbatch + b) * 32 + t);
            rt_sync_threads();
            if (t < 32) {
                double s = 0.0;
                for (int64_t w = 0; w < 8; w++)
                    s += smem_red[w * 32 + t];
                smem_s[t] = s;
            }
            rt_sync_threads();
            double alpha = smem_pv[p];
            double xn2 = smem_s[p];
            double beta = reflector_beta(alpha, xn2);
            double tk = reflector_tau(alpha, beta, xn2);
            double scale = reflector_scale(alpha, beta, xn2);
            float scalef = (float)scale;
            float wc = 0.0f;
            if (lane > p && lane < nb)
                wc = (float)(tk * (smem_pv[lane] + smem_s[lane] * scale));
            /* column p of this thread's rows, from lane p */
            float x0 = rt_shfl_idx_f32(a0, p); float x1 = rt_shfl_idx_f32(a1, p);
            float x2 = rt_shfl_idx_f32(a2, p); float x3 = rt_shfl_idx_f32(a3, p);
            float x4 = rt_shfl_idx_f32(a4, p); float x5 = rt_shfl_idx_f32(a5, p);
            float x6 = rt_shfl_idx_f32(a6, p); float x7 = rt_shfl_idx_f32(a7, p);
            if (lane == p) {
                a0 = r0 > kp ? x0 * scalef : (r0 == kp ? (float)beta : a0);
                a1 = r0 + 8 > kp ? x1 * scalef : (r0 + 8 == kp ? (float)beta : a1);
                a2 = r0 + 16 > kp ? x2 * scalef : (r0 + 16 == kp ? (float)beta : a2);
                a3 = r0 + 24 > kp ? x3 * scalef : (r0 + 24 == kp ? (float)beta : a3);
                a4 = r0 + 32 > kp ? x4 * scalef : (r0 + 32 == kp ? (float)beta : a4);
                a5 = r0 + 40 > kp ? x5 * scalef : (r0 + 40 == kp ? (float)beta : a5);
                a6 = r0 + 48 > kp ? x6 * scalef : (r0 + 48 == kp ? (float)beta : a6);
                a7 = r0 + 56 > kp ? x7 * scalef : (r0 + 56 == kp ? (float)beta : a7);
            }
            if (lane > p && lane < nb) {
                a0 = r0 > kp ? fmaf(-(x0 * scalef), wc, a0) : (r0 == kp ? a0 - wc : a0);
                a1 = r0 + 8 > kp ? fmaf(-(x1 * scalef), wc, a1) : (r0 + 8 == kp ? a1 - wc : a1);
                a2 = r0 + 16 > kp ? fmaf(-(x2 * scalef), wc, a2) : (r0 + 16 == kp ? a2 - wc : a2);
                a3 = r0 + 24 > kp ? fmaf(-(x3 * scalef), wc, a3) : (r0 + 24 == kp ? a3 - wc : a3);
                a4 = r0 + 32 > kp ? fmaf(-(x4 * scalef), wc, a4) : (r0 + 32 == kp ? a4 - wc : a4);
                a5 = r0 + 40 > kp ? fmaf(-(x5 * scalef), wc, a5) : (r0 + 40 == kp ? a5 - wc : a5);
                a6 = r0 + 48 > kp ? fmaf(-(x6 * scalef), wc, a6) : (r0 + 48 == kp ? a6 - wc : a6);
                a7 = r0 + 56 > kp ? fmaf(-(x7 * scalef), wc, a7) : (r0 + 56 == kp ? a7 - wc : a7);
            }
            /* block 0: tau, and y_cp = v_c . v_p = A[kp][k0+c] + s_c / (alpha - beta) (c < p) */
            if (rbi == 0) {
                if (t < p)
                    cap_store_f32(TT, p * 32 + t, (float)(smem_pv[t] + smem_s[t] * scale));
                if (t == 0)
                    cap_store_f32(tau, b * n + k0 + p, (float)tk);
            }
        }
        if (p + 1 < nb) {
            /* this block's part of the sums for column p + 1 (rows below its pivot) and,
             * from the thread holding row kp + 1, the next pivot row */
            int64_t nxt = (p + 1) % 2;
            int64_t kn = kp + 1;
            float y0 = rt_shfl_idx_f32(a0, p + 1); float y1 = rt_shfl_idx_f32(a1, p + 1);
            float y2 = rt_shfl_idx_f32(a2, p + 1); float y3 = rt_shfl_idx_f32(a3, p + 1);
            float y4 = rt_shfl_idx_f32(a4, p + 1); float y5 = rt_shfl_idx_f32(a5, p + 1);
            float y6 = rt_shfl_idx_f32(a6, p + 1); float y7 = rt_shfl_idx_f32(a7, p + 1);
            double q = 0.0;
            if (lane < nb) {
                q = (r0 > kn ? (double)y0 * (double)a0 : 0.0)
                    + (r0 + 8 > kn ? (double)y1 * (double)a1 : 0.0)
                    + (r0 + 16 > kn ? (double)y2 * (double)a2 : 0.0)
                    + (r0 + 24 > kn ? (double)y3 * (double)a3 : 0.0);
                q += (r0 + 32 > kn ? (double)y4 * (double)a4 : 0.0)
                     + (r0 + 40 > kn ? (double)y5 * (double)a5 : 0.0)
                     + (r0 + 48 > kn ? (double)y6 * (double)a6 : 0.0)
                     + (r0 + 56 > kn ? (double)y7 * (double)a7 : 0.0);
            }
            smem_red[t] = q;
            rt_sync_threads();
            if (t < 32) {
                double s = 0.0;
                for (int64_t w = 0; w < 8; w++)
                    s += smem_red[w * 32 + t];
                cap_store_f64(Pp, ((nxt * nbatch + b) * nrb + rbi) * 32 + t, s);
            }
            if (r0 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a0);
            if (r0 + 8 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a1);
            if (r0 + 16 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a2);
            if (r0 + 24 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a3);
            if (r0 + 32 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a4);
            if (r0 + 40 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a5);
            if (r0 + 48 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a6);
            if (r0 + 56 == kn) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a7);
            rt_group_sync();
        }
    }
    if (lane < nb) {
        if (r0 < n) cap_store_f32(M, r0 * n + k0 + lane, a0);
        if (r0 + 8 < n) cap_store_f32(M, (r0 + 8) * n + k0 + lane, a1);
        if (r0 + 16 < n) cap_store_f32(M, (r0 + 16) * n + k0 + lane, a2);
        if (r0 + 24 < n) cap_store_f32(M, (r0 + 24) * n + k0 + lane, a3);
        if (r0 + 32 < n) cap_store_f32(M, (r0 + 32) * n + k0 + lane, a4);
        if (r0 + 40 < n) cap_store_f32(M, (r0 + 40) * n + k0 + lane, a5);
        if (r0 + 48 < n) cap_store_f32(M, (r0 + 48) * n + k0 + lane, a6);
        if (r0 + 56 < n) cap_store_f32(M, (r0 + 56) * n + k0 + lane, a7);
    }
    if (rbi != 0)
        return;
    gpu_t_factor(TT, tau, b * n + k0, nb);
}
