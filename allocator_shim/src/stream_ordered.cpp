// The oracle mode: compute-sanitizer checks the shim's reuse decisions.
//
// Each eager block is a stream-ordered allocation of its own size
// (cudaMallocAsync on its stream), never split and never cached: at the
// moment the shim would make it reusable (cache_block), its stream first
// waits, GPU-side, on every event the block still holds (its recorded
// streams' and its record_use events), then the block goes back with a
// stream-ordered free on that stream (cudaFreeAsync).  compute-sanitizer's
// stream-ordered race tracking (--track-stream-ordered-races all) knows
// exactly which work the free is ordered after, so a use the shim forgot
// (a block released too early) is reported as a use-after-free.  The policy
// becomes stream_wait, so that every event reaches the release and no
// decision rests on the host having seen an event fire.  Graph pools and
// MemPools keep their own segments (a capture's allocations are not
// stream-ordered ones), and so do expandable segments.
//
// Invariants: an ordered segment holds exactly one block; it never sits in
// a pool except inside release_ordered (release_segment takes it out).
#include "caching_allocator.h"

namespace npl {

namespace {

void* ordered_alloc(size_t size, int device, void* stream, void* ctx) {
    auto* ordered = static_cast<const StreamOrderedMemory*>(ctx);
    void* ptr = nullptr;
    int code = 0;
    return ordered->malloc_async(&ptr, size, device, stream, &code) == Status::ok ? ptr : nullptr;
}

// Never called: segment_free gives an ordered segment back with the
// stream-ordered free itself, its status checked.
void ordered_free(void*, size_t, int, void*, void*) {}

}  // namespace

bool CachingAllocator::set_stream_ordered(bool on, std::string* why) {
    Locked lock(this);
    if (!segments_.empty()) {
        *why = "the oracle mode can change only while the allocator holds no memory (empty_cache first)";
        return false;
    }
    if (!on) {
        ordered_ = nullptr;
        return true;
    }
    ensure_runtime();
    const StreamOrderedMemory* ordered = stream_ordered_memory(rt_, why);
    if (ordered == nullptr) return false;
    ordered_ = ordered;
    if (policy_ != Policy::stream_wait) {
        policy_ = Policy::stream_wait;
        regate_pending();
    }
    return true;
}

bool CachingAllocator::stream_ordered() const {
    Locked lock(this);
    return ordered_ != nullptr;
}

SegmentSource CachingAllocator::ordered_source() const {
    SegmentSource source;
    source.alloc = ordered_alloc;
    source.free = ordered_free;
    source.ctx = const_cast<StreamOrderedMemory*>(ordered_);
    source.ordered = true;
    return source;
}

// cache_block's step in the oracle mode: the block's stream waits on each
// event it holds, then the block goes back, stream-ordered.  A wait that
// fails is replaced by the host waiting for that event; if the free fails,
// the block stays cached (reusable as in the ordinary mode).
void CachingAllocator::release_ordered(Block* b) {
    Segment* seg = b->segment;
    int code = 0;
    for (const HeldEvent& h : b->held) {
#ifdef NPL_MUTANT_ORDERED_RELEASE  // a deliberately premature release, built only by the test that must catch it
        break;
#endif
        if (rt_->stream_wait_event(b->stream, h.event, &code) == Status::ok) continue;
        runtime_error("stream_wait_event(oracle)", code, b, b->stream);
        if (rt_->event_synchronize(h.event, &code) != Status::ok) runtime_error("event_synchronize(oracle)", code, b, b->stream);
    }
    for (const HeldEvent& h : b->held) events_.make_idle(h.event, h.device);
    b->held.clear();
    b->state = BlockState::cached;
    pool_insert(b);  // release_segment takes it out of its pool
    if (release_segment(seg)) segments_.remove(seg);  // segment_free: the stream-ordered free
}

}  // namespace npl
