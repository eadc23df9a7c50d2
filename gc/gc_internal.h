/*
 * Collector-private declarations shared by the collector phases.  Not part of
 * the ABI: the runtime core and Python only see gc.h.
 */
#ifndef CAPQR_GC_INTERNAL_H
#define CAPQR_GC_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include "gc.h"

/* Private rt_obj.flags bits (cap.h uses bits below 0x100). */
#define GC_OBJ_FREE_LATCHED 0x100u /* FREED before this cycle began (set by a sweep) */
#define GC_OBJ_DEAD 0x200u         /* header released (verify mode keeps it in a graveyard) */
#define GC_OBJ_ROOTSET 0x400u      /* in the root set (pins or holds were non-zero once) */
#define GC_OBJ_INLINE 0x800u       /* payload shares the header's block (blocks.c) */
#define GC_OBJ_NEWBORN 0x1000u     /* born while marking, not yet reached by it */

/* rt_obj.mark = epoch << 1 | SEEN.  An object is marked in cycle E iff
 * mark >> 1 == E; SEEN says a shadow-frame slot held it during E's scans
 * (a running block may hold a bounds snapshot, so its payload must stay). */
#define GC_MARK_SEEN 1u

/* rt_thread.state values beyond gc.h's EXITED/ENTERED. */
#define GC_THREAD_BUSY 2 /* collector runs the handshake for an exited thread */
#define GC_THREAD_GONE 3 /* unregistered: skipped */

enum { GC_HS_NOOP = 0, GC_HS_SCAN = 1, GC_HS_STOP = 2 };

/* ---- global collector state (fugc.c) ---------------------------------- */
extern uint32_t gc_epoch;        /* mark epoch of the current/last cycle (atomic) */
extern uint32_t gc_alloc_epoch;  /* colour of new objects: gc_epoch once the barrier is on */
#define GC_EPOCH_MAX 0x7fffffffu /* epochs run 1 .. GC_EPOCH_MAX, then wrap to 1 */
uint32_t gc_next_epoch(uint32_t e);
extern int32_t gc_marking;       /* store/pin barrier on (atomic) */
extern int32_t gc_counting_newborn; /* from before the splice to mark end: new objects
                                  * are not in the heap list this cycle sweeps */
extern int gc_stw_mode;          /* CAPQR_GC_STW */
extern int gc_verify_mode;       /* CAPQR_GC_VERIFY: 1 abort, 2 count only */
extern pthread_mutex_t gc_cycle_mu; /* held for a whole cycle */

double gc_now(void);

/* ---- heap (heap.c) ------------------------------------------------------ */
extern pthread_mutex_t gc_list_mu; /* guards the heap list against walkers */
extern rt_obj *gc_heap_list;       /* objects swept by the next cycle */
rt_obj *gc_alloc_list_head(void);  /* objects allocated since the cycle began */
void gc_splice_alloc_list(void);   /* move allocated objects into the heap list */
void gc_release_payload(rt_obj *o);/* release a payload once (sets PAYLOAD_GONE); external
                                      * and device payloads are queued for the host */
void gc_header_free(rt_obj *o);    /* release a header (poisoned first in POISON mode) */
extern int gc_poison_mode;         /* CAPQR_GC_POISON */
void gc_rootset_remove(rt_obj *o);
void gc_rootset_each(void (*fn)(rt_obj *, void *), void *arg);
extern uint64_t gc_alloc_since;    /* bytes allocated since the last cycle began */
extern uint64_t gc_trigger_bytes;  /* occupancy (gc_heap_bytes) that starts a cycle */
void gc_request_auto(void);        /* fugc.c: wake the collector */
extern int32_t gc_enabled;

/* ---- blocks (blocks.c) -------------------------------------------------- */
#define GC_HDR_BYTES ((uint64_t)((sizeof(rt_obj) + 63) & ~(size_t)63)) /* header's share */
#define GC_INLINE_MAX 16384u       /* larger payloads get a block of their own */
#define GC_NCLASS_MAX 32
extern uint64_t gc_heap_bytes;     /* occupancy: headers + payloads not released (atomic) */
rt_obj *gc_obj_alloc(uint64_t nbytes, int internal_payload, uint64_t *charged);
void gc_obj_release_payload(rt_obj *o); /* separate internal payload memory */
typedef struct gc_free_batch {     /* dead blocks gathered by a sweep, per class */
    rt_obj *head[GC_NCLASS_MAX], *tail[GC_NCLASS_MAX];
    uint64_t n[GC_NCLASS_MAX];
} gc_free_batch;
void gc_batch_add(gc_free_batch *b, rt_obj *o); /* release a dead header (and its block) */
void gc_batch_flush(gc_free_batch *b);
void gc_blocks_trim(uint64_t keep_bytes);
uint64_t gc_free_list_bytes(void);
uint64_t gc_obj_occupancy(const rt_obj *o, uint32_t flags); /* its share of gc_heap_bytes */

/* ---- pacing (pace.c) ------------------------------------------------------ */
extern uint64_t gc_goal_bytes;     /* occupancy past which allocating kernels wait */
void gc_pace_note(uint64_t occupancy); /* an allocation passed the trigger */
void gc_pace_poll(rt_thread *t);   /* pollcheck: pay a debt by waiting for the cycle */
void gc_pace_exit(rt_thread *t);   /* thread leaves kernel code: forget its debt */
void gc_pace_cycle_done(void);     /* wake the waiters */
rt_thread *gc_current_thread(void);/* handshake.c: the calling mutator thread, or NULL */
void gc_handshake_answer(rt_thread *t); /* answer a pending handshake, if any */

/* ---- handshakes (handshake.c) ------------------------------------------- */
extern int32_t gc_world_stopped;   /* STW: ENTERED threads park, no thread may enter */
double gc_handshake(int kind);     /* returns latency in seconds */
void gc_world_release(void);       /* end of a STOP handshake's pause */
void gc_scan_block(rt_block *b, uint32_t epoch);
/* Call fn on each ENTERED thread's block (world stopped). */
void gc_for_each_parked_block(void (*fn)(rt_block *, void *), void *arg);

/* ---- marking (mark.c) --------------------------------------------------- */
int gc_try_mark(rt_obj *o, uint32_t epoch, int seen); /* 1 if it was white */
extern uint64_t gc_newborn_reached_bytes; /* objects born while marking that it reached */
void gc_shade(rt_obj *o);          /* barrier: mark and push a table */
void gc_shade_stack(rt_obj *o, uint32_t epoch);
void gc_mark_roots(uint32_t epoch);/* pins and holds */
void gc_drain(uint32_t epoch);     /* parallel trace until the mark stack is empty */
int gc_mark_stack_empty(void);
void gc_markers_start(int nhelpers);
int gc_nmarkers(void);

/* ---- sweep (sweep.c) ---------------------------------------------------- */
typedef struct gc_sweep_result {
    uint64_t objects_reclaimed;     /* headers freed */
    uint64_t bytes_kept;            /* occupancy of the objects this cycle marked */
    uint64_t payload_bytes_released;
    uint64_t freed_payloads_released; /* FREED but reachable: payload only */
    uint64_t objects_kept;
    uint64_t late_roots;            /* white but pinned/held at sweep: kept */
} gc_sweep_result;
void gc_sweep(uint32_t epoch, gc_sweep_result *r);
void gc_graveyard_flush(void);      /* verify mode: free the kept dead headers */
extern rt_obj *gc_graveyard;

/* ---- verify (verify.c) -------------------------------------------------- */
uint64_t gc_verify(void);           /* number of violations */

/* ---- stats (stats.c) ---------------------------------------------------- */
extern uint64_t gc_st_cycles, gc_st_handshakes, gc_st_objects_freed, gc_st_bytes_freed;
extern uint64_t gc_st_bytes_alloc, gc_st_objects_alloc, gc_st_payload_alloc;
extern uint64_t gc_st_verify_failures, gc_st_last_reclaimed, gc_st_late_roots;
extern uint64_t gc_st_freed_payloads;
extern double gc_st_mark_s, gc_st_sweep_s;
extern int32_t gc_st_running;
extern uint64_t gc_live_after;      /* occupancy marked by the last cycle (live at mark end) */
void gc_record_handshake(double seconds, double observed);

#endif
