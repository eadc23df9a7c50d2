/*
 * capqr collector interface: what the runtime core (runtime/csrc) and the
 * Python host (through cffi) call.  Object, block and frame layouts live in
 * capabilities/cap.h; this header adds the mutator-thread state and the
 * collector entry points.  The algorithm is described in gc/fugc.c.
 */
#ifndef CAPQR_GC_H
#define CAPQR_GC_H

#include "cap.h"

/* The pause inside a spin-wait loop (the collector's handshakes, the launch
 * pool's group barrier): lets the sibling hyperthread run, saves power. */
static inline void rt_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* rt_thread.state */
enum { RT_THREAD_EXITED = 0,   /* not running kernel code: the collector acts for it */
       RT_THREAD_ENTERED = 1 };/* running kernel code: answers handshakes at pollchecks */

/* The global poll word every pollcheck loads.  Bit 0: a soft handshake is
 * pending.  Bit 30: some thread owes allocation debt (gc/pace.c).  Bits
 * 1..29: number of launches being stopped (fault/timeout/cancel).
 * gc_handshake_poll must run when any RT_POLL_GC bit is set. */
extern volatile int32_t rt_poll_word;
#define RT_POLL_HANDSHAKE 1
#define RT_POLL_STOP_UNIT 2
#define RT_POLL_PACE 0x40000000
#define RT_POLL_GC (RT_POLL_HANDSHAKE | RT_POLL_PACE)

typedef struct rt_thread {
    int32_t index;
    int32_t state;                 /* RT_THREAD_* (atomic; CAS between thread and collector) */
    uint64_t handshake_done;       /* last handshake epoch answered (atomic) */
    rt_block *block;               /* block running now: its frames are roots */
    struct rt_thread *next;        /* collector's list of mutator threads */
    void *gc_private;              /* collector's per-thread data */
    int32_t pace_debt;             /* allocated past the heap goal: wait at the next pollcheck */
} rt_thread;

/* gc_stats_t and gc_release_rec: cap_abi.h (layouts in capabilities/abi.py STRUCTS,
 * shared with the cffi cdef). */

/* mutator threads (the runtime's workers) */
void gc_thread_register(rt_thread *t);
void gc_thread_unregister(rt_thread *t);
void gc_enter(rt_thread *t);       /* about to run kernel code */
void gc_exit(rt_thread *t);        /* left kernel code */
void gc_handshake_poll(rt_thread *t); /* pollcheck slow path: answer a pending handshake,
                                        * pay allocation debt (any RT_POLL_GC bit) */
void gc_store_barrier(rt_obj *target); /* Dijkstra barrier for cap-table stores */

/* ==== host API begin ====
 * Every prototype from here to "host API end" is declared to cffi as written:
 * runtime/core.py reads them from this file (host_api_cdef), so the Python host
 * calls exactly these signatures.  Only gc_* function prototypes in this part. */

/* lifetime */
int gc_init(void);                 /* idempotent; starts the collector thread */

/* objects */
rt_obj *gc_alloc(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name);
rt_obj *gc_wrap(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name);
int gc_free(rt_obj *o);            /* 0: freed now; -1: was already freed */
void gc_pin(rt_obj *o);            /* a Python handle holds it */
void gc_unpin(rt_obj *o);
void gc_hold(rt_obj *o);           /* a running launch holds it as an argument */
void gc_unhold(rt_obj *o);

/* control and observation */
void gc_collect(void);             /* run one full cycle and wait for it */
void gc_set_enabled(int enabled);  /* 0: no automatic cycles */
void gc_set_threshold(double ratio, uint64_t floor_bytes);
void gc_get_stats(gc_stats_t *out);
int gc_is_live_id(uint64_t id);     /* header with this serial still allocated */
uint64_t gc_count_objects(void);

/* Pinned allocation (heap.c).  Prefer these from Python: the object is born
 * with pins == 1, so no cycle can run between allocation and pin. */
rt_obj *gc_alloc_pinned(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name);
rt_obj *gc_wrap_pinned(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms,
                       const char *name);
/* A device payload owned by the collector from now on (pins == 1). */
rt_obj *gc_wrap_device_pinned(uint64_t devptr, uint64_t nbytes, uint32_t dtype, uint32_t perms,
                              const char *name);

/* Observation (fugc.c, stats.c, heap.c) */
uint64_t gc_cycles_completed(void);
uint64_t gc_last_cycle_reclaimed(void);  /* headers reclaimed by the last cycle */
uint64_t gc_late_roots(void);            /* white objects kept because pinned late */
uint64_t gc_freed_payloads_released(void); /* FREED payloads released by sweeps */
void gc_reset_handshake_stats(void);     /* forget latency samples (benchmarks) */
rt_obj *gc_find_id(uint64_t id);         /* live header by serial, or NULL (tests) */
uint64_t gc_last_id(void);               /* serial of the newest object */
/* Test hook (gc/fugc.c dbg_point): gc_debug_pause(1) parks the collector in
 * its marking phase, (2) in its sweeping phase, (3) after the roots were
 * traced and before the first stack scan (concurrent mode), (4) after the
 * barrier flag went on and before the barrier handshake (allocation still
 * white), (0) resumes; gc_debug_phase() says where it is parked now (0: not
 * parked). */
void gc_debug_pause(int32_t phase);
int32_t gc_debug_phase(void);
void gc_debug_set_epoch(uint32_t e);     /* test hook: the next cycle marks with e + 1 */
uint32_t gc_debug_epoch(void);
void gc_handshake_observed_us(double out[3]); /* p50/p99/max incl. collector wakeup */

/* Deferred releases (heap.c).  The collector never releases memory it does
 * not own from its own thread: an external (wrapped numpy/torch) payload
 * belongs to a Python object, a device payload to the GPU driver.  When the
 * sweep finds such an object unreachable (or freed and no longer reachable
 * by any running block) it queues one record; the host drains the queue
 * from its own threads and drops the Python reference / calls cuMemFree. */
int64_t gc_drain_external_releases(gc_release_rec *out, int64_t max); /* records taken */
int64_t gc_drain_device_releases(gc_release_rec *out, int64_t max);
int64_t gc_pending_releases(void);       /* records queued now (both queues) */
/* Pacing (pace.c, blocks.c): heap occupancy (headers + payloads not yet
 * released), the goal and trigger, bytes parked on the size-class free
 * lists, and how often / how long kernel threads waited to pay allocation
 * debt: {waits, seconds}. */
uint64_t gc_heap_occupancy(void);
uint64_t gc_heap_goal(void);
uint64_t gc_heap_trigger(void);
uint64_t gc_free_list_bytes(void);
void gc_pace_stats(double out[2]);
uint64_t gc_heap_peak(int reset);        /* high-water occupancy + parked blocks (heap.c) */
/* ==== host API end ==== */

#endif
