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
 * The entry points torch's allocator setters take, with their exact C++
 * signatures, are in torch_hooks.cpp.
 */
#ifndef NPU_LIFETIME_SHIM_H
#define NPU_LIFETIME_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The pluggable-allocator entry points (the signatures torch expects).
 * npl_alloc returns NULL when out of memory (see npl_last_oom_message). */
void* npl_alloc(ssize_t size, int device, void* stream);
void npl_free(void* ptr, ssize_t size, int device, void* stream);

/* Lifetime calls.  `ptr` is any address inside a live block (a view's data
 * pointer will do).  Return 0 on success, -1 if `ptr` is in no live block
 * (also a finding).  The _device variants take the stream's device. */
int npl_record_stream(void* ptr, void* stream); /* gate the free on `stream` at free time */
int npl_record_stream_device(void* ptr, void* stream, int stream_device);
int npl_erase_stream(void* ptr, void* stream);  /* withdraw record_stream (torch_npu eraseStream) */
int npl_record_use(void* ptr, void* stream);    /* gate the reuse on `stream` as of now */
int npl_record_use_device(void* ptr, void* stream, int stream_device);
int npl_note_use(void* ptr, void* stream);      /* the sanitizer saw an unrecorded use on `stream` */

/* Reuse policy for freed blocks that wait on events. */
enum npl_policy {
    NPL_POLICY_POLL = 0,        /* reusable once every event has fired (polled) */
    NPL_POLICY_STREAM_WAIT = 1, /* reusable at once; the allocating stream waits on the events */
    NPL_POLICY_LAZY_WAIT = 2    /* the default: record_use events as stream_wait, but waited on only
                                   if still pending at reuse; record_stream events as poll */
};
int npl_set_policy(int policy); /* 0, or -1 for an unknown policy */
int npl_get_policy(void);

/* Expandable segments (torch's expandable_segments:True): new memory of the
 * eager pool grows one segment per (device, stream, size class) by mapping
 * pages at its end.  Applies to the allocations that follow; segments made
 * before stay as they are.  A runtime without virtual-memory calls warns once
 * and keeps plain segments.  Off by default. */
void npl_set_expandable_segments(int enabled);
int npl_get_expandable_segments(void);

/* Debug mode: freed blocks are filled with 0xFF (NaN for every float type)
 * once really free, and quarantined (FIFO, up to `quarantine_bytes`) before
 * reuse; a block leaving quarantine is checked for writes after its free. */
void npl_set_debug(int enabled, uint64_t quarantine_bytes);
int npl_get_debug(void);

/* torch's allocator setting graph_capture_record_stream_reuse (off by
 * default, as torch's): a block freed during a graph capture while streams
 * it was recorded on may still use it is reused inside the capture once the
 * capture's graph orders their work before the allocating stream's next
 * work, instead of waiting for the capture's end.  Returns 0, or 1 when it
 * is on but the selected runtime can't tell a capture's graph (ACL; a
 * libcudart without the calls): such frees then wait for the capture's end
 * (an `unsupported` finding says so once). */
int npl_set_graph_capture_record_stream_reuse(int enabled);
int npl_get_graph_capture_record_stream_reuse(void);
/* The oracle mode (off by default): each eager block is a stream-ordered
 * allocation of its own (cudaMallocAsync on its stream), freed with a
 * stream-ordered free on its stream once the shim makes it reusable, after
 * that stream waited on the block's events, so compute-sanitizer's
 * --track-stream-ordered-races checks every reuse decision.  Policy becomes
 * stream_wait.  Only while the shim holds no memory; 0 on success, else 1
 * (npl_last_oom_message says why: no such runtime calls, memory held). */
int npl_set_stream_ordered(int enabled);
int npl_get_stream_ordered(void);
/* Cross-stream reuse (off here by default): an eager allocation its own
 * stream's pool can't serve takes a whole free segment of another stream's
 * pool.  IDLE: only once that stream's work and the block's events are
 * done (no GPU-side wait added); ALWAYS: after the allocating stream waited
 * GPU-side on that stream's work so far and on the block's pending events.
 * Both take one with waits before the out-of-memory path releases memory.
 * Returns 0, or -1 for an unknown mode. */
#define NPL_CROSS_STREAM_OFF 0
#define NPL_CROSS_STREAM_ALWAYS 1
#define NPL_CROSS_STREAM_IDLE 2
int npl_set_cross_stream_reuse(int mode);
int npl_get_cross_stream_reuse(void);
/* Captures are announced (off by default): every graph capture begins with
 * npl_begin_allocate_to_pool and ends with npl_end_allocate_to_pool, as
 * torch's CUDA graphs call them (install("cuda") sets it).  An allocation
 * then polls the pending blocks' events whenever no pool is open, as
 * torch's allocator does, without asking the runtime whether its stream is
 * capturing; off, it asks on every allocation while blocks are pending, so a
 * capture nobody announced (the ACL route, a direct C caller) is never
 * disturbed by an event query. */
void npl_set_captures_announced(int announced);
int npl_get_captures_announced(void);

void npl_process_events(void); /* poll pending blocks now */
void npl_empty_cache(void);    /* return fully free segments to the runtime */
void npl_init(int device_count);
/* Limits reserved bytes to fraction x the device's memory, as torch's
 * set_per_process_memory_fraction: 1 (the default) the whole device, 0 nothing. */
void npl_set_memory_fraction(double fraction, int device);
double npl_get_memory_fraction(int device);
void* npl_base_allocation(void* ptr, size_t* size); /* the segment holding ptr, and its size */

/* Graph capture into private pools (torch's MempoolId_t is {id0, id1}).
 * Between begin and end, allocations on `device` from `stream` (NULL: any
 * stream of the device) go to the pool; release drops one reference. */
void npl_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1, void* stream);
void npl_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1);
void npl_release_pool(int device, uint64_t id0, uint64_t id1);
/* A graph pool's own segment allocator (torch.cuda.MemPool(allocator), e.g.
 * ncclMemAlloc): the pool's segments come from `alloc` (NULL: out of memory)
 * and go back through `free`, even after the pool is gone.  Neither may
 * call into the shim; `ctx` is passed through.  alloc NULL: the runtime again. */
typedef void* (*npl_segment_alloc_fn)(size_t size, int device, void* stream, void* ctx);
typedef void (*npl_segment_free_fn)(void* ptr, size_t size, int device, void* stream, void* ctx);
void npl_set_pool_allocator(int device, uint64_t id0, uint64_t id1, npl_segment_alloc_fn alloc,
                            npl_segment_free_fn free, void* ctx);
/* npl_empty_cache for one graph pool (torch's emptyCache(mempool_id), which
 * ~MemPool calls): its fully free segments go back, the others' stay.
 * device < 0: the pool on every device. */
void npl_empty_pool_cache(int device, uint64_t id0, uint64_t id1);
/* The calling thread's next npl_alloc takes the cached memory at `ptr` (or
 * fails with a finding): how a pool checkpoint is restored through torch. */
void npl_claim_next(void* ptr);
/* Before a pool checkpoint is taken or restored (torch's getCheckpointState
 * and setCheckpointPoolState): runs the frees a capture deferred, then
 * answers 0 when the pool may be checkpointed, 1 when it was released (torch:
 * "Not expected to checkpoint freeable graph"), 2 when no such pool is known. */
int npl_prepare_pool_checkpoint(int device, uint64_t id0, uint64_t id1);
/* Writes up to `capacity` live block addresses of the pool; returns how many there are. */
size_t npl_pool_live_allocations(int device, uint64_t id0, uint64_t id1, uint64_t* out, size_t capacity);
/* torch.cuda.MemPool: a reference to the pool, created if new (no capture
 * begins); and how many references it has (0: unknown or released). */
void npl_create_or_incref_pool(int device, uint64_t id0, uint64_t id1);
int npl_pool_use_count(int device, uint64_t id0, uint64_t id1);
/* torch.cuda.MemPool(use_on_oom=True): an eager allocation about to run out
 * of memory may take the pool's cached blocks (0 turns it off, as ~MemPool
 * does); only while the pool has references. */
void npl_set_pool_use_on_oom(int device, uint64_t id0, uint64_t id1, int use_on_oom);
/* torch.cuda.MemPool(no_split=True): the pool never splits a block, so each
 * of its segments holds one block. */
void npl_set_pool_no_split(int device, uint64_t id0, uint64_t id1);

/* torch's memory history (_record_memory_history) as torch's allocator
 * records it, the actions only the allocator sees, each as it happens:
 * a segment from the runtime or back to it, pages of an expandable segment
 * mapped or unmapped, and a free once complete (its events fired; size:
 * what the owner asked for).  The hook runs under the allocator's lock and
 * must not call into the shim; NULL turns it off.  The CUDA bridge records
 * ALLOC, FREE_REQUESTED and OOM around npl_alloc / npl_free itself. */
enum npl_history_action {
    NPL_HISTORY_SEGMENT_ALLOC = 0,
    NPL_HISTORY_SEGMENT_FREE = 1,
    NPL_HISTORY_SEGMENT_MAP = 2,
    NPL_HISTORY_SEGMENT_UNMAP = 3,
    NPL_HISTORY_FREE_COMPLETED = 4
};
typedef void (*npl_history_hook)(int action, void* ptr, uint64_t size, int device, void* stream, uint64_t pool_id0,
                                 uint64_t pool_id1, void* ctx);
void npl_set_history_hook(npl_history_hook hook, void* ctx);

/* Every block of every segment, segments in address order and each
 * segment's blocks in address order: what torch's snapshot() and
 * cacheInfo() are built from (the torch bridge). */
enum npl_block_state {
    NPL_BLOCK_LIVE = 0,    /* handed out */
    NPL_BLOCK_PENDING = 1, /* freed, waiting for events (or a capture's end, or debug quarantine) */
    NPL_BLOCK_CACHED = 2   /* in its pool, free (perhaps reused behind a GPU-side wait) */
};
struct npl_block_record {
    void* segment; /* the segment's base address */
    uint64_t segment_size;
    void* segment_stream;
    uint64_t pool_id0, pool_id1; /* the segment's graph pool ({0, 0}: eager) */
    void* address;
    uint64_t size;      /* rounded */
    uint64_t requested; /* what the live owner asked for (0 when free) */
    void* stream;       /* allocation stream */
    int32_t device;
    int32_t small;      /* from the small-block pool */
    int32_t state;      /* enum npl_block_state */
    int32_t events;     /* use events and held events it carries */
    int32_t expandable; /* the segment is expandable (grows by mapping pages) */
    int32_t reserved_;  /* zero */
};
/* Writes up to `capacity` records; returns how many there are. */
size_t npl_block_records(struct npl_block_record* out, size_t capacity);

/* Statistics, per device: torch-style names ("allocated_bytes.all.current",
 * ...), listed once by npl_stats_names_json; npl_stats_values writes the
 * values in that order and returns how many it wrote. */
size_t npl_stats_count(void);
char* npl_stats_names_json(void);
char* npl_stats_meanings_json(void);
size_t npl_stats_values(int device, uint64_t* out, size_t capacity);
void npl_reset_peak(int device);
void npl_reset_accumulated(int device);

/* JSON strings; release each with npl_free_string. */
char* npl_snapshot_json(void);
char* npl_drain_findings_json(void);
char* npl_drain_trace_json(void);
void npl_set_trace(int enabled, size_t capacity);
void npl_free_string(char* s);

/* The allocator's invariants (blocks tile their segments, pools hold exactly
 * their cached blocks, one event per stream and block, statistics equal a
 * recount, none below zero, ...) that do not hold now: a JSON array of
 * sentences, "[]" when all hold.  Reads only.  A build made with
 * NPL_DEBUG_INVARIANTS=1 also checks after every entry point and reports an
 * `invariant_violation` finding (npl_invariant_checks_built_in() is 1). */
char* npl_check_invariants(void);
int npl_invariant_checks_built_in(void);

/* Runtime selection: "cuda", "acl" (optionally a library path), "sim", or
 * NULL/"auto" (a CUDA or ACL runtime already loaded in the process, else sim).
 * Only while no segment is held.  Returns 0, or -1 with npl_last_error(). */
int npl_select_runtime(const char* name, const char* library_path);
int npl_probe_runtime(const char* name, const char* library_path); /* would select succeed, with a device? changes nothing */
const char* npl_runtime_name(void);
int npl_device_count(void); /* devices the selected runtime sees, or -1 */
const char* npl_last_error(void);
const char* npl_last_oom_message(void); /* this thread's last failed allocation, or "" */

/* torch_npu's task queue.  With it on (torch_npu's default), ops reach the
 * device from a host thread: an event recorded straight through ACL can
 * complete before kernels the user queued earlier.  These operations go
 * through torch_npu's own objects (c10_npu::NPUEvent, NPUStream), so every
 * event is ordered after the work queued before the call, as in torch_npu's
 * caching allocator.  Events are the queue's own (opaque) objects.  Each
 * returns 0 or the runtime's error code; `complete` receives 1 or 0.
 * install('npu') sets them from the NPU bridge (torch_bridge/npu_queue_bridge.cpp)
 * before the ACL runtime is selected; NULL goes back to plain ACL calls. */
struct npl_queue_ops {
    int (*event_create)(void** event, int device);
    int (*event_destroy)(void* event);
    int (*event_record)(void* event, void* stream);
    int (*event_query)(void* event, int* complete);
    int (*event_synchronize)(void* event);
    int (*stream_wait_event)(void* stream, void* event);
    int (*stream_synchronize)(void* stream);
    int (*stream_drain)(void* stream);   /* the queue's work for `stream` has reached the device */
    int (*device_synchronize)(int device);
    const char* (*error_string)(int code);
};
/* Returns 0, or -1 (npl_last_error) while the shim holds ACL memory. */
int npl_set_acl_queue_ops(const struct npl_queue_ops* ops);

/* Drop every block, segment, event, statistic and finding, and the simulated
 * streams' state (tests only). */
void npl_reset(void);

/* Hooks for the sanitizer, called outside the allocator's lock: after an
 * allocation, and before a free is processed.  Setting (or clearing, with
 * NULLs) returns once no other thread is inside the previous hooks. */
typedef void (*npl_alloc_hook)(void* ptr, size_t size, int device, void* stream, void* ctx);
typedef void (*npl_free_hook)(void* ptr, size_t size, int device, void* stream, void* ctx);
void npl_set_hooks(npl_alloc_hook on_alloc, npl_free_hook on_free, void* ctx);

/* The simulated runtime's controls (no effect under another runtime).
 * Streams are any non-null handle the caller picks. */
void npl_sim_complete(void* stream);     /* `stream` runs to its end, or to a wait on an unfinished event */
void npl_sim_complete_to(void* stream, uint64_t position); /* the same, up to `position` */
uint64_t npl_sim_launch(void* stream);   /* a kernel queued on `stream`; returns its position */
void* npl_sim_record_event(void* stream);            /* a new event recorded on `stream` */
void npl_sim_wait_event(void* stream, void* event);  /* `stream` waits for `event` (GPU-side) */
void npl_sim_complete_all(void);         /* every stream runs to its end */
void npl_sim_set_capturing(void* stream, int capturing);
void npl_sim_set_memory_limit(uint64_t bytes); /* 0: unlimited */
void npl_sim_set_device(int device);            /* the calling thread's current device */
uint64_t npl_sim_stream_waits(void* stream);   /* stream-wait-event calls on `stream` */
uint64_t npl_sim_incomplete_events(void);
uint64_t npl_sim_event_syncs(void);            /* host waits on events */
/* The next `n` calls of a runtime function ("event_create", "event_record",
 * "event_query", "stream_synchronize", ...: the names of the runtime table
 * in src/runtime.h) fail with an error.  0, or -1 for an unknown name. */
int npl_sim_fail_next(const char* call, uint64_t n);
uint64_t npl_sim_calls(const char* call);     /* calls of that function so far (UINT64_MAX: unknown) */
uint64_t npl_sim_completed(void* stream);     /* operations of `stream` that have run */
/* The simulated virtual memory (expandable segments). */
uint64_t npl_sim_mapped_bytes(void);          /* physical chunks mapped now */
uint64_t npl_sim_reserved_bytes(void);        /* address space reserved now */
int npl_sim_accessible(const void* ptr, size_t size); /* 1: a kernel may touch it (malloc'd or mapped) */
uint64_t npl_sim_illegal_accesses(void);      /* fills / reads refused: unmapped memory */
int npl_sim_fill(void* stream, void* ptr, int byte, size_t size); /* a kernel writing `byte`; -1 refused */
/* The simulated runtime's capture graph, as the capture topology calls see
 * it: the capture `stream` takes part in (0: none) and its frontier (up to
 * `capacity` nodes; returns how many there are), and a node's dependencies. */
size_t npl_sim_capture_frontier(void* stream, uint64_t* capture, void** out, size_t capacity);
size_t npl_sim_node_parents(void* node, void** out, size_t capacity);

#ifdef __cplusplus
}
#endif

#endif /* NPU_LIFETIME_SHIM_H */
