/*
 * Soft handshakes (FUGC style).
 *
 * The collector bumps gc_hs_epoch, sets bit 0 of rt_poll_word and waits until
 * every registered thread has answered (t->handshake_done >= epoch):
 *  - an ENTERED thread answers itself at its next pollcheck
 *    (gc_handshake_poll): it runs the callback on its own stack (scanning its
 *    shadow frames needs no synchronisation with its plain stores), then
 *    publishes handshake_done with release;
 *  - an EXITED thread cannot hold roots, so the collector answers for it after
 *    CASing its state EXITED -> BUSY; gc_enter's CAS EXITED -> ENTERED fails
 *    while BUSY, so the thread cannot start kernel code while the collector
 *    acts for it.
 * Latency = request until the last answer.  A STOP handshake (STW mode and
 * the verifier) additionally parks answering threads until gc_world_release()
 * and makes gc_enter wait, so the whole world is stopped.
 */
#include <sched.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>
#include "gc_internal.h"

volatile int32_t rt_poll_word = 0;

static pthread_mutex_t threads_mu = PTHREAD_MUTEX_INITIALIZER;
static rt_thread *threads = NULL;
static __thread rt_thread *self = NULL;

static uint64_t hs_epoch = 0;
static int32_t hs_kind = GC_HS_NOOP;
static uint32_t hs_mark_epoch = 0;   /* mark epoch the SCAN callback marks with */
static uint64_t world_gen = 0;       /* bumped by each release */

/* Latency is request -> last answer, timestamped by the answering side (a
 * thread at its pollcheck, or the collector acting for an exited thread), so
 * it measures how fast threads respond, not how fast the collector thread
 * gets a CPU back to notice (on an oversubscribed machine that can take a
 * scheduler timeslice; gc_handshake() returns that observed time). */
static uint64_t hs_last_ack_ns = 0;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void note_ack(void)
{
    uint64_t t = now_ns(), cur = __atomic_load_n(&hs_last_ack_ns, __ATOMIC_RELAXED);
    while (t > cur && !__atomic_compare_exchange_n(&hs_last_ack_ns, &cur, t, 1, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED))
        ;
}

static pthread_mutex_t hs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hs_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;

void gc_thread_register(rt_thread *t)
{
    gc_init();
    __atomic_store_n(&t->state, RT_THREAD_EXITED, __ATOMIC_RELAXED);
    t->gc_private = NULL;
    t->pace_debt = 0;
    pthread_mutex_lock(&threads_mu);
    /* threads_mu is held for a whole handshake, so this thread is either
     * counted in it or joins after it. */
    __atomic_store_n(&t->handshake_done, __atomic_load_n(&hs_epoch, __ATOMIC_ACQUIRE),
                     __ATOMIC_RELEASE);
    t->next = threads;
    threads = t;
    pthread_mutex_unlock(&threads_mu);
    self = t;
}

void gc_thread_unregister(rt_thread *t)
{
    int32_t exp;
    /* Wait out a collector acting for us; GONE threads are skipped. */
    for (;;) {
        exp = RT_THREAD_EXITED;
        if (__atomic_compare_exchange_n(&t->state, &exp, GC_THREAD_GONE, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
        sched_yield();
    }
    pthread_mutex_lock(&threads_mu);
    for (rt_thread **pp = &threads; *pp; pp = &(*pp)->next)
        if (*pp == t) { *pp = t->next; break; }
    pthread_mutex_unlock(&threads_mu);
    if (self == t) self = NULL;
}

static int32_t hs_waiting = 0;   /* collector blocked on hs_cv: answers must signal */

static void notify_collector(void)
{
    /* Fast answer path: no syscall unless the collector sleeps (it sets
     * hs_waiting before its last check; seq_cst pairs with our done store,
     * and its timed wait bounds any miss). */
    if (!__atomic_load_n(&hs_waiting, __ATOMIC_SEQ_CST)) return;
    pthread_mutex_lock(&hs_mu);
    pthread_cond_signal(&hs_cv);
    pthread_mutex_unlock(&hs_mu);
}

/* Wait for the release of stop generation gen (not merely for
 * gc_state.world_stopped == 0: the next cycle may stop the world again before a
 * woken thread runs, and this thread must still leave to answer it). */
static void park_while_stopped(uint64_t gen)
{
    pthread_mutex_lock(&park_mu);
    while (__atomic_load_n(&gc_state.world_stopped, __ATOMIC_ACQUIRE) &&
           __atomic_load_n(&world_gen, __ATOMIC_ACQUIRE) == gen)
        pthread_cond_wait(&park_cv, &park_mu);
    pthread_mutex_unlock(&park_mu);
}

void gc_enter(rt_thread *t)
{
    /* Counted before the CAS so gc_free's "nobody entered" check is
     * conservative (seq_cst pairs with its rlen = 0 store). */
    __atomic_add_fetch(&gc_state.n_entered, 1, __ATOMIC_SEQ_CST);
    for (unsigned spins = 0;;) {
        int32_t exp = RT_THREAD_EXITED;
        if (__atomic_compare_exchange_n(&t->state, &exp, RT_THREAD_ENTERED, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED)) {
            /* Dekker with the collector: it sets gc_state.world_stopped, then reads
             * states.  Either it sees us ENTERED (and waits for us) or we see
             * the stop and back out until the world restarts. */
            uint64_t gen = __atomic_load_n(&world_gen, __ATOMIC_SEQ_CST);
            if (!__atomic_load_n(&gc_state.world_stopped, __ATOMIC_SEQ_CST)) return;
            __atomic_store_n(&t->state, RT_THREAD_EXITED, __ATOMIC_SEQ_CST);
            notify_collector();
            park_while_stopped(gen);
            continue;
        }
        /* BUSY: the collector is running our handshake; it is short. */
        if (++spins < 64) rt_cpu_relax(); else sched_yield();
    }
}

void gc_exit(rt_thread *t)
{
    gc_pace_exit(t);
    /* No scan here: after a fault the frames chain may point into unwound
     * stack.  An exited thread holds no snapshots; the collector answers. */
    __atomic_store_n(&t->state, RT_THREAD_EXITED, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&gc_state.n_entered, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&hs_epoch, __ATOMIC_ACQUIRE) >
        __atomic_load_n(&t->handshake_done, __ATOMIC_RELAXED))
        notify_collector();
}

void gc_scan_block(rt_block *b, uint32_t epoch)
{
    if (!b) return;
    for (rt_frame *f = __atomic_load_n(&b->frames, __ATOMIC_ACQUIRE); f; f = f->up) {
        int32_t n = f->nslots;
        if (n < 0) n = 0;
        if (n > RT_FRAME_SLOTS_MAX) n = RT_FRAME_SLOTS_MAX;
        for (int32_t k = 0; k < n; k++) {
            rt_obj *o = f->slots[k];
            if (o) gc_shade_stack(o, epoch);
        }
    }
}

rt_thread *gc_current_thread(void) { return self; }

void gc_handshake_poll(rt_thread *t)
{
    if (!t) t = self;
    if (!t) return;
    gc_handshake_answer(t);
    if (t->pace_debt) gc_pace_poll(t);
}

void gc_handshake_answer(rt_thread *t)
{
    uint64_t e = __atomic_load_n(&hs_epoch, __ATOMIC_ACQUIRE);
    if (e <= __atomic_load_n(&t->handshake_done, __ATOMIC_RELAXED)) return;
    int32_t kind = __atomic_load_n(&hs_kind, __ATOMIC_ACQUIRE);
    uint64_t gen = __atomic_load_n(&world_gen, __ATOMIC_ACQUIRE); /* no release before our answer */
    if (kind == GC_HS_SCAN)
        gc_scan_block(t->block, __atomic_load_n(&hs_mark_epoch, __ATOMIC_ACQUIRE));
    note_ack();
    __atomic_store_n(&t->handshake_done, e, __ATOMIC_RELEASE);
    notify_collector();
    if (kind == GC_HS_STOP) park_while_stopped(gen);
}

double gc_handshake(int kind)
{
    pthread_mutex_lock(&threads_mu);
    uint64_t t0_ns = now_ns();
    double t0 = gc_now();
    __atomic_store_n(&hs_last_ack_ns, t0_ns, __ATOMIC_RELAXED);
    if (kind == GC_HS_STOP) __atomic_store_n(&gc_state.world_stopped, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&hs_kind, kind, __ATOMIC_RELEASE);
    __atomic_store_n(&hs_mark_epoch, __atomic_load_n(&gc_state.epoch, __ATOMIC_ACQUIRE),
                     __ATOMIC_RELEASE);
    uint64_t e = __atomic_add_fetch(&hs_epoch, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_or(&rt_poll_word, RT_POLL_HANDSHAKE, __ATOMIC_SEQ_CST);
    unsigned rounds = 0;
    /* Spin only with a spare CPU: otherwise the spinning collector occupies
     * the CPU of the very thread whose answer it waits for. */
    static long ncpu = 0;
    if (!ncpu) ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned spin_rounds =
        ncpu > (long)__atomic_load_n(&gc_state.n_entered, __ATOMIC_RELAXED) + 1 ? 200 : 0;
    pthread_mutex_lock(&hs_mu);
    for (;;) {
        int pending = 0;
        if (rounds >= spin_rounds) __atomic_store_n(&hs_waiting, 1, __ATOMIC_SEQ_CST);
        for (rt_thread *t = threads; t; t = t->next) {
            if (__atomic_load_n(&t->handshake_done, __ATOMIC_ACQUIRE) >= e) continue;
            int32_t s = RT_THREAD_EXITED;
            if (__atomic_compare_exchange_n(&t->state, &s, GC_THREAD_BUSY, 0, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST)) {
                /* Exited: no block, no roots; the callback is a no-op. */
                note_ack();
                __atomic_store_n(&t->handshake_done, e, __ATOMIC_RELEASE);
                __atomic_store_n(&t->state, RT_THREAD_EXITED, __ATOMIC_SEQ_CST);
                continue;
            }
            if (s == GC_THREAD_GONE) continue;
            pending++;
        }
        if (!pending) break;
        if (++rounds < spin_rounds) {
            /* Busy threads answer within one loop iteration: spin briefly
             * before paying for a sleep/wakeup. */
            pthread_mutex_unlock(&hs_mu);
            for (int i = 0; i < 50; i++) rt_cpu_relax();
            if (rounds > 20) sched_yield();
            pthread_mutex_lock(&hs_mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&hs_cv, &hs_mu, &ts);
        }
    }
    __atomic_store_n(&hs_waiting, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&hs_mu);
    __atomic_fetch_and(&rt_poll_word, ~RT_POLL_HANDSHAKE, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&threads_mu);
    double observed = gc_now() - t0;
    gc_record_handshake(1e-9 * (double)(__atomic_load_n(&hs_last_ack_ns, __ATOMIC_RELAXED) - t0_ns),
                        observed);
    return observed;
}

void gc_world_release(void)
{
    pthread_mutex_lock(&park_mu);
    __atomic_add_fetch(&world_gen, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gc_state.world_stopped, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&park_cv);
    pthread_mutex_unlock(&park_mu);
}

void gc_for_each_parked_block(void (*fn)(rt_block *, void *), void *arg)
{
    pthread_mutex_lock(&threads_mu);
    for (rt_thread *t = threads; t; t = t->next)
        if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) == RT_THREAD_ENTERED) fn(t->block, arg);
    pthread_mutex_unlock(&threads_mu);
}
