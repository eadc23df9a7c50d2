/*
 * Blocked Householder QR on the GPU, part 2: the trailing update (many blocks per matrix).
 *
 * After gpu_qr_panel factored columns k0 .. k0+nb-1, apply its block reflector
 * Q_k^T = I - V T^T V^T to the trailing columns k0+nb .. n-1 of rows k0 .. n-1:
 *     Z = V^T C,  W = T^T Z,  C -= V W.
 * The grid is one-dimensional over (matrix, strip): block bid takes matrix
 * bid / nstrips and the 32-column strip bid % nstrips, all rows, so a batch of
 * two 4096 x 4096 matrices keeps 254 blocks busy instead of 2.  V (unit lower
 * trapezoidal, read from A below the diagonal) and C go through shared memory
 * in chunks of 128 rows; each thread keeps a 4 x 4 register tile (fp32, fmaf),
 * so every shared-memory load feeds two multiply-adds.  Row stride 33 in smem_v
 * keeps the four rows a warp reads in distinct banks.  256 threads per block.
 *
 * Z: thread t sums rows g, g+4, ... of each chunk (g = t / 64) for reflectors
 * qg + 8i and columns cg + 8j (qg = t % 64 / 8, cg = t % 8); the four partial
 * sums are added through shared memory.  C -= V W: thread t updates rows
 * rg + 32i (rg = t / 8) and columns cg + 8j of each chunk.
 */
KERNEL void gpu_qr_update(cap_t A, cap_t Tw, int64_t n, int64_t k0, int64_t nb, int64_t nstrips)
{
    float smem_v[4224];
    float smem_c[4096];
    float smem_t[1024];
    float smem_z[1024];
    float smem_w[1024];
    int64_t bid = rt_block_idx();
    int64_t b = bid / nstrips;
    int64_t cs = k0 + nb + (bid % nstrips) * 32;
    int64_t t = rt_thread_idx();
    int64_t g = t / 64;
    int64_t qg = (t % 64) / 8;
    int64_t cg = t % 8;
    int64_t rg = t / 8;
    int64_t lq = t % 32;
    int64_t lr = t / 32;
    cap_t M = cap_offset_f32(A, b * n * n);
    cap_t TT = cap_offset_f32(Tw, b * 1024);
    float z00 = 0.0f; float z01 = 0.0f; float z02 = 0.0f; float z03 = 0.0f;
    float z10 = 0.0f; float z11 = 0.0f; float z12 = 0.0f; float z13 = 0.0f;
    float z20 = 0.0f; float z21 = 0.0f; float z22 = 0.0f; float z23 = 0.0f;
    float z30 = 0.0f; float z31 = 0.0f; float z32 = 0.0f; float z33 = 0.0f;
    for (int64_t e = t; e < 1024; e += 256)
        smem_t[e] = cap_load_f32(TT, e);
    for (int64_t r0 = k0; r0 < n; r0 += 128) {
        int64_t rows = n - r0 < 128 ? n - r0 : 128;
        /* chunk: V rows r0 .. r0+rows-1 (v[q] = 0 above row k0+q, 1 on it), C the same rows */
        for (int64_t rr = lr; rr < rows; rr += 8) {
            float v = 0.0f;
            float c = 0.0f;
            if (lq < nb && r0 + rr > k0 + lq)
                v = cap_load_f32(M, (r0 + rr) * n + k0 + lq);
            if (lq < nb && r0 + rr == k0 + lq)
                v = 1.0f;
            if (cs + lq < n)
                c = cap_load_f32(M, (r0 + rr) * n + cs + lq);
            smem_v[rr * 33 + lq] = v;
            smem_c[rr * 32 + lq] = c;
        }
        for (int64_t rr = rows + lr; rr < 128; rr += 8) {
            smem_v[rr * 33 + lq] = 0.0f;
            smem_c[rr * 32 + lq] = 0.0f;
        }
        rt_sync_threads();
        for (int64_t rr = g; rr < 128; rr += 4) {
            float p0 = smem_v[rr * 33 + qg + 0];
            float p1 = smem_v[rr * 33 + qg + 8];
            float p2 = smem_v[rr * 33 + qg + 16];
            float p3 = smem_v[rr * 33 + qg + 24];
            float h0 = smem_c[rr * 32 + cg + 0];
            float h1 = smem_c[rr * 32 + cg + 8];
            float h2 = smem_c[rr * 32 + cg + 16];
            float h3 = smem_c[rr * 32 + cg + 24];
            z00 = fmaf(p0, h0, z00);
            z01 = fmaf(p0, h1, z01);
            z02 = fmaf(p0, h2, z02);
            z03 = fmaf(p0, h3, z03);
            z10 = fmaf(p1, h0, z10);
            z11 = fmaf(p1, h1, z11);
            z12 = fmaf(p1, h2, z12);
            z13 = fmaf(p1, h3, z13);
            z20 = fmaf(p2, h0, z20);
            z21 = fmaf(p2, h1, z21);
            z22 = fmaf(p2, h2, z22);
            z23 = fmaf(p2, h3, z23);
            z30 = fmaf(p3, h0, z30);
            z31 = fmaf(p3, h1, z31);
            z32 = fmaf(p3, h2, z32);
            z33 = fmaf(p3, h3, z33);
        }
        rt_sync_threads();
    }
    /* Z = sum of the four row-group partials; W = T^T Z (T upper triangular) */
    smem_c[g * 1024 + (qg + 0) * 32 + cg + 0] = z00;
    smem_c[g * 1024 + (qg + 0) * 32 + cg + 8] = z01;
    smem_c[g * 1024 + (qg + 0) * 32 + cg + 16] = z02;
    smem_c[g * 1024 + (qg + 0) * 32 + cg + 24] = z03;
    smem_c[g * 1024 + (qg + 8) * 32 + cg + 0] = z10;
    smem_c[g * 1024 + (qg + 8) * 32 + cg + 8] = z11;
    smem_c[g * 1024 + (qg + 8) * 32 + cg + 16] = z12;
    smem_c[g * 1024 + (qg + 8) * 32 + cg + 24] = z13;
    smem_c[g * 1024 + (qg + 16) * 32 + cg + 0] = z20;
    smem_c[g * 1024 + (qg + 16) * 32 + cg + 8] = z21;
    smem_c[g * 1024 + (qg + 16) * 32 + cg + 16] = z22;
    smem_c[g * 1024 + (qg + 16) * 32 + cg + 24] = z23;
    smem_c[g * 1024 + (qg + 24) * 32 + cg + 0] = z30;
    smem_c[g * 1024 + (qg + 24) * 32 + cg + 8] = z31;
    smem_c[g * 1024 + (qg + 24) * 32 + cg + 16] = z32;
    smem_c[g * 1024 + (qg + 24) * 32 + cg + 24] = z33;
    rt_sync_threads();
    for (int64_t e = t; e < 1024; e += 256)
        smem_z[e] = (smem_c[e] + smem_c[1024 + e]) + (smem_c[2048 + e] + smem_c[3072 + e]);
    rt_sync_threads();
    for (int64_t e = t; e < 1024; e += 256) {
        int64_t q = e / 32;
        int64_t c = e % 32;
        float s = 0.0f;
        for (int64_t l = 0; l <= q; l++)
            s = fmaf(smem_t[l * 32 + q], smem_z[l * 32 + c], s);
        smem_w[e] = s;
    }
    rt_sync_threads();
    for (int64_t r0 = k0; r0 < n; r0 += 128) {
        int64_t rows = n - r0 < 128 ? n - r0 : 128;
        for (int64_t rr = lr; rr < rows; rr += 8) {
            float v = 0.0f;
            float c = 0.0f;
            if (lq < nb && r0 + rr > k0 + lq)
                v = cap_load_f32(M, (r0 + rr) * n + k0 + lq);
            if (lq < nb && r0 + rr == k0 + lq)
                v = 1.0f;
            if (cs + lq < n)
                c = cap_load_f32(M, (r0 + rr) * n + cs + lq);
            smem_v[rr * 33 + lq] = v;
            smem_c[rr * 32 + lq] = c;
        }
        rt_sync_threads();
        float a00 = smem_c[(rg + 0) * 32 + cg + 0];
        float a01 = smem_c[(rg + 0) * 32 + cg + 8];
        float a02 = smem_c[(rg + 0) * 32 + cg + 16];
        float a03 = smem_c[(rg + 0) * 32 + cg + 24];
        float a10 = smem_c[(rg + 32) * 32 + cg + 0];
        float a11 = smem_c[(rg + 32) * 32 + cg + 8];
        float a12 = smem_c[(rg + 32) * 32 + cg + 16];
        float a13 = smem_c[(rg + 32) * 32 + cg + 24];
        float a20 = smem_c[(rg + 64) * 32 + cg + 0];
        float a21 = smem_c[(rg + 64) * 32 + cg + 8];
        float a22 = smem_c[(rg + 64) * 32 + cg + 16];
        float a23 = smem_c[(rg + 64) * 32 + cg + 24];
        float a30 = smem_c[(rg + 96) * 32 + cg + 0];
        float a31 = smem_c[(rg + 96) * 32 + cg + 8];
        float a32 = smem_c[(rg + 96) * 32 + cg + 16];
        float a33 = smem_c[(rg + 96) * 32 + cg + 24];
        for (int64_t q = 0; q < nb; q++) {
            float u0 = smem_v[(rg + 0) * 33 + q];
            float u1 = smem_v[(rg + 32) * 33 + q];
            float u2 = smem_v[(rg + 64) * 33 + q];
            float u3 = smem_v[(rg + 96) * 33 + q];
            float w0 = smem_w[q * 32 + cg + 0];
            float w1 = smem_w[q * 32 + cg + 8];
            float w2 = smem_w[q * 32 + cg + 16];
            float w3 = smem_w[q * 32 + cg + 24];
            a00 = fmaf(-u0, w0, a00);
            a01 = fmaf(-u0, w1, a01);
            a02 = fmaf(-u0, w2, a02);
            a03 = fmaf(-u0, w3, a03);
            a10 = fmaf(-u1, w0, a10);
            a11 = fmaf(-u1, w1, a11);
            a12 = fmaf(-u1, w2, a12);
            a13 = fmaf(-u1, w3, a13);
            a20 = fmaf(-u2, w0, a20);
            a21 = fmaf(-u2, w1, a21);
            a22 = fmaf(-u2, w2, a22);
            a23 = fmaf(-u2, w3, a23);
            a30 = fmaf(-u3, w0, a30);
            a31 = fmaf(-u3, w1, a31);
            a32 = fmaf(-u3, w2, a32);
            a33 = fmaf(-u3, w3, a33);
        }
        smem_c[(rg + 0) * 32 + cg + 0] = a00;
        smem_c[(rg + 0) * 32 + cg + 8] = a01;
        smem_c[(rg + 0) * 32 + cg + 16] = a02;
        smem_c[(rg + 0) * 32 + cg + 24] = a03;
        smem_c[(rg + 32) * 32 + cg + 0] = a10;
        smem_c[(rg + 32) * 32 + cg + 8] = a11;
        smem_c[(rg + 32) * 32 + cg + 16] = a12;
        smem_c[(rg + 32) * 32 + cg + 24] = a13;
        smem_c[(rg + 64) * 32 + cg + 0] = a20;
        smem_c[(rg + 64) * 32 + cg + 8] = a21;
        smem_c[(rg + 64) * 32 + cg + 16] = a22;
        smem_c[(rg + 64) * 32 + cg + 24] = a23;
        smem_c[(rg + 96) * 32 + cg + 0] = a30;
        smem_c[(rg + 96) * 32 + cg + 8] = a31;
        smem_c[(rg + 96) * 32 + cg + 16] = a32;
        smem_c[(rg + 96) * 32 + cg + 24] = a33;
        rt_sync_threads();
        if (cs + lq < n) {
            for (int64_t rr = lr; rr < rows; rr += 8)
                cap_store_f32(M, (r0 + rr) * n + cs + lq, smem_c[rr * 32 + lq]);
        }
        rt_sync_threads();
    }
}
