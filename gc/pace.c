/*
 * Pacing: allocation debt.  Without it, kernels that allocate faster than a
 * cycle reclaims grow the heap without bound (each cycle's trigger is taken
 * from a heap that already holds what was allocated during the last one).
 *
 * After each cycle (fugc.c update_trigger), with live = the occupancy the
 * cycle marked and T = max(ratio * live, floor):
 *   trigger = live + T / 2   a cycle starts once occupancy passes it;
 *   goal    = live + T       a kernel thread whose allocation finds the
 *                            occupancy past the goal is in debt.
 * A thread in debt waits at its next pollcheck (where it can answer
 * handshakes, so marking and sweeping proceed) until the occupancy is back
 * under the goal or the cycle that was running or requested has ended: at
 * most one cycle per debt, so a growing live set never deadlocks.  Python
 * threads never wait.  The poll word's RT_POLL_PACE bit is set while any
 * thread is in debt, so the fast path of every pollcheck stays one load.
 */
#include <time.h>
#include "gc_internal.h"

static int32_t debtors = 0;
static pthread_mutex_t pace_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pace_cv = PTHREAD_COND_INITIALIZER;
static uint64_t waits = 0;
static double wait_s = 0;

void gc_pace_note(uint64_t occupancy)
{
    if (occupancy <= __atomic_load_n(&gc_state.goal_bytes, __ATOMIC_RELAXED)) return;
    rt_thread *t = gc_current_thread();
    if (!t || __atomic_load_n(&t->state, __ATOMIC_RELAXED) != RT_THREAD_ENTERED ||
        t->pace_debt)
        return;
    t->pace_debt = 1;
    if (__atomic_add_fetch(&debtors, 1, __ATOMIC_ACQ_REL) == 1)
        __atomic_fetch_or(&rt_poll_word, RT_POLL_PACE, __ATOMIC_SEQ_CST);
}

static void settle(rt_thread *t)
{
    t->pace_debt = 0;
    if (__atomic_sub_fetch(&debtors, 1, __ATOMIC_ACQ_REL) == 0) {
        __atomic_fetch_and(&rt_poll_word, ~RT_POLL_PACE, __ATOMIC_SEQ_CST);
        /* a thread that went into debt meanwhile keeps its bit */
        if (__atomic_load_n(&debtors, __ATOMIC_SEQ_CST))
            __atomic_fetch_or(&rt_poll_word, RT_POLL_PACE, __ATOMIC_SEQ_CST);
    }
}

void gc_pace_poll(rt_thread *t)
{
    if (!t->pace_debt) return;
    uint64_t c0 = gc_cycles_completed();
    double t0 = gc_now();
    int waited = 0;
    while (__atomic_load_n(&gc_state.heap_bytes, __ATOMIC_RELAXED) >
               __atomic_load_n(&gc_state.goal_bytes, __ATOMIC_RELAXED) &&
           __atomic_load_n(&gc_state.enabled, __ATOMIC_ACQUIRE) && gc_cycles_completed() == c0) {
        waited = 1;
        gc_handshake_answer(t);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 300000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_mutex_lock(&pace_mu);
        if (gc_cycles_completed() == c0) pthread_cond_timedwait(&pace_cv, &pace_mu, &ts);
        pthread_mutex_unlock(&pace_mu);
    }
    if (waited) {
        pthread_mutex_lock(&pace_mu);
        waits++;
        wait_s += gc_now() - t0;
        pthread_mutex_unlock(&pace_mu);
    }
    settle(t);
}

void gc_pace_exit(rt_thread *t)
{
    if (t->pace_debt) settle(t);
}

void gc_pace_cycle_done(void)
{
    pthread_mutex_lock(&pace_mu);
    pthread_cond_broadcast(&pace_cv);
    pthread_mutex_unlock(&pace_mu);
}

void gc_pace_stats(double out[2])
{
    pthread_mutex_lock(&pace_mu);
    out[0] = (double)waits;
    out[1] = wait_s;
    pthread_mutex_unlock(&pace_mu);
}
