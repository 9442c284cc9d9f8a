// The caching allocator's side of graph capture: routing allocations to
// private pools, releasing them, and answering which of a pool's blocks
// are live (what torch's cudagraph trees check before replaying).
#include "caching_allocator.h"

namespace npl {

thread_local char* CachingAllocator::claim_ = nullptr;

// torch opens the pool before it begins the capture: the last moment an
// event may be queried.  The pool's cached blocks drop the use events that
// have fired, so the capture can take them (it skips a block with events:
// a wait would pull outside work into the graph).
void CachingAllocator::begin_allocate_to_pool(int device, PoolId id, StreamFilter filter, Stream stream) {
    Locked lock(this);
    if (rt_ != nullptr && !id.eager() && !graph_pools_.any_capture_underway()) drop_fired_events_of_pool(device, id);
    graph_pools_.begin(device, id, std::move(filter), stream);
}

// torch's CUDA graphs open a pool before each capture begins and close it
// after it ends, so with captures announced "no pool is open" means "no
// capture": the allocation path then polls without asking the runtime.
void CachingAllocator::set_captures_announced(bool on) {
    Locked lock(this);
    captures_announced_ = on;
}

bool CachingAllocator::captures_announced() const {
    Locked lock(this);
    return captures_announced_;
}

// Whether a stream known to an open capture on `device` really captures
// (the runtime says so; an unanswered question counts as yes).
bool CachingAllocator::real_capture_on(int device) {
    return graph_pools_.any_stream_on(device, [&](Stream s) { return capturing(s); });
}

void CachingAllocator::end_allocate_to_pool(int device, PoolId id) {
    Locked lock(this);
    if (!graph_pools_.end(device, id)) {
        unknown_pool("end_allocate_to_pool", device, id);
        return;
    }
    end_joins(device, id);
}

void CachingAllocator::release_pool(int device, PoolId id) {
    Locked lock(this);
    if (!graph_pools_.known(device, id)) {
        unknown_pool("release_pool", device, id);
        return;
    }
    if (graph_pools_.release(device, id) && rt_ != nullptr) release_pool_segments(device, id);
}

void CachingAllocator::create_or_incref_pool(int device, PoolId id) {
    Locked lock(this);
    graph_pools_.incref(device, id);
}

void CachingAllocator::set_pool_allocator(int device, PoolId id, SegmentSource source) {
    Locked lock(this);
    if ((source.alloc == nullptr) != (source.free == nullptr)) {
        Finding f;
        f.kind = "invalid_argument";
        f.op = "set_pool_allocator";
        f.device = device;
        f.detail = "a pool's allocator needs both its alloc and its free; ignored";
        report(std::move(f));
        return;
    }
    graph_pools_.set_source(device, id, source);
}

void CachingAllocator::set_pool_use_on_oom(int device, PoolId id, bool on) {
    Locked lock(this);
    graph_pools_.set_use_on_oom(device, id, on);
}

// Pools already made for the id (one per stream and size class) stop
// splitting too; a block split before stays split (torch marks a pool at its
// creation, before any allocation).
void CachingAllocator::set_pool_no_split(int device, PoolId id) {
    Locked lock(this);
    graph_pools_.set_no_split(device, id);
    pools_.for_each([&](Pool& p) {
        if (p.device == device && p.id == id) p.no_split = true;
    });
}

int CachingAllocator::pool_use_count(int device, PoolId id) const {
    Locked lock(this);
    return graph_pools_.use_count(device, id);
}

// As torch's getCheckpointState: frees deferred by a capture are done first
// (their blocks belong in the checkpoint as free), and only a pool that still
// has references may be checkpointed or restored.
PoolCheckpointable CachingAllocator::prepare_pool_checkpoint(int device, PoolId id) {
    Locked lock(this);
    if (rt_ != nullptr && !graph_pools_.any_capture_underway()) process_deferred();
    if (!graph_pools_.known(device, id)) return PoolCheckpointable::unknown;
    return graph_pools_.use_count(device, id) > 0 ? PoolCheckpointable::yes : PoolCheckpointable::freeable;
}

void CachingAllocator::unknown_pool(const char* op, int device, PoolId id) {
    Finding f;
    f.kind = "invalid_argument";
    f.op = op;
    f.device = device;
    f.detail = "no capture into graph pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) +
               ") was begun on this device; ignored";
    report(std::move(f));
}

std::vector<void*> CachingAllocator::pool_live_allocations(int device, PoolId id) const {
    Locked lock(this);
    std::vector<void*> live;
    segments_.for_each_block(device, [&](const Block* b) {
        if (b->segment->pool_id == id && b->state == BlockState::live) live.push_back(b->ptr);
    });
    return live;
}

void* CachingAllocator::base_allocation(void* ptr, size_t* size) const {
    Locked lock(this);
    const Segment* seg = segments_.containing(static_cast<char*>(ptr));
    if (seg == nullptr) return ptr;
    if (size != nullptr) *size = seg->size;
    return seg->base;
}

}  // namespace npl
