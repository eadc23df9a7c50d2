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

/* ---- the collector's shared state: one struct (fugc.c defines it) -------
 * Phase-private data (mark stack, root set, handshake bookkeeping, release
 * queues, free lists) stays static in its phase's file. */
typedef struct gc_stats_counters {
    uint64_t cycles, handshakes;
    uint64_t objects_freed, bytes_freed;      /* headers reclaimed, payload bytes released */
    uint64_t bytes_alloc, objects_alloc, payload_alloc;
    uint64_t verify_failures, last_reclaimed, late_roots, freed_payloads;
    double mark_s, sweep_s;
    int32_t running;                          /* a cycle is in progress */
} gc_stats_counters;

typedef struct gc_state_t {
    /* modes, read once at init */
    int stw_mode;                 /* CAPQR_GC_STW */
    int verify_mode;              /* CAPQR_GC_VERIFY: 1 abort, 2 count only */
    int poison_mode;              /* CAPQR_GC_POISON */
    int32_t enabled;              /* automatic cycles (atomic) */
    /* the cycle (atomics unless noted) */
    pthread_mutex_t cycle_mu;     /* held for a whole cycle */
    uint32_t epoch;               /* mark epoch of the current/last cycle */
    uint32_t alloc_epoch;         /* colour of new objects: epoch once the barrier is on */
    int32_t marking;              /* store/pin barrier on */
    int32_t counting_newborn;     /* splice .. mark end: new objects are not in the heap list */
    uint64_t newborn_reached_bytes; /* objects born while marking that it reached */
    int32_t world_stopped;        /* STW: ENTERED threads park, no thread may enter */
    int32_t n_entered;            /* threads ENTERED or entering */
    /* the heap */
    pthread_mutex_t list_mu;      /* guards the heap list against walkers */
    rt_obj *heap_list;            /* objects swept by the next cycle (collector only) */
    rt_obj *graveyard;            /* verify mode: released headers kept until checked */
    uint64_t heap_bytes;          /* occupancy: headers + payloads not released */
    uint64_t alloc_since;         /* bytes allocated since the last cycle began */
    /* pacing */
    uint64_t live_after;          /* live at the last mark end (occupancy, damped) */
    uint64_t trigger_bytes;       /* occupancy that starts a cycle */
    uint64_t goal_bytes;          /* occupancy past which allocating kernels wait */
    gc_stats_counters st;
} gc_state_t;
extern gc_state_t gc_state;

/* ---- cycle control (fugc.c) -------------------------------------------- */
#define GC_EPOCH_MAX 0x7fffffffu /* epochs run 1 .. GC_EPOCH_MAX, then wrap to 1 */
uint32_t gc_next_epoch(uint32_t e);

double gc_now(void);

/* ---- heap (heap.c) ------------------------------------------------------ */
rt_obj *gc_alloc_list_head(void);  /* objects allocated since the cycle began */
void gc_splice_alloc_list(void);   /* move allocated objects into the heap list */
void gc_release_payload(rt_obj *o);/* release a payload once (sets PAYLOAD_GONE); external
                                      * and device payloads are queued for the host */
void gc_header_free(rt_obj *o);    /* release a header (poisoned first in POISON mode) */
void gc_rootset_remove(rt_obj *o);
void gc_rootset_each(void (*fn)(rt_obj *, void *), void *arg);
void gc_request_auto(void);        /* fugc.c: wake the collector */

/* ---- blocks (blocks.c) -------------------------------------------------- */
#define GC_HDR_BYTES ((uint64_t)((sizeof(rt_obj) + RT_PAYLOAD_ALIGN - 1) & \
                              ~(size_t)(RT_PAYLOAD_ALIGN - 1))) /* whole lines */
#define GC_INLINE_MAX 16384u       /* larger payloads get a block of their own */
#define GC_NCLASS_MAX 32
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
void gc_pace_note(uint64_t occupancy); /* an allocation passed the trigger */
void gc_pace_poll(rt_thread *t);   /* pollcheck: pay a debt by waiting for the cycle */
void gc_pace_exit(rt_thread *t);   /* thread leaves kernel code: forget its debt */
void gc_pace_cycle_done(void);     /* wake the waiters */
rt_thread *gc_current_thread(void);/* handshake.c: the calling mutator thread, or NULL */
void gc_handshake_answer(rt_thread *t); /* answer a pending handshake, if any */

/* ---- handshakes (handshake.c) ------------------------------------------- */
double gc_handshake(int kind);     /* returns latency in seconds */
void gc_world_release(void);       /* end of a STOP handshake's pause */
void gc_scan_block(rt_block *b, uint32_t epoch);
/* Call fn on each ENTERED thread's block (world stopped). */
void gc_for_each_parked_block(void (*fn)(rt_block *, void *), void *arg);

/* ---- marking (mark.c) --------------------------------------------------- */
int gc_try_mark(rt_obj *o, uint32_t epoch, int seen); /* 1 if it was white */
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

/* ---- verify (verify.c) -------------------------------------------------- */
uint64_t gc_verify(void);           /* number of violations */

/* ---- stats (stats.c) ---------------------------------------------------- */
void gc_record_handshake(double seconds, double observed);

#endif
