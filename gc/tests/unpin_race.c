/*
 * gc_unpin against a concurrent sweep.  Unpinner threads drop the last pin
 * of unreachable objects while the main thread runs cycles back to back;
 * once pins reaches 0 the sweep may release the header at any moment, so
 * gc_unpin must not touch the object after its decrement.  The unpinners
 * never synchronise with the collector otherwise, so ThreadSanitizer sees
 * any later access as a race with the sweep's free(), and AddressSanitizer
 * reports it as heap-use-after-free when the sweep wins the race.
 * External (wrapped) objects take the same path.  Usage: unpin_race [seconds]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <pthread.h>
#include "gc.h"

#define BATCH 512

static uint64_t done_threads = 0;
static char external_payload[64];

static void pause_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* One batch per thread, and the thread then never synchronises with the
 * collector again (detached, no locks): nothing but the pin count orders its
 * unpins before the sweep's free().  It reports completion only after the
 * sweeps of its objects are long over. */
static void *unpinner(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    rt_obj *batch[BATCH];
    for (int i = 0; i < BATCH; i++)
        batch[i] = (rand_r(&seed) & 1)
                       ? gc_alloc_pinned(16, RT_DT_I64, RT_PERM_R | RT_PERM_W, "u")
                       : gc_wrap_pinned(external_payload, sizeof external_payload, RT_DT_U8,
                                        RT_PERM_R, "w");
    uint64_t c0 = gc_cycles_completed();
    while (gc_cycles_completed() < c0 + 2) pause_us(100); /* in the heap list now */
    for (int i = 0; i < BATCH; i++) gc_unpin(batch[i]);
    pause_us(200000);
    __atomic_add_fetch(&done_threads, 1, __ATOMIC_RELEASE);
    return NULL;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    gc_init();
    gc_set_enabled(0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t cycles = 0, started = 0;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    for (;;) {
        if (started - __atomic_load_n(&done_threads, __ATOMIC_ACQUIRE) < 4) {
            pthread_t th;
            if (pthread_create(&th, &a, unpinner, (void *)(uintptr_t)(started + 1)) == 0) started++;
        }
        gc_collect();
        cycles++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) > secs)
            break;
    }
    while (__atomic_load_n(&done_threads, __ATOMIC_ACQUIRE) < started) gc_collect();
    gc_collect();
    gc_collect();
    uint64_t left = gc_count_objects();
    printf("unpin_race: cycles=%llu threads=%llu objects_left=%llu\n",
           (unsigned long long)cycles, (unsigned long long)started, (unsigned long long)left);
    if (left != 0) { printf("FAIL\n"); return 1; }
    printf("OK\n");
    return 0;
}
