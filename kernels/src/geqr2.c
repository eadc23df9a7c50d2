/*
 * geqr2: unblocked Householder QR (LAPACK xGEQR2), one block per matrix.
 *
 * a:    batch x m x n, row-major (each matrix at b*m*n, element (i,j) at i*n+j),
 *       overwritten by the compact form: R on and above the diagonal, v_j below.
 * tau:  batch x min(m,n).
 * work: at least grid * n elements (one row of scratch per block).
 */
KERNEL void geqr2_f32(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n)
{
    int64_t k = m < n ? m : n;
    cap_t w = cap_offset_f32(work, rt_block_idx() * n);
    for (int64_t b = rt_block_idx(); b < batch; b += rt_grid_dim()) {
        cap_t A = cap_offset_f32(a, b * m * n);
        cap_t TAU = cap_offset_f32(tau, b * k);
        for (int64_t j = 0; j < k; j++) {
            float t = larfg_col(A, n, j, j, m);
            cap_store_f32(TAU, j, t);
            larf_left(A, n, j, j, m, j + 1, n, t, w);
        }
    }
}
