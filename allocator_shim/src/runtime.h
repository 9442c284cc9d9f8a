// The device runtime as a table of functions, resolved at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct npl_queue_ops;

namespace npl {

using Stream = void*;
using Event = void*;

enum class Status { ok, not_ready, out_of_memory, unsupported, error };

// Virtual memory, for expandable segments: an address range reserved once
// and backed page by page by physical chunks mapped at offsets in it (CUDA's
// cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess, ACL's
// aclrtReserveMemAddress / aclrtMallocPhysical / aclrtMapMem).  Sizes and
// offsets are multiples of `granularity`.  Physical chunks count as device
// memory (out_of_memory when there is none); a reservation does not.
struct VirtualMemory {
    Status (*granularity)(int device, size_t* bytes, int* code);
    Status (*reserve)(void** base, size_t size, int device, int* code);
    Status (*unreserve)(void* base, size_t size, int device, int* code);  // nothing mapped in it any more
    Status (*create)(void** chunk, size_t size, int device, int* code);    // a physical chunk
    Status (*release)(void* chunk, int device, int* code);                 // gone once unmapped too
    Status (*map)(void* at, size_t size, void* chunk, int device, int* code);
    Status (*set_access)(void* at, size_t size, int device, int* code);  // read/write for `device`
    Status (*unmap)(void* at, size_t size, int device, int* code);
};

// Every call returns its status; `code` receives the runtime's own code.
// Events belong to the device current at their creation (CUDA and ACL
// alike), so `event_create` takes the device of the stream the event will be
// recorded on.
struct Runtime {
    const char* name;
    Status (*malloc)(void** ptr, size_t size, int device, int* code);
    Status (*free)(void* ptr, int device, int* code);
    Status (*event_create)(Event* event, int device, int* code);
    Status (*event_destroy)(Event event, int device, int* code);
    Status (*event_record)(Event event, Stream stream, int* code);
    Status (*event_query)(Event event, int* code);  // ok = complete
    Status (*event_synchronize)(Event event, int* code);
    Status (*stream_wait_event)(Stream stream, Event event, int* code);
    Status (*stream_capturing)(Stream stream, bool* capturing, int* code);
    Status (*stream_synchronize)(Stream stream, int* code);
    // ok: all the stream's work has run; not_ready; unsupported where the
    // runtime can't say (treated as busy)
    Status (*stream_query)(Stream stream, int* code);
    Status (*stream_device)(Stream stream, int* device, int* code);  // unsupported: use current_device
    Status (*current_device)(int* device, int* code);
    Status (*memset_async)(void* ptr, int byte, size_t size, Stream stream, int* code);
    Status (*copy_to_host)(void* dst, const void* src, size_t size, int device, int* code);  // synchronous
    Status (*memory_total)(int device, size_t* total, int* code);
    Status (*device_count)(int* count, int* code);
    const char* (*error_string)(int code);  // the runtime's words for a status code ("" if none)
    // Its virtual-memory operations, loaded on first use; nullptr (and `why`)
    // when the runtime has none.
    const VirtualMemory* (*virtual_memory)(std::string* why);
};

// Each returns nullptr and explains in `why` when the runtime can't be loaded.
const Runtime* cuda_runtime(std::string* why);
const Runtime* acl_runtime(const char* library_path, std::string* why);
const Runtime* sim_runtime();
// Routes the ACL runtime's ordering calls through torch_npu's task queue
// (NULL: plain ACL); refused once an ACL runtime is `in_use`.
bool set_acl_queue_ops(const struct npl_queue_ops* ops, const Runtime* in_use, std::string* why);

// True when the process already has a CUDA / ACL runtime library loaded.
bool library_loaded(const char* name_fragment, std::string* path);

// ---- Stream-ordered memory (the oracle mode) ------------------------------
// cudaMallocAsync / cudaFreeAsync: memory whose lifetime the runtime orders
// on a stream, so that compute-sanitizer (--track-stream-ordered-races) can
// check every access against it.  nullptr (and `why`) where the runtime has
// none.  The simulated runtime allocates at once and frees once the stream
// has run to the free (its own stream order).
struct StreamOrderedMemory {
    Status (*malloc_async)(void** ptr, size_t size, int device, Stream stream, int* code);
    Status (*free_async)(void* ptr, int device, Stream stream, int* code);
};
const StreamOrderedMemory* stream_ordered_memory(const Runtime* rt, std::string* why);
const StreamOrderedMemory* cuda_stream_ordered_memory(std::string* why);  // only once cuda_runtime() loaded
const StreamOrderedMemory* sim_stream_ordered_memory();

// ---- Capture topology (graph_capture_record_stream_reuse) ----------------
// What the allocator may ask about a graph capture in progress, without
// touching the graph: the capture a stream takes part in and its frontier
// (the nodes the stream's next captured work will depend on: CUDA's capture
// dependencies), and each node's dependencies.  Both calls are legal during
// a capture.
using GraphNode = void*;

struct CaptureInfo {
    bool capturing = false;    // false: the stream captures nothing (the rest is empty)
    bool invalidated = false;  // its capture was invalidated: its topology proves nothing
    uint64_t id = 0;           // the capture's id, unique in the process
    std::vector<GraphNode> frontier;
};

struct CaptureTopology {
    Status (*capture_info)(Stream stream, CaptureInfo* info, int* code);
    Status (*node_parents)(GraphNode node, std::vector<GraphNode>* parents, int* code);
};

// The capture topology of runtime `rt`; nullptr, with the reason in `why`,
// when it has none (ACL; a libcudart without the calls).
const CaptureTopology* capture_topology(const Runtime* rt, std::string* why);
const CaptureTopology* sim_capture_topology();
const CaptureTopology* cuda_capture_topology(std::string* why);  // only once cuda_runtime() loaded

}  // namespace npl
