// graph_capture_record_stream_reuse, the allocator's side: a block freed
// during a graph capture while streams it was recorded on may still use it
// waits for the capture's graph to join those streams, instead of for the
// capture's end, and is reused inside the capture once it has
// (capture_joins.h states the rule, capture_reach.h the graph walk).  Only
// the runtime's capture topology calls are made during the capture: no
// event is created, recorded or queried.
#include <algorithm>

#include "caching_allocator.h"

namespace npl {

bool CachingAllocator::set_capture_reuse(bool on) {
    Locked lock(this);
    capture_reuse_ = on;
    if (!on || rt_ == nullptr) return true;
    std::string why;
    return capture_topology(rt_, &why) != nullptr;
}

bool CachingAllocator::capture_reuse() const {
    Locked lock(this);
    return capture_reuse_;
}

// The selected runtime's capture topology; without one the setting is
// reported once (a finding) and frees wait for the capture's end.
const CaptureTopology* CachingAllocator::topology() {
    if (topology_asked_) return topology_;
    topology_asked_ = true;
    std::string why;
    topology_ = capture_topology(rt_, &why);
    if (topology_ == nullptr) {
        Finding f;
        f.kind = "unsupported";
        f.op = "graph_capture_record_stream_reuse";
        f.detail = "graph_capture_record_stream_reuse is on but " + why +
                   "; a block freed during a capture with recorded streams waits for the capture's end";
        report(std::move(f));
    }
    return topology_;
}

// record_use on a capturing stream: marks `u` with the stream's frontier now
// (the last captured work, the use included), replacing an earlier mark (the
// stream runs in order).  False when the stream's place in the graph can't
// be known: the use is then covered as record_stream covers it.
bool CachingAllocator::mark_capture_use(StreamUse& u) {
    const CaptureTopology* topo = topology();
    if (topo == nullptr) return false;
    CaptureInfo info;
    int code = 0;
    if (topo->capture_info(u.stream, &info, &code) != Status::ok) {
        runtime_error("capture_info(record_use)", code, nullptr, u.stream);
        return false;
    }
    if (!info.capturing || info.invalidated) return false;
    u.capture = info.id;
    u.markers = std::move(info.frontier);
    return true;
}

// A free during a capture that would be deferred to the capture's end
// waits for the join instead when the block belongs to the pool of a
// capture underway, it has no use event (record_use's and note_use's
// recorded outside the capture: only their events can tell), every stream
// it was recorded on is either marked by a record_use in this capture or,
// with the setting on, captures into the same graph, and at least one of
// them has captured work.  A record_use's mark needs no setting: it states
// the use's last work itself.  Otherwise false: the caller defers it.
bool CachingAllocator::await_join(Block* b) {
    if (b->pool->id.eager() || !graph_pools_.open(b->device, b->pool->id)) return false;
    for (const StreamUse& u : b->uses) {
        if (u.event != nullptr || u.noted) return false;
        if (u.recorded && u.capture == 0 && !capture_reuse_) return false;  // record_stream: torch's opt-in
    }
    const CaptureTopology* topo = topology();
    uint64_t capture = 0;
    std::vector<GraphNode> markers;
    if (topo == nullptr || !capture_markers(*topo, b, &capture, &markers)) return false;
    DeviceStats& s = *b->pool->stats;
    s.add(StatId::pending, b->small, 1);
    s.add(StatId::pending_bytes, b->small, static_cast<int64_t>(b->size));
    s.count(CounterId::capture_deferred_frees);
    trace(TraceKind::pending, b, nullptr);
    b->state = BlockState::awaiting_join;
    joins_.add(b, capture, std::move(markers));
    return true;
}

// The frontiers of b's stream and of each stream it was recorded on, if all
// capture into one graph that is not invalidated (and any has a frontier).
bool CachingAllocator::capture_markers(const CaptureTopology& topo, const Block* b, uint64_t* capture,
                                       std::vector<GraphNode>* markers) {
    auto note = [&](const std::vector<GraphNode>& nodes) {
        for (GraphNode n : nodes) {
            if (std::find(markers->begin(), markers->end(), n) == markers->end()) markers->push_back(n);
        }
    };
    auto add = [&](Stream stream) {
        CaptureInfo info;
        int code = 0;
        if (topo.capture_info(stream, &info, &code) != Status::ok) {
            runtime_error("capture_info(free)", code, b, stream);
            return false;
        }
        if (!info.capturing || info.invalidated || (*capture != 0 && info.id != *capture)) return false;
        *capture = info.id;
        note(info.frontier);
        return true;
    };
    if (!add(b->stream)) return false;
    for (const StreamUse& u : b->uses) {
        if (!u.recorded) continue;
        if (u.capture == 0) {
            if (!add(u.stream)) return false;
            continue;
        }
        if (u.capture != *capture) return false;  // marked in another capture: the graph can't tell
#ifndef NPL_MUTANT_CAPTURE_RULE  // a deliberately broken rule, built only by the test that must catch it
        note(u.markers);
#endif
    }
    return !markers->empty();
}

// Before an allocation on `stream` during a capture: the blocks of that
// stream whose markers all lie at or before its frontier go to their pools.
void CachingAllocator::reclaim_joined(Stream stream) {
    if (!joins_.any_on(stream) || topology() == nullptr) return;
    CaptureInfo info;
    int code = 0;
    if (topology_->capture_info(stream, &info, &code) != Status::ok) {
        runtime_error("capture_info(alloc)", code, nullptr, stream);
        return;
    }
    if (!info.capturing || info.invalidated) return;
    if (!reach_.advance(*topology_, info.id, stream, info.frontier, &code)) {
        runtime_error("node_parents(alloc)", code, nullptr, stream);
        return;
    }
    auto reached = [&](GraphNode n) { return reach_.reached(info.id, stream, n); };
    for (Block* b : joins_.take_joined(info.id, stream, reached)) {
        DeviceStats& s = *b->pool->stats;
        s.add(StatId::pending, b->small, -1);
        s.add(StatId::pending_bytes, b->small, -static_cast<int64_t>(b->size));
        b->uses.clear();  // the graph orders every recorded use before the next one: no event needed
        release(b);
    }
}

// Pool `id`'s capture ended: what still waits for a join waits for events
// recorded once no capture is underway, as any free deferred in a capture.
// The graph walks of captures no block waits in any more are forgotten (a
// capture still underway walks again if a block of it comes to wait).
void CachingAllocator::end_joins(int device, PoolId id) {
    for (Block* b : joins_.take_pool(device, id)) {
        b->state = BlockState::deferred;
        events_.defer(b);
    }
    reach_.keep_only(joins_.captures());
}

}  // namespace npl
