/*
 * npu_lifetime allocator shim: the C ABI.
 *
 * A caching device allocator for PyTorch's pluggable-allocator API
 * (torch.cuda.memory.CUDAPluggableAllocator, torch_npu's
 * NPUPluggableAllocator) that keeps, per block, the streams recorded with
 * record_stream and one use event per stream recorded with record_use, and
 * validates every free.  No torch, CUDA or CANN header is needed: the device
 * runtime (CUDA runtime, Ascend ACL, or a simulated runtime on host memory)
 * is resolved at run time.
 *
 * Every function is thread-safe and never lets a C++ exception or an abort
 * escape: problems become structured findings (npl_drain_findings_json).
 */
#ifndef NPU_LIFETIME_SHIM_H
#define NPU_LIFETIME_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The pluggable-allocator entry points (exact signatures torch expects). */
void* npl_alloc(ssize_t size, int device, void* stream);
void npl_free(void* ptr, ssize_t size, int device, void* stream);

/* Lifetime calls.  `ptr` is the base address returned by npl_alloc.
 * Return 0 on success, -1 if `ptr` is not a live block (also a finding). */
int npl_record_stream(void* ptr, void* stream); /* gate the free on `stream` at free time */
int npl_erase_stream(void* ptr, void* stream);  /* withdraw record_stream (torch_npu eraseStream) */
int npl_record_use(void* ptr, void* stream);    /* gate the free on `stream` as of now */
int npl_note_use(void* ptr, void* stream);      /* the sanitizer saw an unrecorded use on `stream` */

/* Reuse policy for freed blocks that wait on events. */
enum npl_policy {
    NPL_POLICY_POLL = 0,        /* reusable once every event has fired (polled) */
    NPL_POLICY_STREAM_WAIT = 1  /* reusable at once; the allocating stream waits on the events */
};
int npl_set_policy(int policy); /* 0, or -1 for an unknown policy */
int npl_get_policy(void);

void npl_process_events(void); /* poll pending blocks now */
void npl_empty_cache(void);    /* return fully free segments to the runtime */

typedef struct npl_stats {
    uint64_t live_bytes, live_blocks;
    uint64_t cached_bytes, cached_blocks;
    uint64_t pending_bytes, pending_blocks;
    uint64_t reserved_bytes, segments;
    uint64_t peak_live_bytes, peak_reserved_bytes;
    uint64_t peak_active_bytes; /* live + pending: memory no allocation can get */
    uint64_t requested_live_bytes;
    uint64_t allocations, frees, cache_hits;
    uint64_t segment_allocs, segment_frees, oom_retries, oom_failures;
    uint64_t events_created, events_recorded, stream_waits;
    uint64_t deferred_frees, findings, findings_dropped;
} npl_stats;

size_t npl_stats_size(void); /* sizeof(npl_stats), for bindings to check */
void npl_get_stats(npl_stats* out);
void npl_reset_peak(void);

/* JSON strings; release each with npl_free_string. */
char* npl_snapshot_json(void);
char* npl_drain_findings_json(void);
void npl_free_string(char* s);

/* Runtime selection: "cuda", "acl" (optionally a library path), "sim", or
 * NULL/"auto" (a CUDA or ACL runtime already loaded in the process, else sim).
 * Only while no segment is held.  Returns 0, or -1 with npl_last_error(). */
int npl_select_runtime(const char* name, const char* library_path);
const char* npl_runtime_name(void);
const char* npl_last_error(void);

/* Drop every block, segment, event, statistic and finding, and the simulated
 * streams' state (tests only). */
void npl_reset(void);

/* Hooks for the sanitizer, called outside the allocator's lock: after an
 * allocation, and before a free is processed. */
typedef void (*npl_alloc_hook)(void* ptr, size_t size, int device, void* stream, void* ctx);
typedef void (*npl_free_hook)(void* ptr, size_t size, int device, void* stream, void* ctx);
void npl_set_hooks(npl_alloc_hook on_alloc, npl_free_hook on_free, void* ctx);

/* The simulated runtime's controls (no effect under another runtime).
 * Streams are any non-null handle the caller picks. */
void npl_sim_complete(void* stream);     /* everything queued on `stream` so far finishes */
void npl_sim_complete_all(void);
void npl_sim_set_capturing(void* stream, int capturing);
void npl_sim_set_memory_limit(uint64_t bytes); /* 0: unlimited */
uint64_t npl_sim_stream_waits(void* stream);   /* stream-wait-event calls on `stream` */
uint64_t npl_sim_incomplete_events(void);

#ifdef __cplusplus
}
#endif

#endif /* NPU_LIFETIME_SHIM_H */
