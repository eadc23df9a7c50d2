/*
 * Minimal non-concurrent heap used until gc/fugc.c lands: objects on a
 * global list, collection only when no kernel code runs.  Same interface.
 */
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include "gc.h"

volatile int32_t rt_poll_word = 0;
static pthread_mutex_t heap_mu = PTHREAD_MUTEX_INITIALIZER;
static rt_obj *all_objs = NULL;
static rt_thread *threads = NULL;
static uint64_t serial = 0;
static gc_stats_t st;

int gc_init(void) { return 0; }

static rt_obj *new_header(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name)
{
    rt_obj *o = calloc(1, sizeof(rt_obj));
    if (!o) return NULL;
    o->nbytes = nbytes; o->dtype = dtype; o->perms = perms;
    if (name) strncpy(o->name, name, RT_NAME_MAX - 1);
    pthread_mutex_lock(&heap_mu);
    o->id = ++serial; o->next = all_objs; all_objs = o;
    st.objects_allocated_total++; st.bytes_allocated_total += nbytes;
    pthread_mutex_unlock(&heap_mu);
    return o;
}

rt_obj *gc_alloc(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name)
{
    void *p = calloc(1, nbytes ? nbytes : 1);
    if (!p) return NULL;
    rt_obj *o = new_header(nbytes, dtype, perms, name);
    if (!o) { free(p); return NULL; }
    o->base = p; o->rlen = nbytes; o->wlen = (perms & RT_PERM_W) ? nbytes : 0;
    return o;
}

rt_obj *gc_wrap(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name)
{
    rt_obj *o = new_header(nbytes, dtype, perms, name);
    if (!o) return NULL;
    o->base = payload; o->rlen = nbytes; o->wlen = (perms & RT_PERM_W) ? nbytes : 0;
    o->flags = RT_OBJ_EXTERNAL;
    return o;
}

int gc_free(rt_obj *o)
{
    uint32_t old = __atomic_fetch_or(&o->flags, RT_OBJ_FREED, __ATOMIC_ACQ_REL);
    if (old & RT_OBJ_FREED) return -1;
    __atomic_store_n(&o->rlen, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&o->wlen, 0, __ATOMIC_RELEASE);
    return 0;
}
void gc_pin(rt_obj *o) { __atomic_add_fetch(&o->pins, 1, __ATOMIC_ACQ_REL); }
void gc_unpin(rt_obj *o)
{
    if (__atomic_sub_fetch(&o->pins, 1, __ATOMIC_ACQ_REL) == 0 && (o->flags & RT_OBJ_EXTERNAL)) {
        /* numpy may release the memory now: detach it from every cap */
        __atomic_store_n(&o->rlen, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&o->wlen, 0, __ATOMIC_RELEASE);
        __atomic_fetch_or(&o->flags, RT_OBJ_FREED | RT_OBJ_PAYLOAD_GONE, __ATOMIC_ACQ_REL);
    }
}
void gc_hold(rt_obj *o) { __atomic_add_fetch(&o->holds, 1, __ATOMIC_ACQ_REL); }
void gc_unhold(rt_obj *o) { __atomic_sub_fetch(&o->holds, 1, __ATOMIC_ACQ_REL); }
void gc_thread_register(rt_thread *t)
{
    pthread_mutex_lock(&heap_mu); t->next = threads; threads = t; pthread_mutex_unlock(&heap_mu);
}
void gc_thread_unregister(rt_thread *t) { (void)t; }
void gc_enter(rt_thread *t) { __atomic_store_n(&t->state, RT_THREAD_ENTERED, __ATOMIC_SEQ_CST); }
void gc_exit(rt_thread *t) { __atomic_store_n(&t->state, RT_THREAD_EXITED, __ATOMIC_SEQ_CST); }
void gc_handshake_poll(rt_thread *t) { (void)t; }
void gc_store_barrier(rt_obj *target) { (void)target; }
void gc_collect(void) { st.cycles++; }
void gc_set_enabled(int e) { st.enabled = e; }
void gc_set_threshold(double r, uint64_t f) { (void)r; (void)f; }
void gc_get_stats(gc_stats_t *out) { *out = st; }
int gc_is_live_id(uint64_t id)
{
    int found = 0;
    pthread_mutex_lock(&heap_mu);
    for (rt_obj *o = all_objs; o; o = o->next) if (o->id == id) { found = 1; break; }
    pthread_mutex_unlock(&heap_mu);
    return found;
}
uint64_t gc_count_objects(void)
{
    uint64_t n = 0;
    pthread_mutex_lock(&heap_mu);
    for (rt_obj *o = all_objs; o; o = o->next) n++;
    pthread_mutex_unlock(&heap_mu);
    return n;
}
