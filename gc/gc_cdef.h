/* Extra collector entry points for the cffi cdef (runtime/core.py appends this file). */
rt_obj *gc_alloc_pinned(uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name);
rt_obj *gc_wrap_pinned(void *payload, uint64_t nbytes, uint32_t dtype, uint32_t perms, const char *name);
uint64_t gc_cycles_completed(void);
uint64_t gc_last_cycle_reclaimed(void);
uint64_t gc_late_roots(void);
uint64_t gc_freed_payloads_released(void);
void gc_reset_handshake_stats(void);
rt_obj *gc_find_id(uint64_t id);
uint64_t gc_last_id(void);
void gc_debug_pause(int32_t phase);
int32_t gc_debug_phase(void);
void gc_handshake_observed_us(double out[3]);
