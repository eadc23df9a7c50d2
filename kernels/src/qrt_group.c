/*
 * The group steps of kernels/src/qrt.c (composed after it: family "qrt_group"):
 * qrt_step for a single matrix whose look-ahead panel is factored by a group
 * of blocks (rt_group_sync).  Kept apart so that the one-block kernels of
 * qrt.c do not carry this code through every build.
 */

/*
 * The look-ahead panel of a single matrix on a group of blocks (rt_group_sync):
 * xGEQR2 + xLARFT of P (mr x jb, row t at P[t * ldp + p], jb <= 64) by blocks
 * g = 0 .. G-1, one barrier per column.  The rows are cut into chunks of ch
 * (qrt_gstep: 64, qrt_tall: a count fixed by m); block g owns chunks
 * [g nc / G, (g+1) nc / G).  In the pass that applies H_p to its rows a
 * block also forms, per chunk, the partial sums
 * s_c = sum over rows t > p+1 of P[t][p+1] P[t][c] (double) for every column
 * c, and the owner of row p+1 copies that row (the next pivot row) aside.
 * After the barrier every block adds the chunks' partials in chunk order, so
 * every block derives the same beta, tau, w_c = tau (P[p][c] + s_c / (alpha -
 * beta)) and, for c < p, the Gram entry v_p . v_c of xLARFT, whatever G is:
 * the result does not depend on the worker count.  The partials and pivot
 * rows are double buffered by the parity of p (a block may write column
 * p+1's while another still reads column p's).  Sums in double: the squares
 * of float data cannot overflow or underflow there, which is what xLARFG's
 * rescaling loop is for (so float32 only: kernels/parallel.py).
 *
 * S: 2 * (64 * nc + 64) doubles, nc = ceil(mr / ch).  Block 0 writes TAU and, with
 * want_t, T (without it the sums skip the Gram entries).
 */
static void gpanel_qr(cap_t P, int64_t ldp, int64_t mr, int64_t jb, cap_t TAU, cap_t T,
                      int64_t ldt, int64_t want_t, cap_t S, int64_t g, int64_t G, int64_t ch)
{
    double acc[64];
    double s[64];
    double piv[64];
    double q0[32];
    double q1[32];
    double q2[32];
    double q3[32];
    float w[64];
    if (jb > 64)
        jb = 64;
    ch = ch < 1 ? 1 : ch;
    int64_t nc = (mr + ch - 1) / ch;
    int64_t k0 = g * nc / G;
    int64_t k1 = (g + 1) * nc / G;
    int64_t half = 64 * nc + 64;
    /* Column p's reflector from the sums the pass for p - 1 left; p = -1 has no
     * reflector, its pass only forms column 0's sums and pivot row. */
    for (int64_t p = -1; p < jb; p++) {
        double tau = 0.0;
        double beta = 0.0;
        double scale = 0.0;
        if (p >= 0) {
            rt_group_sync();
            cap_t Sp = cap_offset_f64(S, (p % 2) * half);
            for (int64_t c = 0; c < jb; c++) {
                s[c] = 0.0;
                piv[c] = cap_load_f64(Sp, 64 * nc + c);
            }
            /* the pass for p - 1 formed the Gram entries only for T */
            int64_t c_sum = want_t ? 0 : p;
            for (int64_t k = 0; k < nc; k++)
                for (int64_t c = c_sum; c < jb; c++)
                    s[c] = s[c] + cap_load_f64(Sp, 64 * k + c);
            double alpha = piv[p];
            double xn2 = s[p];
            beta = alpha;
            if (xn2 > 0.0 || xn2 != xn2) {
                beta = -copysign(sqrt(alpha * alpha + xn2), alpha);
                tau = (beta - alpha) / beta;
                scale = 1.0 / (alpha - beta);
            }
            for (int64_t c = 0; c < jb; c++)
                w[c] = c > p ? (float)(tau * (piv[c] + s[c] * scale)) : 0.0f;
            if (g == 0) {
                cap_store_f32(TAU, p, (float)tau);
                for (int64_t c = 0; want_t && c < p; c++)
                    cap_store_f32(T, p * ldt + c, (float)(piv[c] + s[c] * scale));
            }
        }
        cap_t Sn = cap_offset_f64(S, ((p + 1) % 2) * half);
        float scalef = (float)scale;
        /* columns whose sums the next reflector needs (all of them for T's Gram entries) */
        int64_t c_lo = want_t ? 0 : p + 1;
        for (int64_t kk = k0; kk < k1; kk++) {
            /* the block's chunks forward for even p, backward for odd p: a pass
             * starts on the chunks the last one ended on, still in cache.  Each
             * chunk's sums are its own (added in chunk order after the barrier),
             * so the order is not in the result. */
            int64_t k = p % 2 == 0 ? kk : k0 + k1 - 1 - kk;
            int64_t tb = ch * k;
            int64_t te = mr < ch * k + ch ? mr : ch * k + ch;
            for (int64_t c = 0; c < 64; c++)
                acc[c] = 0.0;
            /* the pivot rows p and p + 1 where this chunk holds them */
            for (int64_t t = tb > p ? tb : p; t < te && t <= p + 1; t++) {
                if (t == p) {
                    for (int64_t c = p + 1; c < jb; c++)
                        cap_store_f32(P, t * ldp + c, cap_load_f32(P, t * ldp + c) - w[c]);
                    cap_store_f32(P, t * ldp + p, (float)beta);
                    continue;
                }
                if (tau != 0.0) {
                    float v = cap_load_f32(P, t * ldp + p) * scalef;
                    cap_store_f32(P, t * ldp + p, v);
                    for (int64_t c = p + 1; c < jb; c++)
                        cap_store_f32(P, t * ldp + c, fmaf(-v, w[c], cap_load_f32(P, t * ldp + c)));
                }
                if (p + 1 < jb)
                    for (int64_t c = 0; c < jb; c++)
                        cap_store_f64(Sn, 64 * nc + c, (double)cap_load_f32(P, t * ldp + c));
            }
            /* the rows below them, 64 at a time (they stay in L1 between the two
             * sweeps): H_p applied to each row, then the sums (in four row phases
             * over whole 32-column blocks, else four rows per pass over acc in the
             * order of t as one row at a time would).  Each
             * sweep is a rectangular nest with affine indices: one guard for all
             * its accesses (docs/hoisting.md). */
            for (int64_t t0 = tb > p + 2 ? tb : p + 2; t0 < te; t0 += 64) {
                int64_t kc = te - t0 < 64 ? te - t0 : 64;
                if (tau != 0.0) {
                    /* from the vector of 8 that holds column p on: whole vectors, v_t
                     * stored into column p by the same vector store, the columns before
                     * it stored back as they are (a scalar store of v_t followed by the
                     * vector load of its line stalled every row on store forwarding) */
                    int64_t c8 = p / 8 * 8;
                    for (int64_t tt = 0; tt < kc; tt++) {
                        float v = cap_load_f32(P, (t0 + tt) * ldp + p) * scalef;
                        for (int64_t c = c8; c < jb; c++) {
                            float x = cap_load_f32(P, (t0 + tt) * ldp + c);
                            float y = c > p ? fmaf(-v, w[c], x) : x;
                            cap_store_f32(P, (t0 + tt) * ldp + c, c == p ? v : y);
                        }
                    }
                }
                if (p + 1 < jb && jb % 32 == 0) {
                    /* whole 32-column blocks (no column past jb is read): each row adds
                     * to the sums of its phase t % 4, four independent fma chains
                     * instead of one chain of four, added in a fixed order after the
                     * rows (as panel_qr's first sweep, qrt.c) */
                    int64_t kq = kc / 4;
                    for (int64_t c0 = c_lo / 32 * 32; c0 < jb; c0 += 32) {
                        for (int64_t l = 0; l < 32; l++) {
                            q0[l] = 0.0;
                            q1[l] = 0.0;
                            q2[l] = 0.0;
                            q3[l] = 0.0;
                        }
                        for (int64_t u = 0; u < kq; u++) {
                            int64_t r = (t0 + 4 * u) * ldp;
                            double x0 = (double)cap_load_f32(P, r + p + 1);
                            double x1 = (double)cap_load_f32(P, r + ldp + p + 1);
                            double x2 = (double)cap_load_f32(P, r + 2 * ldp + p + 1);
                            double x3 = (double)cap_load_f32(P, r + 3 * ldp + p + 1);
                            for (int64_t l = 0; l < 32; l++) {
                                q0[l] = fma(x0, (double)cap_load_f32(P, r + c0 + l), q0[l]);
                                q1[l] = fma(x1, (double)cap_load_f32(P, r + ldp + c0 + l), q1[l]);
                                q2[l] = fma(x2, (double)cap_load_f32(P, r + 2 * ldp + c0 + l),
                                            q2[l]);
                                q3[l] = fma(x3, (double)cap_load_f32(P, r + 3 * ldp + c0 + l),
                                            q3[l]);
                            }
                        }
                        for (int64_t tt = 4 * kq; tt < kc; tt++) {
                            double x = (double)cap_load_f32(P, (t0 + tt) * ldp + p + 1);
                            for (int64_t l = 0; l < 32; l++)
                                q0[l] = fma(x, (double)cap_load_f32(P, (t0 + tt) * ldp + c0 + l),
                                            q0[l]);
                        }
                        for (int64_t l = 0; l < 32; l++)
                            acc[c0 + l] = acc[c0 + l] + ((q0[l] + q1[l]) + (q2[l] + q3[l]));
                    }
                } else if (p + 1 < jb) {
                    int64_t kq = kc / 4;
                    for (int64_t u = 0; u < kq; u++) {
                        double x0 = (double)cap_load_f32(P, (t0 + 4 * u) * ldp + p + 1);
                        double x1 = (double)cap_load_f32(P, (t0 + 4 * u + 1) * ldp + p + 1);
                        double x2 = (double)cap_load_f32(P, (t0 + 4 * u + 2) * ldp + p + 1);
                        double x3 = (double)cap_load_f32(P, (t0 + 4 * u + 3) * ldp + p + 1);
                        for (int64_t c = c_lo; c < jb; c++)
                            acc[c] = fma(x3, (double)cap_load_f32(P, (t0 + 4 * u + 3) * ldp + c),
                                         fma(x2, (double)cap_load_f32(P, (t0 + 4 * u + 2) * ldp + c),
                                             fma(x1, (double)cap_load_f32(P, (t0 + 4 * u + 1) * ldp + c),
                                                 fma(x0, (double)cap_load_f32(P, (t0 + 4 * u) * ldp + c),
                                                     acc[c]))));
                    }
                    for (int64_t tt = 4 * kq; tt < kc; tt++) {
                        double x = (double)cap_load_f32(P, (t0 + tt) * ldp + p + 1);
                        for (int64_t c = c_lo; c < jb; c++)
                            acc[c] = fma(x, (double)cap_load_f32(P, (t0 + tt) * ldp + c), acc[c]);
                    }
                }
            }
            if (p + 1 < jb)
                for (int64_t c = c_lo; c < jb; c++)
                    cap_store_f64(Sn, 64 * k + c, acc[c]);
        }
    }
    if (g == 0 && want_t)
        larft_from_gram(T, ldt, TAU, jb);
}

/*
 * qrt_step for one matrix, with the look-ahead panel on a group of blocks.
 * Launched with group = G (2 <= G <= workers) and G + tiles blocks: blocks
 * 0 .. G-1 copy the next panel's columns into the other workspace slot (rows
 * split between them), block 0 applies panel j to them (larfb_tile), the
 * group factors them (gpanel_qr) and copies them back; every other block
 * updates one column tile by panel j, as in qrt_step.  j < 0: the group
 * factors panel 0 alone.  work as for qrt_step with batch 1; S: 2 * (64 *
 * ceil(m / 64) + 64) doubles.  Rows of ld elements, as for qrt_f32.
 */
KERNEL void qrt_gstep_f32(cap_t a, cap_t tau, cap_t work, cap_t S, int64_t m, int64_t n,
                          int64_t nb, int64_t j, int64_t tw, int64_t G, int64_t ld)
{
    int64_t k = m < n ? m : n;
    nb = clamp_i64(nb, 1, 64);
    tw = clamp_i64(tw, 1, 64);
    ld = ld < n ? n : ld;
    G = G < 1 ? 1 : G;
    /* panel j (none for j < 0), the next panel jn and their widths */
    int64_t jb = panel_width(k, j, nb);
    int64_t jn = step_next(j, nb);
    int64_t jbn = panel_width(k, jn, nb);
    int64_t cs = step_first_col(k, nb, j);
    cap_t Pc = panel_slot(work, m, nb, j);
    cap_t Tc = slot_t(Pc, m, nb);
    cap_t Vc = slot_v(Pc, nb, j);
    int64_t blk = rt_block_idx();
    if (blk >= G) {
        /* the tiles, one per block when the grid is G + tiles (any grid > G works) */
        for (int64_t c0 = cs + (blk - G) * tw; j >= 0 && c0 < n; c0 += (rt_grid_dim() - G) * tw) {
            int64_t cw = n - c0 < tw ? n - c0 : tw;
            larfb_tile(Vc, nb, jb, Tc, nb, a, ld, j, c0, cw, m - j);
        }
        return;
    }
    if (jbn == 0)
        return;
    cap_t Pn = panel_slot(work, m, nb, jn);
    cap_t Tn = slot_t(Pn, m, nb);
    /* the rows of the slot: from row j (j >= 0) or 0; the panel to factor starts
     * nb rows in after an update (see qrt_step) */
    int64_t r0 = j >= 0 ? j : 0;
    int64_t mr = m - r0;
    int64_t top = j >= 0 ? nb : 0;
    int64_t lo = blk * mr / G;
    int64_t hi = (blk + 1) * mr / G;
    for (int64_t t = lo; t < hi; t++)
        for (int64_t p = 0; p < jbn; p++)
            cap_store_f32(Pn, t * nb + p, cap_load_f32(a, (r0 + t) * ld + jn + p));
    rt_group_sync();
    if (j >= 0) {
        if (blk == 0)
            larfb_tile(Vc, nb, jb, Tc, nb, Pn, nb, 0, 0, jbn, mr);
        rt_group_sync();
    }
    gpanel_qr(cap_offset_f32(Pn, top * nb), nb, mr - top, jbn, cap_offset_f32(tau, jn), Tn, nb,
              1, S, blk, G, 64);
    rt_group_sync();
    for (int64_t t = lo; t < hi; t++)
        for (int64_t p = 0; p < jbn; p++)
            cap_store_f32(a, (r0 + t) * ld + jn + p, cap_load_f32(Pn, t * nb + p));
}

/* The width of step j's tiles in qrt_coop_f32: tw, or narrower (a multiple of 8,
 * not below tmin) where the rounds of the G blocks that tiles of tw take, block 0's
 * lead units included, hold more tiles than that, so the last round is evened out. */
static int64_t coop_tile_width(int64_t k, int64_t n, int64_t nb, int64_t j, int64_t tw,
                               int64_t tmin, int64_t lead, int64_t G)
{
    int64_t cs = step_first_col(k, nb, j);
    int64_t cols = j >= 0 && cs < n ? n - cs : 0;
    if (tmin >= tw || G < 2 || cols == 0)
        return tw;
    /* the rounds that tiles of tw take, and the tiles those rounds hold */
    int64_t rounds = ((cols + tw - 1) / tw + lead + G - 1) / G;
    int64_t slots = rounds * G - lead;
    int64_t w = slots > 0 ? (cols + slots - 1) / slots : tw;
    return clamp_i64((w + 7) / 8 * 8, tmin, tw);
}

/*
 * The steps of one matrix in one launch: qrt_step's items for j = -1, 0, nb,
 * ... by a group of G = grid blocks, with rt_group_sync() between steps
 * instead of a launch per step.  Block 0 takes the look-ahead item (the next
 * panel, the critical path) and counts it as pw tiles; the tiles are shared
 * out so that every block has about the same number of units, each block a
 * run of neighbouring tiles.  Tiles are tw wide, or as narrow as tmin (a
 * multiple of 8, tmin < tw) where that takes no more rounds of the group but
 * evens out the last one (coop_tile_width).  Every item is qrt_step's and a
 * tile's result does not depend on its width, so the result is bitwise
 * qrt_step's and qrt_f32's.  work as for qrt_step with batch 1.
 */
KERNEL void qrt_coop_f32(cap_t a, cap_t tau, cap_t work, int64_t m, int64_t n, int64_t nb,
                         int64_t tw, int64_t tmin, int64_t pw, int64_t ld)
{
    int64_t k = m < n ? m : n;
    nb = clamp_i64(nb, 1, 64);
    tw = clamp_i64(tw, 1, 64);
    tmin = clamp_i64(tmin, 1, tw);
    pw = clamp_i64(pw, 0, 64);
    ld = ld < n ? n : ld;
    int64_t g = rt_block_idx();
    int64_t G = rt_grid_dim();
    int64_t steps = (k + nb - 1) / nb;
    for (int64_t s = -1; s < steps; s++) {
        int64_t j = s < 0 ? -1 : s * nb;
        int64_t jbn = panel_width(k, step_next(j, nb), nb);
        int64_t lead = jbn > 0 ? pw : 0;
        int64_t w = coop_tile_width(k, n, nb, j, tw, tmin, lead, G);
        int64_t ntiles = step_tiles(k, n, nb, j, w);
        int64_t own0 = G > 1 ? (ntiles + lead) / G - lead : ntiles;
        own0 = clamp_i64(own0, 0, ntiles);
        int64_t lo = 0;
        int64_t hi = own0;
        if (g == 0 && jbn > 0)
            step_item(a, tau, work, m, n, nb, j, w, ld, 0, -1);
        if (g > 0) {
            lo = own0 + (g - 1) * (ntiles - own0) / (G - 1);
            hi = own0 + g * (ntiles - own0) / (G - 1);
        }
        for (int64_t t = lo; t < hi; t++)
            step_item(a, tau, work, m, n, nb, j, w, ld, 0, t);
        rt_group_sync();
    }
}
