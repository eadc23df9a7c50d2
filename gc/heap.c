/*
 * Heap: objects, the two object lists, the root set and the deferred
 * release queues (memory itself comes from blocks.c).
 *
 * New headers are pushed lock-free onto the alloc list.  At the start of a
 * cycle the collector splices that list into the heap list, which only the
 * collector modifies (under gc_state.list_mu, so gc_is_live_id and
 * gc_count_objects may walk it).  A cycle sweeps only the heap list: an
 * object allocated while a cycle runs is never swept by that cycle, whatever
 * colour its allocator gave it.
 */
#include <stdlib.h>
#include <string.h>
#include "gc_internal.h"

static rt_obj *alloc_list = NULL;
static uint64_t serial = 0;


/* ---- root set: every object whose pins or holds ever became non-zero ----
 * So a cycle visits only these for pin/hold roots, not the whole heap.  An
 * object enters on its first pin/hold (flag GC_OBJ_ROOTSET, set under
 * rs_mu, never cleared while the header lives) and leaves when swept.
 * Open addressing with linear probing and backward-shift deletion. */
static pthread_mutex_t rs_mu = PTHREAD_MUTEX_INITIALIZER;
static rt_obj **rs_tab = NULL;
static size_t rs_cap = 0, rs_n = 0;

static size_t rs_hash(const rt_obj *o) { return (size_t)(((uintptr_t)o >> 4) * 0x9E3779B97F4A7C15ull); }

static void rs_insert_locked(rt_obj *o)
{
    if (2 * (rs_n + 1) > rs_cap) {
        size_t ncap = rs_cap ? 2 * rs_cap : 1024;
        rt_obj **nt = calloc(ncap, sizeof(*nt));
        if (!nt) abort();
        for (size_t i = 0; i < rs_cap; i++)
            if (rs_tab[i]) {
                size_t j = rs_hash(rs_tab[i]) & (ncap - 1);
                while (nt[j]) j = (j + 1) & (ncap - 1);
                nt[j] = rs_tab[i];
            }
        free(rs_tab);
        rs_tab = nt;
        rs_cap = ncap;
    }
    size_t j = rs_hash(o) & (rs_cap - 1);
    while (rs_tab[j]) {
        if (rs_tab[j] == o) return;
        j = (j + 1) & (rs_cap - 1);
    }
    rs_tab[j] = o;
    rs_n++;
}

static void rootset_insert(rt_obj *o)
{
    pthread_mutex_lock(&rs_mu);
    rs_insert_locked(o);
    pthread_mutex_unlock(&rs_mu);
}

static void rootset_add(rt_obj *o)
{
    if (__atomic_load_n(&o->flags, __ATOMIC_ACQUIRE) & GC_OBJ_ROOTSET) return;
    pthread_mutex_lock(&rs_mu);
    if (!(__atomic_fetch_or(&o->flags, GC_OBJ_ROOTSET, __ATOMIC_ACQ_REL) & GC_OBJ_ROOTSET))
        rs_insert_locked(o);
    pthread_mutex_unlock(&rs_mu);
}

/* sweep: o is about to be freed */
void gc_rootset_remove(rt_obj *o)
{
    pthread_mutex_lock(&rs_mu);
    if (rs_cap) {
        size_t mask = rs_cap - 1, i = rs_hash(o) & mask;
        while (rs_tab[i] && rs_tab[i] != o) i = (i + 1) & mask;
        if (rs_tab[i]) {
            rs_tab[i] = NULL;
            rs_n--;
            /* backward shift: re-place the rest of the cluster */
            for (size_t j = (i + 1) & mask; rs_tab[j]; j = (j + 1) & mask) {
                rt_obj *x = rs_tab[j];
                rs_tab[j] = NULL;
                size_t k = rs_hash(x) & mask;
                while (rs_tab[k]) k = (k + 1) & mask;
                rs_tab[k] = x;
            }
        }
    }
    pthread_mutex_unlock(&rs_mu);
}

void gc_rootset_each(void (*fn)(rt_obj *, void *), void *arg)
{
    pthread_mutex_lock(&rs_mu);
    for (size_t i = 0; i < rs_cap; i++)
        if (rs_tab[i]) fn(rs_tab[i], arg);
    pthread_mutex_unlock(&rs_mu);
}

rt_obj *gc_alloc_list_head(void) { return __atomic_load_n(&alloc_list, __ATOMIC_ACQUIRE); }

void gc_splice_alloc_list(void)
{
    pthread_mutex_lock(&gc_state.list_mu);
    rt_obj *h = __atomic_exchange_n(&alloc_list, NULL, __ATOMIC_ACQ_REL);
    if (h) {
        /* These are swept (and counted as kept) by this cycle: they are not
         * newborn for it, whatever the last cycle's marking left on them. */
        rt_obj *t = h;
        for (;; t = t->next) {
            if (__atomic_load_n(&t->flags, __ATOMIC_RELAXED) & GC_OBJ_NEWBORN)
                __atomic_fetch_and(&t->flags, ~GC_OBJ_NEWBORN, __ATOMIC_RELAXED);
            if (!t->next) break;
        }
        t->next = gc_state.heap_list;
        gc_state.heap_list = h;
    }
    pthread_mutex_unlock(&gc_state.list_mu);
}

/* A zeroed header (and, for internal objects, a zeroed payload at base). */
static rt_obj *new_object(uint64_t nbytes, int internal_payload, uint32_t dtype, uint32_t perms,
                          const char *name, int32_t pins, uint64_t *charged)
{
    rt_obj *o = gc_obj_alloc(nbytes, internal_payload, charged);
    if (!o) return NULL;
    o->nbytes = nbytes;
    o->dtype = dtype;
    o->perms = perms;
    o->pins = pins;
    if (pins) { o->flags |= GC_OBJ_ROOTSET; }
    if (name) strncpy(o->name, name, RT_NAME_MAX - 1);
    o->id = __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED);
    /* Black allocation once the cycle's barrier is on everywhere (fugc.c
     * step 2); before that, and between cycles, the previous epoch: white
     * for the cycle that starts next. */
    o->mark = __atomic_load_n(&gc_state.alloc_epoch, __ATOMIC_ACQUIRE) << 1;
    if (__atomic_load_n(&gc_state.counting_newborn, __ATOMIC_ACQUIRE))
        o->flags |= GC_OBJ_NEWBORN; /* counted as live only if marking reaches it */
    return o;
}

static uint64_t heap_peak = 0; /* high-water mark of occupancy + parked blocks */

uint64_t gc_heap_peak(int reset)
{
    return reset ? __atomic_exchange_n(&heap_peak, 0, __ATOMIC_RELAXED)
                 : __atomic_load_n(&heap_peak, __ATOMIC_RELAXED);
}

/* Make o visible to the collector; start a cycle once the heap passed the
 * trigger, and put an allocating kernel thread past the heap goal in debt
 * (it waits at its next pollcheck: pace.c). */
static void publish(rt_obj *o, uint64_t counted)
{
    rt_obj *h = __atomic_load_n(&alloc_list, __ATOMIC_RELAXED);
    do {
        o->next = h;
    } while (!__atomic_compare_exchange_n(&alloc_list, &h, o, 1, __ATOMIC_RELEASE,
                                          __ATOMIC_RELAXED));
    __atomic_add_fetch(&gc_state.st.objects_alloc, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gc_state.alloc_since, counted, __ATOMIC_RELAXED);
    uint64_t occ = __atomic_load_n(&gc_state.heap_bytes, __ATOMIC_RELAXED);
    uint64_t pk = __atomic_load_n(&heap_peak, __ATOMIC_RELAXED);
    while (occ + gc_free_list_bytes() > pk &&
           !__atomic_compare_exchange_n(&heap_peak, &pk, occ + gc_free_list_bytes(), 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    if (occ > __atomic_load_n(&gc_state.trigger_bytes, __ATOMIC_RELAXED) &&
        __atomic_load_n(&gc_state.enabled, __ATOMIC_RELAXED)) {
        gc_request_auto();
        gc_pace_note(occ);
    }
}

/* ---- deferred releases: payloads the collector does not free itself -----
 * External (numpy/torch) payloads belong to a Python object, device payloads
 * to the GPU driver; neither may be released from the collector thread (no
 * Python, no driver calls there, and the sweep holds locks).  The sweep
 * queues a record; the host drains the queue from its own threads. */
typedef struct release_queue {
    pthread_mutex_t mu;
    gc_release_rec *v;
    size_t n, cap;
} release_queue;
static release_queue external_q = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};
static release_queue device_q = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static void queue_push(release_queue *q, const rt_obj *o)
{
    pthread_mutex_lock(&q->mu);
    if (q->n == q->cap) {
        size_t ncap = q->cap ? 2 * q->cap : 256;
        gc_release_rec *nv = realloc(q->v, ncap * sizeof *nv);
        if (!nv) abort();
        q->v = nv;
        q->cap = ncap;
    }
    q->v[q->n].id = o->id;
    q->v[q->n].handle = (uint64_t)(uintptr_t)o->base;
    q->v[q->n].nbytes = o->nbytes;
    __atomic_store_n(&q->n, q->n + 1, __ATOMIC_RELAXED); /* gc_pending_releases reads it */
    pthread_mutex_unlock(&q->mu);
}

static int64_t queue_drain(release_queue *q, gc_release_rec *out, int64_t max)
{
    if (max <= 0) return 0;
    pthread_mutex_lock(&q->mu);
    size_t k = q->n < (size_t)max ? q->n : (size_t)max;
    if (k) { /* oldest first */
        memcpy(out, q->v, k * sizeof *out);
        memmove(q->v, q->v + k, (q->n - k) * sizeof *q->v);
        __atomic_store_n(&q->n, q->n - k, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&q->mu);
    return (int64_t)k;
}

int64_t gc_drain_external_releases(gc_release_rec *out, int64_t max)
{
    return queue_drain(&external_q, out, max);
}

int64_t gc_drain_device_releases(gc_release_rec *out, int64_t max)
{
    return queue_drain(&device_q, out, max);
}

int64_t gc_pending_releases(void)
{
    return (int64_t)(__atomic_load_n(&external_q.n, __ATOMIC_RELAXED) +
                     __atomic_load_n(&device_q.n, __ATOMIC_RELAXED));
}

static rt_obj *alloc_common(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name,
                            int32_t pins)
{
    gc_init();
    uint64_t charged;
    rt_obj *o = new_object(nbytes, 1, dtype, perms, name, pins, &charged);
    if (!o) return NULL;
    o->rlen = nbytes;
    o->wlen = (perms & RT_PERM_W) ? nbytes : 0;
    if (pins) rootset_insert(o);
    __atomic_add_fetch(&gc_state.st.bytes_alloc, nbytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gc_state.st.payload_alloc, nbytes, __ATOMIC_RELAXED);
    publish(o, charged);
    return o;
}

rt_obj *gc_alloc(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name)
{
    return alloc_common(nbytes, dtype, perms, name, 0);
}

/* Allocated with pins == 1: no window in which a Python caller holds an
 * unrooted header (between gc_alloc and gc_pin a whole cycle could run). */
rt_obj *gc_alloc_pinned(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name)
{
    return alloc_common(nbytes, dtype, perms, name, 1);
}

static rt_obj *wrap_common(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms,
                           const char *name, int32_t pins)
{
    gc_init();
    uint64_t charged;
    rt_obj *o = new_object(nbytes, 0, dtype, perms, name, pins, &charged);
    if (!o) return NULL;
    o->base = payload;
    o->rlen = nbytes;
    o->wlen = (perms & RT_PERM_W) ? nbytes : 0;
    o->flags |= RT_OBJ_EXTERNAL;
    if (pins) rootset_insert(o);
    __atomic_add_fetch(&gc_state.st.bytes_alloc, nbytes, __ATOMIC_RELAXED);
    publish(o, charged); /* numpy's memory does not count toward our heap */
    return o;
}

rt_obj *gc_wrap(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name)
{
    return wrap_common(payload, nbytes, dtype, perms, name, 0);
}

rt_obj *gc_wrap_pinned(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms,
                       const char *name)
{
    return wrap_common(payload, nbytes, dtype, perms, name, 1);
}

/* A device payload (a driver address, never dereferenced on the host),
 * owned by the collector from now on: when unreachable, or freed and no
 * longer held, the sweep queues it for gc_drain_device_releases. */
rt_obj *gc_wrap_device_pinned(uint64_t devptr, uint64_t nbytes, uint32_t dtype, uint32_t perms,
                              const char *name)
{
    gc_init();
    uint64_t charged;
    rt_obj *o = new_object(nbytes, 0, dtype, perms, name, 1, &charged);
    if (!o) return NULL;
    o->base = (char *)(uintptr_t)devptr;
    o->rlen = nbytes;
    o->wlen = (perms & RT_PERM_W) ? nbytes : 0;
    o->flags |= RT_OBJ_DEVICE;
    rootset_insert(o);
    __atomic_add_fetch(&gc_state.st.bytes_alloc, nbytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gc_state.st.payload_alloc, nbytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gc_state.heap_bytes, nbytes, __ATOMIC_RELAXED);
    publish(o, charged + nbytes); /* device churn paces cycles like host churn */
    return o;
}

void gc_release_payload(rt_obj *o)
{
    uint32_t old = __atomic_fetch_or(&o->flags, RT_OBJ_PAYLOAD_GONE, __ATOMIC_ACQ_REL);
    if (old & RT_OBJ_PAYLOAD_GONE) return;
    if (old & RT_OBJ_EXTERNAL) {
        queue_push(&external_q, o);
        return;
    }
    if (old & RT_OBJ_DEVICE) {
        queue_push(&device_q, o);
        __atomic_sub_fetch(&gc_state.heap_bytes, o->nbytes, __ATOMIC_RELAXED);
    } else if (old & GC_OBJ_INLINE) {
        return; /* reused with its header (blocks.c), counted then */
    } else {
        gc_obj_release_payload(o);
    }
    __atomic_add_fetch(&gc_state.st.bytes_freed, o->nbytes, __ATOMIC_RELAXED);
}

int gc_free(rt_obj *o)
{
    uint32_t old = __atomic_fetch_or(&o->flags, RT_OBJ_FREED, __ATOMIC_SEQ_CST);
    if (old & RT_OBJ_FREED) return -1;
    __atomic_store_n(&o->rlen, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&o->wlen, 0, __ATOMIC_SEQ_CST);
    /* Release at once only if no snapshot can exist: no Python handle, no
     * running launch, no thread in kernel code (a thread entering later reads
     * rlen == 0; seq_cst orders our stores before these loads), and no cycle
     * running (a marker might be reading a table's payload). */
    if (__atomic_load_n(&o->pins, __ATOMIC_SEQ_CST) > 0 ||
        __atomic_load_n(&o->holds, __ATOMIC_SEQ_CST) != 0 ||
        __atomic_load_n(&gc_state.n_entered, __ATOMIC_SEQ_CST) != 0)
        return 0;
    if (pthread_mutex_trylock(&gc_state.cycle_mu) == 0) {
        if (__atomic_load_n(&gc_state.n_entered, __ATOMIC_SEQ_CST) == 0 &&
            __atomic_load_n(&o->holds, __ATOMIC_SEQ_CST) == 0 &&
            __atomic_load_n(&o->pins, __ATOMIC_SEQ_CST) <= 0)
            gc_release_payload(o);
        pthread_mutex_unlock(&gc_state.cycle_mu);
    }
    return 0;
}

void gc_pin(rt_obj *o)
{
    rootset_add(o); /* before the count: a root scan that sees pins > 0 must find it */
    __atomic_add_fetch(&o->pins, 1, __ATOMIC_SEQ_CST);
    /* Pin barrier: a pin taken after the root scan must still mark. */
    if (__atomic_load_n(&gc_state.marking, __ATOMIC_SEQ_CST)) gc_shade(o);
}

/* The decrement is the last access: once pins reaches 0 a concurrent sweep
 * may release the header.  External payloads need nothing here: they stay
 * attached until the sweep queues their release (heap.c release queues). */
void gc_unpin(rt_obj *o) { __atomic_sub_fetch(&o->pins, 1, __ATOMIC_ACQ_REL); }

void gc_hold(rt_obj *o)
{
    rootset_add(o);
    __atomic_add_fetch(&o->holds, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&gc_state.marking, __ATOMIC_SEQ_CST)) gc_shade(o);
}

void gc_unhold(rt_obj *o) { __atomic_sub_fetch(&o->holds, 1, __ATOMIC_ACQ_REL); }

static int walk(int (*fn)(rt_obj *, void *), void *arg)
{
    int r = 0;
    pthread_mutex_lock(&gc_state.list_mu);
    for (rt_obj *o = gc_alloc_list_head(); o && !r; o = o->next) r = fn(o, arg);
    for (rt_obj *o = gc_state.heap_list; o && !r; o = o->next) r = fn(o, arg);
    pthread_mutex_unlock(&gc_state.list_mu);
    return r;
}

static int match_id(rt_obj *o, void *arg) { return o->id == *(uint64_t *)arg; }
static int count_one(rt_obj *o, void *arg) { (void)o; (*(uint64_t *)arg)++; return 0; }

uint64_t gc_last_id(void) { return __atomic_load_n(&serial, __ATOMIC_ACQUIRE); }

int gc_is_live_id(uint64_t id) { return walk(match_id, &id); }

uint64_t gc_count_objects(void)
{
    uint64_t n = 0;
    walk(count_one, &n);
    return n;
}

/* Header of a live object by id (NULL if reclaimed); for tests/debugging. */
static int find_id(rt_obj *o, void *arg)
{
    void **a = arg;
    if (o->id == *(uint64_t *)a[0]) { a[1] = o; return 1; }
    return 0;
}
rt_obj *gc_find_id(uint64_t id)
{
    void *a[2] = {&id, NULL};
    walk(find_id, a);
    return a[1];
}
