/*
 * Blocked Householder QR on the GPU, part 1 for tall panels: one launch per column,
 * many blocks per matrix.
 *
 * Same contract as gpu_qr_panel (kernels/gpu/panel.c): factor columns k0 .. k0+nb-1
 * (nb <= 32) of rows k0 .. n-1 with LAPACK's slarfg formulas, write R, the
 * reflectors, tau and the 32 x 32 T factor (Tw[b*1024 ...], zero-padded).  A
 * single block per matrix leaves a batch of two 4096-row panels on two SMs, so
 * here the panel's rows are cut into blocks of RB = 64 rows and each column is
 * one launch over (matrix, row block); the kernel boundary is the grid-wide
 * barrier between columns.
 *
 * Step j needs, for every panel column c, s_c = sum over rows r > k0+j of
 * A[r][k0+j] * A[r][k0+c] (double) and the pivot row A[k0+j][k0 .. k0+nb-1].
 * Launch j reads them (the row blocks' parts of s from Pp, the pivot row from
 * Pv, both written by launch j-1 or by gpu_qr_steps_init), derives beta, tau
 * and w_c = tau (A[k0+j][k0+c] + s_c / (alpha - beta)) in every block, updates
 * its own rows, then writes its part of the sums for column j+1 and, in the
 * block holding row k0+j+1, the next pivot row.  Pp and Pv are double
 * buffered by the parity of j.  Block 0 of each matrix (it holds the panel's
 * first 64 rows, so every pivot row) also writes R's row, tau, and the column
 * y_cj = v_c . v_j of V^T V into the strictly lower triangle of Tw; the last
 * launch forms T there (slarft).  Launched with 256 threads: lane t % 32 is
 * the panel column, warp t / 32 takes rows warp, warp + 8, ... of the block.
 *
 * Layout of the float64 buffer D: the pivot rows Pv first, then the parts Pp:
 *   Pv[(par * nbatch + b) * 32 + c],  Pp[((par * nbatch + b) * nrb + rbi) * 32 + c].
 */
KERNEL void gpu_qr_steps_init(cap_t A, cap_t D, int64_t n, int64_t k0, int64_t nb,
                              int64_t nbatch, int64_t nrb)
{
    double smem_red[256];
    double smem_x[64];
    int64_t t = rt_thread_idx();
    int64_t lane = t % 32;
    int64_t warp = t / 32;
    int64_t bid = rt_block_idx();
    int64_t b = bid / nrb;
    int64_t rbi = bid % nrb;
    int64_t rlo = k0 + rbi * 64;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t Pv = D;
    cap_t Pp = cap_offset_f64(D, 2 * nbatch * 32);
    if (t < 64) {
        double x = 0.0;
        if (rlo + t < n && rlo + t > k0)
            x = (double)cap_load_f32(M, (rlo + t) * n + k0);
        smem_x[t] = x;
    }
    rt_sync_threads();
    double q = 0.0;
    if (lane < nb) {
        for (int64_t i = 0; i < 8; i++) {
            int64_t r = rlo + warp + 8 * i;
            if (r < n && r > k0)
                q += smem_x[warp + 8 * i] * (double)cap_load_f32(M, r * n + k0 + lane);
        }
    }
    smem_red[t] = q;
    rt_sync_threads();
    if (t < 32) {
        double s = 0.0;
        for (int64_t w = 0; w < 8; w++)
            s += smem_red[w * 32 + t];
        cap_store_f64(Pp, (b * nrb + rbi) * 32 + t, s);
        if (rbi == 0) {
            double p = 0.0;
            if (t < nb)
                p = (double)cap_load_f32(M, k0 * n + k0 + t);
            cap_store_f64(Pv, b * 32 + t, p);
        }
    }
}

KERNEL void gpu_qr_steps_column(cap_t A, cap_t tau, cap_t Tw, cap_t D, int64_t n, int64_t k0,
                                int64_t nb, int64_t nbatch, int64_t nrb, int64_t j)
{
    double smem_red[256];
    double smem_s[32];
    double smem_pv[32];
    double smem_x[64];
    float smem_y[1024];
    float smem_tau[32];
    float smem_tt[1024];
    int64_t t = rt_thread_idx();
    int64_t lane = t % 32;
    int64_t warp = t / 32;
    int64_t bid = rt_block_idx();
    int64_t b = bid / nrb;
    int64_t rbi = bid % nrb;
    int64_t rlo = k0 + rbi * 64;
    int64_t kj = k0 + j;
    int64_t par = j % 2;
    int64_t nxt = 1 - par;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t Pv = D;
    cap_t Pp = cap_offset_f64(D, 2 * nbatch * 32);
    /* the sums of step j: every block adds the row blocks' parts itself */
    double q = 0.0;
    for (int64_t i = warp; i < nrb; i += 8)
        q += cap_load_f64(Pp, ((par * nbatch + b) * nrb + i) * 32 + lane);
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
    double alpha = smem_pv[j];
    double xn2 = smem_s[j];
    double tk = 0.0;
    double beta = alpha;
    double scale = 0.0;
    if (xn2 > 0.0) {
        beta = -copysign(sqrt(alpha * alpha + xn2), alpha);
        tk = (beta - alpha) / beta;
        scale = 1.0 / (alpha - beta);
    }
    float scalef = (float)scale;
    float wc = 0.0f;
    if (lane > j && lane < nb)
        wc = (float)(tk * (smem_pv[lane] + smem_s[lane] * scale));
    /* this block's rows: load, then (after the barrier: lane j overwrites column j,
     * which the other lanes read) write the updated values back */
    float a0 = 0.0f; float a1 = 0.0f; float a2 = 0.0f; float a3 = 0.0f;
    float a4 = 0.0f; float a5 = 0.0f; float a6 = 0.0f; float a7 = 0.0f;
    float x0 = 0.0f; float x1 = 0.0f; float x2 = 0.0f; float x3 = 0.0f;
    float x4 = 0.0f; float x5 = 0.0f; float x6 = 0.0f; float x7 = 0.0f;
    int64_t r0 = rlo + warp;
    if (lane < nb) {
        if (r0 < n) { a0 = cap_load_f32(M, r0 * n + k0 + lane); x0 = cap_load_f32(M, r0 * n + kj); }
        if (r0 + 8 < n) { a1 = cap_load_f32(M, (r0 + 8) * n + k0 + lane); x1 = cap_load_f32(M, (r0 + 8) * n + kj); }
        if (r0 + 16 < n) { a2 = cap_load_f32(M, (r0 + 16) * n + k0 + lane); x2 = cap_load_f32(M, (r0 + 16) * n + kj); }
        if (r0 + 24 < n) { a3 = cap_load_f32(M, (r0 + 24) * n + k0 + lane); x3 = cap_load_f32(M, (r0 + 24) * n + kj); }
        if (r0 + 32 < n) { a4 = cap_load_f32(M, (r0 + 32) * n + k0 + lane); x4 = cap_load_f32(M, (r0 + 32) * n + kj); }
        if (r0 + 40 < n) { a5 = cap_load_f32(M, (r0 + 40) * n + k0 + lane); x5 = cap_load_f32(M, (r0 + 40) * n + kj); }
        if (r0 + 48 < n) { a6 = cap_load_f32(M, (r0 + 48) * n + k0 + lane); x6 = cap_load_f32(M, (r0 + 48) * n + kj); }
        if (r0 + 56 < n) { a7 = cap_load_f32(M, (r0 + 56) * n + k0 + lane); x7 = cap_load_f32(M, (r0 + 56) * n + kj); }
    }
    rt_sync_threads();
    if (lane < nb && lane >= j) {
        /* rows below the pivot: a -= (x / (alpha - beta)) w (c > j), x scaled (c == j);
         * the pivot row: a -= w (v is 1 there), beta on the diagonal */
        if (lane == j) {
            a0 = r0 > kj ? x0 * scalef : (r0 == kj ? (float)beta : a0);
            a1 = r0 + 8 > kj ? x1 * scalef : (r0 + 8 == kj ? (float)beta : a1);
            a2 = r0 + 16 > kj ? x2 * scalef : (r0 + 16 == kj ? (float)beta : a2);
            a3 = r0 + 24 > kj ? x3 * scalef : (r0 + 24 == kj ? (float)beta : a3);
            a4 = r0 + 32 > kj ? x4 * scalef : (r0 + 32 == kj ? (float)beta : a4);
            a5 = r0 + 40 > kj ? x5 * scalef : (r0 + 40 == kj ? (float)beta : a5);
            a6 = r0 + 48 > kj ? x6 * scalef : (r0 + 48 == kj ? (float)beta : a6);
            a7 = r0 + 56 > kj ? x7 * scalef : (r0 + 56 == kj ? (float)beta : a7);
        } else {
            a0 = r0 > kj ? fmaf(-(x0 * scalef), wc, a0) : (r0 == kj ? a0 - wc : a0);
            a1 = r0 + 8 > kj ? fmaf(-(x1 * scalef), wc, a1) : (r0 + 8 == kj ? a1 - wc : a1);
            a2 = r0 + 16 > kj ? fmaf(-(x2 * scalef), wc, a2) : (r0 + 16 == kj ? a2 - wc : a2);
            a3 = r0 + 24 > kj ? fmaf(-(x3 * scalef), wc, a3) : (r0 + 24 == kj ? a3 - wc : a3);
            a4 = r0 + 32 > kj ? fmaf(-(x4 * scalef), wc, a4) : (r0 + 32 == kj ? a4 - wc : a4);
            a5 = r0 + 40 > kj ? fmaf(-(x5 * scalef), wc, a5) : (r0 + 40 == kj ? a5 - wc : a5);
            a6 = r0 + 48 > kj ? fmaf(-(x6 * scalef), wc, a6) : (r0 + 48 == kj ? a6 - wc : a6);
            a7 = r0 + 56 > kj ? fmaf(-(x7 * scalef), wc, a7) : (r0 + 56 == kj ? a7 - wc : a7);
        }
        if (r0 < n && r0 >= kj) cap_store_f32(M, r0 * n + k0 + lane, a0);
        if (r0 + 8 < n && r0 + 8 >= kj) cap_store_f32(M, (r0 + 8) * n + k0 + lane, a1);
        if (r0 + 16 < n && r0 + 16 >= kj) cap_store_f32(M, (r0 + 16) * n + k0 + lane, a2);
        if (r0 + 24 < n && r0 + 24 >= kj) cap_store_f32(M, (r0 + 24) * n + k0 + lane, a3);
        if (r0 + 32 < n && r0 + 32 >= kj) cap_store_f32(M, (r0 + 32) * n + k0 + lane, a4);
        if (r0 + 40 < n && r0 + 40 >= kj) cap_store_f32(M, (r0 + 40) * n + k0 + lane, a5);
        if (r0 + 48 < n && r0 + 48 >= kj) cap_store_f32(M, (r0 + 48) * n + k0 + lane, a6);
        if (r0 + 56 < n && r0 + 56 >= kj) cap_store_f32(M, (r0 + 56) * n + k0 + lane, a7);
    }
    /* column j+1 of this block's rows below its pivot, from lane j+1's registers */
    if (lane == j + 1) {
        smem_x[warp] = r0 > kj + 1 ? (double)a0 : 0.0;
        smem_x[warp + 8] = r0 + 8 > kj + 1 ? (double)a1 : 0.0;
        smem_x[warp + 16] = r0 + 16 > kj + 1 ? (double)a2 : 0.0;
        smem_x[warp + 24] = r0 + 24 > kj + 1 ? (double)a3 : 0.0;
        smem_x[warp + 32] = r0 + 32 > kj + 1 ? (double)a4 : 0.0;
        smem_x[warp + 40] = r0 + 40 > kj + 1 ? (double)a5 : 0.0;
        smem_x[warp + 48] = r0 + 48 > kj + 1 ? (double)a6 : 0.0;
        smem_x[warp + 56] = r0 + 56 > kj + 1 ? (double)a7 : 0.0;
    }
    rt_sync_threads();
    if (j + 1 < nb) {
        /* rows past n hold a = 0 and rows at or above the next pivot x = 0 */
        double p = 0.0;
        if (lane < nb) {
            p = smem_x[warp] * (double)a0 + smem_x[warp + 8] * (double)a1
                + smem_x[warp + 16] * (double)a2 + smem_x[warp + 24] * (double)a3;
            p += smem_x[warp + 32] * (double)a4 + smem_x[warp + 40] * (double)a5
                 + smem_x[warp + 48] * (double)a6 + smem_x[warp + 56] * (double)a7;
        }
        smem_red[t] = p;
        rt_sync_threads();
        if (t < 32) {
            double s = 0.0;
            for (int64_t w = 0; w < 8; w++)
                s += smem_red[w * 32 + t];
            cap_store_f64(Pp, ((nxt * nbatch + b) * nrb + rbi) * 32 + t, s);
        }
        /* the next pivot row, from the thread that holds row kj + 1 */
        if (r0 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a0);
        if (r0 + 8 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a1);
        if (r0 + 16 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a2);
        if (r0 + 24 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a3);
        if (r0 + 32 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a4);
        if (r0 + 40 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a5);
        if (r0 + 48 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a6);
        if (r0 + 56 == kj + 1) cap_store_f64(Pv, (nxt * nbatch + b) * 32 + lane, (double)a7);
    }
    if (rbi != 0)
        return;
    /* block 0: tau, and y_cj = v_c . v_j = A[kj][k0+c] + s_c / (alpha - beta) (c < j) */
    cap_t TT = cap_offset_f32(Tw, b * 1024);
    if (t < j)
        cap_store_f32(TT, j * 32 + t, (float)(smem_pv[t] + smem_s[t] * scale));
    if (t == 0)
        cap_store_f32(tau, b * n + kj, (float)tk);
    if (j + 1 < nb)
        return;
    /* last column: T (slarft, forward, columnwise) from y and tau; thread i owns row i */
    rt_sync_threads();
    for (int64_t e = t; e < 1024; e += 256) {
        int64_t r = e / 32;
        int64_t c = e % 32;
        smem_y[c * 32 + r] = r > c && r < nb ? cap_load_f32(TT, e) : 0.0f;
    }
    if (t < 32)
        smem_tau[t] = t < nb ? cap_load_f32(tau, b * n + k0 + t) : 0.0f;
    rt_sync_threads();
    if (t < 32) {
        for (int64_t jj = 0; jj < 32; jj++) {
            float v = 0.0f;
            if (t < nb && jj < nb) {
                if (t == jj)
                    v = smem_tau[jj];
                if (t < jj) {
                    float s = 0.0f;
                    for (int64_t l = t; l < jj; l++)
                        s = fmaf(smem_tt[t * 32 + l], smem_y[l * 32 + jj], s);
                    v = -smem_tau[jj] * s;
                }
            }
            smem_tt[t * 32 + jj] = v;
        }
    }
    rt_sync_threads();
    for (int64_t e = t; e < 1024; e += 256)
        cap_store_f32(TT, e, smem_tt[e]);
}
