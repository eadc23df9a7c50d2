/*
 * Counters and handshake latency percentiles (over the last HS_RING
 * handshakes, so a long-running process reports recent behaviour).
 */
#include <stdlib.h>
#include <string.h>
#include "gc_internal.h"


#define HS_RING 8192
static pthread_mutex_t st_mu = PTHREAD_MUTEX_INITIALIZER;
static double hs_ring[HS_RING];
static uint64_t hs_n;
static double hs_max;
static double obs_ring[HS_RING];   /* request -> collector noticed */
static double obs_max;

void gc_record_handshake(double s, double observed)
{
    pthread_mutex_lock(&st_mu);
    hs_ring[hs_n % HS_RING] = s;
    obs_ring[hs_n % HS_RING] = observed;
    hs_n++;
    if (s > hs_max) hs_max = s;
    if (observed > obs_max) obs_max = observed;
    pthread_mutex_unlock(&st_mu);
    __atomic_add_fetch(&gc_state.st.handshakes, 1, __ATOMIC_RELAXED);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double q)
{
    if (!n) return 0;
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* Forget latency samples (benchmarks measure one configuration at a time). */
void gc_reset_handshake_stats(void)
{
    pthread_mutex_lock(&st_mu);
    hs_n = 0;
    hs_max = 0;
    obs_max = 0;
    pthread_mutex_unlock(&st_mu);
}

void gc_get_stats(gc_stats_t *out)
{
    gc_init();
    memset(out, 0, sizeof(*out));
    out->cycles = __atomic_load_n(&gc_state.st.cycles, __ATOMIC_ACQUIRE);
    uint64_t oa = __atomic_load_n(&gc_state.st.objects_alloc, __ATOMIC_ACQUIRE);
    uint64_t of = __atomic_load_n(&gc_state.st.objects_freed, __ATOMIC_ACQUIRE);
    uint64_t pa = __atomic_load_n(&gc_state.st.payload_alloc, __ATOMIC_ACQUIRE);
    uint64_t pf = __atomic_load_n(&gc_state.st.bytes_freed, __ATOMIC_ACQUIRE);
    out->objects_live = oa - of;
    out->bytes_live = pa - pf;
    out->objects_freed_total = of;
    out->bytes_freed_total = pf;
    out->bytes_allocated_total = __atomic_load_n(&gc_state.st.bytes_alloc, __ATOMIC_ACQUIRE);
    out->objects_allocated_total = oa;
    out->handshakes = __atomic_load_n(&gc_state.st.handshakes, __ATOMIC_ACQUIRE);
    out->mark_seconds_total = gc_state.st.mark_s;
    out->sweep_seconds_total = gc_state.st.sweep_s;
    out->threshold_bytes = __atomic_load_n(&gc_state.trigger_bytes, __ATOMIC_RELAXED);
    out->stw = gc_state.stw_mode;
    out->verify = gc_state.verify_mode;
    out->verify_failures = __atomic_load_n(&gc_state.st.verify_failures, __ATOMIC_ACQUIRE);
    out->running = __atomic_load_n(&gc_state.st.running, __ATOMIC_ACQUIRE);
    out->enabled = __atomic_load_n(&gc_state.enabled, __ATOMIC_ACQUIRE);

    static double tmp[HS_RING];
    pthread_mutex_lock(&st_mu);
    size_t n = hs_n < HS_RING ? (size_t)hs_n : HS_RING;
    memcpy(tmp, hs_ring, n * sizeof(double));
    qsort(tmp, n, sizeof(double), cmp_d);
    out->handshake_p50_us = pct(tmp, n, 0.50) * 1e6;
    out->handshake_p99_us = pct(tmp, n, 0.99) * 1e6;
    out->handshake_max_us = hs_max * 1e6;
    pthread_mutex_unlock(&st_mu);
}

/* Handshake latency as the collector thread observed it (includes its own
 * wakeup delay): p50, p99, max in microseconds. */
void gc_handshake_observed_us(double out[3])
{
    static double tmp[HS_RING];
    pthread_mutex_lock(&st_mu);
    size_t n = hs_n < HS_RING ? (size_t)hs_n : HS_RING;
    memcpy(tmp, obs_ring, n * sizeof(double));
    qsort(tmp, n, sizeof(double), cmp_d);
    out[0] = pct(tmp, n, 0.50) * 1e6;
    out[1] = pct(tmp, n, 0.99) * 1e6;
    out[2] = obs_max * 1e6;
    pthread_mutex_unlock(&st_mu);
}

uint64_t gc_last_cycle_reclaimed(void) { return __atomic_load_n(&gc_state.st.last_reclaimed, __ATOMIC_ACQUIRE); }
uint64_t gc_late_roots(void) { return __atomic_load_n(&gc_state.st.late_roots, __ATOMIC_ACQUIRE); }
uint64_t gc_freed_payloads_released(void) { return __atomic_load_n(&gc_state.st.freed_payloads, __ATOMIC_ACQUIRE); }
