// What the caching allocator tells about itself: statistics, a snapshot of
// its segments and blocks, the trace; and its reset and fork locking.
#include "caching_allocator.h"
#include "json.h"

namespace npl {

namespace {

const char* state_name(BlockState s) {
    switch (s) {
        case BlockState::live:
            return "live";
        case BlockState::pending:
            return "pending";
        case BlockState::deferred:
            return "deferred";
        case BlockState::awaiting_join:
            return "awaiting_join";
        case BlockState::quarantined:
            return "quarantined";
        default:
            return "cached";
    }
}

const char* policy_name(Policy p) {
    switch (p) {
        case Policy::poll:
            return "poll";
        case Policy::stream_wait:
            return "stream_wait";
        default:
            return "lazy_wait";
    }
}

void block_json(Json& j, const Block* b) {
    j.open_object().key("address").pointer(b->ptr).key("size").value(static_cast<uint64_t>(b->size));
    if (b->state == BlockState::live) j.key("requested").value(static_cast<uint64_t>(b->requested));
    j.key("state").value(state_name(b->state)).key("alloc_stream").pointer(b->stream);
    j.key("generation").value(b->generation);
    j.key("recorded_streams").open_array();
    for (const StreamUse& u : b->uses) {
        if (u.recorded) j.pointer(u.stream);
    }
    j.close_array().key("use_events").open_array();
    for (const StreamUse& u : b->uses) {
        if (u.event == nullptr) continue;
        j.open_object().key("stream").pointer(u.stream);
        j.key("kind").value(u.noted ? "note_use" : "record_use").close_object();
    }
    j.close_array().key("held_events").open_array();
    for (const HeldEvent& h : b->held) {
        j.open_object().key("stream").pointer(h.stream).key("must_fire").value(h.must_fire).close_object();
    }
    j.close_array().close_object();
}

}  // namespace

void CachingAllocator::stats(int device, uint64_t* out) const {
    Locked lock(this);
    DeviceStats s;
    if (device >= 0 && static_cast<size_t>(device) < stats_.size()) s = stats_[device];
    s.derive_active();
    s.counters[static_cast<int>(CounterId::findings)] = findings_.total();
    s.counters[static_cast<int>(CounterId::findings_dropped)] = findings_.dropped();
    s.counters[static_cast<int>(CounterId::trace_dropped)] = trace_.dropped();
    stat_values(s, out);
}

void CachingAllocator::reset_peak(int device) {
    Locked lock(this);
    dstats(device).reset_peaks();
}

void CachingAllocator::reset_accumulated(int device) {
    Locked lock(this);
    dstats(device).reset_accumulated();
}

std::string CachingAllocator::snapshot_json() const {
    Locked lock(this);
    Json j;
    j.open_object().key("runtime").value(rt_ ? rt_->name : "none");
    j.key("policy").value(policy_name(policy_)).key("debug").value(quarantine_.enabled());
    j.key("segments").open_array();
    segments_.for_each([&](const Segment* seg) {
        j.open_object().key("address").pointer(seg->base).key("size").value(static_cast<uint64_t>(seg->size));
        j.key("device").value(seg->device).key("stream").pointer(seg->stream);
        j.key("pool").value(seg->small ? "small" : "large").key("is_expandable").value(seg->expansion != nullptr);
        j.key("graph_pool").open_array().value(seg->pool_id.first).value(seg->pool_id.second).close_array();
        j.key("blocks").open_array();
        for (const Block* b = seg->first; b != nullptr; b = b->next) block_json(j, b);
        j.close_array().close_object();
    });
    j.close_array().close_object();
    return j.str();
}

namespace {
int32_t record_state(BlockState state) {
    if (state == BlockState::live) return NPL_BLOCK_LIVE;
    return state == BlockState::cached ? NPL_BLOCK_CACHED : NPL_BLOCK_PENDING;
}
}  // namespace

std::vector<npl_block_record> CachingAllocator::block_records() const {
    Locked lock(this);
    std::vector<npl_block_record> out;
    segments_.for_each([&](const Segment* seg) {
        for (const Block* b = seg->first; b != nullptr; b = b->next) {
            npl_block_record r{};
            r.segment = seg->base;
            r.segment_size = seg->size;
            r.segment_stream = seg->stream;
            r.pool_id0 = seg->pool_id.first;
            r.pool_id1 = seg->pool_id.second;
            r.address = b->ptr;
            r.size = b->size;
            r.requested = b->state == BlockState::live ? b->requested : 0;
            r.stream = b->stream;
            r.device = seg->device;
            r.small = seg->small ? 1 : 0;
            r.state = record_state(b->state);
            r.events = static_cast<int32_t>(b->uses.size() + b->held.size());
            r.expandable = seg->expansion != nullptr ? 1 : 0;
            out.push_back(r);
        }
    });
    return out;
}

void CachingAllocator::configure_trace(bool enabled, size_t capacity) {
    Locked lock(this);
    trace_.configure(enabled, capacity);
}

std::string CachingAllocator::drain_trace_json() {
    Locked lock(this);
    return trace_.drain_json();
}

void CachingAllocator::reset() {
    Locked lock(this);
    segments_.clear([&](Segment* seg) {
        for (Block* b = seg->first; b != nullptr;) {
            for (const StreamUse& u : b->uses) {
                if (u.event != nullptr) destroy_event(u.event, u.event_device);
            }
            for (const HeldEvent& h : b->held) destroy_event(h.event, h.device);
            Block* next = b->next;
            delete b;
            b = next;
        }
        int code = 0;
        if (segment_free(seg, &code) != Status::ok) runtime_error("free", code, nullptr, nullptr);
    });
    events_.clear([&](Event e, int device) { destroy_event(e, device); });
    joins_.clear();
    reach_.clear();
    capture_reuse_ = false;
    ordered_ = nullptr;
    cross_stream_ = CrossStream::off;
    captures_announced_ = false;
    for (Block* b : spare_blocks_) delete b;
    pools_.clear();
    book_.clear();
    spare_blocks_.clear();
    stream_devices_.clear();
    graph_pools_.clear();
    quarantine_.clear();
    trace_.clear();
    stats_.clear();
    fractions_.clear();
    expansions_ = 0;
    expandable_ = false;
    expandable_warned_ = false;
    vm_refused_ = false;
    policy_ = Policy::lazy_wait;
    quarantine_.configure(false, 0);
}

void CachingAllocator::lock_for_fork() { mu_.lock(); }
void CachingAllocator::unlock_after_fork() { mu_.unlock(); }

}  // namespace npl
