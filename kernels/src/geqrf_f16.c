/*
 * geqrf_f16: blocked Householder QR with half-precision storage.  The matrix
 * (hence the trailing matrix during the factorisation, R and the Householder
 * vectors V) lives in IEEE half; every product accumulates in float32 (the
 * panel is factored in a float32 copy, xLARFB's W and T are float32).
 *
 * After a panel is factored, its V is rounded to half (that is what is
 * stored) and tau is recomputed from the rounded vector, tau = 2 / v^T v, so
 * each stored reflector I - tau v v^T is exactly orthogonal: Q built from the
 * output is orthogonal to float32 accuracy and the half rounding shows up
 * only in R - Q^T A, where the checker sees it.  Values beyond the half range
 * become +-inf in the output (never clipped), so the caller and the checker
 * flag them.
 *
 * a:    batch x m x n halfs, row-major, overwritten by the compact form.
 * tau:  batch x min(m,n) float32.
 * work: float32, at least grid * (m*nb + nb*nb + nb) elements.
 * nb:   panel width, 1 <= nb <= 128 (clamped).
 */
KERNEL void geqrf_f16(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n,
                      int64_t nb)
{
    int64_t k = m < n ? m : n;
    if (nb < 1)
        nb = 1;
    if (nb > 128)
        nb = 128;
    int64_t wsz = m * nb + nb * nb + nb;
    cap_t P = cap_offset_f32(work, rt_block_idx() * wsz);
    cap_t T = cap_offset_f32(P, m * nb);
    cap_t wrow = cap_offset_f32(T, nb * nb);
    for (int64_t b = rt_block_idx(); b < batch; b += rt_grid_dim()) {
        cap_t A = cap_offset_f16(a, b * m * n);
        cap_t TAU = cap_offset_f32(tau, b * k);
        for (int64_t j = 0; j < k; j += nb) {
            int64_t jb = k - j < nb ? k - j : nb;
            int64_t mr = m - j;
            for (int64_t t = 0; t < mr; t++)
                for (int64_t p = 0; p < jb; p++)
                    cap_store_f32(P, t * nb + p, cap_load_f16(A, (j + t) * n + j + p));
            for (int64_t p = 0; p < jb; p++) {
                float tp = larfg_col(P, nb, p, p, mr);
                cap_store_f32(TAU, j + p, tp);
                larf_left(P, nb, p, p, mr, p + 1, jb, tp, wrow);
            }
            /* Store the panel in half and continue with exactly what was stored. */
            for (int64_t t = 0; t < mr; t++) {
                for (int64_t p = 0; p < jb; p++) {
                    cap_store_f16(A, (j + t) * n + j + p, cap_load_f32(P, t * nb + p));
                    cap_store_f32(P, t * nb + p, cap_load_f16(A, (j + t) * n + j + p));
                }
            }
            for (int64_t p = 0; p < jb; p++) {
                if (cap_load_f32(TAU, j + p) != 0.0f) {
                    float s = 1.0f;
                    for (int64_t t = p + 1; t < mr; t++) {
                        float v = cap_load_f32(P, t * nb + p);
                        s = fmaf(v, v, s);
                    }
                    cap_store_f32(TAU, j + p, 2.0f / s);
                }
            }
            if (j + jb < n) {
                larft(P, nb, 0, 0, jb, mr, cap_offset_f32(TAU, j), T, nb);
                larfb(P, nb, 0, 0, jb, mr, A, n, j, j + jb, n - j - jb, T, nb);
            }
        }
    }
}
