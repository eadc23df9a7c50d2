/*
 * copy: dst = src (n elements), one contiguous slice per block, and per block
 * the count of non-finite elements in its slice (bad[block]).  kernels.qr's
 * input copy and NaN/Inf check in one pass on every worker, instead of two
 * single-threaded numpy passes (n = 4096: 1297 -> 1165 ms for the whole call on
 * the 2-core VM; on the 16-core H200 host no difference within the noise,
 * bench/results/cpu-qrcopy-2026-12-03-h200host16.txt).
 */
KERNEL void copy_f32(cap_t src, cap_t dst, cap_t bad, int64_t n)
{
    int64_t per = (n + rt_grid_dim() - 1) / rt_grid_dim();
    int64_t lo = rt_block_idx() * per;
    int64_t hi = n - lo < per ? n : lo + per;
    int64_t count = 0;
    for (int64_t i = lo; i < hi; i++) {
        float x = cap_load_f32(src, i);
        cap_store_f32(dst, i, x);
        count += isfinite(x) ? 0 : 1;
    }
    cap_store_i64(bad, rt_block_idx(), count);
}
