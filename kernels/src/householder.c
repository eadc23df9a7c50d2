/*
 * Householder building blocks shared by the QR kernels (float32 text; the
 * float64 build is derived by kernels/sources.py with a fixed substitution).
 *
 * Layout: every matrix is row-major with leading dimension ld, element (i, j)
 * at i * ld + j.  Householder vectors are columns, so they are strided, but
 * every inner loop below runs along a row (unit stride), which is what gcc
 * vectorises.  This is the orientation numpy gives us, so no transposes.
 *
 * Every multiply-add is an explicit fmaf(): gcc contracts a*b+c differently
 * depending on how the surrounding code is shaped, and checked and raw
 * builds are shaped differently, so implicit contraction would make their
 * results differ in the last bit.  Explicit fmaf() makes them bitwise equal.
 */

/* ||A[i0:i1, col]||_2, scaled by the largest magnitude so that neither the
 * squares overflow nor tiny entries underflow (the job of LAPACK's xNRM2). */
static float nrm2_col(cap_t A, int64_t ld, int64_t col, int64_t i0, int64_t i1)
{
    float amax = 0.0f;
    for (int64_t i = i0; i < i1; i++) {
        float x = fabsf(cap_load_f32(A, i * ld + col));
        if (x > amax || isnan(x))
            amax = x;
    }
    if (amax == 0.0f || !isfinite(amax))
        return amax;
    float s = 0.0f;
    for (int64_t i = i0; i < i1; i++) {
        float x = cap_load_f32(A, i * ld + col) / amax;
        s = fmaf(x, x, s);
    }
    return amax * sqrtf(s);
}

static void scal_col(cap_t A, int64_t ld, int64_t col, int64_t i0, int64_t i1, float s)
{
    for (int64_t i = i0; i < i1; i++)
        cap_store_f32(A, i * ld + col, s * cap_load_f32(A, i * ld + col));
}

/* xLARFG on A[r:m, col]: alpha = A[r, col], x = A[r+1:m, col].  Overwrites
 * alpha with beta = -sign(alpha) * ||(alpha, x)||, x with v (v[0] = 1 is
 * implicit) and returns tau = (beta - alpha) / beta; tau = 0 (H = I) when x is
 * zero.  Tiny columns are rescaled by 1/safmin like LAPACK, so beta and v stay
 * accurate instead of flushing to zero. */
static float larfg_col(cap_t A, int64_t ld, int64_t col, int64_t r, int64_t m)
{
    float alpha = cap_load_f32(A, r * ld + col);
    float xnorm = nrm2_col(A, ld, col, r + 1, m);
    if (xnorm == 0.0f)
        return 0.0f;
    float beta = -copysignf(hypotf(alpha, xnorm), alpha);
    float safmin = 1.17549435e-38f / 5.96046448e-08f;
    int64_t knt = 0;
    if (fabsf(beta) < safmin) {
        float rsafmn = 1.0f / safmin;
        while (fabsf(beta) < safmin && knt < 20) {
            knt++;
            scal_col(A, ld, col, r + 1, m, rsafmn);
            beta = beta * rsafmn;
            alpha = alpha * rsafmn;
        }
        xnorm = nrm2_col(A, ld, col, r + 1, m);
        beta = -copysignf(hypotf(alpha, xnorm), alpha);
    }
    float tau = (beta - alpha) / beta;
    scal_col(A, ld, col, r + 1, m, 1.0f / (alpha - beta));
    for (int64_t k = 0; k < knt; k++)
        beta = beta * safmin;
    cap_store_f32(A, r * ld + col, beta);
    return tau;
}

/* Apply H = I - tau v v^T (v = A[r:m, col], v[0] = 1) from the left to
 * A[r:m, c0:c1].  w (length >= c1) holds v^T A row-wise; both passes stream
 * rows, so the inner loops are unit-stride axpys.  Rows go four at a time
 * (one inner loop, and one set of range checks, per four rows); the sum over
 * the rows keeps its order, so the result is that of one row at a time. */
static void larf_left(cap_t A, int64_t ld, int64_t col, int64_t r, int64_t m,
                      int64_t c0, int64_t c1, float tau, cap_t w)
{
    if (tau == 0.0f || c0 >= c1)
        return;
    int64_t nq = (m - r - 1) / 4;
    int64_t rest = r + 1 + 4 * nq;
    for (int64_t c = c0; c < c1; c++)
        cap_store_f32(w, c, cap_load_f32(A, r * ld + c));
    for (int64_t q = 0; q < nq; q++) {
        int64_t a0 = (r + 1 + 4 * q) * ld;
        int64_t a1 = a0 + ld;
        int64_t a2 = a1 + ld;
        int64_t a3 = a2 + ld;
        float v0 = cap_load_f32(A, a0 + col);
        float v1 = cap_load_f32(A, a1 + col);
        float v2 = cap_load_f32(A, a2 + col);
        float v3 = cap_load_f32(A, a3 + col);
        for (int64_t c = c0; c < c1; c++)
            cap_store_f32(w, c, fmaf(v3, cap_load_f32(A, a3 + c),
                                     fmaf(v2, cap_load_f32(A, a2 + c),
                                          fmaf(v1, cap_load_f32(A, a1 + c),
                                               fmaf(v0, cap_load_f32(A, a0 + c),
                                                    cap_load_f32(w, c))))));
    }
    for (int64_t i = rest; i < m; i++) {
        float vi = cap_load_f32(A, i * ld + col);
        for (int64_t c = c0; c < c1; c++)
            cap_store_f32(w, c, fmaf(vi, cap_load_f32(A, i * ld + c), cap_load_f32(w, c)));
    }
    for (int64_t c = c0; c < c1; c++) {
        float t = tau * cap_load_f32(w, c);
        cap_store_f32(w, c, t);
        cap_store_f32(A, r * ld + c, cap_load_f32(A, r * ld + c) - t);
    }
    for (int64_t q = 0; q < nq; q++) {
        int64_t a0 = (r + 1 + 4 * q) * ld;
        int64_t a1 = a0 + ld;
        int64_t a2 = a1 + ld;
        int64_t a3 = a2 + ld;
        float v0 = cap_load_f32(A, a0 + col);
        float v1 = cap_load_f32(A, a1 + col);
        float v2 = cap_load_f32(A, a2 + col);
        float v3 = cap_load_f32(A, a3 + col);
        for (int64_t c = c0; c < c1; c++) {
            float wc = cap_load_f32(w, c);
            cap_store_f32(A, a0 + c, fmaf(-v0, wc, cap_load_f32(A, a0 + c)));
            cap_store_f32(A, a1 + c, fmaf(-v1, wc, cap_load_f32(A, a1 + c)));
            cap_store_f32(A, a2 + c, fmaf(-v2, wc, cap_load_f32(A, a2 + c)));
            cap_store_f32(A, a3 + c, fmaf(-v3, wc, cap_load_f32(A, a3 + c)));
        }
    }
    for (int64_t i = rest; i < m; i++) {
        float vi = cap_load_f32(A, i * ld + col);
        for (int64_t c = c0; c < c1; c++)
            cap_store_f32(A, i * ld + c, fmaf(-vi, cap_load_f32(w, c), cap_load_f32(A, i * ld + c)));
    }
}

/* xLARFT (forward, columnwise): the jb x jb upper triangular T of the block
 * reflector H = I - V T V^T, V = unit lower trapezoidal in A[r:m, vc:vc+jb],
 * tau[0:jb], jb <= 128.  T is row-major with leading dimension ldt.  The
 * Gram matrix G[p][q] = v_p^T v_q (q < p) is accumulated in one sweep over
 * the rows (unit-stride axpys into a local array), then
 * T[0:p, p] = -tau_p T[0:p, 0:p] G[p][0:p]. */
static void larft(cap_t A, int64_t ld, int64_t r, int64_t vc, int64_t jb, int64_t m,
                  cap_t tau, cap_t T, int64_t ldt)
{
    float g[128][128];
    float x[128];
    /* Callers pass jb <= 128; saying so lets gcc prove the local-array guards
     * of the triangular loops below (they are re-checked per row otherwise). */
    if (jb > 128)
        jb = 128;
    for (int64_t p = 0; p < jb; p++)
        for (int64_t q = 0; q < p; q++)
            g[p][q] = 0.0f;
    for (int64_t t = 0; t < m - r; t++) {
        /* x = row t of V: V(t, t) = 1, V(t, p) = 0 for p > t. */
        int64_t pe = t < jb ? t : jb;
        for (int64_t p = 0; p < pe; p++)
            x[p] = cap_load_f32(A, (r + t) * ld + vc + p);
        if (t < jb && t < 128)
            x[t] = 1.0f;
        int64_t pl = t < jb ? t + 1 : jb;
        for (int64_t p = 1; p < pl; p++) {
            float xp = x[p];
            for (int64_t q = 0; q < p; q++)
                g[p][q] = fmaf(xp, x[q], g[p][q]);
        }
    }
    for (int64_t p = 0; p < jb; p++) {
        float tp = cap_load_f32(tau, p);
        for (int64_t q = 0; q < p; q++) {
            float s = 0.0f;
            for (int64_t s_i = q; s_i < p; s_i++)
                s = fmaf(cap_load_f32(T, q * ldt + s_i), g[p][s_i], s);
            cap_store_f32(T, q * ldt + p, tp == 0.0f ? 0.0f : -tp * s);
        }
        cap_store_f32(T, p * ldt + p, tp);
    }
}
