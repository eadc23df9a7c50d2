/*
 * capqr runtime core: the worker pool that runs kernel blocks, the fault
 * path, and the rt_api table kernels call through.
 *
 * A launch is a grid of blocks.  Workers (persistent pthreads registered as
 * collector mutators) take block indices from the launch's atomic counter;
 * each block runs inside a setjmp so a refused access (rt_api.fault) or a
 * stop request (pollcheck slow path) unwinds it without running a single
 * further instruction of kernel code.  The first fault of a launch wins; it
 * sets the launch's stop flag and bumps rt_poll_word so the other blocks
 * stop at their next pollcheck and unstarted blocks are skipped.
 *
 * The Python thread that launched waits in rt_launch_wait() with the GIL
 * released, in short slices so Python can deliver signals and enforce the
 * deadline (rt_launch_cancel).
 */
#define _GNU_SOURCE   /* sched_getaffinity, CPU_COUNT */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cap.h"
#include "gc.h"
#include "core.h"

struct rt_launch {
    rt_entry_fn entry;
    const rt_arg *args;
    int64_t grid;
    int64_t next;          /* next block index to hand out (atomic) */
    int64_t running;       /* blocks in progress (under pool_mu) */
    int64_t finished;      /* blocks that returned normally (atomic) */
    int32_t stop;          /* fault or cancel: stop all blocks (atomic) */
    int32_t stop_kind;     /* RT_FAULT_* that caused the stop */
    int32_t poll_raised;   /* we added RT_POLL_STOP_UNIT to rt_poll_word */
    int32_t done;          /* all blocks accounted for (under pool_mu) */
    rt_fault_rec fault;    /* first fault */
    struct rt_launch *next_active;
    /* Group barrier (rt_group_sync) of blocks 0 .. group-1; group 0: none. */
    int64_t group;
    int32_t group_lock;    /* spin lock: a round's bookkeeping is a few stores */
    int64_t group_live;    /* group blocks that have not returned (under group_lock) */
    int64_t group_arrived; /* arrivals in the open round (under group_lock) */
    int64_t group_round;   /* rounds completed (written under group_lock, read atomically) */
    int64_t timed;         /* blocks timed for the entry's block-time estimate (pool_mu) */
    int64_t timed_ns;      /* their run time (under pool_mu) */
    int64_t start_ns;      /* when it started, and when a block was last claimed (pool_mu): */
    int64_t claim_ns;      /*   rt_launch_wait wakes every sleeper if claims stall */
    int32_t woke_all;      /* every sleeper was signalled (under pool_mu) */
};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER;   /* workers wait here */
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;   /* launchers wait here */
static rt_launch *active = NULL;      /* launches with blocks left to hand out */
static uint64_t pool_gen = 0;         /* launches started (written under pool_mu, read atomically) */
static int nworkers = 0;
static rt_thread *workers = NULL;
static pthread_t *worker_ids = NULL;
static int64_t kernels_running = 0;   /* blocks in kernel code, all launches (atomic) */

__attribute__((noreturn)) static void fault_impl(rt_block *b, cap_t c, int64_t index,
                                                 int32_t elsize, int32_t access, int32_t line);
__attribute__((noreturn)) static void fault_local_impl(rt_block *b, const char *array, int64_t index, int32_t line);
__attribute__((noreturn)) static void fault_div_impl(rt_block *b, int32_t line);
static void poll_impl(rt_block *b);
static cap_t alloc_impl(rt_block *b, int64_t n, int32_t dtype, int32_t line);
static void store_cap_impl(rt_block *b, rt_capslot *slot, cap_t v);
static cap_t load_cap_impl(rt_block *b, const rt_capslot *slot);
static void group_sync_impl(rt_block *b, int32_t line);

static const rt_api api_table = {
    RT_ABI_VERSION, fault_impl, fault_local_impl, fault_div_impl, poll_impl, alloc_impl, store_cap_impl,
    load_cap_impl, group_sync_impl,
};

/* ---- stopping a launch ------------------------------------------------- */

static void request_stop(rt_launch *L, int32_t kind)
{
    int32_t expected = 0;
    if (__atomic_compare_exchange_n(&L->stop, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        L->stop_kind = kind;
        __atomic_store_n(&L->poll_raised, 1, __ATOMIC_RELEASE);
        __atomic_fetch_add(&rt_poll_word, RT_POLL_STOP_UNIT, __ATOMIC_SEQ_CST);
    }
}

/* First fault wins; the record is written before the stop flag is visible. */
static void record_fault(rt_launch *L, const rt_fault_rec *r)
{
    static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&fault_mu);
    if (L->fault.kind == RT_OK) L->fault = *r;
    pthread_mutex_unlock(&fault_mu);
    request_stop(L, r->kind);
}

/* A fault record for this block with everything but the kind and buffer. */
static rt_fault_rec fault_rec(rt_block *b, int64_t index, int32_t line)
{
    rt_fault_rec r;
    memset(&r, 0, sizeof r);
    r.block = b->block_idx;
    r.index = index;
    r.line = line;
    r.thread = -1;
    return r;
}

/* Publish the record (first fault of the launch wins) and unwind the block. */
__attribute__((noreturn)) static void raise_fault(rt_block *b, const rt_fault_rec *r)
{
    record_fault(b->launch, r);
    longjmp(b->jmp, 1);
}

__attribute__((noreturn)) static void fault_impl(rt_block *b, cap_t c, int64_t index,
                                                 int32_t elsize, int32_t access, int32_t line)
{
    rt_fault_rec r = fault_rec(b, index, line);
    r.access = access;
    r.elsize = elsize;
    r.offset = (int64_t)(c.p - c.lo);
    /* what rt_fault_kind (capabilities/checks.h, the device's classification too) needs */
    int freed = 0, wrong_type = 0, in_object = 0, may_write = 0;
    if (!c.obj) {
        strcpy(r.buffer, "<int-derived>");
    } else {
        rt_obj *o = c.obj;
        uint32_t fl = __atomic_load_n(&o->flags, __ATOMIC_ACQUIRE);
        memcpy(r.buffer, o->name, RT_NAME_MAX);
        r.buffer[RT_NAME_MAX - 1] = 0;
        r.obj_id = o->id;
        freed = (fl & RT_OBJ_FREED) != 0;
        wrong_type = rt_wrong_type(o->dtype == RT_DT_CAP, elsize, (uint64_t)r.offset);
        /* the same test as the access, against the object's full size */
        in_object = RT_INB(c, index, (uint64_t)elsize, o->nbytes);
        may_write = (o->perms & RT_PERM_W) != 0;
    }
    r.kind = rt_fault_kind(c.obj != 0, freed, wrong_type, access == RT_ACC_STORE, in_object,
                           may_write);
    raise_fault(b, &r);
}

/* Faults that name no buffer object: local arrays, division, allocation. */
__attribute__((noreturn)) static void fault_plain(rt_block *b, int32_t kind, int64_t index,
                                                  int32_t line, const char *what)
{
    rt_fault_rec r = fault_rec(b, index, line);
    r.kind = kind;
    strncpy(r.buffer, what, RT_NAME_MAX - 1);
    raise_fault(b, &r);
}

__attribute__((noreturn)) static void fault_local_impl(rt_block *b, const char *array,
                                                       int64_t index, int32_t line)
{
    fault_plain(b, RT_FAULT_LOCAL, index, line, array);
}

__attribute__((noreturn)) static void fault_div_impl(rt_block *b, int32_t line)
{
    fault_plain(b, RT_FAULT_DIVZERO, 0, line, "<division>");
}

static void poll_impl(rt_block *b)
{
    int32_t w = __atomic_load_n(&rt_poll_word, __ATOMIC_ACQUIRE);
    if (w & RT_POLL_GC) gc_handshake_poll(b->thread);
    if (__atomic_load_n(&b->launch->stop, __ATOMIC_ACQUIRE)) longjmp(b->jmp, 2);
}

static const int64_t dtype_size[] = {0, 2, 4, 8, 4, 8, 1, 16};

cap_t rt_cap_of(rt_obj *o, int64_t offset_bytes)
{
    cap_t c;
    c.lo = o->base;
    c.p = o->base + offset_bytes;
    c.rlen = __atomic_load_n(&o->rlen, __ATOMIC_ACQUIRE);
    c.wlen = __atomic_load_n(&o->wlen, __ATOMIC_ACQUIRE);
    c.obj = o;
    if (o->dtype == RT_DT_CAP) c.rlen = c.wlen = 0; /* slots only via rt_load/store_cap */
    return c;
}

static cap_t alloc_impl(rt_block *b, int64_t n, int32_t dtype, int32_t line)
{
    if (dtype < RT_DT_F16 || dtype > RT_DT_CAP || n < 0 || n > ((int64_t)1 << 40))
        fault_plain(b, RT_FAULT_ALLOC, n, line, "<cap_alloc>");
    rt_obj *o = gc_alloc((uint64_t)n * (uint64_t)dtype_size[dtype], (uint32_t)dtype,
                         RT_PERM_R | RT_PERM_W, "<cap_alloc>");
    if (!o) fault_plain(b, RT_FAULT_ALLOC, n, line, "<cap_alloc: out of memory>");
    return rt_cap_of(o, 0);
}

/* Slots are read and written as one 16-byte atomic: blocks may store into
 * the same slot concurrently, and a torn {p, obj} pair would pair one
 * object's address with another's bounds (refused, but a spurious fault). */
static void store_cap_impl(rt_block *b, rt_capslot *slot, cap_t v)
{
    (void)b;
    rt_capslot s = {v.p, v.obj};
    gc_store_barrier(v.obj);
    __atomic_store(slot, &s, __ATOMIC_RELEASE);
}

static cap_t load_cap_impl(rt_block *b, const rt_capslot *slot)
{
    (void)b;
    rt_capslot s;
    __atomic_load((rt_capslot *)slot, &s, __ATOMIC_ACQUIRE);
    if (!s.obj) return (cap_t){s.p, s.p, 0, 0, NULL};
    cap_t c = rt_cap_of(s.obj, 0);
    c.p = s.p;
    return c;
}

/* ---- the group barrier --------------------------------------------------
 *
 * A launch made with group = G (1 <= G <= grid, G <= workers: the host checks
 * both) lets blocks 0 .. G-1 call rt_group_sync(); each call returns once
 * every group block that has not returned has called it as often.
 *
 * Why it cannot deadlock: blocks are handed out in index order and launches
 * in FIFO order, so blocks 0 .. G-1 are the first of their launch to get a
 * worker, after blocks of earlier launches that run to their end without
 * waiting for this launch; with G <= workers they all get one.  A group
 * block that returns (or unwinds after a fault) leaves the group, so the
 * others never wait for a block that will not come.  Waiting blocks spin on
 * the round counter with pollchecks: collector handshakes are answered, and
 * a fault, timeout or cancel (the launch's stop flag) unwinds them.
 * The lock makes every write before a block's arrival visible to every block
 * leaving that round (arrival and the round's opening are ordered by it).  A
 * spin lock, not a pthread mutex: with 8 or 16 blocks arriving at once a
 * mutex sleeps in the kernel (a round took 9 us with 8 blocks, 20 us with 16,
 * on the 16-core H200 host). */

static void group_lock(rt_launch *L)
{
    while (__atomic_exchange_n(&L->group_lock, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&L->group_lock, __ATOMIC_RELAXED))
            rt_cpu_relax();
}

static void group_unlock(rt_launch *L) { __atomic_store_n(&L->group_lock, 0, __ATOMIC_RELEASE); }

static void open_round(rt_launch *L)
{
    L->group_arrived = 0;
    __atomic_store_n(&L->group_round, L->group_round + 1, __ATOMIC_RELEASE);
}

static void group_sync_impl(rt_block *b, int32_t line)
{
    rt_launch *L = b->launch;
    if (b->block_idx >= L->group)
        fault_plain(b, RT_FAULT_GROUP, b->block_idx, line,
                    L->group ? "<outside the group>" : "<no group>");
    group_lock(L);
    int64_t round = L->group_round;
    if (++L->group_arrived >= L->group_live) {
        open_round(L);
        group_unlock(L);
        return;
    }
    group_unlock(L);
    for (unsigned spins = 0; __atomic_load_n(&L->group_round, __ATOMIC_ACQUIRE) == round;
         spins++) {
        if (*b->poll) poll_impl(b);
        if (spins < 20000)
            rt_cpu_relax();
        else
            sched_yield(); /* a long wait: leave the core to whoever needs it */
    }
}

static void group_leave(rt_launch *L)
{
    group_lock(L);
    L->group_live--;
    if (L->group_arrived > 0 && L->group_arrived >= L->group_live) open_round(L);
    group_unlock(L);
}

/* ---- the worker pool --------------------------------------------------- */

static void run_block(rt_thread *self, rt_launch *L, int64_t idx)
{
    rt_block blk;
    memset(&blk, 0, sizeof blk);
    blk.block_idx = idx;
    blk.grid_dim = L->grid;
    blk.poll = &rt_poll_word;
    blk.api = &api_table;
    blk.frames = NULL;
    blk.thread = self;
    blk.launch = L;
    __atomic_store_n(&self->block, &blk, __ATOMIC_RELEASE);
    __atomic_fetch_add(&kernels_running, 1, __ATOMIC_ACQ_REL);
    gc_enter(self);
    if (setjmp(blk.jmp) == 0) {
        L->entry(&blk, L->args);
        __atomic_fetch_add(&L->finished, 1, __ATOMIC_ACQ_REL);
    }
    /* After a longjmp the shadow frames of the unwound calls are dead. */
    __atomic_store_n(&blk.frames, NULL, __ATOMIC_RELEASE);
    if (idx < L->group) group_leave(L);
    gc_exit(self);
    __atomic_store_n(&self->block, NULL, __ATOMIC_RELEASE);
    __atomic_fetch_sub(&kernels_running, 1, __ATOMIC_ACQ_REL);
}

static void unlink_active(rt_launch *L)
{
    for (rt_launch **pp = &active; *pp; pp = &(*pp)->next_active)
        if (*pp == L) { *pp = L->next_active; return; }
}

static int64_t now_ns(void);

/* How many sleeping workers a launch is worth waking.  A futex wake-up of an
 * idle core costs tens of microseconds (2-core VM: a grid-2 launch of empty
 * blocks after 2 ms of idleness 64-80 us, back to back 28-38 us), so a launch
 * of a few short blocks is done sooner by fewer workers.  Each entry point
 * keeps the mean run time of the blocks of its last launch (only blocks
 * 0 .. RT_TIMED_BLOCKS x workers - 1 are timed: a grid of many tiny blocks
 * pays no clock reads for the rest), and a launch wakes one sleeper per
 * RT_WAKE_WORK_NS of estimated work.  An entry point not seen before wakes one
 * per block as before, a group launch at least its group (its blocks wait for
 * each other), and rt_launch_wait wakes every sleeper once blocks wait
 * unclaimed while no block was claimed for RT_WAKE_WORK_NS (the blocks grew
 * since the estimate) or none at all for RT_WAKE_LOST_NS, so an estimate that
 * was too low costs about RT_WAKE_WORK_NS. */
#define RT_WAKE_WORK_NS 50000L
#define RT_TIMED_BLOCKS 2
#define RT_WAKE_LOST_NS 1000000L
#define RT_ENTRY_SLOTS 64
static struct { rt_entry_fn entry; int64_t block_ns; } entry_cost[RT_ENTRY_SLOTS]; /* pool_mu */
static int64_t wakes_asked = 0;   /* sleepers signalled, a broadcast counting nworkers (pool_mu) */

static int64_t *entry_block_ns(rt_entry_fn e)
{
    size_t h = ((uintptr_t)e >> 4) % RT_ENTRY_SLOTS;
    for (size_t i = 0; i < RT_ENTRY_SLOTS; i++) {
        size_t k = (h + i) % RT_ENTRY_SLOTS;
        if (entry_cost[k].entry == e || entry_cost[k].entry == NULL) {
            entry_cost[k].entry = e;
            return &entry_cost[k].block_ns;
        }
    }
    entry_cost[h].entry = e;   /* full: the newest entry takes its home slot */
    entry_cost[h].block_ns = 0;
    return &entry_cost[h].block_ns;
}

static int64_t workers_to_wake(rt_launch *L)
{
    int64_t most = L->grid < nworkers ? L->grid : nworkers;
    int64_t per = *entry_block_ns(L->entry);
    if (per <= 0) return most;
    double work = (double)per * (double)L->grid;
    int64_t want = (int64_t)(work / RT_WAKE_WORK_NS) + 1;
    if (want < L->group) want = L->group;
    return want < most ? want : most;
}

/* A launch is done once no block will start and none is running. */
static void maybe_finish(rt_launch *L)
{
    int exhausted = __atomic_load_n(&L->next, __ATOMIC_ACQUIRE) >= L->grid ||
                    __atomic_load_n(&L->stop, __ATOMIC_ACQUIRE);
    if (exhausted) unlink_active(L);
    if (exhausted && L->running == 0 && !L->done) {
        if (__atomic_load_n(&L->poll_raised, __ATOMIC_ACQUIRE))
            __atomic_fetch_sub(&rt_poll_word, RT_POLL_STOP_UNIT, __ATOMIC_SEQ_CST);
        if (!L->stop && L->timed > 0)
            *entry_block_ns(L->entry) = L->timed_ns / L->timed + 1;
        /* The last access to L here: a launcher that sees done without the
         * lock (rt_launch_wait's spin) may free it right after. */
        __atomic_store_n(&L->done, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&pool_done);
    }
}

/* How long an idle worker watches pool_gen, yielding the core, before it sleeps
 * on pool_work.  A launch sequence (the steps of one matrix: a launch per
 * panel, a few host microseconds apart) then finds its workers awake instead of
 * paying a futex wake-up per worker per launch; a worker idle for longer
 * sleeps as before.  sched_yield leaves the core to the launching thread when
 * the cores are oversubscribed. */
#define RT_WORKER_SPIN_NS 200000L

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Called and returns with pool_mu held: whether a launch started meanwhile. */
static int spin_for_work(void)
{
    uint64_t gen = pool_gen;
    pthread_mutex_unlock(&pool_mu);
    int64_t end = now_ns() + RT_WORKER_SPIN_NS;
    while (__atomic_load_n(&pool_gen, __ATOMIC_ACQUIRE) == gen && now_ns() < end)
        sched_yield();
    pthread_mutex_lock(&pool_mu);
    return pool_gen != gen;
}

/* CPUs a pinned pool puts its workers on (rt_core_init's pin): worker i on the
 * i-th CPU of the process's affinity set, modulo its size.  Unpinned, two workers
 * of a group launch can share a core while another idles (the scheduler keeps a
 * recently run thread where it is), and each of the group's barriers then waits
 * for a time slice. */
static cpu_set_t pin_cpus;
static int pin_ncpus;

static void pin_self(int index)
{
    int want = index % pin_ncpus, seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &pin_cpus) || seen++ != want) continue;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        pthread_setaffinity_np(pthread_self(), sizeof one, &one);
        return;
    }
}

static void *worker_main(void *arg)
{
    rt_thread *self = arg;
    if (pin_ncpus > 0) pin_self(self->index);
    gc_thread_register(self);
    pthread_mutex_lock(&pool_mu);
    int spun = 0;  /* spun since the last block: sleep next time */
    for (;;) {
        rt_launch *L = active;
        while (L && (L->next >= L->grid || L->stop)) {
            rt_launch *nx = L->next_active;
            maybe_finish(L);
            L = nx;
        }
        if (!L) {
            if (!spun && self->index < nworkers - 1) {
                spun = 1;
                spin_for_work();
                continue;
            }
            pthread_cond_wait(&pool_work, &pool_mu);
            continue;
        }
        spun = 0;
        int64_t idx = L->next++;
        L->running++;
        int timed = idx < RT_TIMED_BLOCKS * nworkers;
        int64_t t0 = timed || !L->woke_all ? now_ns() : 0;   /* one clock read for both */
        if (!L->woke_all) L->claim_ns = t0;
        pthread_mutex_unlock(&pool_mu);
        run_block(self, L, idx);
        int64_t ran = timed ? now_ns() - t0 : 0;
        pthread_mutex_lock(&pool_mu);
        if (timed) { L->timed++; L->timed_ns += ran; }
        L->running--;
        maybe_finish(L);
    }
    return NULL;
}

int rt_core_init(int threads, int pin)
{
    pthread_mutex_lock(&pool_mu);
    if (nworkers > 0) { pthread_mutex_unlock(&pool_mu); return nworkers; }
    gc_init();
    cpu_set_t set;
    int have_set = sched_getaffinity(0, sizeof set, &set) == 0;
    if (pin && have_set) {
        pin_cpus = set;
        pin_ncpus = CPU_COUNT(&set);
    }
    if (threads <= 0) {
        /* one worker per CPU this process may run on (taskset, cpusets): with more
         * workers than CPUs a group barrier stalls whenever one is descheduled */
        long n = have_set ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    workers = calloc((size_t)threads, sizeof(rt_thread));
    worker_ids = calloc((size_t)threads, sizeof(pthread_t));
    for (int i = 0; i < threads; i++) {
        workers[i].index = i;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 16u << 20); /* kernels may use big local arrays */
        if (pthread_create(&worker_ids[i], &attr, worker_main, &workers[i]) == 0) nworkers++;
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&pool_mu);
    return nworkers;
}

int rt_core_threads(void) { return nworkers; }
int64_t rt_core_wakes_asked(void)
{
    pthread_mutex_lock(&pool_mu);
    int64_t n = wakes_asked;
    pthread_mutex_unlock(&pool_mu);
    return n;
}
int64_t rt_core_kernels_running(void) { return __atomic_load_n(&kernels_running, __ATOMIC_ACQUIRE); }
const rt_api *rt_core_api(void) { return &api_table; }

rt_launch *rt_launch_start(void *entry, const rt_arg *args, int64_t grid, int64_t group)
{
    rt_launch *L = calloc(1, sizeof *L);
    if (!L) return NULL;
    L->entry = (rt_entry_fn)entry;
    L->args = args;
    L->grid = grid;
    L->group = group > 0 ? group : 0;
    L->group_live = L->group;
    pthread_mutex_lock(&pool_mu);
    if (grid <= 0) {
        L->done = 1;
    } else {
        rt_launch **pp = &active;
        while (*pp) pp = &(*pp)->next_active;
        *pp = L;   /* FIFO: earlier launches get workers first */
        __atomic_store_n(&pool_gen, pool_gen + 1, __ATOMIC_RELEASE);  /* spinning workers */
        /* Wake no more workers than the launch has blocks, and fewer for a
         * short launch (workers_to_wake): the rest would contend for pool_mu
         * and sleep again. */
        int64_t wake = workers_to_wake(L);
        wakes_asked += wake;
        L->woke_all = wake >= (grid < nworkers ? grid : nworkers);
        L->start_ns = now_ns();
        if (wake >= nworkers)
            pthread_cond_broadcast(&pool_work);
        else
            for (int64_t i = 0; i < wake; i++) pthread_cond_signal(&pool_work);
    }
    pthread_mutex_unlock(&pool_mu);
    return L;
}

/* How long rt_launch_wait looks at the done flag, yielding the core, before
 * it sleeps on the condition variable: a short launch then costs no futex
 * sleep and wake-up of the launching thread.  sched_yield gives the core to
 * a block that wants it, so with every core busy the spin costs the blocks
 * little (measured on 2 cores: grid = cores got faster, not slower). */
#define RT_WAIT_SPIN_NS 50000L

/* Under pool_mu: whether a launch that woke fewer workers than it has blocks
 * needs them all after all (workers_to_wake). */
static int short_of_workers(rt_launch *L)
{
    if (L->woke_all || L->stop || L->next >= L->grid) return 0;
    int64_t quiet = now_ns() - (L->next > 0 ? L->claim_ns : L->start_ns);
    return quiet > (L->next > 0 ? RT_WAKE_WORK_NS : RT_WAKE_LOST_NS);
}

static struct timespec realtime_in(int64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ns / 1000000000L) + (ts.tv_nsec + ns % 1000000000L) / 1000000000L;
    ts.tv_nsec = (ts.tv_nsec + ns % 1000000000L) % 1000000000L;
    return ts;
}

int rt_launch_wait(rt_launch *L, double seconds)
{
    int64_t spin = seconds * 1e9 < RT_WAIT_SPIN_NS ? (int64_t)(seconds * 1e9) : RT_WAIT_SPIN_NS;
    int64_t spin_end = now_ns() + spin;
    while (!__atomic_load_n(&L->done, __ATOMIC_ACQUIRE)) {
        if (now_ns() >= spin_end) break;
        sched_yield();
    }
    if (__atomic_load_n(&L->done, __ATOMIC_ACQUIRE)) return 1;
    int64_t left = (int64_t)(seconds * 1e9) - spin;
    int64_t end = now_ns() + (left > 0 ? left : 0);
    struct timespec until = realtime_in(left > 0 ? left : 0);
    pthread_mutex_lock(&pool_mu);
    while (!__atomic_load_n(&L->done, __ATOMIC_ACQUIRE)) {
        if (short_of_workers(L)) {
            L->woke_all = 1;
            wakes_asked += nworkers;
            pthread_cond_broadcast(&pool_work);
        }
        /* while workers may still be wanted, look again every RT_WAKE_WORK_NS */
        int watch = !L->woke_all && end - now_ns() > RT_WAKE_WORK_NS;
        struct timespec t = watch ? realtime_in(RT_WAKE_WORK_NS) : until;
        if (pthread_cond_timedwait(&pool_done, &pool_mu, &t) == ETIMEDOUT && !watch) break;
    }
    int done = __atomic_load_n(&L->done, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&pool_mu);
    return done;
}

void rt_launch_cancel(rt_launch *L, int32_t kind)
{
    pthread_mutex_lock(&pool_mu);
    request_stop(L, kind);
    maybe_finish(L);
    pthread_mutex_unlock(&pool_mu);
}

/* out and finished may be NULL: the caller asks for the record only after a
 * fault (no allocation on the fast path). */
int32_t rt_launch_result(rt_launch *L, rt_fault_rec *out, int64_t *finished)
{
    if (out) *out = L->fault;
    if (finished) *finished = __atomic_load_n(&L->finished, __ATOMIC_ACQUIRE);
    if (L->fault.kind != RT_OK) return L->fault.kind;
    return L->stop ? L->stop_kind : RT_OK;
}

void rt_launch_free(rt_launch *L) { free(L); }

/* Argument helpers for the host. */
void rt_arg_set_cap(rt_arg *a, rt_obj *o, int64_t offset_bytes) { a->cap = rt_cap_of(o, offset_bytes); }
void rt_arg_set_nobounds(rt_arg *a, int64_t addr)
{
    a->cap = (cap_t){(char *)(uintptr_t)addr, (char *)(uintptr_t)addr, 0, 0, NULL};
}
