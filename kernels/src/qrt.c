/*
 * Blocked Householder QR with register-tiled trailing updates (larfb_tile in
 * tile.c), in two drivers that share every numerical step:
 *
 * qrt_f32       one block per matrix: each panel is factored, then the
 *               trailing columns are updated tile by tile.  For batches at
 *               least as large as the worker pool.
 * qrt_step_f32  one step of the same algorithm for every matrix of the batch,
 *               launched by the host once per panel, with one block per
 *               (matrix, column tile): a single matrix uses every worker.  The
 *               step that applies panel j also factors panel j + nb (look-ahead:
 *               its item first updates those columns, then factors them into
 *               the other workspace slot), so the panel overlaps the update.
 *
 * Both produce bitwise the same result: a tile's update does not depend on
 * its width or on the block that runs it, and the panel columns are updated
 * by the same larfb_tile before they are factored.
 *
 * a:   batch x m x n row-major, overwritten by the compact form (R and v).
 * tau: batch x min(m, n).
 * nb:  panel width, clamped to 1..64.
 */

/* Factor A[j:m, j:j+jb] (leading dimension n): copy it to P (leading
 * dimension nb; contiguous rows stream through cache), xGEQR2 there, copy it
 * back, tau into TAU[j:j+jb], and (when columns follow) T of the block
 * reflector into T (leading dimension nb).  wrow: nb floats of scratch. */
static void factor_panel(cap_t A, int64_t m, int64_t n, int64_t j, int64_t jb,
                         cap_t P, int64_t nb, cap_t T, cap_t TAU, cap_t wrow)
{
    int64_t mr = m - j;
    for (int64_t t = 0; t < mr; t++) {
        int64_t ra = (j + t) * n + j;
        int64_t rp = t * nb;
        for (int64_t p = 0; p < jb; p++)
            cap_store_f32(P, rp + p, cap_load_f32(A, ra + p));
    }
    for (int64_t p = 0; p < jb; p++) {
        float tp = larfg_col(P, nb, p, p, mr);
        cap_store_f32(TAU, j + p, tp);
        larf_left(P, nb, p, p, mr, p + 1, jb, tp, wrow);
    }
    for (int64_t t = 0; t < mr; t++) {
        int64_t ra = (j + t) * n + j;
        int64_t rp = t * nb;
        for (int64_t p = 0; p < jb; p++)
            cap_store_f32(A, ra + p, cap_load_f32(P, rp + p));
    }
    if (j + jb < n)
        larft(P, nb, 0, 0, jb, mr, cap_offset_f32(TAU, j), T, nb);
}

/* work: grid * (m*nb + nb*nb + nb) elements (P, T, a scratch row per block). */
KERNEL void qrt_f32(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n,
                    int64_t nb)
{
    int64_t k = m < n ? m : n;
    if (nb < 1)
        nb = 1;
    if (nb > 64)
        nb = 64;
    int64_t wsz = m * nb + nb * nb + nb;
    cap_t P = cap_offset_f32(work, rt_block_idx() * wsz);
    cap_t T = cap_offset_f32(P, m * nb);
    cap_t wrow = cap_offset_f32(T, nb * nb);
    for (int64_t b = rt_block_idx(); b < batch; b += rt_grid_dim()) {
        cap_t A = cap_offset_f32(a, b * m * n);
        cap_t TAU = cap_offset_f32(tau, b * k);
        for (int64_t j = 0; j < k; j += nb) {
            int64_t jb = k - j < nb ? k - j : nb;
            factor_panel(A, m, n, j, jb, P, nb, T, TAU, wrow);
            for (int64_t c0 = j + jb; c0 < n; c0 += 64) {
                int64_t cw = n - c0 < 64 ? n - c0 : 64;
                larfb_tile(P, nb, jb, T, nb, A, n, j, c0, cw, m - j);
            }
        }
    }
}

/*
 * One step.  j < 0: factor panel 0 of every matrix (items: one per matrix).
 * j >= 0 (panel j factored, its V and T in workspace slot (j / nb) % 2):
 * items are, per matrix, the next panel (update + factor into the other
 * slot) if there is one, then the remaining columns in tiles of tw (1..64).
 * work: batch * (2 * (m*nb + nb*nb) + nb) elements, one region per matrix
 * (items of a matrix run on different blocks and share its slots).
 */
KERNEL void qrt_step_f32(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n,
                         int64_t nb, int64_t j, int64_t tw)
{
    int64_t k = m < n ? m : n;
    if (nb < 1)
        nb = 1;
    if (nb > 64)
        nb = 64;
    if (tw < 1)
        tw = 1;
    if (tw > 64)
        tw = 64;
    int64_t slot = m * nb + nb * nb;
    int64_t wsz = 2 * slot + nb;
    int64_t jb = 0;
    int64_t jn = 0;
    if (j >= 0) {
        jb = k - j < nb ? k - j : nb;
        jn = j + nb;
    }
    int64_t jbn = 0;
    if (jn < k)
        jbn = k - jn < nb ? k - jn : nb;
    int64_t cs = jbn > 0 ? jn + jbn : j + jb;
    int64_t ntiles = 0;
    if (j >= 0 && cs < n)
        ntiles = (n - cs + tw - 1) / tw;
    int64_t npan = jbn > 0 ? 1 : 0;
    int64_t items = batch * (npan + ntiles);
    for (int64_t it = rt_block_idx(); it < items; it += rt_grid_dim()) {
        int64_t b = it;
        int64_t tile = -1;
        if (it >= batch * npan) {
            b = (it - batch * npan) / ntiles;
            tile = (it - batch * npan) % ntiles;
        }
        cap_t A = cap_offset_f32(a, b * m * n);
        cap_t base = cap_offset_f32(work, b * wsz);
        int64_t cur = j >= 0 ? (j / nb) % 2 : 0;
        cap_t Pc = cap_offset_f32(base, cur * slot);
        cap_t Tc = cap_offset_f32(Pc, m * nb);
        if (tile < 0) {
            cap_t Pn = cap_offset_f32(base, ((jn / nb) % 2) * slot);
            cap_t Tn = cap_offset_f32(Pn, m * nb);
            if (j >= 0)
                larfb_tile(Pc, nb, jb, Tc, nb, A, n, j, jn, jbn, m - j);
            factor_panel(A, m, n, jn, jbn, Pn, nb, Tn, cap_offset_f32(tau, b * k),
                         cap_offset_f32(base, 2 * slot));
        } else {
            int64_t c0 = cs + tile * tw;
            int64_t cw = n - c0 < tw ? n - c0 : tw;
            larfb_tile(Pc, nb, jb, Tc, nb, A, n, j, c0, cw, m - j);
        }
    }
}
