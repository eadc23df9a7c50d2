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
 * qrt_gstep_f32 qrt_step for one matrix with the look-ahead panel factored
 *               by a group of blocks (rt_group_sync; kernels/src/qrt_group.c).
 *
 * The first two produce bitwise the same result: a tile's update does not
 * depend on its width or on the block that runs it, and the panel columns
 * are updated by the same larfb_tile before they are factored.  The group
 * panel sums in double in a fixed order: its result does not depend on the
 * group size, but differs from panel_qr's by rounding.
 *
 * a:   batch x m x n row-major, overwritten by the compact form (R and v).
 * tau: batch x min(m, n).
 * nb:  panel width, clamped to 1..64.
 */

/* ||X[0:len]||_2 of a contiguous vector, scaled by the largest magnitude like
 * nrm2_col (a NaN propagates), with eight partial maxima and sums so that
 * both passes vectorise; the lanes are combined in a fixed order. */
static float nrm2_scaled(cap_t X, int64_t len)
{
    float am[8];
    float sq[8];
    int64_t n8 = len / 8;
    for (int64_t l = 0; l < 8; l++) {
        am[l] = 0.0f;
        sq[l] = 0.0f;
    }
    for (int64_t i = 0; i < n8; i++)
        for (int64_t l = 0; l < 8; l++) {
            float x = fabsf(cap_load_f32(X, 8 * i + l));
            am[l] = (x > am[l] || x != x) ? x : am[l];
        }
    float amax = 0.0f;
    for (int64_t l = 0; l < 8; l++)
        if (am[l] > amax || am[l] != am[l])
            amax = am[l];
    for (int64_t i = 8 * n8; i < len; i++) {
        float x = fabsf(cap_load_f32(X, i));
        if (x > amax || x != x)
            amax = x;
    }
    if (amax == 0.0f || !isfinite(amax))
        return amax;
    for (int64_t i = 0; i < n8; i++)
        for (int64_t l = 0; l < 8; l++) {
            float y = cap_load_f32(X, 8 * i + l) / amax;
            sq[l] = fmaf(y, y, sq[l]);
        }
    float s = 0.0f;
    for (int64_t l = 0; l < 8; l++)
        s = s + sq[l];
    for (int64_t i = 8 * n8; i < len; i++) {
        float y = cap_load_f32(X, i) / amax;
        s = fmaf(y, y, s);
    }
    return amax * sqrtf(s);
}

/* ||X[0:len]||_2 in one pass where that is exact enough: the squares summed in
 * double (eight partial sums, combined in a fixed order).  For float data the sum
 * can neither overflow nor lose the small entries to underflow, so nrm2_scaled's
 * second pass and its division per element are needed only for a sum that is not
 * finite (an Inf or NaN entry) or below safmin (a nearly zero column, and every
 * range where the float64 build's squares could underflow; its overflow gives Inf). */
static float nrm2_vec(cap_t X, int64_t len)
{
    double sq[8];
    int64_t n8 = len / 8;
    for (int64_t l = 0; l < 8; l++)
        sq[l] = 0.0;
    for (int64_t i = 0; i < n8; i++)
        for (int64_t l = 0; l < 8; l++) {
            double x = (double)cap_load_f32(X, 8 * i + l);
            sq[l] = fma(x, x, sq[l]);
        }
    double s = ((sq[0] + sq[1]) + (sq[2] + sq[3])) + ((sq[4] + sq[5]) + (sq[6] + sq[7]));
    for (int64_t i = 8 * n8; i < len; i++) {
        double x = (double)cap_load_f32(X, i);
        s = fma(x, x, s);
    }
    float safmin = 1.17549435e-38f / 5.96046448e-08f;
    if (isfinite(s) && s >= (double)safmin)
        return (float)sqrt(s);
    return nrm2_scaled(X, len);
}

/* xLARFG on column p of the packed panel (rows p..mr-1), as larfg_col does it,
 * but the column below the diagonal is gathered once into the contiguous
 * scratch X (one strided pass instead of three) and scattered back scaled. */
static float panel_larfg(cap_t P, int64_t ldp, int64_t p, int64_t mr, cap_t X)
{
    int64_t len = mr - p - 1;
    if (len <= 0)
        return 0.0f;
    float alpha = cap_load_f32(P, p * ldp + p);
    for (int64_t i = 0; i < len; i++)
        cap_store_f32(X, i, cap_load_f32(P, (p + 1 + i) * ldp + p));
    float xnorm = nrm2_vec(X, len);
    if (xnorm == 0.0f)
        return 0.0f;
    float beta = -copysignf(hypotf(alpha, xnorm), alpha);
    float safmin = 1.17549435e-38f / 5.96046448e-08f;
    int64_t knt = 0;
    if (fabsf(beta) < safmin) {
        float rsafmn = 1.0f / safmin;
        while (fabsf(beta) < safmin && knt < 20) {
            knt++;
            for (int64_t i = 0; i < len; i++)
                cap_store_f32(X, i, rsafmn * cap_load_f32(X, i));
            beta = beta * rsafmn;
            alpha = alpha * rsafmn;
        }
        xnorm = nrm2_vec(X, len);
        beta = -copysignf(hypotf(alpha, xnorm), alpha);
    }
    float tau = (beta - alpha) / beta;
    float scale = 1.0f / (alpha - beta);
    for (int64_t i = 0; i < len; i++)
        cap_store_f32(P, (p + 1 + i) * ldp + p, scale * cap_load_f32(X, i));
    for (int64_t k = 0; k < knt; k++)
        beta = beta * safmin;
    cap_store_f32(P, p * ldp + p, beta);
    return tau;
}

/* xLARFT (forward, columnwise) from the Gram entries v_p . v_q (q < p), which
 * the panel factorisations leave in T's strictly lower triangle (the block
 * reflector's T is upper triangular; larfb_tile reads only that part):
 * T[0:p, p] = -tau_p T[0:p, 0:p] G[p][0:p], column by column. */
static void larft_from_gram(cap_t T, int64_t ldt, cap_t TAU, int64_t jb)
{
    for (int64_t p = 0; p < jb; p++) {
        float tp = cap_load_f32(TAU, p);
        for (int64_t q = 0; q < p; q++) {
            float s = 0.0f;
            for (int64_t s_i = q; s_i < p; s_i++)
                s = fmaf(cap_load_f32(T, q * ldt + s_i), cap_load_f32(T, p * ldt + s_i), s);
            cap_store_f32(T, q * ldt + p, tp == 0.0f ? 0.0f : -tp * s);
        }
        cap_store_f32(T, p * ldt + p, tp);
    }
}

/* xGEQR2 + xLARFT on the packed panel P (mr x jb, row t at P[t * ldp + p],
 * jb <= 64, ldp <= 64): tau into TAU[0:jb], T into T (leading dimension ldt)
 * when want_t.  Every sweep runs along rows (unit stride, vectorised):
 * reflector p's first sweep forms w[c] = v_p^T P[:, c] for every column c
 * of the panel at once; for c > p that is what H_p needs, for c < p it is
 * the Gram entry v_p^T v_c that xLARFT needs (column c < p is final and
 * v_p is zero above row p), so T costs no extra pass over V.  The second
 * sweep applies H_p to the columns right of p only.
 *
 * When rows hold whole 32-column blocks (ldp a multiple of 32: nb = 32 or 64,
 * the drivers' defaults), the first sweep runs block by block with the rows in
 * four phases (row t adds to phase t % 4), each a 32-wide sum of its own: four
 * independent chains of one fmaf per row instead of one chain of four, so the
 * sweep is not bound by fmaf latency.  The phases are added in a fixed order
 * at the end; the columns past jb in the last block are read (the panel's own
 * padding) and their sums dropped.  The second sweep updates whole blocks
 * from the block holding column p + 1, keeping every other column's value as
 * it is: the columns it changes get the same fmaf as one at a time. */
static void panel_qr(cap_t P, int64_t ldp, int64_t mr, int64_t jb, cap_t TAU, cap_t T,
                     int64_t ldt, int64_t want_t, cap_t X)
{
    float w[64];
    float s0[32];
    float s1[32];
    float s2[32];
    float s3[32];
    if (jb > 64)
        jb = 64;
    int64_t blocks = ldp % 32 == 0 ? (jb + 31) / 32 : 0;
    for (int64_t c = 0; c < 64; c++)
        w[c] = 0.0f;
    for (int64_t p = 0; p < jb; p++) {
        float tp = panel_larfg(P, ldp, p, mr, X);
        cap_store_f32(TAU, p, tp);
        int64_t r1 = p + 1;
        int64_t nq = (mr - r1) / 4;
        int64_t rest = r1 + 4 * nq;
        for (int64_t b = 0; b < blocks; b++) {
            int64_t c0 = 32 * b;
            for (int64_t l = 0; l < 32; l++) {
                s0[l] = cap_load_f32(P, p * ldp + c0 + l);
                s1[l] = 0.0f;
                s2[l] = 0.0f;
                s3[l] = 0.0f;
            }
            for (int64_t q = 0; q < nq; q++) {
                int64_t r = (r1 + 4 * q) * ldp;
                float v0 = cap_load_f32(P, r + p);
                float v1 = cap_load_f32(P, r + ldp + p);
                float v2 = cap_load_f32(P, r + 2 * ldp + p);
                float v3 = cap_load_f32(P, r + 3 * ldp + p);
                for (int64_t l = 0; l < 32; l++) {
                    s0[l] = fmaf(v0, cap_load_f32(P, r + c0 + l), s0[l]);
                    s1[l] = fmaf(v1, cap_load_f32(P, r + ldp + c0 + l), s1[l]);
                    s2[l] = fmaf(v2, cap_load_f32(P, r + 2 * ldp + c0 + l), s2[l]);
                    s3[l] = fmaf(v3, cap_load_f32(P, r + 3 * ldp + c0 + l), s3[l]);
                }
            }
            for (int64_t t = rest; t < mr; t++) {
                float vt = cap_load_f32(P, t * ldp + p);
                for (int64_t l = 0; l < 32; l++)
                    s0[l] = fmaf(vt, cap_load_f32(P, t * ldp + c0 + l), s0[l]);
            }
            for (int64_t l = 0; l < 32; l++)
                w[c0 + l] = c0 + l < jb ? (s0[l] + s1[l]) + (s2[l] + s3[l]) : 0.0f;
        }
        if (blocks == 0) {
            /* Rows below p go four at a time (one w update per four rows); the
             * sums keep the order of t, as one row at a time would. */
            for (int64_t c = 0; c < jb; c++)
                w[c] = cap_load_f32(P, p * ldp + c);
            for (int64_t q = 0; q < nq; q++) {
                float v0 = cap_load_f32(P, (r1 + 4 * q) * ldp + p);
                float v1 = cap_load_f32(P, (r1 + 4 * q + 1) * ldp + p);
                float v2 = cap_load_f32(P, (r1 + 4 * q + 2) * ldp + p);
                float v3 = cap_load_f32(P, (r1 + 4 * q + 3) * ldp + p);
                for (int64_t c = 0; c < jb; c++)
                    w[c] = fmaf(v3, cap_load_f32(P, (r1 + 4 * q + 3) * ldp + c),
                                fmaf(v2, cap_load_f32(P, (r1 + 4 * q + 2) * ldp + c),
                                     fmaf(v1, cap_load_f32(P, (r1 + 4 * q + 1) * ldp + c),
                                          fmaf(v0, cap_load_f32(P, (r1 + 4 * q) * ldp + c),
                                               w[c]))));
            }
            for (int64_t t = rest; t < mr; t++) {
                float vt = cap_load_f32(P, t * ldp + p);
                for (int64_t c = 0; c < jb; c++)
                    w[c] = fmaf(vt, cap_load_f32(P, t * ldp + c), w[c]);
            }
        }
        for (int64_t q = 0; q < p; q++)
            cap_store_f32(T, p * ldt + q, w[q]);
        if (tp == 0.0f)
            continue;
        for (int64_t c = r1; c < jb; c++) {
            w[c] = tp * w[c];
            cap_store_f32(P, p * ldp + c, cap_load_f32(P, p * ldp + c) - w[c]);
        }
        if (blocks > 0) {
            for (int64_t c0 = 32 * (r1 / 32); c0 < jb; c0 += 32)
                for (int64_t t = r1; t < mr; t++) {
                    float vt = cap_load_f32(P, t * ldp + p);
                    for (int64_t l = 0; l < 32; l++) {
                        float x = cap_load_f32(P, t * ldp + c0 + l);
                        float y = fmaf(-vt, w[c0 + l], x);
                        cap_store_f32(P, t * ldp + c0 + l, c0 + l > p && c0 + l < jb ? y : x);
                    }
                }
            continue;
        }
        for (int64_t q = 0; q < nq; q++) {
            float v0 = cap_load_f32(P, (r1 + 4 * q) * ldp + p);
            float v1 = cap_load_f32(P, (r1 + 4 * q + 1) * ldp + p);
            float v2 = cap_load_f32(P, (r1 + 4 * q + 2) * ldp + p);
            float v3 = cap_load_f32(P, (r1 + 4 * q + 3) * ldp + p);
            for (int64_t c = r1; c < jb; c++) {
                float wc = w[c];
                cap_store_f32(P, (r1 + 4 * q) * ldp + c,
                              fmaf(-v0, wc, cap_load_f32(P, (r1 + 4 * q) * ldp + c)));
                cap_store_f32(P, (r1 + 4 * q + 1) * ldp + c,
                              fmaf(-v1, wc, cap_load_f32(P, (r1 + 4 * q + 1) * ldp + c)));
                cap_store_f32(P, (r1 + 4 * q + 2) * ldp + c,
                              fmaf(-v2, wc, cap_load_f32(P, (r1 + 4 * q + 2) * ldp + c)));
                cap_store_f32(P, (r1 + 4 * q + 3) * ldp + c,
                              fmaf(-v3, wc, cap_load_f32(P, (r1 + 4 * q + 3) * ldp + c)));
            }
        }
        for (int64_t t = rest; t < mr; t++) {
            float vt = cap_load_f32(P, t * ldp + p);
            for (int64_t c = r1; c < jb; c++)
                cap_store_f32(P, t * ldp + c, fmaf(-vt, w[c], cap_load_f32(P, t * ldp + c)));
        }
    }
    if (want_t)
        larft_from_gram(T, ldt, TAU, jb);
}

/* Factor A[j:m, j:j+jb] (n columns, leading dimension ld): copy it to P
 * (leading dimension nb; contiguous rows stream through cache), factor it there
 * (panel_qr), copy it back, tau into TAU[j:j+jb], and (when columns follow)
 * T of the block reflector into T (leading dimension nb). */
static void factor_panel(cap_t A, int64_t m, int64_t n, int64_t ld, int64_t j, int64_t jb,
                         cap_t P, int64_t nb, cap_t T, cap_t TAU, cap_t X)
{
    int64_t mr = m - j;
    for (int64_t t = 0; t < mr; t++)
        for (int64_t p = 0; p < jb; p++)
            cap_store_f32(P, t * nb + p, cap_load_f32(A, (j + t) * ld + j + p));
    panel_qr(P, nb, mr, jb, cap_offset_f32(TAU, j), T, nb, j + jb < n ? 1 : 0, X);
    for (int64_t t = 0; t < mr; t++)
        for (int64_t p = 0; p < jb; p++)
            cap_store_f32(A, (j + t) * ld + j + p, cap_load_f32(P, t * nb + p));
}

static int64_t clamp_i64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* Columns of the panel starting at column j of k (0 when j < 0 or past k). */
static int64_t panel_width(int64_t k, int64_t j, int64_t nb)
{
    if (j < 0 || j >= k)
        return 0;
    return k - j < nb ? k - j : nb;
}

/* The first column of step j's look-ahead panel: panel j + nb, panel 0 for j < 0. */
static int64_t step_next(int64_t j, int64_t nb)
{
    return j >= 0 ? j + nb : 0;
}

/* The first column of step j's tiles: right of the look-ahead panel where there is
 * one, else right of panel j. */
static int64_t step_first_col(int64_t k, int64_t nb, int64_t j)
{
    int64_t jn = step_next(j, nb);
    int64_t jbn = panel_width(k, jn, nb);
    return jbn > 0 ? jn + jbn : j + panel_width(k, j, nb);
}

/* Column tiles of width tw that step j updates (qrt_step_f32, qrt_coop_f32), none
 * for j < 0. */
static int64_t step_tiles(int64_t k, int64_t n, int64_t nb, int64_t j, int64_t tw)
{
    int64_t cs = step_first_col(k, nb, j);
    return j >= 0 && cs < n ? (n - cs + tw - 1) / tw : 0;
}

/* A matrix's workspace is two slots of slot_elems(m, nb) elements, each holding a
 * packed panel (m rows of stride nb), its T (nb x nb, at slot_t) and a column of m.
 * Panel j's slot is (j / nb) % 2 (the first panel's, j < 0, is slot 0), so the
 * look-ahead panel fills one slot while the tiles read the other.  A slot is a
 * whole number of 16 elements, so that on a workspace that starts on a cache line
 * (every collector payload does) every slot does too, whatever m. */
static int64_t slot_elems(int64_t m, int64_t nb)
{
    return (m * nb + nb * nb + m + 15) / 16 * 16;
}

static cap_t panel_slot(cap_t ws, int64_t m, int64_t nb, int64_t j)
{
    return cap_offset_f32(ws, (j >= 0 ? (j / nb) % 2 : 0) * slot_elems(m, nb));
}

static cap_t slot_t(cap_t slot, int64_t m, int64_t nb)
{
    return cap_offset_f32(slot, m * nb);
}

/* V of panel j in its slot: row t (matrix row j + t) at [t * nb]; panels after the
 * first start nb rows in (the look-ahead item packs from row j - nb). */
static cap_t slot_v(cap_t slot, int64_t nb, int64_t j)
{
    return cap_offset_f32(slot, j > 0 ? nb * nb : 0);
}

/* The matrices of a: batch x m rows of ld >= n elements (rows padded to whole
 * cache lines keep tiles of neighbouring blocks off each other's lines),
 * matrix b at b * m * ld; an ld below n is taken as n.
 * work: grid * slot_elems(m, nb) elements (P, T and a column X per block). */
KERNEL void qrt_f32(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n,
                    int64_t nb, int64_t ld)
{
    int64_t k = m < n ? m : n;
    nb = clamp_i64(nb, 1, 64);
    ld = ld < n ? n : ld;
    cap_t P = cap_offset_f32(work, rt_block_idx() * slot_elems(m, nb));
    cap_t T = cap_offset_f32(P, m * nb);
    cap_t X = cap_offset_f32(T, nb * nb);
    for (int64_t b = rt_block_idx(); b < batch; b += rt_grid_dim()) {
        cap_t A = cap_offset_f32(a, b * m * ld);
        cap_t TAU = cap_offset_f32(tau, b * k);
        for (int64_t j = 0; j < k; j += nb) {
            int64_t jb = k - j < nb ? k - j : nb;
            factor_panel(A, m, n, ld, j, jb, P, nb, T, TAU, X);
            for (int64_t c0 = j + jb; c0 < n; c0 += 64) {
                int64_t cw = n - c0 < 64 ? n - c0 : 64;
                larfb_tile(P, nb, jb, T, nb, A, ld, j, c0, cw, m - j);
            }
        }
    }
}

/* One work item of step j (qrt_step_f32): panel j's update of column tile
 * ``tile`` of matrix b, or (tile < 0) the look-ahead item, which factors panel
 * j + nb (panel 0 when j < 0) into the other workspace slot.  nb, tw and ld
 * clamped by the caller. */
static void step_item(cap_t a, cap_t tau, cap_t work, int64_t m, int64_t n, int64_t nb,
                      int64_t j, int64_t tw, int64_t ld, int64_t b, int64_t tile)
{
    int64_t k = m < n ? m : n;
    int64_t wsz = 2 * slot_elems(m, nb);
    /* panel j (none for j < 0), the next panel jn and their widths */
    int64_t jb = panel_width(k, j, nb);
    int64_t jn = step_next(j, nb);
    int64_t jbn = panel_width(k, jn, nb);
    int64_t cs = step_first_col(k, nb, j);
    cap_t A = cap_offset_f32(a, b * m * ld);
    cap_t base = cap_offset_f32(work, b * wsz);
    cap_t Pc = panel_slot(base, m, nb, j);
    cap_t Tc = slot_t(Pc, m, nb);
    cap_t Vc = slot_v(Pc, nb, j);
    if (tile < 0) {
        cap_t Pn = panel_slot(base, m, nb, jn);
        cap_t Tn = slot_t(Pn, m, nb);
        cap_t X = cap_offset_f32(Tn, nb * nb);
        if (j < 0) {
            factor_panel(A, m, n, ld, jn, jbn, Pn, nb, Tn, cap_offset_f32(tau, b * k), X);
        } else {
            /* Copy the next panel's columns from row j down into the slot
             * once, apply panel j to them there and factor rows jn.. of
             * them in place (panel j is full: jn = j + nb), then copy all
             * of it back: two strided passes over A instead of four. */
            int64_t mr = m - j;
            for (int64_t t = 0; t < mr; t++)
                for (int64_t p = 0; p < jbn; p++)
                    cap_store_f32(Pn, t * nb + p, cap_load_f32(A, (j + t) * ld + jn + p));
            larfb_tile(Vc, nb, jb, Tc, nb, Pn, nb, 0, 0, jbn, mr);
            panel_qr(cap_offset_f32(Pn, nb * nb), nb, mr - nb, jbn,
                     cap_offset_f32(tau, b * k + jn), Tn, nb, jn + jbn < n ? 1 : 0, X);
            for (int64_t t = 0; t < mr; t++)
                for (int64_t p = 0; p < jbn; p++)
                    cap_store_f32(A, (j + t) * ld + jn + p, cap_load_f32(Pn, t * nb + p));
        }
    } else {
        int64_t c0 = cs + tile * tw;
        int64_t cw = n - c0 < tw ? n - c0 : tw;
        larfb_tile(Vc, nb, jb, Tc, nb, A, ld, j, c0, cw, m - j);
    }
}

/*
 * One step.  j < 0: factor panel 0 of every matrix (items: one per matrix).
 * j >= 0 (panel j factored, its V and T in workspace slot (j / nb) % 2):
 * items are, per matrix, the next panel (update + factor into the other
 * slot) if there is one, then the remaining columns in tiles of tw (1..64).
 * work: batch * 2 * slot_elems(m, nb) elements, one region per matrix
 * (items of a matrix run on different blocks and share its slots).  Rows of
 * ld elements, as for qrt_f32.
 */
KERNEL void qrt_step_f32(cap_t a, cap_t tau, cap_t work, int64_t batch, int64_t m, int64_t n,
                         int64_t nb, int64_t j, int64_t tw, int64_t ld)
{
    int64_t k = m < n ? m : n;
    nb = clamp_i64(nb, 1, 64);
    tw = clamp_i64(tw, 1, 64);
    ld = ld < n ? n : ld;
    int64_t ntiles = step_tiles(k, n, nb, j, tw);
    int64_t npan = panel_width(k, step_next(j, nb), nb) > 0 ? 1 : 0;
    int64_t items = batch * (npan + ntiles);
    for (int64_t it = rt_block_idx(); it < items; it += rt_grid_dim()) {
        if (it < batch * npan)
            step_item(a, tau, work, m, n, nb, j, tw, ld, it, -1);
        else
            step_item(a, tau, work, m, n, nb, j, tw, ld, (it - batch * npan) / ntiles,
                      (it - batch * npan) % ntiles);
    }
}
