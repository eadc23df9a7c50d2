/*
 * A single tall matrix on every block of one launch (family "qrt_tall", composed
 * after qrt_group.c): the rows are shared out, not the columns, so a matrix of
 * one or a few panels (65536 x 64, 8192 x 256) keeps every worker busy where the
 * column tiles of qrt_step would leave most of them idle.
 *
 * The rows are cut into chunks of ch (a multiple of 64, fixed by m alone);
 * block g of G owns chunks [g nc / G, (g+1) nc / G) of each panel's rows.  Per
 * panel of nb columns:
 *   1. gpanel_qr (qrt_group.c) factors it in place, one barrier per column;
 *   2. each block forms, per chunk it owns and per 64-column tile of the
 *      trailing columns, the chunk's share V^T C (larfb_rows mode 1) into Wp;
 *   3. the trailing columns are shared out in units of 16: each block adds the
 *      chunks' shares of its columns in chunk order and applies T^T (Wf);
 *   4. each block applies C -= V Wf to its chunks (larfb_rows mode 2).
 * Sums run in chunk order whoever formed them, so the result does not depend
 * on G (the worker count).  Same algorithm as qrt_step (Householder vectors,
 * tau, LAPACK's compact form), with the group panel's rounding.
 *
 * work: nb*nb (T) + nb*n (Wf) + nck*nb*n (Wp) floats, nck = ceil(m / ch).
 * S: 2 * (64 * nck + 64) doubles (gpanel_qr's sums).  Rows of ld elements.
 * Launched with group = grid; b: the matrix of the batch.
 */

/* W = T^T (the chunks' shares of V^T C, added in chunk order) for 16-column
 * units u of the nt trailing columns, units [g U / G, (g+1) U / G). */
static void tall_reduce(cap_t Wp, int64_t stride, cap_t Wf, int64_t ldw, cap_t T, int64_t ldt,
                        int64_t jb, int64_t nt, int64_t nck, int64_t g, int64_t G)
{
    float w[64][16];
    if (jb > 64)
        jb = 64;
    int64_t units = (nt + 15) / 16;
    for (int64_t u = g * units / G; u < (g + 1) * units / G; u++) {
        int64_t l0 = 16 * u;
        int64_t lw = nt - l0 < 16 ? nt - l0 : 16;
        for (int64_t p = 0; p < jb; p++)
            for (int64_t l = 0; l < lw; l++)
                w[p][l] = cap_load_f32(Wp, p * ldw + l0 + l);
        for (int64_t k = 1; k < nck; k++)
            for (int64_t p = 0; p < jb; p++)
                for (int64_t l = 0; l < lw; l++)
                    w[p][l] = w[p][l] + cap_load_f32(Wp, k * stride + p * ldw + l0 + l);
        /* step 2 of larfb_tile, in its order */
        for (int64_t p = jb - 1; p >= 0; p--) {
            float tpp = cap_load_f32(T, p * ldt + p);
            for (int64_t l = 0; l < lw; l++)
                w[p][l] *= tpp;
            for (int64_t q = 0; q < p; q++) {
                float tq = cap_load_f32(T, q * ldt + p);
                for (int64_t l = 0; l < lw; l++)
                    w[p][l] = fmaf(tq, w[q][l], w[p][l]);
            }
        }
        for (int64_t p = 0; p < jb; p++)
            for (int64_t l = 0; l < lw; l++)
                cap_store_f32(Wf, p * ldw + l0 + l, w[p][l]);
    }
}

KERNEL void qrt_tall_f32(cap_t a, cap_t tau, cap_t work, cap_t S, int64_t b, int64_t m,
                         int64_t n, int64_t nb, int64_t ch, int64_t ld)
{
    int64_t k = m < n ? m : n;
    nb = clamp_i64(nb, 1, 64);
    ch = 64 * (ch / 64 < 1 ? 1 : ch / 64);
    ld = ld < n ? n : ld;
    int64_t g = rt_block_idx();
    int64_t G = rt_grid_dim();
    cap_t A = cap_offset_f32(a, b * m * ld);
    cap_t TAU = cap_offset_f32(tau, b * k);
    cap_t T = work;
    cap_t Wf = cap_offset_f32(work, nb * nb);
    cap_t Wp = cap_offset_f32(Wf, nb * n);
    for (int64_t j = 0; j < k; j += nb) {
        int64_t jb = k - j < nb ? k - j : nb;
        int64_t mr = m - j;
        int64_t cs = j + jb;
        cap_t V = cap_offset_f32(A, j * ld + j);
        gpanel_qr(V, ld, mr, jb, cap_offset_f32(TAU, j), T, nb, cs < n ? 1 : 0, S, g, G, ch);
        if (cs >= n)
            continue;
        int64_t nck = (mr + ch - 1) / ch;
        int64_t k0 = g * nck / G;
        int64_t k1 = (g + 1) * nck / G;
        rt_group_sync();
        for (int64_t kk = k0; kk < k1; kk++) {
            int64_t t_hi = mr < kk * ch + ch ? mr : kk * ch + ch;
            for (int64_t c0 = cs; c0 < n; c0 += 64) {
                int64_t cw = n - c0 < 64 ? n - c0 : 64;
                larfb_rows(V, ld, jb, T, nb, A, ld, j, c0, cw, kk * ch, t_hi, 1,
                           cap_offset_f32(Wp, kk * nb * n + c0 - cs), n);
            }
        }
        rt_group_sync();
        tall_reduce(Wp, nb * n, Wf, n, T, nb, jb, n - cs, nck, g, G);
        rt_group_sync();
        for (int64_t kk = k0; kk < k1; kk++) {
            int64_t t_hi = mr < kk * ch + ch ? mr : kk * ch + ch;
            for (int64_t c0 = cs; c0 < n; c0 += 64) {
                int64_t cw = n - c0 < 64 ? n - c0 : 64;
                larfb_rows(V, ld, jb, T, nb, A, ld, j, c0, cw, kk * ch, t_hi, 2,
                           cap_offset_f32(Wf, c0 - cs), n);
            }
        }
        /* the next panel's chunks start nb rows further down: other owners */
        rt_group_sync();
    }
}
