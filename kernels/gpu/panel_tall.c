/*
 * Blocked Householder QR on the GPU, part 1 for tall panels (one block per matrix).
 *
 * Same contract as gpu_qr_panel (kernels/gpu/panel.c): factor columns k0 .. k0+nb-1
 * (nb <= 32) of rows k0 .. n-1, write tau and the 32 x 32 T factor to Tw.  For
 * a tall panel the column-by-column passes of panel.c stream m x 128 bytes per
 * column from L2; here the panel is factored in sub-panels of 8 columns, each
 * copied to a contiguous scratch area Pw[b*n*8 ...] (32 bytes a row, so
 * 4096 rows fit in L1) where its eight reflectors are formed exactly as in
 * panel.c (double sums, LAPACK's slarfg formulas).  The sub-panel goes back to
 * A and its block reflector I - V_s T_s V_s^T is applied to the panel's
 * columns to its right with two streaming passes (Z = V_s^T C, C -= V_s T_s^T Z).
 * Last, T of the whole panel comes from the Gram matrix G = V^T V (slarft:
 * T[i][j] = -tau_j sum_{l=i}^{j-1} T[i][l] G[l][j]), computed from 64-row chunks of
 * V in shared memory with 4 x 4 register tiles (threads 0 .. 255).
 * Launched with 512 threads.
 */
KERNEL void gpu_qr_panel_tall(cap_t A, cap_t tau, cap_t Tw, cap_t Pw, int64_t n, int64_t k0,
                              int64_t nb)
{
    double smem_red[512];
    double smem_tot[8];
    float smem_w8[8];
    float smem_ys[64];
    float smem_ts[64];
    float smem_taus[32];
    float smem_zr[6272];
    float smem_ws[256];
    float smem_tt[1024];
    float smem_g[1024];
    int64_t b = rt_block_idx();
    int64_t t = rt_thread_idx();
    int64_t P = rt_block_dim();
    int64_t lane = t % 32;
    int64_t warp = t / 32;
    int64_t nw = P / 32;
    int64_t c8 = t % 8;
    int64_t g8 = t / 8;
    int64_t ng8 = P / 8;
    int64_t g = t / 64;
    int64_t qg = (t % 64) / 8;
    int64_t cg = t % 8;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t tb = cap_offset_f32(tau, b * n);
    cap_t TT = cap_offset_f32(Tw, b * 1024);
    cap_t S = cap_offset_f32(Pw, b * n * 8);
    for (int64_t s0 = 0; s0 < nb; s0 += 8) {
        int64_t ks = k0 + s0;
        int64_t nbs = nb - s0 < 8 ? nb - s0 : 8;
        if (c8 < nbs) {
            for (int64_t r = ks + g8; r < n; r += ng8)
                cap_store_f32(S, r * 8 + c8, cap_load_f32(M, r * n + ks + c8));
        }
        rt_sync_threads();
        for (int64_t j = 0; j < nbs; j++) {
            int64_t kj = ks + j;
            double q = 0.0;
            if (c8 < nbs) {
                for (int64_t r = kj + 1 + g8; r < n; r += ng8)
                    q += (double)cap_load_f32(S, r * 8 + j) * (double)cap_load_f32(S, r * 8 + c8);
            }
            smem_red[g8 * 8 + c8] = q;
            rt_sync_threads();
            if (t < 8) {
                double sum = 0.0;
                for (int64_t gg = 0; gg < ng8; gg++)
                    sum += smem_red[gg * 8 + t];
                smem_tot[t] = sum;
            }
            rt_sync_threads();
            double alpha = (double)cap_load_f32(S, kj * 8 + j);
            double xn2 = smem_tot[j];
            double tk = 0.0;
            double beta = alpha;
            double scale = 0.0;
            if (xn2 > 0.0) {
                beta = -copysign(sqrt(alpha * alpha + xn2), alpha);
                tk = (beta - alpha) / beta;
                scale = 1.0 / (alpha - beta);
            }
            float scalef = (float)scale;
            if (t < nbs) {
                double d = (double)cap_load_f32(S, kj * 8 + t) + smem_tot[t] * scale;
                if (t > j)
                    smem_w8[t] = (float)(tk * d);
                if (t < j)
                    smem_ys[t * 8 + j] = (float)d;
            }
            rt_sync_threads();
            if (c8 > j && c8 < nbs) {
                float wc = smem_w8[c8];
                for (int64_t r = kj + 1 + g8; r < n; r += ng8) {
                    float v = cap_load_f32(S, r * 8 + j) * scalef;
                    cap_store_f32(S, r * 8 + c8, fmaf(-v, wc, cap_load_f32(S, r * 8 + c8)));
                }
                if (g8 == 0)
                    cap_store_f32(S, kj * 8 + c8, cap_load_f32(S, kj * 8 + c8) - wc);
            }
            rt_sync_threads();
            for (int64_t r = kj + 1 + t; r < n; r += P)
                cap_store_f32(S, r * 8 + j, cap_load_f32(S, r * 8 + j) * scalef);
            if (t == 0) {
                cap_store_f32(S, kj * 8 + j, (float)beta);
                cap_store_f32(tb, kj, (float)tk);
                smem_taus[s0 + j] = (float)tk;
            }
            rt_sync_threads();
        }
        if (c8 < nbs) {
            for (int64_t r = ks + g8; r < n; r += ng8)
                cap_store_f32(M, r * n + ks + c8, cap_load_f32(S, r * 8 + c8));
        }
        /* T_s of the sub-panel: thread i owns row i (no barrier inside) */
        if (t < 8) {
            for (int64_t j = 0; j < 8; j++) {
                float tv = 0.0f;
                if (t < nbs && j < nbs) {
                    if (t == j)
                        tv = smem_taus[s0 + j];
                    if (t < j) {
                        float sum = 0.0f;
                        for (int64_t l = t; l < j; l++)
                            sum = fmaf(smem_ts[t * 8 + l], smem_ys[l * 8 + j], sum);
                        tv = -smem_taus[s0 + j] * sum;
                    }
                }
                smem_ts[t * 8 + j] = tv;
            }
        }
        rt_sync_threads();
        int64_t c1 = s0 + 8;
        if (c1 < nb) {
            float z0 = 0.0f; float z1 = 0.0f; float z2 = 0.0f; float z3 = 0.0f; float z4 = 0.0f; float z5 = 0.0f; float z6 = 0.0f; float z7 = 0.0f;
            int64_t act = lane >= c1 && lane < nb;
            /* head rows ks .. ks+7: v_q is 0 above row ks+q and 1 on it */
            if (act && warp == 0) {
                for (int64_t r = ks; r < ks + 8 && r < n; r++) {
                    float a = cap_load_f32(M, r * n + k0 + lane);
                    float v0 = r > ks + 0 ? cap_load_f32(S, r * 8 + 0) : (r == ks + 0 ? 1.0f : 0.0f);
                    float v1 = r > ks + 1 ? cap_load_f32(S, r * 8 + 1) : (r == ks + 1 ? 1.0f : 0.0f);
                    float v2 = r > ks + 2 ? cap_load_f32(S, r * 8 + 2) : (r == ks + 2 ? 1.0f : 0.0f);
                    float v3 = r > ks + 3 ? cap_load_f32(S, r * 8 + 3) : (r == ks + 3 ? 1.0f : 0.0f);
                    float v4 = r > ks + 4 ? cap_load_f32(S, r * 8 + 4) : (r == ks + 4 ? 1.0f : 0.0f);
                    float v5 = r > ks + 5 ? cap_load_f32(S, r * 8 + 5) : (r == ks + 5 ? 1.0f : 0.0f);
                    float v6 = r > ks + 6 ? cap_load_f32(S, r * 8 + 6) : (r == ks + 6 ? 1.0f : 0.0f);
                    float v7 = r > ks + 7 ? cap_load_f32(S, r * 8 + 7) : (r == ks + 7 ? 1.0f : 0.0f);
                    z0 = fmaf(v0, a, z0);
                    z1 = fmaf(v1, a, z1);
                    z2 = fmaf(v2, a, z2);
                    z3 = fmaf(v3, a, z3);
                    z4 = fmaf(v4, a, z4);
                    z5 = fmaf(v5, a, z5);
                    z6 = fmaf(v6, a, z6);
                    z7 = fmaf(v7, a, z7);
                }
            }
            if (act) {
                for (int64_t r = ks + 8 + warp; r < n; r += nw) {
                    float a = cap_load_f32(M, r * n + k0 + lane);
                    z0 = fmaf(cap_load_f32(S, r * 8 + 0), a, z0);
                    z1 = fmaf(cap_load_f32(S, r * 8 + 1), a, z1);
                    z2 = fmaf(cap_load_f32(S, r * 8 + 2), a, z2);
                    z3 = fmaf(cap_load_f32(S, r * 8 + 3), a, z3);
                    z4 = fmaf(cap_load_f32(S, r * 8 + 4), a, z4);
                    z5 = fmaf(cap_load_f32(S, r * 8 + 5), a, z5);
                    z6 = fmaf(cap_load_f32(S, r * 8 + 6), a, z6);
                    z7 = fmaf(cap_load_f32(S, r * 8 + 7), a, z7);
                }
            }
            smem_zr[(warp * 8 + 0) * 32 + lane] = z0;
            smem_zr[(warp * 8 + 1) * 32 + lane] = z1;
            smem_zr[(warp * 8 + 2) * 32 + lane] = z2;
            smem_zr[(warp * 8 + 3) * 32 + lane] = z3;
            smem_zr[(warp * 8 + 4) * 32 + lane] = z4;
            smem_zr[(warp * 8 + 5) * 32 + lane] = z5;
            smem_zr[(warp * 8 + 6) * 32 + lane] = z6;
            smem_zr[(warp * 8 + 7) * 32 + lane] = z7;
            rt_sync_threads();
            for (int64_t e = t; e < 256; e += P) {
                float sum = 0.0f;
                for (int64_t w = 0; w < nw; w++)
                    sum += smem_zr[w * 256 + e];
                smem_ws[e] = sum;
            }
            rt_sync_threads();
            for (int64_t e = t; e < 256; e += P) {
                int64_t qq = e / 32;
                int64_t cc = e % 32;
                float sum = 0.0f;
                for (int64_t l = 0; l <= qq; l++)
                    sum = fmaf(smem_ts[l * 8 + qq], smem_ws[l * 32 + cc], sum);
                smem_zr[e] = sum;
            }
            rt_sync_threads();
            if (act) {
                float w0 = smem_zr[0 * 32 + lane];
                float w1 = smem_zr[1 * 32 + lane];
                float w2 = smem_zr[2 * 32 + lane];
                float w3 = smem_zr[3 * 32 + lane];
                float w4 = smem_zr[4 * 32 + lane];
                float w5 = smem_zr[5 * 32 + lane];
                float w6 = smem_zr[6 * 32 + lane];
                float w7 = smem_zr[7 * 32 + lane];
                if (warp == 0) {
                    for (int64_t r = ks; r < ks + 8 && r < n; r++) {
                        float a = cap_load_f32(M, r * n + k0 + lane);
                        float u0 = r > ks + 0 ? cap_load_f32(S, r * 8 + 0) : (r == ks + 0 ? 1.0f : 0.0f);
                        float u1 = r > ks + 1 ? cap_load_f32(S, r * 8 + 1) : (r == ks + 1 ? 1.0f : 0.0f);
                        float u2 = r > ks + 2 ? cap_load_f32(S, r * 8 + 2) : (r == ks + 2 ? 1.0f : 0.0f);
                        float u3 = r > ks + 3 ? cap_load_f32(S, r * 8 + 3) : (r == ks + 3 ? 1.0f : 0.0f);
                        float u4 = r > ks + 4 ? cap_load_f32(S, r * 8 + 4) : (r == ks + 4 ? 1.0f : 0.0f);
                        float u5 = r > ks + 5 ? cap_load_f32(S, r * 8 + 5) : (r == ks + 5 ? 1.0f : 0.0f);
                        float u6 = r > ks + 6 ? cap_load_f32(S, r * 8 + 6) : (r == ks + 6 ? 1.0f : 0.0f);
                        float u7 = r > ks + 7 ? cap_load_f32(S, r * 8 + 7) : (r == ks + 7 ? 1.0f : 0.0f);
                        a = fmaf(-u0, w0, a);
                        a = fmaf(-u1, w1, a);
                        a = fmaf(-u2, w2, a);
                        a = fmaf(-u3, w3, a);
                        a = fmaf(-u4, w4, a);
                        a = fmaf(-u5, w5, a);
                        a = fmaf(-u6, w6, a);
                        a = fmaf(-u7, w7, a);
                        cap_store_f32(M, r * n + k0 + lane, a);
                    }
                }
                for (int64_t r = ks + 8 + warp; r < n; r += nw) {
                    float a = cap_load_f32(M, r * n + k0 + lane);
                    a = fmaf(-cap_load_f32(S, r * 8 + 0), w0, a);
                    a = fmaf(-cap_load_f32(S, r * 8 + 1), w1, a);
                    a = fmaf(-cap_load_f32(S, r * 8 + 2), w2, a);
                    a = fmaf(-cap_load_f32(S, r * 8 + 3), w3, a);
                    a = fmaf(-cap_load_f32(S, r * 8 + 4), w4, a);
                    a = fmaf(-cap_load_f32(S, r * 8 + 5), w5, a);
                    a = fmaf(-cap_load_f32(S, r * 8 + 6), w6, a);
                    a = fmaf(-cap_load_f32(S, r * 8 + 7), w7, a);
                    cap_store_f32(M, r * n + k0 + lane, a);
                }
            }
            rt_sync_threads();
        }
    }
    /* Gram matrix G = V^T V of the whole panel (V unit lower trapezoidal in A) */
    float y00 = 0.0f; float y01 = 0.0f; float y02 = 0.0f; float y03 = 0.0f;
    float y10 = 0.0f; float y11 = 0.0f; float y12 = 0.0f; float y13 = 0.0f;
    float y20 = 0.0f; float y21 = 0.0f; float y22 = 0.0f; float y23 = 0.0f;
    float y30 = 0.0f; float y31 = 0.0f; float y32 = 0.0f; float y33 = 0.0f;
    for (int64_t r0 = k0; r0 < n; r0 += 64) {
        int64_t rows = n - r0 < 64 ? n - r0 : 64;
        for (int64_t rr = warp; rr < rows; rr += nw) {
            float v = 0.0f;
            if (lane < nb && r0 + rr > k0 + lane)
                v = cap_load_f32(M, (r0 + rr) * n + k0 + lane);
            if (lane < nb && r0 + rr == k0 + lane)
                v = 1.0f;
            smem_zr[rr * 33 + lane] = v;
        }
        for (int64_t rr = rows + warp; rr < 64; rr += nw)
            smem_zr[rr * 33 + lane] = 0.0f;
        rt_sync_threads();
        if (t < 256) {
            for (int64_t rr = g; rr < 64; rr += 4) {
                float p0 = smem_zr[rr * 33 + qg + 0];
                float p1 = smem_zr[rr * 33 + qg + 8];
                float p2 = smem_zr[rr * 33 + qg + 16];
                float p3 = smem_zr[rr * 33 + qg + 24];
                float h0 = smem_zr[rr * 33 + cg + 0];
                float h1 = smem_zr[rr * 33 + cg + 8];
                float h2 = smem_zr[rr * 33 + cg + 16];
                float h3 = smem_zr[rr * 33 + cg + 24];
                y00 = fmaf(p0, h0, y00);
                y01 = fmaf(p0, h1, y01);
                y02 = fmaf(p0, h2, y02);
                y03 = fmaf(p0, h3, y03);
                y10 = fmaf(p1, h0, y10);
                y11 = fmaf(p1, h1, y11);
                y12 = fmaf(p1, h2, y12);
                y13 = fmaf(p1, h3, y13);
                y20 = fmaf(p2, h0, y20);
                y21 = fmaf(p2, h1, y21);
                y22 = fmaf(p2, h2, y22);
                y23 = fmaf(p2, h3, y23);
                y30 = fmaf(p3, h0, y30);
                y31 = fmaf(p3, h1, y31);
                y32 = fmaf(p3, h2, y32);
                y33 = fmaf(p3, h3, y33);
            }
        }
        rt_sync_threads();
    }
    if (t < 256) {
        smem_zr[2176 + g * 1024 + (qg + 0) * 32 + cg + 0] = y00;
        smem_zr[2176 + g * 1024 + (qg + 0) * 32 + cg + 8] = y01;
        smem_zr[2176 + g * 1024 + (qg + 0) * 32 + cg + 16] = y02;
        smem_zr[2176 + g * 1024 + (qg + 0) * 32 + cg + 24] = y03;
        smem_zr[2176 + g * 1024 + (qg + 8) * 32 + cg + 0] = y10;
        smem_zr[2176 + g * 1024 + (qg + 8) * 32 + cg + 8] = y11;
        smem_zr[2176 + g * 1024 + (qg + 8) * 32 + cg + 16] = y12;
        smem_zr[2176 + g * 1024 + (qg + 8) * 32 + cg + 24] = y13;
        smem_zr[2176 + g * 1024 + (qg + 16) * 32 + cg + 0] = y20;
        smem_zr[2176 + g * 1024 + (qg + 16) * 32 + cg + 8] = y21;
        smem_zr[2176 + g * 1024 + (qg + 16) * 32 + cg + 16] = y22;
        smem_zr[2176 + g * 1024 + (qg + 16) * 32 + cg + 24] = y23;
        smem_zr[2176 + g * 1024 + (qg + 24) * 32 + cg + 0] = y30;
        smem_zr[2176 + g * 1024 + (qg + 24) * 32 + cg + 8] = y31;
        smem_zr[2176 + g * 1024 + (qg + 24) * 32 + cg + 16] = y32;
        smem_zr[2176 + g * 1024 + (qg + 24) * 32 + cg + 24] = y33;
    }
    rt_sync_threads();
    for (int64_t e = t; e < 1024; e += P)
        smem_g[e] = (smem_zr[2176 + e] + smem_zr[3200 + e]) + (smem_zr[4224 + e] + smem_zr[5248 + e]);
    rt_sync_threads();
    /* T (slarft from G): thread i owns row i */
    if (t < 32) {
        for (int64_t j = 0; j < 32; j++) {
            float tv = 0.0f;
            if (t < nb && j < nb) {
                if (t == j)
                    tv = smem_taus[j];
                if (t < j) {
                    float sum = 0.0f;
                    for (int64_t l = t; l < j; l++)
                        sum = fmaf(smem_tt[t * 32 + l], smem_g[l * 32 + j], sum);
                    tv = -smem_taus[j] * sum;
                }
            }
            smem_tt[t * 32 + j] = tv;
            cap_store_f32(TT, t * 32 + j, tv);
        }
    }
}
