// Cross-stream reuse (npl_set_cross_stream_reuse): off, idle or always.
//
// torch's allocator caches per (device, stream): memory one stream freed
// serves only that stream, so a stream that never allocates again strands
// it (vllm-project/vllm#52950: a new stream per weight sync left ~2 GiB per
// step reserved).  Here an eager allocation that its own stream's pool
// cannot serve first takes a whole free segment from another stream's pool
// of the same device and size class (the smallest that fits), before the
// runtime is asked for memory:
//
//   1. the segment's stream and the block's own events (record_use's, on
//      other streams):
//      - if the stream has run all its work (stream_query) and the events
//        have completed, the segment is idle: it is taken with no GPU-side
//        wait, so no dependency is added that torch's allocator (a new
//        segment) would not have had;
//      - otherwise, in `idle` mode it stays where it is; in `always` mode
//        an event is recorded on its stream now and the allocating stream
//        waits on it GPU-side: everything that stream queued, its uses of
//        the block before the free included, comes first (a runtime that
//        cannot say whether a stream is idle, ACL, counts as busy);
//   2. the allocating stream waits on the block's own events still pending
//      (wait_for_held; none are pending under `idle`), as any reuse does;
//   3. the segment and its block move to the allocating stream's pool.
//
// In both modes the out-of-memory path takes one with waits before it
// gives cached memory back: a GPU-side wait costs less than the device
// synchronisation a release implies.
//
// Why it is safe: every access to the old owner's memory is either on the
// segment's stream (done, or ordered before the event of step 1) or on a stream the
// block holds an event of (step 2); a record_stream'ed use still pending
// keeps the block out of the pools altogether (its event must fire first
// under poll and lazy_wait; under stream_wait it is a held event).  Only
// whole segments move, so a segment's blocks always share its stream and
// pool (the invariant merging relies on).  Never during a capture (no event
// may be recorded), never for graph pools or MemPools (their memory belongs
// to a graph or a pool allocator) or expandable segments (they grow in
// place on their stream).  A failed record or wait leaves the segment where
// it was (a finding says why).
#include "caching_allocator.h"

namespace npl {

void CachingAllocator::set_cross_stream_reuse(CrossStream mode) {
    Locked lock(this);
    cross_stream_ = mode;
}

CrossStream CachingAllocator::cross_stream_reuse() const {
    Locked lock(this);
    return cross_stream_;
}

// The smallest whole free segment of size >= `size` in the eager pools of
// p's device and size class on other streams, or nullptr.
Block* CachingAllocator::foreign_segment(const Pool* p, size_t size) {
    Block* best = nullptr;
    pools_.for_each([&](Pool& q) {
        if (q.stream == p->stream || q.device != p->device || q.small != p->small || !q.id.eager()) return;
        for (Block* b = q.blocks.at_least(size); b != nullptr; b = q.blocks.after(b)) {
            if (b->prev != nullptr || b->next != nullptr || b->segment->expansion != nullptr) continue;
            if (best == nullptr || b->size < best->size) best = b;
            break;  // the pool's best fit among its whole segments
        }
    });
    return best;
}

// Whether every event b holds has completed (a failed query counts as not).
bool CachingAllocator::events_fired(const Block* b) {
    for (const HeldEvent& h : b->held) {
        int code = 0;
        if (rt_->event_query(h.event, &code) != Status::ok) return false;
    }
    return true;
}

// The allocating stream waits GPU-side on everything b's stream queued so far.
bool CachingAllocator::wait_for_stream(Block* b, Stream stream) {
    Event e = acquire_event(b->device);
    if (e == nullptr || !record(e, b->stream, b, "record_event(cross_stream)")) {
        if (e != nullptr) events_.make_idle(e, b->device);
        return false;
    }
    int code = 0;
    Status waited = rt_->stream_wait_event(stream, e, &code);
    events_.make_idle(e, b->device);
    if (waited != Status::ok) {
        runtime_error("stream_wait_event(cross_stream)", code, b, stream);
        return false;
    }
    dstats(b->device).count(CounterId::stream_waits);
    return true;
}

// Another stream's whole free segment for an allocation of `size` on
// `stream`, moved to p; nullptr if none (or, without `may_wait`, none idle).
Block* CachingAllocator::adopt_foreign(Pool* p, size_t size, Stream stream, bool may_wait) {
    Block* b = foreign_segment(p, size);
    // a stream captured without torch's knowledge: a query or record there would end up in its graph
    if (b == nullptr || capturing(b->stream)) return nullptr;
    int code = 0;
#ifdef NPL_MUTANT_CROSS_STREAM  // a deliberately unordered reuse, built only by the test that must catch it
    bool idle = true;
#else
    bool idle = rt_->stream_query(b->stream, &code) == Status::ok && events_fired(b);
#endif
    // busy and no waiting allowed: taking it would make this stream wait on that one's work
    if (!idle && (!may_wait || !wait_for_stream(b, stream))) return nullptr;
    dstats(p->device).count(CounterId::cross_stream_segments);
    pool_erase(b);
    if (!b->held.empty() && !wait_for_held(b, stream)) {
        pool_insert(b);
        return nullptr;
    }
    b->segment->stream = stream;
    b->stream = stream;
    b->pool = p;
    trace(TraceKind::reuse_wait, b, stream);
    pool_insert(b);
    take(b, size);
    return b;
}

}  // namespace npl
