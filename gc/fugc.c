/*
 * capqr's collector: a concurrent, non-moving mark-sweep collector with
 * soft-handshake safepoints, modelled on Fil-C's FUGC.
 *
 * State: everything the phases share lives in one struct, gc_state
 * (gc_internal.h, defined below); each phase file keeps only its private
 * bookkeeping.  Files: fugc.c (this cycle driver), handshake.c, mark.c,
 * sweep.c, verify.c, heap.c (objects, lists, root set, deferred releases),
 * blocks.c (memory, size classes, poison mode), pace.c, stats.c.
 *
 * Objects (cap.h rt_obj) are a header + payload and never move.  Caps point
 * at headers, so a freed object's payload can go while its header stays and
 * later accesses trap as "freed" instead of reading reused memory.
 *
 * Roots: pins (Python handles), holds (arguments of running launches), the
 * shadow-frame slots of every ENTERED thread's block, and, transitively, the
 * slots of cap tables (dtype RT_DT_CAP) that still have a host payload and
 * were not freed (a freed table's bounds are zero: no kernel can read its
 * slots again, so they are not edges).
 *
 * Mark word: rt_obj.mark = epoch << 1 | SEEN.  Cycle E marks by CAS to
 * E << 1; nothing is ever cleared (bumping the epoch whitens everything).
 * SEEN records that a shadow slot held the object during E's stack scans.
 * Epochs are 31 bits and wrap from GC_EPOCH_MAX to 1: every object's mark
 * is at most one cycle old (unmarked objects are swept), so equality with
 * the current epoch stays exact across the wrap.
 *
 * Payload ownership.  Internal payloads are malloc'ed and freed by the
 * sweep.  External payloads (capabilities.wrap: numpy/torch memory) and
 * device payloads (gc_wrap_device_pinned: a GPU address) follow exactly the
 * same lifetime rules, but their release is deferred: the sweep queues a
 * record {id, address, nbytes} (heap.c) and the host drains it from its own
 * threads (gc_drain_external_releases: Python drops the array reference;
 * gc_drain_device_releases: the GPU lane calls cuMemFree).  The collector
 * thread never calls into Python or the driver.  Device payloads are leaves
 * (never traced: the host cannot read them).
 *
 * One cycle (gc_cycle below, run by the collector thread):
 *  1. Splice the alloc list into the heap list.  Only the heap list is swept
 *     by this cycle, so objects born during the cycle survive it whatever
 *     epoch their allocator read.
 *  2. epoch = E; barrier on (gc_state.marking = 1).  Soft handshake (no-op
 *     callback; STOP in STW mode): once every thread answered, every later
 *     cap-table store runs the Dijkstra barrier (shade the stored target),
 *     and stores in flight before it completed.  Only then is allocation
 *     black (gc_state.alloc_epoch = E: new headers get mark E).  Before that new
 *     objects are white, so a table allocated while a thread may still skip
 *     the barrier is traced when a stack scan finds it (black allocation
 *     first would let such a table hide an unshaded store).
 *  3. Mark roots outside frames: objects with pins > 0 or holds > 0 (kept
 *     in a root set, so this does not walk the heap).  gc_pin/gc_hold shade
 *     while marking, so later roots are covered too.
 *  4. Loop: drain the mark stack (parallel: collector + helper markers);
 *     soft handshake whose callback scans the thread's own shadow frames
 *     (marking with SEEN) -- ENTERED threads do it at a pollcheck, EXITED
 *     threads have no frames and the collector answers for them under the
 *     enter/exit CAS; if the mark stack is still empty after the handshake,
 *     marking is complete (the fixpoint: a whole round of stack scans found
 *     no new grey object, and every barrier shade before a thread's answer
 *     is on the stack; after its answer a thread's roots are black, so its
 *     later stores only store non-white targets).
 *  5. Barrier off.  Sweep the heap list concurrently (sweep.c): white ->
 *     release payload and header.  FREED objects: a sweep first latches the
 *     free (FREE_LATCHED); a later cycle's sweep releases the payload only
 *     if that cycle's stack scans did not SEE it and it is unpinned and
 *     unheld: no running block can then hold a bounds snapshot of it (one
 *     made after the free has zero bounds; one made before lives in a
 *     shadow slot that every scan of the later cycle would see, or was a
 *     temporary that died before the pollcheck that answered the scan).
 *  6. CAPQR_GC_VERIFY: stop the world and check reachability independently.
 *  7. Pacing (pace.c): live = occupancy (headers + payloads) of what this
 *     cycle marked, measured at mark end: the objects it found marked in
 *     the heap list, plus the objects born during marking that tracing or
 *     a stack scan reached (flag GC_OBJ_NEWBORN; not those that died
 *     unseen, not through the barrier, which sees every fresh store);
 *     a rise over the last estimate counts half (damps one cycle's
 *     overcount).  T = max(ratio * live, floor)
 *     (CAPQR_GC_RATIO, default 1.25; CAPQR_GC_FLOOR, default 1 MiB): the
 *     next cycle starts at occupancy live + T/2; a kernel thread that
 *     allocates past live + T waits at its next pollcheck until the
 *     running cycle ends (allocation debt).  Dead small objects go back to
 *     size-class free lists (blocks.c), reused before malloc is asked for
 *     more (so resident memory tracks the goal's high-water mark) and
 *     trimmed to the goal after the cycle; the sweep costs a list push per
 *     object, not two free() calls.
 *
 * CAPQR_GC_STW=1: one STOP handshake parks every ENTERED thread at a
 * pollcheck (and blocks gc_enter) for the whole cycle; the collector scans
 * the parked threads' frames itself, marks, sweeps and releases the world.
 * Black allocation starts once the world is stopped, as in step 2.
 *
 * CAPQR_GC_POISON=1: internal payloads are page mmaps; a released one loses
 * its pages and becomes PROT_NONE in a bounded quarantine, and released
 * headers are overwritten, so any late access faults.  An oracle that does
 * not share the collector's root set (CAPQR_GC_VERIFY does).
 *
 * Known limit: a Python thread that obtains a header from a table slot and
 * pins it after marking ended while a kernel overwrote that slot keeps the
 * object itself (sweep keeps pinned white objects) but not its children if
 * it is a table.  Use gc_alloc_pinned to avoid the gc_alloc/gc_pin window.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "gc_internal.h"


gc_state_t gc_state = {
    .enabled = 1,
    .cycle_mu = PTHREAD_MUTEX_INITIALIZER,
    .epoch = 1,
    .alloc_epoch = 1,
    .list_mu = PTHREAD_MUTEX_INITIALIZER,
    .trigger_bytes = 1u << 20,
    .goal_bytes = 2u << 20,
};

static double ratio = 1.25;
static uint64_t floor_bytes = 1u << 20;

static pthread_mutex_t coll_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t coll_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static uint64_t cycles_started = 0, cycles_done = 0, collect_target = 0;
static int32_t auto_requested = 0;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

double gc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Step 7: from live at mark end, the occupancy that starts the next cycle
 * and the goal past which allocating kernels wait. */
static uint64_t headroom(void)
{
    double t = ratio * (double)__atomic_load_n(&gc_state.live_after, __ATOMIC_RELAXED);
    return t > (double)floor_bytes ? (uint64_t)t : floor_bytes;
}

static void update_trigger(void)
{
    uint64_t live = __atomic_load_n(&gc_state.live_after, __ATOMIC_RELAXED), t = headroom();
    __atomic_store_n(&gc_state.trigger_bytes, live + t / 2, __ATOMIC_RELAXED);
    __atomic_store_n(&gc_state.goal_bytes, live + t, __ATOMIC_RELAXED);
}

uint64_t gc_heap_goal(void) { return __atomic_load_n(&gc_state.goal_bytes, __ATOMIC_RELAXED); }
uint64_t gc_heap_trigger(void) { return __atomic_load_n(&gc_state.trigger_bytes, __ATOMIC_RELAXED); }

void gc_request_auto(void)
{
    int32_t exp = 0;
    if (!__atomic_compare_exchange_n(&auto_requested, &exp, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&coll_mu);
    pthread_cond_signal(&coll_cv);
    pthread_mutex_unlock(&coll_mu);
}

/* Test hook: park the collector at a phase so tests can act "during
 * marking" / "during sweeping" deterministically.  1: marking (concurrent:
 * barrier on, roots marked, before the stack scans; STW: barrier on, before
 * the world stops); 2: sweeping (concurrent: barrier off, before the sweep;
 * STW: after the world restarted); 3: marking, concurrent only, after the
 * roots were traced and before the first stack scan (a store into a root
 * table now is only kept alive by the store barrier); 4: the new epoch and
 * the barrier flag are published but the barrier handshake has not run, so
 * allocation is still white (both modes). */
static int32_t dbg_pause_at = 0, dbg_phase = 0;
static pthread_mutex_t dbg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dbg_cv = PTHREAD_COND_INITIALIZER;

static void dbg_point(int32_t phase)
{
    if (__atomic_load_n(&dbg_pause_at, __ATOMIC_ACQUIRE) != phase) return;
    pthread_mutex_lock(&dbg_mu);
    __atomic_store_n(&dbg_phase, phase, __ATOMIC_RELEASE);
    while (__atomic_load_n(&dbg_pause_at, __ATOMIC_ACQUIRE) == phase)
        pthread_cond_wait(&dbg_cv, &dbg_mu);
    __atomic_store_n(&dbg_phase, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&dbg_mu);
}

void gc_debug_pause(int32_t phase)
{
    pthread_mutex_lock(&dbg_mu);
    __atomic_store_n(&dbg_pause_at, phase, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&dbg_cv);
    pthread_mutex_unlock(&dbg_mu);
}

int32_t gc_debug_phase(void) { return __atomic_load_n(&dbg_phase, __ATOMIC_ACQUIRE); }

void gc_debug_set_epoch(uint32_t e)
{
    gc_init();
    e = ((e - 1) % GC_EPOCH_MAX) + 1; /* a valid epoch: 1 .. GC_EPOCH_MAX */
    pthread_mutex_lock(&gc_state.cycle_mu);
    __atomic_store_n(&gc_state.epoch, e, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gc_state.alloc_epoch, e, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&gc_state.cycle_mu);
}

uint32_t gc_debug_epoch(void) { return __atomic_load_n(&gc_state.epoch, __ATOMIC_ACQUIRE); }

static void mark_stw(uint32_t epoch);
static void scan_parked(rt_block *b, void *arg) { gc_scan_block(b, *(uint32_t *)arg); }

/* Next mark epoch: 31 bits (the mark word holds epoch << 1 | SEEN in 32),
 * never 0.  Wrapping is safe because every object's mark is at most one
 * cycle old: the sweep releases what a cycle did not mark, and objects
 * allocated during a cycle are spliced into the next one. */
uint32_t gc_next_epoch(uint32_t e) { return e >= GC_EPOCH_MAX ? 1 : e + 1; }

static void gc_cycle(void)
{
    gc_sweep_result r;
    memset(&r, 0, sizeof(r));
    pthread_mutex_lock(&gc_state.cycle_mu);
    __atomic_store_n(&gc_state.st.running, 1, __ATOMIC_RELEASE);
    double t0 = gc_now();

    /* 1 */
    __atomic_store_n(&gc_state.alloc_since, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&gc_state.newborn_reached_bytes, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&gc_state.counting_newborn, 1, __ATOMIC_SEQ_CST);
    gc_splice_alloc_list();
    uint32_t epoch = gc_next_epoch(__atomic_load_n(&gc_state.epoch, __ATOMIC_RELAXED));
    /* 2: epoch first, so a barrier that sees marking also sees E; allocation
     * stays white (gc_state.alloc_epoch is E - 1) until every thread runs the
     * barrier */
    __atomic_store_n(&gc_state.epoch, epoch, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gc_state.marking, 1, __ATOMIC_SEQ_CST);
    dbg_point(4);
    if (gc_state.stw_mode) {
        dbg_point(1);
        gc_handshake(GC_HS_STOP);
    } else {
        gc_handshake(GC_HS_NOOP);
    }
    __atomic_store_n(&gc_state.alloc_epoch, epoch, __ATOMIC_SEQ_CST); /* black allocation */
    if (gc_state.stw_mode) {
        mark_stw(epoch);
    } else {
        /* 3 */
        gc_mark_roots(epoch);
        dbg_point(1);
        /* 4 */
        for (;;) {
            gc_drain(epoch);
            dbg_point(3);
            gc_handshake(GC_HS_SCAN);
            if (gc_mark_stack_empty()) break;
        }
    }
    /* 5 */
    __atomic_store_n(&gc_state.marking, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gc_state.counting_newborn, 0, __ATOMIC_SEQ_CST);
    /* pins/holds from Python threads that shaded just before barrier-off */
    gc_drain(epoch);
    double t1 = gc_now();
    if (!gc_state.stw_mode) dbg_point(2);
    gc_sweep(epoch, &r);
    if (gc_state.stw_mode) gc_world_release();
    double t2 = gc_now();
    if (gc_state.stw_mode) dbg_point(2);

    __atomic_add_fetch(&gc_state.st.objects_freed, r.objects_reclaimed, __ATOMIC_RELAXED);
    __atomic_store_n(&gc_state.st.last_reclaimed, r.objects_reclaimed, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gc_state.st.late_roots, r.late_roots, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gc_state.st.freed_payloads, r.freed_payloads_released, __ATOMIC_RELAXED);
    gc_state.st.mark_s += t1 - t0;
    gc_state.st.sweep_s += t2 - t1;
    {   /* a drop applies at once, growth by halves: one cycle's overcount
         * (objects reached, then dropped before mark end) cannot raise the
         * goal far, and real growth converges within a few cycles (debt
         * waits are one cycle long, so a damped goal cannot deadlock) */
        uint64_t prev = __atomic_load_n(&gc_state.live_after, __ATOMIC_RELAXED);
        uint64_t now = r.bytes_kept + __atomic_load_n(&gc_state.newborn_reached_bytes, __ATOMIC_RELAXED);
        __atomic_store_n(&gc_state.live_after, now <= prev ? now : prev + (now - prev + 1) / 2,
                         __ATOMIC_RELAXED);
    }
    update_trigger();
    /* Parked blocks are reused before malloc is asked for more, so
     * occupancy + parked stays near the goal's high-water mark; trim only
     * what a shrunken live set no longer needs (handing blocks back to
     * malloc from this thread would scatter them over the workers' arenas). */
    gc_blocks_trim(__atomic_load_n(&gc_state.goal_bytes, __ATOMIC_RELAXED));

    /* 6 */
    if (gc_state.verify_mode) {
        gc_verify();
        gc_graveyard_flush();
    }
    __atomic_add_fetch(&gc_state.st.cycles, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&gc_state.st.running, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&gc_state.cycle_mu);
    gc_pace_cycle_done();
}

/* Stop-the-world marking (the world is already stopped; it stays stopped
 * through the sweep). */
static void mark_stw(uint32_t epoch)
{
    gc_mark_roots(epoch);
    gc_for_each_parked_block(scan_parked, &epoch);
    gc_drain(epoch);
}

static void *collector_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&coll_mu);
    for (;;) {
        while (!(collect_target > cycles_started) &&
               !(__atomic_load_n(&auto_requested, __ATOMIC_ACQUIRE) &&
                 __atomic_load_n(&gc_state.enabled, __ATOMIC_ACQUIRE)))
            pthread_cond_wait(&coll_cv, &coll_mu);
        cycles_started++;
        __atomic_store_n(&auto_requested, 0, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&coll_mu);
        gc_cycle();
        pthread_mutex_lock(&coll_mu);
        cycles_done++;
        pthread_cond_broadcast(&done_cv);
    }
    return NULL;
}

static double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    double d = strtod(v, &end);
    return end == v ? dflt : d;
}

static void init_once_fn(void)
{
    gc_state.stw_mode = env_double("CAPQR_GC_STW", 0) != 0;
    gc_state.verify_mode = (int)env_double("CAPQR_GC_VERIFY", 0);
    gc_state.poison_mode = env_double("CAPQR_GC_POISON", 0) != 0;
    ratio = env_double("CAPQR_GC_RATIO", 1.25);
    if (ratio <= 0) ratio = 1.25;
    double fl = env_double("CAPQR_GC_FLOOR", (double)(1u << 20));
    floor_bytes = fl > 0 ? (uint64_t)fl : (1u << 20);
    update_trigger();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int helpers = (int)env_double("CAPQR_GC_MARKERS", (double)(ncpu > 1 ? ncpu - 1 : 0));
    if (helpers < 0) helpers = 0;
    if (helpers > 7) helpers = 7;
    gc_markers_start(helpers);
    pthread_t th;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &a, collector_main, NULL) != 0) {
        fprintf(stderr, "capqr gc: cannot start the collector thread\n");
        abort();
    }
    pthread_attr_destroy(&a);
}

int gc_init(void)
{
    pthread_once(&init_once, init_once_fn);
    return 0;
}

void gc_collect(void)
{
    gc_init();
    pthread_mutex_lock(&coll_mu);
    /* A cycle already running may have missed our garbage: wait for the
     * next one to start and finish. */
    uint64_t target = cycles_started + 1;
    if (collect_target < target) collect_target = target;
    pthread_cond_signal(&coll_cv);
    while (cycles_done < target) pthread_cond_wait(&done_cv, &coll_mu);
    pthread_mutex_unlock(&coll_mu);
}

void gc_set_enabled(int enabled)
{
    gc_init();
    __atomic_store_n(&gc_state.enabled, enabled ? 1 : 0, __ATOMIC_RELEASE);
    if (enabled && __atomic_load_n(&gc_state.heap_bytes, __ATOMIC_RELAXED) >
                       __atomic_load_n(&gc_state.trigger_bytes, __ATOMIC_RELAXED))
        __atomic_store_n(&auto_requested, 1, __ATOMIC_RELEASE);
    /* the collector may be waiting with a request noted while disabled */
    pthread_mutex_lock(&coll_mu);
    pthread_cond_signal(&coll_cv);
    pthread_mutex_unlock(&coll_mu);
}

void gc_set_threshold(double r, uint64_t f)
{
    gc_init();
    if (r > 0) ratio = r;
    if (f > 0) floor_bytes = f;
    update_trigger();
}

uint64_t gc_cycles_completed(void)
{
    return __atomic_load_n(&gc_state.st.cycles, __ATOMIC_ACQUIRE);
}
