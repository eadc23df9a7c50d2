/*
 * Stand-alone stress driver for the collector (no Python, no core).
 * Simulated workers register, enter, keep caps in shadow frames, allocate,
 * store caps into tables through the barrier, overwrite and drop them, free
 * some explicitly and pollcheck; the main thread runs cycles back to back.
 * Every live data object's payload holds its id, checked on each use through
 * a bounds snapshot, as a kernel would.  Build with -fsanitize=address or
 * thread (see gc/tests/run.sh).  Usage: stress [threads] [seconds]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include "gc.h"

#define NSLOTS 8
#define TABLE_N 16

static rt_obj *shared[4];           /* pinned tables shared by all workers */
static volatile int stop_flag = 0;
static uint64_t checks = 0, loads = 0, allocs = 0, frees = 0;

typedef struct { char *lo; uint64_t rlen; rt_obj *obj; } snap;

static snap snap_of(rt_obj *o)
{
    snap s = {0, 0, o};
    if (o) {
        s.lo = o->base;
        s.rlen = __atomic_load_n(&o->rlen, __ATOMIC_ACQUIRE);
    }
    return s;
}

static inline void poll(rt_thread *t)
{
    if (__atomic_load_n(&rt_poll_word, __ATOMIC_ACQUIRE) & RT_POLL_GC) gc_handshake_poll(t);
}

static void store_cap(rt_obj *table, uint64_t i, rt_obj *v)
{
    rt_capslot *s = (rt_capslot *)table->base + i;
    gc_store_barrier(v);
    __atomic_store_n(&s->p, v ? v->base : NULL, __ATOMIC_RELAXED);
    __atomic_store_n(&s->obj, v, __ATOMIC_RELEASE);
}

static rt_obj *load_cap(rt_obj *table, uint64_t i)
{
    rt_capslot *s = (rt_capslot *)table->base + i;
    return __atomic_load_n(&s->obj, __ATOMIC_ACQUIRE);
}

static void check(snap s)
{
    /* use the snapshot like a kernel: in bounds -> read */
    if (!s.obj || s.obj->dtype == RT_DT_CAP) return;
    if (s.rlen >= 8) {
        uint64_t v;
        memcpy(&v, s.lo, 8);
        if (v != s.obj->id) {
            fprintf(stderr, "stress: payload of id %llu holds %llu\n",
                    (unsigned long long)s.obj->id, (unsigned long long)v);
            abort();
        }
        __atomic_add_fetch(&checks, 1, __ATOMIC_RELAXED);
    }
}

static rt_obj *new_data(uint64_t n)
{
    rt_obj *o = gc_alloc(n, RT_DT_I64, RT_PERM_R | RT_PERM_W, "data");
    if (!o) abort();
    memcpy(o->base, &o->id, 8);
    __atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
    return o;
}

static void *worker(void *arg)
{
    rt_thread *t = arg;
    unsigned seed = (unsigned)t->index * 7919u + 1;
    gc_thread_register(t);
    while (!__atomic_load_n(&stop_flag, __ATOMIC_RELAXED)) {
        rt_block b;
        memset(&b, 0, sizeof b);
        rt_frame f;
        memset(&f, 0, sizeof f);
        f.nslots = NSLOTS;
        f.blk = &b;
        t->block = &b;
        gc_enter(t);
        __atomic_store_n(&b.frames, &f, __ATOMIC_RELEASE);
        snap loc[NSLOTS];
        memset(loc, 0, sizeof loc);
        /* slot 0: a private table */
        rt_obj *tab = gc_alloc(TABLE_N * sizeof(rt_capslot), RT_DT_CAP, RT_PERM_R | RT_PERM_W, "tab");
        f.slots[0] = tab;
        loc[0] = snap_of(tab);
        int iters = 200 + rand_r(&seed) % 400;
        for (int it = 0; it < iters; it++) {
            int k = 1 + rand_r(&seed) % (NSLOTS - 1);
            int op = rand_r(&seed) % 100;
            if (op < 6) {                       /* allocate into a local */
                rt_obj *o = new_data(8 + 8 * (rand_r(&seed) % 64));
                f.slots[k] = o;
                loc[k] = snap_of(o);
            } else if (op < 45) {               /* store a local into a table */
                rt_obj *dst = (rand_r(&seed) & 1) ? tab : shared[rand_r(&seed) % 4];
                store_cap(dst, rand_r(&seed) % TABLE_N, loc[k].obj);
            } else if (op < 70) {               /* load from a table into a local */
                rt_obj *src = (rand_r(&seed) & 1) ? tab : shared[rand_r(&seed) % 4];
                rt_obj *o = load_cap(src, rand_r(&seed) % TABLE_N);
                f.slots[k] = o;
                loc[k] = snap_of(o);
                __atomic_add_fetch(&loads, 1, __ATOMIC_RELAXED);
            } else if (op < 72) {               /* drop */
                f.slots[k] = NULL;
                loc[k] = snap_of(NULL);
            } else if (op < 74) {               /* explicit free (Python would) */
                if (loc[k].obj && loc[k].obj->dtype != RT_DT_CAP && gc_free(loc[k].obj) == 0)
                    __atomic_add_fetch(&frees, 1, __ATOMIC_RELAXED);
            } else if (op < 75) {               /* nested table */
                rt_obj *t2 = gc_alloc(4 * sizeof(rt_capslot), RT_DT_CAP, RT_PERM_R | RT_PERM_W, "t2");
                f.slots[k] = t2;
                loc[k] = snap_of(t2);
                store_cap(t2, 0, new_data(16));   /* temporary: no pollcheck in between */
                store_cap(tab, rand_r(&seed) % TABLE_N, t2);
            } else {
                check(loc[k]);
            }
            for (int j = 0; j < NSLOTS; j++) check(loc[j]);
            poll(t);                             /* loop back-edge */
        }
        __atomic_store_n(&b.frames, NULL, __ATOMIC_RELEASE);
        gc_exit(t);
        t->block = NULL;
        if (rand_r(&seed) % 4 == 0) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);               /* idle: exited */
        }
    }
    gc_thread_unregister(t);
    return NULL;
}

int main(int argc, char **argv)
{
    int nth = argc > 1 ? atoi(argv[1]) : 8;
    double secs = argc > 2 ? atof(argv[2]) : 3.0;
    gc_init();
    gc_set_threshold(1.5, 64 << 10);
    for (int i = 0; i < 4; i++) {
        shared[i] = gc_alloc(TABLE_N * sizeof(rt_capslot), RT_DT_CAP, RT_PERM_R | RT_PERM_W, "shared");
        gc_pin(shared[i]);
    }
    rt_thread *ts = calloc((size_t)nth, sizeof(rt_thread));
    pthread_t *th = calloc((size_t)nth, sizeof(pthread_t));
    for (int i = 0; i < nth; i++) {
        ts[i].index = i;
        pthread_create(&th[i], NULL, worker, &ts[i]);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t forced = 0;
    for (;;) {
        gc_collect();
        forced++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) > secs) break;
    }
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);

    /* Everything still pinned is reachable from the shared tables; drop them:
     * within two cycles every object must be reclaimed. */
    for (int i = 0; i < 4; i++) gc_unpin(shared[i]);
    uint64_t before = gc_count_objects();
    gc_collect();
    gc_collect();
    uint64_t after = gc_count_objects();
    gc_stats_t st;
    gc_get_stats(&st);
    printf("threads=%d forced=%llu cycles=%llu allocs=%llu loads=%llu checks=%llu frees=%llu\n",
           nth, (unsigned long long)forced, (unsigned long long)st.cycles,
           (unsigned long long)allocs, (unsigned long long)loads, (unsigned long long)checks,
           (unsigned long long)frees);
    printf("handshakes=%llu p50=%.1fus p99=%.1fus max=%.1fus mark=%.3fs sweep=%.3fs "
           "freed_objs=%llu freed_payloads=%llu late_roots=%llu verify_failures=%llu\n",
           (unsigned long long)st.handshakes, st.handshake_p50_us, st.handshake_p99_us,
           st.handshake_max_us, st.mark_seconds_total, st.sweep_seconds_total,
           (unsigned long long)st.objects_freed_total,
           (unsigned long long)gc_freed_payloads_released(), (unsigned long long)gc_late_roots(),
           (unsigned long long)st.verify_failures);
    double pace[2];
    gc_pace_stats(pace);
    printf("pace: waits=%.0f wait_s=%.3f peak_occupancy=%llu goal=%llu\n", pace[0], pace[1],
           (unsigned long long)gc_heap_peak(0), (unsigned long long)gc_heap_goal());
    printf("objects before final cycles=%llu after=%llu live_bytes=%llu\n",
           (unsigned long long)before, (unsigned long long)after,
           (unsigned long long)st.bytes_live);
    free(ts);
    free(th);
    if (after != 0 || st.verify_failures) { printf("FAIL\n"); return 1; }
    printf("OK\n");
    return 0;
}
