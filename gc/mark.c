/*
 * Marking: the mark word, the Dijkstra barrier, root marking and parallel
 * tracing.
 *
 * Only cap tables (dtype RT_DT_CAP) have outgoing edges, so marking any
 * other object is a single CAS on its mark word (it becomes black at once);
 * a table that turns from white to marked is pushed on the shared mark stack
 * (grey) and traced later by one of the markers.
 *
 * Parallel tracing: the collector and gc_nmarkers() helper threads drain the
 * shared stack in chunks into private stacks, donating half of a private
 * stack back when it overflows.  A drain phase ends when every participant
 * is idle and the shared stack is empty (counted under ms_mu).  Barrier
 * pushes from mutators may land at any time; whatever lands after a phase
 * ended is found by the termination check in fugc.c.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "gc_internal.h"

#define CHUNK 64
#define LOCAL_MAX 1024

static pthread_mutex_t ms_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ms_cv = PTHREAD_COND_INITIALIZER;     /* work or phase end */
static pthread_cond_t helper_cv = PTHREAD_COND_INITIALIZER; /* a new phase */
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;   /* a helper left the phase */
static rt_obj **ms = NULL;
static size_t ms_n = 0, ms_cap = 0;
static int ms_idle = 0, ms_participants = 1, ms_over = 1;
static uint32_t ms_epoch = 0;
static uint64_t phase_seq = 0;
static int nhelpers = 0, helpers_done = 0;

int gc_nmarkers(void) { return 1 + nhelpers; }

/* Live at mark end counts objects born during marking (not in the heap
 * list this cycle sweeps, white or black) only when tracing, a stack scan or
 * a root pass reaches them, each once (the flag is cleared): the others may
 * have died already.  Not the store barrier: every fresh object stored into
 * a table would count, even when a later store overwrites it before the
 * table is traced. */
static void count_newborn(rt_obj *o)
{
    uint32_t fl = __atomic_load_n(&o->flags, __ATOMIC_RELAXED);
    if (!(fl & GC_OBJ_NEWBORN)) return;
    fl = __atomic_fetch_and(&o->flags, ~GC_OBJ_NEWBORN, __ATOMIC_ACQ_REL);
    if (fl & GC_OBJ_NEWBORN)
        __atomic_add_fetch(&gc_state.newborn_reached_bytes, gc_obj_occupancy(o, fl), __ATOMIC_RELAXED);
}

static int try_mark(rt_obj *o, uint32_t epoch, int seen, int count)
{
    uint32_t want = (epoch << 1) | (seen ? GC_MARK_SEEN : 0);
    uint32_t m = __atomic_load_n(&o->mark, __ATOMIC_RELAXED);
    for (;;) {
        if ((m >> 1) == epoch) {
            if (count) count_newborn(o);
            if (!seen || (m & GC_MARK_SEEN)) return 0;
            if (__atomic_compare_exchange_n(&o->mark, &m, m | GC_MARK_SEEN, 1, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                return 0;
            continue;
        }
        if (__atomic_compare_exchange_n(&o->mark, &m, want, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            if (count) count_newborn(o);
            return 1;
        }
    }
}

int gc_try_mark(rt_obj *o, uint32_t epoch, int seen) { return try_mark(o, epoch, seen, 1); }

/* A table's slots are edges unless it was freed (kernels can no longer
 * read them: its bounds are zero) or its payload is not host memory. */
static inline int needs_trace(rt_obj *o)
{
    return o->dtype == RT_DT_CAP && o->base &&
           !(__atomic_load_n(&o->flags, __ATOMIC_ACQUIRE) &
             (RT_OBJ_FREED | RT_OBJ_PAYLOAD_GONE | RT_OBJ_DEVICE));
}

/* caller holds ms_mu */
static void ms_push_locked(rt_obj *const *v, size_t n)
{
    if (ms_n + n > ms_cap) {
        size_t cap = ms_cap ? ms_cap : 1024;
        while (cap < ms_n + n) cap *= 2;
        rt_obj **nm = realloc(ms, cap * sizeof(*ms));
        if (!nm) {
            fprintf(stderr, "capqr gc: out of memory growing the mark stack\n");
            abort();
        }
        ms = nm;
        ms_cap = cap;
    }
    memcpy(ms + ms_n, v, n * sizeof(*v));
    ms_n += n;
    if (ms_idle) pthread_cond_broadcast(&ms_cv);
}

static void ms_push(rt_obj *const *v, size_t n)
{
    pthread_mutex_lock(&ms_mu);
    ms_push_locked(v, n);
    pthread_mutex_unlock(&ms_mu);
}

int gc_mark_stack_empty(void)
{
    pthread_mutex_lock(&ms_mu);
    int e = ms_n == 0;
    pthread_mutex_unlock(&ms_mu);
    return e;
}

void gc_shade(rt_obj *o)
{
    if (try_mark(o, __atomic_load_n(&gc_state.epoch, __ATOMIC_ACQUIRE), 0, 0) && needs_trace(o))
        ms_push(&o, 1);
}

void gc_shade_stack(rt_obj *o, uint32_t epoch)
{
    if (gc_try_mark(o, epoch, 1) && needs_trace(o)) ms_push(&o, 1);
}

void gc_store_barrier(rt_obj *target)
{
    /* Dijkstra: shade the new target while marking.  Relaxed load: the
     * handshake after turning marking on orders it for every mutator. */
    if (target && __atomic_load_n(&gc_state.marking, __ATOMIC_RELAXED)) gc_shade(target);
}

/* Roots held outside kernel frames: pins (Python handles) and holds
 * (arguments of running launches), found through the root set.  A pin or
 * hold taken after this pass is shaded by gc_pin/gc_hold (barrier on). */
typedef struct { uint32_t epoch; rt_obj *buf[CHUNK]; size_t nb; } roots_ctx;

static void root_one(rt_obj *o, void *arg)
{
    roots_ctx *c = arg;
    if (__atomic_load_n(&o->pins, __ATOMIC_SEQ_CST) <= 0 &&
        __atomic_load_n(&o->holds, __ATOMIC_SEQ_CST) <= 0)
        return;
    if (gc_try_mark(o, c->epoch, 0) && needs_trace(o)) {
        c->buf[c->nb++] = o;
        if (c->nb == CHUNK) { ms_push(c->buf, c->nb); c->nb = 0; }
    }
}

void gc_mark_roots(uint32_t epoch)
{
    roots_ctx c;
    c.epoch = epoch;
    c.nb = 0;
    gc_rootset_each(root_one, &c);
    if (c.nb) ms_push(c.buf, c.nb);
}

static void trace(rt_obj *t, uint32_t epoch, rt_obj **local, size_t *nl)
{
    rt_capslot *s = (rt_capslot *)t->base;
    uint64_t n = t->nbytes / sizeof(rt_capslot);
    for (uint64_t i = 0; i < n; i++) {
        rt_obj *x = __atomic_load_n(&s[i].obj, __ATOMIC_ACQUIRE);
        if (!x || !gc_try_mark(x, epoch, 0) || !needs_trace(x)) continue;
        if (*nl == LOCAL_MAX) {
            /* donate the older half so idle markers can help */
            ms_push(local, LOCAL_MAX / 2);
            memmove(local, local + LOCAL_MAX / 2, (LOCAL_MAX / 2) * sizeof(*local));
            *nl = LOCAL_MAX / 2;
        }
        local[(*nl)++] = x;
    }
}

static void mark_loop(void)
{
    rt_obj *local[LOCAL_MAX];
    size_t nl = 0;
    pthread_mutex_lock(&ms_mu);
    uint32_t epoch = ms_epoch;
    for (;;) {
        if (ms_n) {
            size_t take = ms_n < CHUNK ? ms_n : CHUNK;
            ms_n -= take;
            memcpy(local, ms + ms_n, take * sizeof(*local));
            nl = take;
            pthread_mutex_unlock(&ms_mu);
            while (nl) {
                rt_obj *o = local[--nl];
                trace(o, epoch, local, &nl);
            }
            pthread_mutex_lock(&ms_mu);
            continue;
        }
        if (ms_over) break;
        if (++ms_idle == ms_participants) {
            ms_over = 1;
            pthread_cond_broadcast(&ms_cv);
            break;
        }
        while (!ms_n && !ms_over) pthread_cond_wait(&ms_cv, &ms_mu);
        if (ms_over) break;
        ms_idle--;
    }
    pthread_mutex_unlock(&ms_mu);
}

static void *helper_main(void *arg)
{
    (void)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&ms_mu);
    for (;;) {
        while (phase_seq == seen) pthread_cond_wait(&helper_cv, &ms_mu);
        seen = phase_seq;
        pthread_mutex_unlock(&ms_mu);
        mark_loop();
        pthread_mutex_lock(&ms_mu);
        helpers_done++;
        pthread_cond_signal(&done_cv);
    }
    return NULL;
}

void gc_markers_start(int n)
{
    for (int i = 0; i < n; i++) {
        pthread_t th;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &a, helper_main, NULL) == 0) nhelpers++;
        pthread_attr_destroy(&a);
    }
}

void gc_drain(uint32_t epoch)
{
    pthread_mutex_lock(&ms_mu);
    if (!ms_n) { pthread_mutex_unlock(&ms_mu); return; }
    ms_epoch = epoch;
    ms_over = 0;
    ms_idle = 0;
    /* A lone small table is cheaper to trace than to wake helpers for. */
    int use_helpers = nhelpers && (ms_n > 1 || ms[0]->nbytes / sizeof(rt_capslot) > 4096);
    ms_participants = 1 + (use_helpers ? nhelpers : 0);
    if (use_helpers) {
        helpers_done = 0;
        phase_seq++;
        pthread_cond_broadcast(&helper_cv);
    }
    pthread_mutex_unlock(&ms_mu);
    mark_loop();
    if (use_helpers) {
        pthread_mutex_lock(&ms_mu);
        while (helpers_done < nhelpers) pthread_cond_wait(&done_cv, &ms_mu);
        pthread_mutex_unlock(&ms_mu);
    }
}
