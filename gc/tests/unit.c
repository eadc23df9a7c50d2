/*
 * Deterministic collector checks without Python:
 *  - the mark epoch wraps from GC_EPOCH_MAX to 1 without losing live objects;
 *  - an unreachable wrapped (external) payload is queued for the host, never
 *    freed by the collector, and only once;
 *  - device payloads: released through gc_drain_device_releases once
 *    unreachable, or once freed and no longer pinned or held; never while a
 *    launch holds them.  The addresses are fake: the host never touches them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gc.h"

static int failures = 0;
#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "unit.c:%d: check failed: %s\n", __LINE__, #c);       \
            failures++;                                                           \
        }                                                                         \
    } while (0)

static void store(rt_obj *table, uint64_t i, rt_obj *v)
{
    rt_capslot *s = (rt_capslot *)table->base + i;
    gc_store_barrier(v);
    s->p = v ? v->base : NULL;
    __atomic_store_n(&s->obj, v, __ATOMIC_RELEASE);
}

static int64_t drain_device(uint64_t *ids, int64_t max)
{
    gc_release_rec r[64];
    int64_t n = gc_drain_device_releases(r, max < 64 ? max : 64);
    for (int64_t i = 0; i < n; i++) ids[i] = r[i].id;
    return n;
}

static void test_epoch_wrap(void)
{
    rt_obj *root = gc_alloc_pinned(4 * sizeof(rt_capslot), RT_DT_CAP, RT_PERM_R | RT_PERM_W, "root");
    gc_debug_set_epoch(0x7ffffffdu);
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
        rt_obj *o = gc_alloc(8, RT_DT_I64, RT_PERM_R | RT_PERM_W, "leaf");
        ids[i] = o->id;
        store(root, (uint64_t)i, o);
        gc_collect();
    }
    CHECK(gc_debug_epoch() < 0x7ffffffdu); /* it wrapped */
    for (int i = 0; i < 4; i++) CHECK(gc_is_live_id(ids[i]));
    store(root, 0, NULL);
    gc_collect();
    CHECK(!gc_is_live_id(ids[0]));
    CHECK(gc_is_live_id(ids[1]));
    gc_unpin(root);
    gc_collect();
    for (int i = 1; i < 4; i++) CHECK(!gc_is_live_id(ids[i]));
}

static void test_external_release(void)
{
    static char payload[32];
    rt_obj *w = gc_wrap_pinned(payload, sizeof payload, RT_DT_U8, RT_PERM_R | RT_PERM_W, "ext");
    uint64_t id = w->id;
    gc_collect();
    gc_release_rec r[4];
    CHECK(gc_drain_external_releases(r, 4) == 0); /* pinned */
    gc_unpin(w);
    gc_collect();
    int64_t n = gc_drain_external_releases(r, 4);
    CHECK(n == 1 && r[0].id == id && r[0].handle == (uint64_t)(uintptr_t)payload &&
          r[0].nbytes == sizeof payload);
    gc_collect();
    CHECK(gc_drain_external_releases(r, 4) == 0); /* once */
}

static void test_device_release(void)
{
    uint64_t got[64];
    /* unreachable: queued by the sweep */
    rt_obj *a = gc_wrap_device_pinned(0xdead0000ull, 4096, RT_DT_F32, RT_PERM_R | RT_PERM_W, "dA");
    uint64_t ida = a->id;
    gc_collect();
    CHECK(drain_device(got, 64) == 0);
    gc_unpin(a);
    gc_collect();
    gc_release_rec r[4];
    CHECK(gc_drain_device_releases(r, 4) == 1 && r[0].id == ida && r[0].handle == 0xdead0000ull &&
          r[0].nbytes == 4096);

    /* freed while a launch holds it: kept until the hold goes */
    rt_obj *b = gc_wrap_device_pinned(0xbeef0000ull, 256, RT_DT_F32, RT_PERM_R | RT_PERM_W, "dB");
    uint64_t idb = b->id;
    gc_hold(b);
    CHECK(gc_free(b) == 0);
    CHECK(gc_free(b) == -1);
    gc_unpin(b);
    for (int i = 0; i < 3; i++) gc_collect();
    CHECK(drain_device(got, 64) == 0);
    gc_unhold(b);
    for (int i = 0; i < 3; i++) gc_collect();
    CHECK(drain_device(got, 64) == 1 && got[0] == idb);

    /* reachable from a table after free: the payload goes, the header stays */
    rt_obj *t = gc_alloc_pinned(sizeof(rt_capslot), RT_DT_CAP, RT_PERM_R | RT_PERM_W, "tab");
    rt_obj *c = gc_wrap_device_pinned(0xcafe0000ull, 64, RT_DT_F32, RT_PERM_R | RT_PERM_W, "dC");
    uint64_t idc = c->id;
    store(t, 0, c);
    gc_free(c);
    gc_unpin(c);
    for (int i = 0; i < 3; i++) gc_collect();
    CHECK(drain_device(got, 64) == 1 && got[0] == idc);
    CHECK(gc_is_live_id(idc));
    gc_unpin(t);
    gc_collect();
    CHECK(!gc_is_live_id(idc));
    CHECK(drain_device(got, 64) == 0); /* released once */
}

int main(void)
{
    gc_init();
    gc_set_enabled(0);
    test_epoch_wrap();
    test_external_release();
    test_device_release();
    CHECK(gc_pending_releases() == 0);
    if (failures) { printf("unit: %d FAILED\n", failures); return 1; }
    printf("unit: OK\n");
    return 0;
}
