/*
 * CAPQR_GC_VERIFY: after each cycle, stop the world and recompute
 * reachability from the roots independently of the mark bits (own visited
 * set, own traversal).  A reachable object whose header was released (DEAD,
 * kept in the graveyard for this check) or whose payload was released while
 * it was neither freed nor external is a collector bug: report it loudly and
 * abort() (mode 1) or just count it (mode 2, for tests of the verifier).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gc_internal.h"

typedef struct vset {
    rt_obj **tab;
    size_t cap, n;
    rt_obj **work;
    size_t wn, wcap;
    uint64_t failures;
} vset;

static size_t hash_ptr(const void *p) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull); }

static void die_oom(void)
{
    fprintf(stderr, "capqr gc verify: out of memory\n");
    abort();
}

static int vset_add(vset *s, rt_obj *o)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t ncap = s->cap ? 2 * s->cap : 4096;
        rt_obj **nt = calloc(ncap, sizeof(*nt));
        if (!nt) die_oom();
        for (size_t i = 0; i < s->cap; i++)
            if (s->tab[i]) {
                size_t j = hash_ptr(s->tab[i]) & (ncap - 1);
                while (nt[j]) j = (j + 1) & (ncap - 1);
                nt[j] = s->tab[i];
            }
        free(s->tab);
        s->tab = nt;
        s->cap = ncap;
    }
    size_t j = hash_ptr(o) & (s->cap - 1);
    while (s->tab[j]) {
        if (s->tab[j] == o) return 0;
        j = (j + 1) & (s->cap - 1);
    }
    s->tab[j] = o;
    s->n++;
    if (s->wn == s->wcap) {
        s->wcap = s->wcap ? 2 * s->wcap : 1024;
        s->work = realloc(s->work, s->wcap * sizeof(*s->work));
        if (!s->work) die_oom();
    }
    s->work[s->wn++] = o;
    return 1;
}

static void report(vset *s, rt_obj *o, const char *what)
{
    s->failures++;
    fprintf(stderr,
            "\n*** capqr gc VERIFY FAILURE: reachable object id=%llu name='%s' %s "
            "(flags=0x%x mark=0x%x pins=%d holds=%d epoch=%u) ***\n",
            (unsigned long long)o->id, o->name, what, o->flags, o->mark, o->pins, o->holds,
            gc_state.epoch);
}

static void add_block(rt_block *b, void *arg)
{
    vset *s = arg;
    if (!b) return;
    for (rt_frame *f = b->frames; f; f = f->up) {
        int32_t n = f->nslots < 0 ? 0 : f->nslots > RT_FRAME_SLOTS_MAX ? RT_FRAME_SLOTS_MAX : f->nslots;
        for (int32_t k = 0; k < n; k++)
            if (f->slots[k]) vset_add(s, f->slots[k]);
    }
}

uint64_t gc_verify(void)
{
    vset s;
    memset(&s, 0, sizeof(s));
    gc_handshake(GC_HS_STOP);
    /* World stopped: ENTERED threads are parked at pollchecks (their frames
     * are stable), nobody can enter.  Python threads still run but only
     * shrink the root set (unpin) or pin objects they already reach. */
    pthread_mutex_lock(&gc_state.list_mu);
    for (int pass = 0; pass < 2; pass++)
        for (rt_obj *o = pass ? gc_state.heap_list : gc_alloc_list_head(); o; o = o->next)
            if (__atomic_load_n(&o->pins, __ATOMIC_ACQUIRE) > 0 ||
                __atomic_load_n(&o->holds, __ATOMIC_ACQUIRE) > 0)
                vset_add(&s, o);
    pthread_mutex_unlock(&gc_state.list_mu);
    gc_for_each_parked_block(add_block, &s);
    while (s.wn) {
        rt_obj *o = s.work[--s.wn];
        uint32_t fl = __atomic_load_n(&o->flags, __ATOMIC_ACQUIRE);
        if (fl & GC_OBJ_DEAD) { report(&s, o, "has a RELEASED HEADER"); continue; }
        if ((fl & RT_OBJ_PAYLOAD_GONE) && !(fl & RT_OBJ_FREED)) {
            report(&s, o, "has a RELEASED PAYLOAD but was never freed");
            continue;
        }
        /* freed tables have no edges (kernels cannot read their slots) */
        if (o->dtype != RT_DT_CAP || (fl & (RT_OBJ_PAYLOAD_GONE | RT_OBJ_FREED | RT_OBJ_DEVICE)) ||
            !o->base)
            continue;
        rt_capslot *sl = (rt_capslot *)o->base;
        uint64_t n = o->nbytes / sizeof(rt_capslot);
        for (uint64_t i = 0; i < n; i++) {
            rt_obj *x = __atomic_load_n(&sl[i].obj, __ATOMIC_ACQUIRE);
            if (x) vset_add(&s, x);
        }
    }
    gc_world_release();
    free(s.tab);
    free(s.work);
    if (s.failures) {
        __atomic_add_fetch(&gc_state.st.verify_failures, s.failures, __ATOMIC_RELAXED);
        fprintf(stderr, "*** capqr gc: %llu verify failure(s) after cycle %llu ***\n",
                (unsigned long long)s.failures, (unsigned long long)gc_state.st.cycles);
        if (gc_state.verify_mode == 1) abort();
    }
    return s.failures;
}
