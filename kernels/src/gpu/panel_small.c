/*
 * Blocked Householder QR on the GPU, part 1 for short panels (one block per matrix).
 *
 * Same contract and arithmetic as gpu_qr_panel (panel.c; the same reflector.c and
 * t_factor.c, composed by kernels/sources.py: gpu_panel_small), for
 * panels of at most 256 rows: the panel is copied to shared memory first
 * (row stride 33: a warp reading a row, or the block reading a column, hits
 * 32 distinct banks), factored there, and copied back, so the column steps
 * wait on shared memory instead of L1/L2.  Launched with 256 threads (P below:
 * constant loop steps).
 */
KERNEL void gpu_qr_panel_small(cap_t A, cap_t tau, cap_t Tw, int64_t n, int64_t k0, int64_t nb)
{
    float smem_p[8448];
    double smem_red[512];
    double smem_tot[32];
    float smem_w[32];
    int64_t b = rt_block_idx();
    int64_t t = rt_thread_idx();
    int64_t P = 256;    /* launched with exactly 256 threads: constant loop steps */
    int64_t lane = t % 32;
    int64_t warp = t / 32;
    int64_t nw = P / 32;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t tb = cap_offset_f32(tau, b * n);
    cap_t TT = cap_offset_f32(Tw, b * 1024);
    int64_t m = n - k0;
    if (lane < nb) {
        /* rows warp + nw * i; four loads in flight before their stores (in-order issue) */
        int64_t cnt = warp < m ? (m - warp + nw - 1) / nw : 0;
        int64_t c4 = cnt - cnt % 4;
        for (int64_t i = 0; i < c4; i += 4) {
            float x0 = cap_load_f32(M, (k0 + warp + i * nw) * n + k0 + lane);
            float x1 = cap_load_f32(M, (k0 + warp + i * nw + nw) * n + k0 + lane);
            float x2 = cap_load_f32(M, (k0 + warp + i * nw + 2 * nw) * n + k0 + lane);
            float x3 = cap_load_f32(M, (k0 + warp + i * nw + 3 * nw) * n + k0 + lane);
            smem_p[(warp + i * nw) * 33 + lane] = x0;
            smem_p[(warp + i * nw + nw) * 33 + lane] = x1;
            smem_p[(warp + i * nw + 2 * nw) * 33 + lane] = x2;
            smem_p[(warp + i * nw + 3 * nw) * 33 + lane] = x3;
        }
        for (int64_t i = c4; i < cnt; i++)
            smem_p[(warp + i * nw) * 33 + lane] = cap_load_f32(M, (k0 + warp + i * nw) * n + k0 + lane);
    }
    rt_sync_threads();
    for (int64_t j = 0; j < nb; j++) {
        double q = 0.0;
        if (lane < nb) {
            for (int64_t rr = j + 1 + warp; rr < m; rr += nw)
                q += (double)smem_p[rr * 33 + j] * (double)smem_p[rr * 33 + lane];
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
        double alpha = (double)smem_p[j * 33 + j];
        double xn2 = smem_tot[j];
        double beta = reflector_beta(alpha, xn2);
        double tk = reflector_tau(alpha, beta, xn2);
        double scale = reflector_scale(alpha, beta, xn2);
        float scalef = (float)scale;
        if (t < nb) {
            double d = (double)smem_p[j * 33 + t] + smem_tot[t] * scale;
            if (t > j)
                smem_w[t] = (float)(tk * d);
            if (t < j)
                cap_store_f32(TT, j * 32 + t, (float)d);
        }
        rt_sync_threads();
        if (lane > j && lane < nb) {
            float wc = smem_w[lane];
            for (int64_t rr = j + 1 + warp; rr < m; rr += nw) {
                float v = smem_p[rr * 33 + j] * scalef;
                smem_p[rr * 33 + lane] = fmaf(-v, wc, smem_p[rr * 33 + lane]);
            }
            if (warp == 0)
                smem_p[j * 33 + lane] = smem_p[j * 33 + lane] - wc;
        }
        rt_sync_threads();
        for (int64_t rr = j + 1 + t; rr < m; rr += P)
            smem_p[rr * 33 + j] = smem_p[rr * 33 + j] * scalef;
        if (t == 0) {
            smem_p[j * 33 + j] = (float)beta;
            cap_store_f32(tb, k0 + j, (float)tk);
        }
        rt_sync_threads();
    }
    if (lane < nb) {
        for (int64_t rr = warp; rr < m; rr += nw)
            cap_store_f32(M, (k0 + rr) * n + k0 + lane, smem_p[rr * 33 + lane]);
    }
    gpu_t_factor(TT, tb, k0, nb);
}
