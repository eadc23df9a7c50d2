/* Host-facing entry points of the runtime core (runtime/csrc/launch.c). */
#ifndef CAPQR_CORE_H
#define CAPQR_CORE_H
#include "cap.h"

typedef struct rt_launch rt_launch;

/* ==== host API begin ====
 * Every prototype from here to "host API end" is declared to cffi as written
 * (runtime/core.py reads them): no second copy of these declarations exists. */
int rt_core_init(int threads, int pin); /* start the worker pool (idempotent); pin: a CPU each */
int rt_core_threads(void);
int64_t rt_core_kernels_running(void);
int64_t rt_core_wakes_asked(void);   /* sleeping workers a launch signalled, in all */
const rt_api *rt_core_api(void);

rt_launch *rt_launch_start(void *entry, const rt_arg *args, int64_t grid,
                            int64_t group);
int rt_launch_wait(rt_launch *L, double seconds);   /* 1 when every block is accounted for */
void rt_launch_cancel(rt_launch *L, int32_t kind);  /* RT_FAULT_TIMEOUT / RT_FAULT_CANCELLED */
int32_t rt_launch_result(rt_launch *L, rt_fault_rec *out, int64_t *finished);
void rt_launch_free(rt_launch *L);
void rt_arg_set_cap(rt_arg *a, rt_obj *o, int64_t offset_bytes);
void rt_arg_set_nobounds(rt_arg *a, int64_t addr);
/* ==== host API end ==== */

cap_t rt_cap_of(rt_obj *o, int64_t offset_bytes);  /* C-internal: cap_t is lane-specific */
#endif
