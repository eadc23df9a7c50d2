/*
 * Sweep: runs concurrently with mutators after marking terminated and the
 * barrier is off.  Walks only the heap list (objects that existed when the
 * cycle began); objects allocated since are on the alloc list and untouched.
 *
 *  - white (not marked this epoch): unreachable from every root, so no
 *    table, frame, pin or hold can produce it again; release payload
 *    and header (external and device payloads: queued for the host, see
 *    heap.c).
 *  - marked and FREED: the first sweep that sees the free only latches it
 *    (FREE_LATCHED: freed before every stack scan of the next cycle).  A
 *    later sweep of a LATCHED object not SEEN in any shadow frame during
 *    its cycle's scans, with pins == 0 and holds == 0: no
 *    running block can hold a bounds snapshot any more (a snapshot taken
 *    after the free has zero bounds), so release the payload; the header
 *    stays while reachable so later accesses trap as "freed".
 */
#include <stdlib.h>
#include <string.h>
#include "gc_internal.h"

void gc_graveyard_flush(void)
{
    rt_obj *o = gc_state.graveyard;
    gc_state.graveyard = NULL;
    while (o) {
        rt_obj *n = o->next;
        gc_header_free(o);
        o = n;
    }
}

void gc_sweep(uint32_t epoch, gc_sweep_result *r)
{
    unsigned batch = 0, dead_batch = 0;
    gc_free_batch fb;
    memset(&fb, 0, sizeof fb);
    pthread_mutex_lock(&gc_state.list_mu);
    rt_obj **pp = &gc_state.heap_list;
    rt_obj *o;
    while ((o = *pp)) {
        uint32_t m = __atomic_load_n(&o->mark, __ATOMIC_RELAXED);
        uint32_t fl = __atomic_load_n(&o->flags, __ATOMIC_ACQUIRE);
        int32_t pins = __atomic_load_n(&o->pins, __ATOMIC_SEQ_CST);
        int32_t holds = __atomic_load_n(&o->holds, __ATOMIC_SEQ_CST);
        if (fl & GC_OBJ_NEWBORN) /* only the cycle it was born in counts it */
            fl = __atomic_and_fetch(&o->flags, ~GC_OBJ_NEWBORN, __ATOMIC_ACQ_REL);
        if ((m >> 1) != epoch) {
            if (pins > 0 || holds > 0) {
                /* Rooted after marking ended through a pointer we could not
                 * see (a Python thread between gc_alloc and gc_pin): keep. */
                r->late_roots++;
                r->objects_kept++;
                r->bytes_kept += gc_obj_occupancy(o, fl);
                pp = &o->next;
            } else {
                *pp = o->next;
                if (!(fl & RT_OBJ_PAYLOAD_GONE)) {
                    r->payload_bytes_released += o->nbytes;
                    gc_release_payload(o);
                }
                r->objects_reclaimed++;
                if (fl & GC_OBJ_ROOTSET) gc_rootset_remove(o);
                if (gc_state.verify_mode) {
                    /* keep the header readable so the verifier can detect a
                     * reachable released object; freed after verification */
                    __atomic_fetch_or(&o->flags, GC_OBJ_DEAD, __ATOMIC_RELEASE);
                    o->next = gc_state.graveyard;
                    gc_state.graveyard = o;
                } else {
                    gc_batch_add(&fb, o);
                    /* hand dead blocks to allocators early: blocks held here
                     * are neither occupancy nor reusable */
                    if (++dead_batch == 256) {
                        dead_batch = 0;
                        gc_batch_flush(&fb);
                    }
                }
            }
        } else {
            if ((fl & (RT_OBJ_FREED | RT_OBJ_PAYLOAD_GONE)) == RT_OBJ_FREED) {
                if (!(fl & GC_OBJ_FREE_LATCHED)) {
                    /* freed before this point, hence before every stack scan
                     * of the next cycle: eligible then */
                    __atomic_fetch_or(&o->flags, GC_OBJ_FREE_LATCHED, __ATOMIC_SEQ_CST);
                } else if (!(m & GC_MARK_SEEN) && pins <= 0 && holds == 0) {
                    r->payload_bytes_released += o->nbytes;
                    r->freed_payloads_released++;
                    gc_release_payload(o);
                }
            }
            r->objects_kept++;
            r->bytes_kept += gc_obj_occupancy(o, __atomic_load_n(&o->flags, __ATOMIC_ACQUIRE));
            pp = &o->next;
        }
        if (++batch == 4096) {
            /* let gc_is_live_id/gc_count_objects in; only we modify the list,
             * so pp stays valid.  Dead blocks become reusable in batches. */
            batch = 0;
            pthread_mutex_unlock(&gc_state.list_mu);
            gc_batch_flush(&fb);
            pthread_mutex_lock(&gc_state.list_mu);
        }
    }
    pthread_mutex_unlock(&gc_state.list_mu);
    gc_batch_flush(&fb);
}
