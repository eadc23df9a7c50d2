/*
 * capqr guards: pure range checks of cap_t bounds and int64 index arithmetic, the
 * same on both lanes (C11 and CUDA C++).  Loop versioning (runtime/compiler/hoist/)
 * runs a loop's fast copy only when these hold for the whole loop; a tile copy
 * checks its whole tile with one call.  cap_abi.h includes this at its end (it needs
 * cap_t, RT_INB and RT_ABI_FN from there); the per-access checks are checks.h.
 */
#ifndef CAPQR_GUARDS_H
#define CAPQR_GUARDS_H

/* ---- loop-versioning guards (runtime/compiler/hoist/), both lanes ---- */
/* Overflow-checked int64 arithmetic: gcc's builtins on the host; on the device
 * the same results from wrapping arithmetic and the high product word. */
#ifdef RT_DEVICE_LANE
RT_ABI_FN int rt_add_ovf(rt_i64 a, rt_i64 b, rt_i64 *r)
{
    *r = (rt_i64)((rt_u64)a + (rt_u64)b);
    return ((a ^ *r) & (b ^ *r)) < 0;
}
RT_ABI_FN int rt_sub_ovf(rt_i64 a, rt_i64 b, rt_i64 *r)
{
    *r = (rt_i64)((rt_u64)a - (rt_u64)b);
    return ((a ^ b) & (a ^ *r)) < 0;
}
RT_ABI_FN int rt_mul_ovf(rt_i64 a, rt_i64 b, rt_i64 *r)
{
    rt_i64 hi = __mul64hi(a, b);
    *r = (rt_i64)((rt_u64)a * (rt_u64)b);
    return hi != (*r < 0 ? -1 : 0);
}
#else
#define rt_add_ovf(a, b, r) __builtin_add_overflow(a, b, r)
#define rt_sub_ovf(a, b, r) __builtin_sub_overflow(a, b, r)
#define rt_mul_ovf(a, b, r) __builtin_mul_overflow(a, b, r)
#endif

/* The last value e0 + d*span of an affine index, or 0 if computing it
 * overflows (then the index sequence may wrap and no range guard holds). */
RT_ABI_FN int rt_affine_end(rt_i64 e0, rt_i64 d, rt_i64 span, rt_i64 *end)
{
    rt_i64 tot;
    return !rt_mul_ovf(d, span, &tot) && !rt_add_ovf(e0, tot, end);
}

/* An affine index e0 + d*t for t in [0, span] stays inside the object, without
 * wrapping, at both ends. */
RT_ABI_FN int rt_range_ok(cap_t c, rt_i64 e0, rt_i64 d, rt_i64 span, rt_i64 S, int store)
{
    rt_i64 eL;
    rt_u64 len = store ? c.wlen : c.rlen;
    if (!rt_affine_end(e0, d, span, &eL)) return 0;
    return RT_INB(c, e0, (rt_u64)S, len) && RT_INB(c, eL, (rt_u64)S, len);
}

/* Iteration span (last - a) of `for (i = a; i < b (or <= b); i += step)` when
 * a < b (a <= b), or 0 if it cannot be computed without overflow, including
 * the final `i += step` past the end. */
RT_ABI_FN int rt_loop_span(rt_i64 a, rt_i64 b, rt_i64 step, int incl, rt_i64 *span)
{
    rt_i64 d, last, after;
    if (rt_sub_ovf(b, a, &d)) return 0;
    if (!incl) d -= 1;
    last = a + (d / step) * step;
    if (rt_add_ovf(last, step, &after)) return 0;
    *span = last - a;
    return 1;
}
/* Same for a 32-bit (int) loop counter: the start must fit an int and the
 * final `i += step` must not pass INT32_MAX. */
RT_ABI_FN int rt_loop_span32(rt_i64 a, rt_i64 b, rt_i64 step, int incl, rt_i64 *span)
{
    if (a < RT_I32_MIN || a > RT_I32_MAX || !rt_loop_span(a, b, step, incl, span))
        return 0;
    return a + *span + step <= RT_I32_MAX;
}
/* Local-array subscript e0 + d*t for t in [0, span] stays in [0, dim). */
RT_ABI_FN int rt_lrange_ok(rt_i64 e0, rt_i64 d, rt_i64 span, rt_i64 dim)
{
    rt_i64 eL;
    if (!rt_affine_end(e0, d, span, &eL)) return 0;
    return e0 >= 0 && e0 < dim && eL >= 0 && eL < dim;
}
/* An int (32-bit) part e0 + d*t of an index, t in [0, span], stays in int
 * range.  The loop computes that part in 32-bit arithmetic from an int
 * counter, the guard in 64 bits; they agree exactly when it does. */
RT_ABI_FN int rt_irange_ok(rt_i64 e0, rt_i64 d, rt_i64 span)
{
    rt_i64 eL;
    if (!rt_affine_end(e0, d, span, &eL)) return 0;
    return e0 >= RT_I32_MIN && e0 <= RT_I32_MAX && eL >= RT_I32_MIN && eL <= RT_I32_MAX;
}
/* A loop nest's index e00 + di*s + dj*t over the iteration box s in [0, si],
 * t in [0, sj] is affine, so its extremes are corners of the box.  If no corner
 * value overflows, every value in the box lies between the smallest and the
 * largest corner, hence is in int64 range, hence the wrapping computation of
 * the index is exact.  Sets [*lo, *hi]; 0 if a corner overflows. */
RT_ABI_FN int rt_affine_box(rt_i64 e00, rt_i64 di, rt_i64 si, rt_i64 dj, rt_i64 sj,
                            rt_i64 *lo, rt_i64 *hi)
{
    rt_i64 ti, tj, e10, e01, e11;
    if (rt_mul_ovf(di, si, &ti) || rt_mul_ovf(dj, sj, &tj)) return 0;
    if (rt_add_ovf(e00, ti, &e10) || rt_add_ovf(e00, tj, &e01) || rt_add_ovf(e10, tj, &e11))
        return 0;
    *lo = e00 < e10 ? e00 : e10;
    *lo = *lo < e01 ? *lo : e01;
    *lo = *lo < e11 ? *lo : e11;
    *hi = e00 > e10 ? e00 : e10;
    *hi = *hi > e01 ? *hi : e01;
    *hi = *hi > e11 ? *hi : e11;
    return 1;
}
/* Every index of a 2-level nest (see rt_affine_box) is inside the object:
 * the smallest and the largest are, and RT_INB holds on the whole interval
 * between two in-bounds indices (as for rt_range_ok's two ends). */
RT_ABI_FN int rt_range2_ok(cap_t c, rt_i64 e00, rt_i64 di, rt_i64 si, rt_i64 dj, rt_i64 sj,
                           rt_i64 S, int store)
{
    rt_i64 lo, hi;
    rt_u64 len = store ? c.wlen : c.rlen;
    if (!rt_affine_box(e00, di, si, dj, sj, &lo, &hi)) return 0;
    return RT_INB(c, lo, (rt_u64)S, len) && RT_INB(c, hi, (rt_u64)S, len);
}
/* An int part of a 2-level nest's index stays in int range (rt_irange_ok). */
RT_ABI_FN int rt_irange2_ok(rt_i64 e00, rt_i64 di, rt_i64 si, rt_i64 dj, rt_i64 sj)
{
    rt_i64 lo, hi;
    if (!rt_affine_box(e00, di, si, dj, sj, &lo, &hi)) return 0;
    return lo >= RT_I32_MIN && hi <= RT_I32_MAX;
}
/* Local-array subscript of a 2-level nest stays in [0, dim). */
RT_ABI_FN int rt_lrange2_ok(rt_i64 e00, rt_i64 di, rt_i64 si, rt_i64 dj, rt_i64 sj, rt_i64 dim)
{
    rt_i64 lo, hi;
    if (!rt_affine_box(e00, di, si, dj, sj, &lo, &hi)) return 0;
    return lo >= 0 && hi < dim;
}
/* Hull checks: several accesses of one loop to one object that differ only in
 * their first index e0 in [lo, hi] (same stride, size and access) touch indices
 * between the smallest and the largest end of the ranges that start at lo and
 * at hi, so those two ranges being inside the object (and not overflowing)
 * covers all of them, and is necessary too (lo and hi are accesses). */
RT_ABI_FN rt_i64 rt_min64(rt_i64 a, rt_i64 b) { return a < b ? a : b; }
RT_ABI_FN rt_i64 rt_max64(rt_i64 a, rt_i64 b) { return a > b ? a : b; }
RT_ABI_FN int rt_range_hull_ok(cap_t c, rt_i64 lo, rt_i64 hi, rt_i64 d, rt_i64 span, rt_i64 S,
                               int store)
{
    rt_i64 tot, loL, hiL;
    rt_u64 len = store ? c.wlen : c.rlen;
    if (rt_mul_ovf(d, span, &tot) || rt_add_ovf(lo, tot, &loL) || rt_add_ovf(hi, tot, &hiL))
        return 0;
    return RT_INB(c, tot < 0 ? loL : lo, (rt_u64)S, len)
        && RT_INB(c, tot < 0 ? hi : hiL, (rt_u64)S, len);
}
RT_ABI_FN int rt_lrange_hull_ok(rt_i64 lo, rt_i64 hi, rt_i64 d, rt_i64 span, rt_i64 dim)
{
    return rt_lrange_ok(lo, d, span, dim) && rt_lrange_ok(hi, d, span, dim);
}
/* The step q of a line of first indices is small enough for its two ends to
 * stand for every member (runtime/compiler/lines.py): |q| < RT_IDX_LIMIT. */
RT_ABI_FN int rt_line_ok(rt_i64 q) { return RT_OFFSET_SANE(q); }
RT_ABI_FN int rt_range2_hull_ok(cap_t c, rt_i64 lo, rt_i64 hi, rt_i64 di, rt_i64 si, rt_i64 dj,
                                rt_i64 sj, rt_i64 S, int store)
{
    return rt_range2_ok(c, lo, di, si, dj, sj, S, store)
        && rt_range2_ok(c, hi, di, si, dj, sj, S, store);
}
RT_ABI_FN int rt_lrange2_hull_ok(rt_i64 lo, rt_i64 hi, rt_i64 di, rt_i64 si, rt_i64 dj,
                                 rt_i64 sj, rt_i64 dim)
{
    return rt_lrange2_ok(lo, di, si, dj, sj, dim) && rt_lrange2_ok(hi, di, si, dj, sj, dim);
}

/* ---- checked tiles (cap_tile_load_T / cap_tile_store_T), both lanes ---- */
/* Element (r, k) of a rows x cols tile sits at index off + r*ld + k of the cap
 * and aoff + r*ald + k of the local array (n elements, flat).  Both index sets
 * are affine in (r, k), so rt_range2_ok / rt_lrange2_ok over the box
 * [0, rows-1] x [0, cols-1] accept exactly the tiles whose every element is
 * in range: the corners are elements, and a corner that overflows is out of
 * every object.  One check per tile; rows <= 0 or cols <= 0 is an empty tile. */
RT_ABI_FN int rt_tile_ok(cap_t c, rt_i64 off, rt_i64 ld, rt_i64 S, int store, rt_i64 n,
                         rt_i64 aoff, rt_i64 ald, rt_i64 rows, rt_i64 cols)
{
    if (rows <= 0 || cols <= 0) return 1;
    return rt_range2_ok(c, off, ld, rows - 1, 1, cols - 1, S, store)
        && rt_lrange2_ok(aoff, ald, rows - 1, 1, cols - 1, n);
}
/* off + r*ld + k, or 0 when it overflows (*idx then saturates toward the true
 * value's sign: such an index is outside every object). */
RT_ABI_FN int rt_tile_index(rt_i64 off, rt_i64 ld, rt_i64 r, rt_i64 k, rt_i64 *idx)
{
    rt_i64 t, u;
    if (rt_mul_ovf(r, ld, &t)) { *idx = ld < 0 ? -RT_I64_MAX - 1 : RT_I64_MAX; return 0; }
    if (rt_add_ovf(off, t, &u)) { *idx = t < 0 ? -RT_I64_MAX - 1 : RT_I64_MAX; return 0; }
    if (rt_add_ovf(u, k, idx)) { *idx = RT_I64_MAX; return 0; }
    return 1;
}
/* The first element a refused tile copy would fault on, in the order of the
 * equivalent loop: rows, then columns, and per element the read before the
 * write (store == 0: the cap is read, the array written; store == 1: the
 * reverse).  Returns 1 for the cap access (*idx: its cap index), 2 for the
 * local array (*idx: its flat index), 0 if every element is in range.  Cold
 * path, O(rows + cols): a row is skipped when both of its ends are in range. */
RT_ABI_FN int rt_tile_first_fault(cap_t c, rt_i64 off, rt_i64 ld, rt_i64 S, int store,
                                  rt_i64 n, rt_i64 aoff, rt_i64 ald, rt_i64 rows,
                                  rt_i64 cols, rt_i64 *idx)
{
    rt_i64 r, k, ci, li;
    rt_u64 len = store ? c.wlen : c.rlen;
    if (rows <= 0 || cols <= 0) return 0;
    for (r = 0; r < rows; r++) {
        if (rt_tile_index(off, ld, r, 0, &ci) && rt_range_ok(c, ci, 1, cols - 1, S, store)
                && rt_tile_index(aoff, ald, r, 0, &li) && rt_lrange_ok(li, 1, cols - 1, n))
            continue;
        for (k = 0; k < cols; k++) {
            int cok = rt_tile_index(off, ld, r, k, &ci) && RT_INB(c, ci, (rt_u64)S, len);
            int lok = rt_tile_index(aoff, ald, r, k, &li) && li >= 0 && li < n;
            if (store ? !lok : !cok) { *idx = store ? li : ci; return store ? 2 : 1; }
            if (store ? !cok : !lok) { *idx = store ? ci : li; return store ? 1 : 2; }
        }
    }
    return 0;
}

#endif /* CAPQR_GUARDS_H */
