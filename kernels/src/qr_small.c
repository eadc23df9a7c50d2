/*
 * Small matrices (family "qr_small", float32): up to 64 x 32, one block per
 * matrix, the whole matrix in a local array.  A batch of 32 x 32 matrices is
 * latency-bound in the general kernels (a column's reductions, scalar tails of
 * the trailing columns, xNRM2's divisions); here every row is four whole
 * vectors of 8 (the columns padded with zeros to 32), so the reflector's
 * application is branch-free full-width FMAs.
 *
 * Per column j (xGEQR2 with xLARFG's reflector):
 *   - ||x||^2 of x = A[j+1:m, j] summed in double: the square of a float can
 *     neither overflow nor underflow there, which is what xNRM2's scaling and
 *     xLARFG's rescaling loop are for (as in gpanel_qr, kernels/src/qrt_group.c);
 *   - beta = -sign(alpha) sqrt(alpha^2 + ||x||^2), tau = (beta - alpha) / beta,
 *     v = x / (alpha - beta), tau = 0 (H = I) when x is zero;
 *   - w = tau (A[j, :] + v^T A[j+1:m, :]) for the columns right of j, and
 *     A[j:m, :] -= (1, v) w^T; the columns up to j are stored back unchanged.
 *
 * src: the input, batch x m x lds; a: the result, batch x m x ld (each matrix in
 * the first n columns of the rows; src may be a itself, with lds = ld);
 * tau: batch x min(m, n); bad[block]: how many non-finite input elements the
 * block's matrices held.  The block reads its matrix from src and writes it to
 * a, so the host's input copy and NaN/Inf scan are this kernel's load loop (in
 * the workers' caches, not the launching thread's).  The host
 * (kernels/parallel.py) calls it only with m <= 64 and n <= 32; the clamps below
 * keep the local array in bounds anyway.
 */
KERNEL void qr_small_f32(cap_t src, cap_t a, cap_t tau, cap_t bad, int64_t batch, int64_t m,
                         int64_t n, int64_t lds, int64_t ld)
{
    float x[64][32];
    float w[32];
    m = m < 1 ? 1 : (m > 64 ? 64 : m);
    n = n < 1 ? 1 : (n > 32 ? 32 : n);
    ld = ld < n ? n : ld;
    lds = lds < n ? n : lds;
    int64_t k = m < n ? m : n;
    int64_t nonfinite = 0;
    for (int64_t b = rt_block_idx(); b < batch; b += rt_grid_dim()) {
        cap_t S = cap_offset_f32(src, b * m * lds);
        cap_t A = cap_offset_f32(a, b * m * ld);
        cap_t TAU = cap_offset_f32(tau, b * k);
        for (int64_t t = 0; t < m; t++) {
            for (int64_t c = 0; c < 32; c++)
                x[t][c] = 0.0f;
            for (int64_t c = 0; c < n; c++) {
                float y = cap_load_f32(S, t * lds + c);
                nonfinite += isfinite(y) ? 0 : 1;
                x[t][c] = y;
            }
        }
        for (int64_t j = 0; j < k; j++) {
            double s0 = 0.0;
            double s1 = 0.0;
            int64_t t = j + 1;
            for (; t + 1 < m; t += 2) {
                double y0 = (double)x[t][j];
                double y1 = (double)x[t + 1][j];
                s0 = fma(y0, y0, s0);
                s1 = fma(y1, y1, s1);
            }
            if (t < m) {
                double y0 = (double)x[t][j];
                s0 = fma(y0, y0, s0);
            }
            double xn2 = s0 + s1;
            double alpha = (double)x[j][j];
            double tj = 0.0;
            if (xn2 > 0.0 || xn2 != xn2) {
                double beta = -copysign(sqrt(alpha * alpha + xn2), alpha);
                tj = (beta - alpha) / beta;
                float scale = (float)(1.0 / (alpha - beta));
                x[j][j] = (float)beta;
                for (int64_t r = j + 1; r < m; r++)
                    x[r][j] = x[r][j] * scale;
            }
            cap_store_f32(TAU, j, (float)tj);
            if (tj == 0.0 || j + 1 >= n)
                continue;
            float tf = (float)tj;
            for (int64_t c = 0; c < 32; c++)
                w[c] = x[j][c];
            /* four rows per pass over w (it lives in memory, not registers: one
             * load and store of it per four rows), added in the order of r */
            int64_t q = j + 1;
            for (; q + 3 < m; q += 4) {
                float v0 = x[q][j];
                float v1 = x[q + 1][j];
                float v2 = x[q + 2][j];
                float v3 = x[q + 3][j];
                for (int64_t c = 0; c < 32; c++)
                    w[c] = fmaf(v3, x[q + 3][c], fmaf(v2, x[q + 2][c],
                                fmaf(v1, x[q + 1][c], fmaf(v0, x[q][c], w[c]))));
            }
            for (; q < m; q++) {
                float v = x[q][j];
                for (int64_t c = 0; c < 32; c++)
                    w[c] = fmaf(v, x[q][c], w[c]);
            }
            for (int64_t c = 0; c < 32; c++)
                w[c] = c > j ? tf * w[c] : 0.0f;
            for (int64_t c = 0; c < 32; c++)
                x[j][c] = c > j ? x[j][c] - w[c] : x[j][c];
            for (int64_t r = j + 1; r < m; r++) {
                float v = x[r][j];
                for (int64_t c = 0; c < 32; c++)
                    x[r][c] = c > j ? fmaf(-v, w[c], x[r][c]) : x[r][c];
            }
        }
        for (int64_t t = 0; t < m; t++)
            for (int64_t c = 0; c < n; c++)
                cap_store_f32(A, t * ld + c, x[t][c]);
    }
    cap_store_i64(bad, rt_block_idx(), nonfinite);
}
