/*
 * Batched Householder QR on the GPU: one block per matrix.
 *
 * A holds `batch` row-major n x n float32 matrices.  On return each holds the
 * LAPACK compact form (as sgeqrf / scipy.linalg.qr(mode='raw') after
 * transposing back): R on and above the diagonal, the Householder vectors v
 * (v[0] = 1 implicit) below it; tau[b*n + k] are the reflector scalars, so
 * Q = H(0) H(1) ... H(n-1), H(k) = I - tau_k v_k v_k^T.
 *
 * Per column k:
 *   1. the column below the diagonal goes to shared memory (smem_v) and the
 *      block reduces its sum of squares in double (graded inputs would
 *      underflow in float), tree reduction in smem_red;
 *   2. thread 0 forms beta, tau, 1/(alpha-beta) as LAPACK's slarfg does
 *      (tau = 0 for an already-zero column: H = I);
 *   3. the vector is scaled in place and written back below the diagonal;
 *   4. H(k) is applied to the trailing columns: one thread per column, so in
 *      row-major storage the warp's loads of row i are contiguous (coalesced),
 *      and v[i] is a shared-memory broadcast.
 * The block size must be a power of two (the reduction halves it) <= 1024, n <= 4096.
 */
KERNEL void gpu_qr(cap_t A, cap_t tau, int64_t n)
{
    float smem_v[4096];
    double smem_red[1024];
    double smem_s[4];
    int64_t b = rt_block_idx();
    int64_t t = rt_thread_idx();
    int64_t T = rt_block_dim();
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t tb = cap_offset_f32(tau, b * n);
    for (int64_t k = 0; k < n; k++) {
        int64_t m = n - k;
        double ss = 0.0;
        for (int64_t i = t; i < m; i += T) {
            float x = cap_load_f32(M, (k + i) * n + k);
            smem_v[i] = x;
            if (i > 0)
                ss += (double)x * (double)x;
        }
        smem_red[t] = ss;
        rt_sync_threads();
        for (int64_t s = T / 2; s > 0; s = s / 2) {
            if (t < s)
                smem_red[t] = smem_red[t] + smem_red[t + s];
            rt_sync_threads();
        }
        if (t == 0) {
            double alpha = (double)smem_v[0];
            double xn2 = smem_red[0];
            double tk = 0.0;
            double beta = alpha;
            double scale = 0.0;
            if (xn2 > 0.0) {
                beta = -copysign(sqrt(alpha * alpha + xn2), alpha);
                tk = (beta - alpha) / beta;
                scale = 1.0 / (alpha - beta);
            }
            smem_s[0] = tk;
            smem_s[1] = scale;
            smem_s[2] = beta;
        }
        rt_sync_threads();
        float tkf = (float)smem_s[0];
        double scale = smem_s[1];
        for (int64_t i = t + 1; i < m; i += T) {
            float v = (float)((double)smem_v[i] * scale);
            smem_v[i] = v;
            cap_store_f32(M, (k + i) * n + k, v);
        }
        if (t == 0) {
            smem_v[0] = 1.0f;
            cap_store_f32(M, k * n + k, (float)smem_s[2]);
            cap_store_f32(tb, k, tkf);
        }
        rt_sync_threads();
        if (tkf != 0.0f) {
            for (int64_t j = k + 1 + t; j < n; j += T) {
                float d = 0.0f;
                for (int64_t i = 0; i < m; i++)
                    d += smem_v[i] * cap_load_f32(M, (k + i) * n + j);
                d = d * tkf;
                for (int64_t i = 0; i < m; i++)
                    cap_store_f32(M, (k + i) * n + j, cap_load_f32(M, (k + i) * n + j) - d * smem_v[i]);
            }
        }
        rt_sync_threads();
    }
}
