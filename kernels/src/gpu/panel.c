/*
 * Blocked Householder QR on the GPU, part 1: the panel (one block per matrix).
 *
 * A holds `batch` row-major n x n float32 matrices; columns k0 .. k0+nb-1
 * (nb <= 32) of rows k0 .. n-1 are already updated by the earlier panels.
 * This kernel factors them as LAPACK's sgeqr2 does (the slarfg scalars of
 * reflector.c), leaving R on/above the diagonal and v below it, tau[b*n + k0 + j],
 * and the compact-WY factor T (nb x nb upper triangular, zero-padded to 32 x 32)
 * of H(k0) ... H(k0+nb-1) = I - V T V^T in Tw[b*1024 ...] for gpu_qr_update
 * (t_factor.c).  Composed with both files by kernels/sources.py (gpu_panel).
 *
 * Thread layout: lane = t % 32 is the panel column, warp w = t / 32 takes the
 * rows kj+1+w, kj+1+w+nw, ... (a warp reads one 128-byte row segment per
 * step: coalesced).  For column j one pass gives every lane c the sum over the
 * rows below the diagonal of x[r] * A[r][c] (double: graded, huge and tiny
 * inputs neither overflow nor underflow); from it and row kj every thread
 * derives ||x||, tau, and v . a_c = A[kj][c] + scale * sum, so
 *   c > j:  w_c = tau (v . a_c), the update a_c -= v w_c;
 *   c < j:  y_cj = v_c . v_j, stored in row j of Tw's strictly lower triangle,
 *           from which gpu_t_factor forms T at the end.
 * Four barriers per column.  Launched with 512 threads (written into the kernel
 * as P, so the loop steps and their hoisted range checks are constants).
 */
KERNEL void gpu_qr_panel(cap_t A, cap_t tau, cap_t Tw, int64_t n, int64_t k0, int64_t nb)
{
    double smem_red[1024];
    double smem_tot[32];
    float smem_w[32];
    int64_t b = rt_block_idx();
    int64_t t = rt_thread_idx();
    int64_t P = 512;    /* launched with exactly 512 threads: constant loop steps */
    int64_t lane = t % 32;
    int64_t warp = t / 32;
    int64_t nw = P / 32;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t tb = cap_offset_f32(tau, b * n);
    cap_t TT = cap_offset_f32(Tw, b * 1024);
    for (int64_t j = 0; j < nb; j++) {
        int64_t kj = k0 + j;
        /* this thread's rows: r1, r1 + nw, ... below n; four per step so that eight
         * loads are in flight before the first multiply (in-order issue), the rest
         * (fewer than four) from rtail on.  The loops are bounded by n itself, so one
         * interval check before the column loop covers every column's rows. */
        int64_t r1 = kj + 1 + warp;
        int64_t cnt = r1 < n ? (n - r1 + nw - 1) / nw : 0;
        int64_t rtail = r1 + cnt / 4 * 4 * nw;
        double q = 0.0;
        if (lane < nb) {
            int64_t c = k0 + lane;
            double q1 = 0.0;
            double q2 = 0.0;
            double q3 = 0.0;
            for (int64_t r = r1; r < n - 3 * nw; r += 4 * nw) {
                float x0 = cap_load_f32(M, r * n + kj);
                float x1 = cap_load_f32(M, (r + nw) * n + kj);
                float x2 = cap_load_f32(M, (r + 2 * nw) * n + kj);
                float x3 = cap_load_f32(M, (r + 3 * nw) * n + kj);
                float y0 = cap_load_f32(M, r * n + c);
                float y1 = cap_load_f32(M, (r + nw) * n + c);
                float y2 = cap_load_f32(M, (r + 2 * nw) * n + c);
                float y3 = cap_load_f32(M, (r + 3 * nw) * n + c);
                q += (double)x0 * (double)y0;
                q1 += (double)x1 * (double)y1;
                q2 += (double)x2 * (double)y2;
                q3 += (double)x3 * (double)y3;
            }
            for (int64_t r = rtail; r < n; r += nw)
                q += (double)cap_load_f32(M, r * n + kj) * (double)cap_load_f32(M, r * n + c);
            q = (q + q1) + (q2 + q3);
        }
        smem_red[warp * 32 + lane] = q;
        rt_sync_threads();
        if (t < 32) {
            double s = 0.0;
            for (int64_t w = 0; w < nw; w++)
                s += smem_red[w * 32 + t];
            smem_tot[t] = s;
        }
        rt_sync_threads();
        double alpha = (double)cap_load_f32(M, kj * n + kj);
        double xn2 = smem_tot[j];
        double beta = reflector_beta(alpha, xn2);
        double tk = reflector_tau(alpha, beta, xn2);
        double scale = reflector_scale(alpha, beta, xn2);
        float scalef = (float)scale;
        if (t < nb) {
            double d = (double)cap_load_f32(M, kj * n + k0 + t) + smem_tot[t] * scale;
            if (t > j)
                smem_w[t] = (float)(tk * d);
            if (t < j)
                cap_store_f32(TT, j * 32 + t, (float)d);
        }
        rt_sync_threads();
        if (lane > j && lane < nb) {
            int64_t cu = k0 + lane;
            float wc = smem_w[lane];
            for (int64_t r = r1; r < n - 3 * nw; r += 4 * nw) {
                float x0 = cap_load_f32(M, r * n + kj);
                float x1 = cap_load_f32(M, (r + nw) * n + kj);
                float x2 = cap_load_f32(M, (r + 2 * nw) * n + kj);
                float x3 = cap_load_f32(M, (r + 3 * nw) * n + kj);
                float a0 = cap_load_f32(M, r * n + cu);
                float a1 = cap_load_f32(M, (r + nw) * n + cu);
                float a2 = cap_load_f32(M, (r + 2 * nw) * n + cu);
                float a3 = cap_load_f32(M, (r + 3 * nw) * n + cu);
                float v0 = x0 * scalef;
                float v1 = x1 * scalef;
                float v2 = x2 * scalef;
                float v3 = x3 * scalef;
                cap_store_f32(M, r * n + cu, fmaf(-v0, wc, a0));
                cap_store_f32(M, (r + nw) * n + cu, fmaf(-v1, wc, a1));
                cap_store_f32(M, (r + 2 * nw) * n + cu, fmaf(-v2, wc, a2));
                cap_store_f32(M, (r + 3 * nw) * n + cu, fmaf(-v3, wc, a3));
            }
            for (int64_t r = rtail; r < n; r += nw) {
                float v = cap_load_f32(M, r * n + kj) * scalef;
                cap_store_f32(M, r * n + cu, fmaf(-v, wc, cap_load_f32(M, r * n + cu)));
            }
            if (warp == 0)
                cap_store_f32(M, kj * n + cu, cap_load_f32(M, kj * n + cu) - wc);
        }
        rt_sync_threads();
        /* v = x / (alpha - beta): rows kj + 1 + t, + P, ... (as the sums, four per step) */
        int64_t rc = kj + 1 + t;
        int64_t cc = rc < n ? (n - rc + P - 1) / P : 0;
        int64_t rctail = rc + cc / 4 * 4 * P;
        for (int64_t r = rc; r < n - 3 * P; r += 4 * P) {
            float x0 = cap_load_f32(M, r * n + kj);
            float x1 = cap_load_f32(M, (r + P) * n + kj);
            float x2 = cap_load_f32(M, (r + 2 * P) * n + kj);
            float x3 = cap_load_f32(M, (r + 3 * P) * n + kj);
            cap_store_f32(M, r * n + kj, x0 * scalef);
            cap_store_f32(M, (r + P) * n + kj, x1 * scalef);
            cap_store_f32(M, (r + 2 * P) * n + kj, x2 * scalef);
            cap_store_f32(M, (r + 3 * P) * n + kj, x3 * scalef);
        }
        for (int64_t r = rctail; r < n; r += P)
            cap_store_f32(M, r * n + kj, cap_load_f32(M, r * n + kj) * scalef);
        if (t == 0) {
            cap_store_f32(M, kj * n + kj, (float)beta);
            cap_store_f32(tb, kj, (float)tk);
        }
        rt_sync_threads();
    }
    gpu_t_factor(TT, tb, k0, nb);
}
