/*
 * Blocks: the memory behind headers and payloads, and the heap occupancy
 * the pacer works from.
 *
 * Small internal objects (payload <= GC_INLINE_MAX) are one block, header
 * then payload, from a size class; the sweep returns dead blocks to their
 * class's free list (a list push, no free()) and allocation pops them, so
 * a steady churn recycles the same memory without malloc/free per object.
 * An explicit free() of such an object zeroes its bounds at once, but its
 * payload memory is reused only with its header (when the header dies).
 * Larger payloads, external and device objects have a separate header.
 *
 * CAPQR_GC_POISON=1: every internal payload is a page-aligned mmap of its
 * own; releasing it drops its pages and makes it PROT_NONE, kept in a
 * bounded quarantine so the addresses are not reused while a late access
 * could still come; released headers are overwritten with 0xdb before they
 * go.  A late access then faults (SIGSEGV) instead of reading recycled
 * memory.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "gc_internal.h"

/* ---- size classes --------------------------------------------------------- */
static const uint32_t class_size[] = {16,   32,   48,   64,   96,   128,  192,  256,  384,  512,
                                      768,  1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
                                      16384};
#define NCLASS ((int)(sizeof class_size / sizeof class_size[0]))
_Static_assert(NCLASS <= GC_NCLASS_MAX, "gc_free_batch too small");

typedef struct free_list {
    pthread_mutex_t mu;
    rt_obj *head;
    uint64_t n;
} free_list;
static free_list lists[NCLASS];
static pthread_once_t lists_once = PTHREAD_ONCE_INIT;
static uint64_t free_bytes = 0; /* bytes parked on the free lists (atomic) */

static void lists_init(void)
{
    for (int i = 0; i < NCLASS; i++) pthread_mutex_init(&lists[i].mu, NULL);
}

static int class_of(uint64_t nbytes)
{
    if (nbytes > GC_INLINE_MAX) return -1;
    int lo = 0, hi = NCLASS - 1;
    while (lo < hi) { /* first class >= nbytes */
        int mid = (lo + hi) / 2;
        if (class_size[mid] >= nbytes) hi = mid; else lo = mid + 1;
    }
    return lo;
}

static uint64_t block_bytes(int cls) { return GC_HDR_BYTES + class_size[cls]; }

/* ---- poison mode ------------------------------------------------------------ */
#define POISON_QUARANTINE 8192
static pthread_mutex_t poison_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t len; } quarantine[POISON_QUARANTINE];
static size_t quarantine_next = 0;

static size_t page_round(uint64_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return ((size_t)(n ? n : 1) + pg - 1) / pg * pg;
}

static void *poison_alloc(uint64_t nbytes)
{
    void *p = mmap(NULL, page_round(nbytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void poison_release(void *p, uint64_t nbytes)
{
    size_t len = page_round(nbytes);
    madvise(p, len, MADV_DONTNEED);
    mprotect(p, len, PROT_NONE);
    pthread_mutex_lock(&poison_mu);
    size_t k = quarantine_next++ % POISON_QUARANTINE;
    if (quarantine[k].p) munmap(quarantine[k].p, quarantine[k].len);
    quarantine[k].p = p;
    quarantine[k].len = len;
    pthread_mutex_unlock(&poison_mu);
}

/* ---- payload alignment ---------------------------------------------------------- */
/* Every internal payload starts on a cache line.  With malloc's 16 bytes a
 * kernel's speed depended on where its buffers landed: the gemm micro kernel
 * at n = 128 (2-core VM) ran at 30 or 40 GF/s from one run to the next, its
 * checked/raw ratio 0.69-1.36 over four runs of one tree.  Inline blocks are
 * allocated aligned (the header is a whole number of lines, GC_HDR_BYTES);
 * a payload of its own is over-allocated by a line, and the byte before it
 * says how far it was moved.  RT_PAYLOAD_ALIGN: capabilities/abi.py. */
static void *payload_alloc(uint64_t nbytes)
{
    if (nbytes > SIZE_MAX - RT_PAYLOAD_ALIGN) return NULL;
    char *raw = calloc(1, (size_t)nbytes + RT_PAYLOAD_ALIGN); /* zeroed, lazily for big ones */
    if (!raw) return NULL;
    char *p = (char *)(((uintptr_t)raw + RT_PAYLOAD_ALIGN) & ~(uintptr_t)(RT_PAYLOAD_ALIGN - 1));
    ((unsigned char *)p)[-1] = (unsigned char)(p - raw);   /* 1 .. 64 */
    return p;
}

static void payload_free(void *p)
{
    free((char *)p - ((unsigned char *)p)[-1]);
}

static void *block_alloc(int cls)
{
    void *p = NULL;
    return posix_memalign(&p, RT_PAYLOAD_ALIGN, block_bytes(cls)) == 0 ? p : NULL;
}

/* ---- objects ------------------------------------------------------------------ */
rt_obj *gc_obj_alloc(uint64_t nbytes, int internal_payload, uint64_t *charged)
{
    pthread_once(&lists_once, lists_init);
    int cls = internal_payload && !gc_state.poison_mode ? class_of(nbytes) : -1;
    rt_obj *o = NULL;
    if (cls >= 0) {
        free_list *l = &lists[cls];
        pthread_mutex_lock(&l->mu);
        o = l->head;
        if (o) {
            l->head = o->next;
            l->n--;
        }
        pthread_mutex_unlock(&l->mu);
        if (o) __atomic_sub_fetch(&free_bytes, block_bytes(cls), __ATOMIC_RELAXED);
        else o = block_alloc(cls);
        if (!o) return NULL;
        memset(o, 0, sizeof *o);
        o->base = (char *)o + GC_HDR_BYTES;
        memset(o->base, 0, nbytes);
        o->flags = GC_OBJ_INLINE;
        *charged = block_bytes(cls);
    } else {
        o = calloc(1, sizeof *o);
        if (!o) return NULL;
        *charged = GC_HDR_BYTES;
        if (internal_payload) {
            o->base = gc_state.poison_mode ? poison_alloc(nbytes) : payload_alloc(nbytes);
            if (!o->base) { free(o); return NULL; }
            *charged += nbytes;
        }
    }
    __atomic_add_fetch(&gc_state.heap_bytes, *charged, __ATOMIC_RELAXED);
    return o;
}

/* The payload memory of an internal object with a payload of its own. */
void gc_obj_release_payload(rt_obj *o)
{
    if (o->flags & GC_OBJ_INLINE) return; /* goes with the header */
    if (gc_state.poison_mode) poison_release(o->base, o->nbytes);
    else payload_free(o->base);
    __atomic_sub_fetch(&gc_state.heap_bytes, o->nbytes, __ATOMIC_RELAXED);
}

void gc_batch_add(gc_free_batch *b, rt_obj *o)
{
    if (o->flags & GC_OBJ_INLINE) {
        int cls = class_of(o->nbytes);
        __atomic_add_fetch(&gc_state.st.bytes_freed, o->nbytes, __ATOMIC_RELAXED);
        o->next = b->head[cls];
        b->head[cls] = o;
        if (!b->tail[cls]) b->tail[cls] = o;
        b->n[cls]++;
        return;
    }
    if (gc_state.poison_mode) memset(o, 0xdb, sizeof *o);
    free(o);
    __atomic_sub_fetch(&gc_state.heap_bytes, GC_HDR_BYTES, __ATOMIC_RELAXED);
}

void gc_batch_flush(gc_free_batch *b)
{
    for (int c = 0; c < NCLASS; c++) {
        if (!b->head[c]) continue;
        uint64_t bytes = b->n[c] * block_bytes(c);
        free_list *l = &lists[c];
        pthread_mutex_lock(&l->mu);
        b->tail[c]->next = l->head;
        l->head = b->head[c];
        l->n += b->n[c];
        pthread_mutex_unlock(&l->mu);
        __atomic_add_fetch(&free_bytes, bytes, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&gc_state.heap_bytes, bytes, __ATOMIC_RELAXED);
        b->head[c] = b->tail[c] = NULL;
        b->n[c] = 0;
    }
}

void gc_header_free(rt_obj *o)
{
    gc_free_batch b;
    memset(&b, 0, sizeof b);
    gc_batch_add(&b, o);
    gc_batch_flush(&b);
}

/* Keep at most keep_bytes parked on the free lists (the allocation expected
 * before the next cycle); give the rest back to malloc, largest classes
 * first. */
void gc_blocks_trim(uint64_t keep_bytes)
{
    pthread_once(&lists_once, lists_init);
    for (int c = NCLASS - 1; c >= 0; c--) {
        while (__atomic_load_n(&free_bytes, __ATOMIC_RELAXED) > keep_bytes) {
            free_list *l = &lists[c];
            pthread_mutex_lock(&l->mu);
            rt_obj *o = l->head;
            if (o) {
                l->head = o->next;
                l->n--;
            }
            pthread_mutex_unlock(&l->mu);
            if (!o) break;
            __atomic_sub_fetch(&free_bytes, block_bytes(c), __ATOMIC_RELAXED);
            free(o);
        }
    }
}

/* What o adds to the occupancy now. */
uint64_t gc_obj_occupancy(const rt_obj *o, uint32_t fl)
{
    if (fl & GC_OBJ_INLINE) return block_bytes(class_of(o->nbytes));
    uint64_t n = GC_HDR_BYTES;
    if (!(fl & (RT_OBJ_EXTERNAL | RT_OBJ_PAYLOAD_GONE))) n += o->nbytes;
    return n;
}

uint64_t gc_free_list_bytes(void) { return __atomic_load_n(&free_bytes, __ATOMIC_RELAXED); }
uint64_t gc_heap_occupancy(void) { return __atomic_load_n(&gc_state.heap_bytes, __ATOMIC_RELAXED); }
