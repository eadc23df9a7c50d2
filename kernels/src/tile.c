/*
 * Block-reflector update of one column tile (xLARFB, left, transposed,
 * forward, columnwise), register-tiled:
 *
 *     C := H^T C = C - V (T^T (V^T C)),
 *
 * V unit lower trapezoidal, mr x jb, row t at P[t * ldp + p] (the packed
 * panel: the entries on and above the diagonal are R and are read as 1 / 0);
 * T upper triangular jb x jb at T[q * ldt + p]; C the tile of A with
 * cw <= 64 columns, element (t, l) at A[(r0 + t) * ld + c0 + l].  jb <= 64.
 *
 * The work is done in local arrays of constant shape, so the hot loops run
 * over memory no buffer can alias: 64-row chunks of C and V are packed into
 * cp / vp (zero-padded to the tile width rounded up to 8 and to jb rounded
 * up to 4; a zero row or column adds exact zeros), and both GEMMs are rank-4
 * updates of rows of that width in L1
 * (W rows += four rows of C times their V entries; C rows -= four rows of W
 * times theirs): per 8-wide vector, 4 or 6 loads and 2 stores feed 8 fmaf,
 * which gcc turns into AVX2 FMAs.  Both passes add products with explicit
 * fmaf() in the order of t (step 1) and p (step 3), one column at a time,
 * so a column's result does not depend on the tile width or on which block
 * runs the tile.
 *
 * Packing the C chunk (64 rows, n floats apart) is the costly memory access:
 * it is paid twice per panel against 4 * jb flops per element, so a wider
 * panel (jb = 64) halves its share.
 *
 * larfb_rows is the same update split for a tall matrix whose rows are shared
 * out between blocks (qrt_tall in kernels/src/qrt_tall.c): it works on rows
 * [t_lo, t_hi) of V and C only, and mode selects the part: 0 all of it (as
 * larfb_tile, whose rows are [0, mr)), 1 step 1 alone, storing this range's
 * share of V^T C into W (jb x cw, element (p, l) at W[p * ldw + l]), 2 step 3
 * alone with W given (T^T times the sum of every range's share).  Each range
 * runs the same arithmetic on its rows as the whole update does.
 */
static void larfb_rows(cap_t P, int64_t ldp, int64_t jb, cap_t T, int64_t ldt,
                       cap_t A, int64_t ld, int64_t r0, int64_t c0, int64_t cw,
                       int64_t t_lo, int64_t t_hi, int64_t mode, cap_t W, int64_t ldw)
{
    float w[64][64];
    float cp[64][64];
    float vp[64][64];
    if (jb < 1 || jb > 64 || cw < 1 || cw > 64)
        return;
    /* W rows in pairs (step 1) and quads (step 3); the padding rows are zero. */
    int64_t jh = (jb + 1) / 2;
    int64_t jq = (jb + 3) / 4;
    if (jh > 32)
        jh = 32;
    if (jq > 16)
        jq = 16;
    /* Only the columns of the tile (rounded up to a vector of 8) and the rows
     * of V (rounded up to the quads of step 3) are worked on, so a narrow tile
     * or a short panel costs in proportion. */
    int64_t jbp = 4 * jq;
    int64_t cwp = (cw + 7) / 8 * 8;
    if (cwp > 64)
        cwp = 64;
    for (int64_t p = 0; p < jbp; p++)
        for (int64_t l = 0; l < cwp; l++)
            w[p][l] = (mode == 2 && p < jb && l < cw) ? cap_load_f32(W, p * ldw + l) : 0.0f;
    /* Two passes over the 64-row chunks, which pack C and V the same way: pass 0
     * is step 1, W = V^T C; pass 1 is step 3, C -= V W, after step 2. */
    for (int64_t pass = mode == 2 ? 1 : 0; pass < (mode == 1 ? 1 : 2); pass++) {
        if (pass == 1 && mode == 0) {
            /* Step 2: W := T^T W; row p needs rows q <= p, so go from the bottom up. */
            for (int64_t p = jb - 1; p >= 0; p--) {
                float tpp = cap_load_f32(T, p * ldt + p);
                for (int64_t l = 0; l < cwp; l++)
                    w[p][l] *= tpp;
                for (int64_t q = 0; q < p; q++) {
                    float tq = cap_load_f32(T, q * ldt + p);
                    for (int64_t l = 0; l < cwp; l++)
                        w[p][l] = fmaf(tq, w[q][l], w[p][l]);
                }
            }
        }
        for (int64_t t0 = t_lo; t0 < t_hi; t0 += 64) {
            int64_t kc = t_hi - t0 < 64 ? t_hi - t0 : 64;
            for (int64_t tt = 0; tt < kc; tt++) {
                int64_t rc = (r0 + t0 + tt) * ld + c0;
                for (int64_t l = 0; l < cw; l++)
                    cp[tt][l] = cap_load_f32(A, rc + l);
                for (int64_t l = cw; l < cwp; l++)
                    cp[tt][l] = 0.0f;
                int64_t t = t0 + tt;
                int64_t pe = t < jb ? t : jb;
                int64_t rv = t * ldp;
                for (int64_t p = 0; p < pe; p++)
                    vp[tt][p] = cap_load_f32(P, rv + p);
                for (int64_t p = pe; p < jbp; p++)
                    vp[tt][p] = 0.0f;
                if (t < jb)
                    vp[tt][t] = 1.0f;
            }
            for (int64_t tt = kc; tt < 64; tt++) {
                for (int64_t l = 0; l < cwp; l++)
                    cp[tt][l] = 0.0f;
                for (int64_t p = 0; p < jbp; p++)
                    vp[tt][p] = 0.0f;
            }
            if (pass == 0) {
                /* Step 1, W += V^T C for the chunk.  Indices are written as 4u + i and
                 * 2q + r with clamped trip counts, so gcc can prove every local-array
                 * guard of the inner loop. */
                int64_t ku = (kc + 3) / 4;
                if (ku > 16)
                    ku = 16;
                for (int64_t q = 0; q < jh; q++) {
                    for (int64_t u = 0; u < ku; u++) {
                        float v00 = vp[4 * u][2 * q];
                        float v01 = vp[4 * u][2 * q + 1];
                        float v10 = vp[4 * u + 1][2 * q];
                        float v11 = vp[4 * u + 1][2 * q + 1];
                        float v20 = vp[4 * u + 2][2 * q];
                        float v21 = vp[4 * u + 2][2 * q + 1];
                        float v30 = vp[4 * u + 3][2 * q];
                        float v31 = vp[4 * u + 3][2 * q + 1];
                        for (int64_t l = 0; l < cwp; l++) {
                            float x0 = cp[4 * u][l];
                            float x1 = cp[4 * u + 1][l];
                            float x2 = cp[4 * u + 2][l];
                            float x3 = cp[4 * u + 3][l];
                            float a = w[2 * q][l];
                            float b = w[2 * q + 1][l];
                            w[2 * q][l] = fmaf(v30, x3, fmaf(v20, x2, fmaf(v10, x1,
                                                                           fmaf(v00, x0, a))));
                            w[2 * q + 1][l] = fmaf(v31, x3, fmaf(v21, x2, fmaf(v11, x1,
                                                                               fmaf(v01, x0, b))));
                        }
                    }
                }
            } else {
                /* Step 3, C -= V W for the chunk, four rows of W at a time. */
                int64_t kh = (kc + 1) / 2;
                if (kh > 32)
                    kh = 32;
                for (int64_t h = 0; h < kh; h++) {
                    for (int64_t q = 0; q < jq; q++) {
                        float v00 = vp[2 * h][4 * q];
                        float v01 = vp[2 * h][4 * q + 1];
                        float v02 = vp[2 * h][4 * q + 2];
                        float v03 = vp[2 * h][4 * q + 3];
                        float v10 = vp[2 * h + 1][4 * q];
                        float v11 = vp[2 * h + 1][4 * q + 1];
                        float v12 = vp[2 * h + 1][4 * q + 2];
                        float v13 = vp[2 * h + 1][4 * q + 3];
                        for (int64_t l = 0; l < cwp; l++) {
                            float x0 = w[4 * q][l];
                            float x1 = w[4 * q + 1][l];
                            float x2 = w[4 * q + 2][l];
                            float x3 = w[4 * q + 3][l];
                            float a = cp[2 * h][l];
                            float b = cp[2 * h + 1][l];
                            cp[2 * h][l] = fmaf(-v03, x3, fmaf(-v02, x2, fmaf(-v01, x1,
                                                                               fmaf(-v00, x0, a))));
                            cp[2 * h + 1][l] = fmaf(-v13, x3, fmaf(-v12, x2, fmaf(-v11, x1,
                                                                                   fmaf(-v10, x0, b))));
                        }
                    }
                }
                for (int64_t tt = 0; tt < kc; tt++) {
                    int64_t rc = (r0 + t0 + tt) * ld + c0;
                    for (int64_t l = 0; l < cw; l++)
                        cap_store_f32(A, rc + l, cp[tt][l]);
                }
            }
        }
    }
    if (mode == 1)
        for (int64_t p = 0; p < jb; p++)
            for (int64_t l = 0; l < cw; l++)
                cap_store_f32(W, p * ldw + l, w[p][l]);
}

static void larfb_tile(cap_t P, int64_t ldp, int64_t jb, cap_t T, int64_t ldt,
                       cap_t A, int64_t ld, int64_t r0, int64_t c0, int64_t cw, int64_t mr)
{
    larfb_rows(P, ldp, jb, T, ldt, A, ld, r0, c0, cw, 0, mr, 0, T, 0);
}
