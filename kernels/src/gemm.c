/*
 * Block-reflector update (xLARFB, left, transposed, forward, columnwise):
 *
 *     C := H^T C = C - V T^T V^T C,
 *
 * V unit lower trapezoidal (mr x jb, row t of V at V[(vr + t) * ldv + vc]),
 * C the trailing matrix (mr x nc, row t at C[(cr + t) * ldc + cc]), T upper
 * triangular (jb x jb, T[q * ldt + p]).  All row-major.
 *
 * Written for gcc -O3 -march=native without -ffast-math (so no vectorised
 * reductions): C is processed in chunks of 64 columns; for each chunk
 * W = V^T C is accumulated in a local 128 x 64 array by axpys along the
 * chunk's contiguous columns, W := T^T W in place, then C -= V W row by row.
 * The inner loops have a constant trip count of 64 over local arrays, which
 * do not alias any buffer, so gcc vectorises them without runtime alias
 * checks; buffer accesses (checked) are O(mr * 64) per chunk against
 * O(mr * jb * 64) flops.  Full chunks load/store a row with one unconditional
 * affine loop (the instrumenter checks its range once); the ragged last chunk
 * is zero-padded.
 * jb <= 128 (the caller clamps the panel width).
 *
 * The f16 kernel gets a copy of this file with the C loads/stores in half
 * precision (kernels/sources.py rewrites the accesses whose cap is C).
 */
static void larfb(cap_t V, int64_t ldv, int64_t vr, int64_t vc, int64_t jb, int64_t mr,
                  cap_t C, int64_t ldc, int64_t cr, int64_t cc, int64_t nc,
                  cap_t T, int64_t ldt)
{
    float w[128][64];
    float x[64];
    for (int64_t c0 = 0; c0 < nc; c0 += 64) {
        int64_t cw = nc - c0 < 64 ? nc - c0 : 64;
        /* W = V^T C, rows t < jb: V(t, t) = 1, V(t, p) = 0 for p > t. */
        for (int64_t p = 0; p < jb; p++) {
            for (int l = 0; l < 64; l++)
                w[p][l] = 0.0f;
        }
        for (int64_t t = 0; t < mr; t++) {
            int64_t rc = (cr + t) * ldc + cc + c0;
            if (cw == 64) {
                for (int l = 0; l < 64; l++)
                    x[l] = cap_load_f32(C, rc + l);
            } else {
                for (int l = 0; l < 64; l++)
                    x[l] = l < cw ? cap_load_f32(C, rc + l) : 0.0f;
            }
            int64_t pe = t < jb ? t : jb;
            for (int64_t p = 0; p < pe; p++) {
                float vq = cap_load_f32(V, (vr + t) * ldv + vc + p);
                for (int l = 0; l < 64; l++)
                    w[p][l] = fmaf(vq, x[l], w[p][l]);
            }
            if (t < jb) {
                for (int l = 0; l < 64; l++)
                    w[t][l] += x[l];
            }
        }
        /* W := T^T W: row p needs rows q <= p, so go from the bottom up. */
        for (int64_t p = jb - 1; p >= 0; p--) {
            float tpp = cap_load_f32(T, p * ldt + p);
            for (int l = 0; l < 64; l++)
                w[p][l] *= tpp;
            for (int64_t q = 0; q < p; q++) {
                float tq = cap_load_f32(T, q * ldt + p);
                for (int l = 0; l < 64; l++)
                    w[p][l] = fmaf(tq, w[q][l], w[p][l]);
            }
        }
        /* C -= V W. */
        for (int64_t t = 0; t < mr; t++) {
            int64_t rc = (cr + t) * ldc + cc + c0;
            if (cw == 64) {
                for (int l = 0; l < 64; l++)
                    x[l] = cap_load_f32(C, rc + l);
            } else {
                for (int l = 0; l < 64; l++)
                    x[l] = l < cw ? cap_load_f32(C, rc + l) : 0.0f;
            }
            int64_t pe = t < jb ? t : jb;
            for (int64_t p = 0; p < pe; p++) {
                float u = cap_load_f32(V, (vr + t) * ldv + vc + p);
                for (int l = 0; l < 64; l++)
                    x[l] = fmaf(-u, w[p][l], x[l]);
            }
            if (t < jb) {
                for (int l = 0; l < 64; l++)
                    x[l] -= w[t][l];
            }
            if (cw == 64) {
                for (int l = 0; l < 64; l++)
                    cap_store_f32(C, rc + l, x[l]);
            } else {
                for (int l = 0; l < cw; l++)
                    cap_store_f32(C, rc + l, x[l]);
            }
        }
    }
}
