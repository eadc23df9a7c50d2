/*
 * The compact-WY factor T of a panel's nb <= 32 reflectors, H(k0) ... H(k0+nb-1) =
 * I - V T V^T (LAPACK slarft, forward, columnwise), shared by the GPU panel kernels
 * (kernels/sources.py FAMILIES: gpu_panel, gpu_panel_small, gpu_steps).
 *
 * On entry the strictly lower triangle of the 32 x 32 TT holds y_cp = v_c . v_p in
 * row p, column c < p, and tb[k0 .. k0+nb-1] the taus, both written by this block;
 * on exit TT holds T, upper triangular, zero-padded to 32 x 32:
 *   T[i][j] = -tau_j sum_{l=i}^{j-1} T[i][l] y_lj   (i < j),   T[j][j] = tau_j.
 * Thread i < 32 owns row i of T, so the recurrence needs no barrier: it keeps the
 * row's upper part in TT itself (row i, columns >= i: no y lives there) and zeroes
 * the rest after a barrier, once every y is read.  One block calls this, under
 * block-uniform control (it waits at barriers).
 */
static void gpu_t_factor(cap_t TT, cap_t tb, int64_t k0, int64_t nb)
{
    int64_t t = rt_thread_idx();
    rt_sync_threads();
    if (t < 32) {
        for (int64_t j = t; j < 32; j++) {
            float v = 0.0f;
            if (j < nb) {
                if (t == j) {
                    v = cap_load_f32(tb, k0 + j);
                } else {
                    float s = 0.0f;
                    for (int64_t l = t; l < j; l++)
                        s = fmaf(cap_load_f32(TT, t * 32 + l), cap_load_f32(TT, j * 32 + l), s);
                    v = -cap_load_f32(tb, k0 + j) * s;
                }
            }
            cap_store_f32(TT, t * 32 + j, v);
        }
    }
    rt_sync_threads();
    if (t < 32) {
        for (int64_t j = 0; j < t; j++)
            cap_store_f32(TT, t * 32 + j, 0.0f);
    }
}
