/*
 * geqrf: blocked Householder QR with compact WY (LAPACK xGEQRF), one block
 * per matrix.  For each panel of nb columns: copy it to a contiguous
 * workspace P (row-major, leading dimension nb: the panel's rows become
 * adjacent instead of n apart, so the column sweeps of xGEQR2/xLARFT stream
 * through cache instead of touching one page per row), xGEQR2 on P, copy it
 * back, xLARFT forms T from P, xLARFB applies H^T = I - V T^T V^T (V read
 * from P) to the trailing columns.
 *
 * a:    batch x m x n, row-major (element (i,j) of matrix b at b*m*n + i*n + j),
 *       overwritten by the compact form: R on and above the diagonal, v below.
 * tau:  batch x min(m,n).
 * work: at least grid * (m*nb + nb*nb + nb) elements, one slot per block:
 *       P (m x nb), T (nb x nb), a scratch row of nb.
 * nb:   panel width, 1 <= nb <= 128 (need not divide n; clamped to that range).
 */
KERNEL void geqrf_f32(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n,
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
        cap_t A = cap_offset_f32(a, b * m * n);
        cap_t TAU = cap_offset_f32(tau, b * k);
        for (int64_t j = 0; j < k; j += nb) {
            int64_t jb = k - j < nb ? k - j : nb;
            int64_t mr = m - j;
            for (int64_t t = 0; t < mr; t++)
                for (int64_t p = 0; p < jb; p++)
                    cap_store_f32(P, t * nb + p, cap_load_f32(A, (j + t) * n + j + p));
            for (int64_t p = 0; p < jb; p++) {
                float tp = larfg_col(P, nb, p, p, mr);
                cap_store_f32(TAU, j + p, tp);
                larf_left(P, nb, p, p, mr, p + 1, jb, tp, wrow);
            }
            for (int64_t t = 0; t < mr; t++)
                for (int64_t p = 0; p < jb; p++)
                    cap_store_f32(A, (j + t) * n + j + p, cap_load_f32(P, t * nb + p));
            if (j + jb < n) {
                larft(P, nb, 0, 0, jb, mr, cap_offset_f32(TAU, j), T, nb);
                larfb(P, nb, 0, 0, jb, mr, A, n, j, j + jb, n - j - jb, T, nb);
            }
        }
    }
}
