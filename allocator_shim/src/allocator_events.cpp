// The caching allocator's events: created, recorded, held by freed blocks,
// polled, and waited on by the host on the out-of-memory path: the runtime
// calls and the block states they decide.  The idle events, the record order,
// the pending blocks' FIFOs and the deferred frees are an EventQueues
// (event_queues.h), which states their invariants.
#include <algorithm>

#include "caching_allocator.h"

namespace npl {

Event CachingAllocator::acquire_event(int device) {
    Event e = events_.take_idle(device);
    if (e != nullptr) return e;
    int code = 0;
    if (rt_->event_create(&e, device, &code) != Status::ok) {
        runtime_error("event_create", code, nullptr, nullptr);
        return nullptr;
    }
    dstats(device).count(CounterId::events_created);
    return e;
}

void CachingAllocator::destroy_event(Event e, int device) {
    int code = 0;
    if (rt_->event_destroy(e, device, &code) != Status::ok) runtime_error("event_destroy", code, nullptr, nullptr);
}

bool CachingAllocator::record(Event e, Stream stream, Block* b, const char* op) {
    int code = 0;
    if (rt_->event_record(e, stream, &code) != Status::ok) {
        runtime_error(op, code, b, stream);
        return false;
    }
    events_.note_record();
    dstats(b->device).count(CounterId::events_recorded);
    return true;
}

void CachingAllocator::hold(Block* b, const HeldEvent& h) {
    for (HeldEvent& mine : b->held) {
        if (mine.stream != h.stream) continue;
        if (mine.event == h.event) {
            mine.seq = std::max(mine.seq, h.seq);
            mine.must_fire = mine.must_fire || h.must_fire;
            return;
        }
        // one stream runs in order: the later record subsumes the earlier
        const HeldEvent& older = mine.seq < h.seq ? mine : h;
        events_.make_idle(older.event, older.device);
        if (mine.seq < h.seq) mine = HeldEvent{h.stream, h.event, h.device, h.seq, h.must_fire || mine.must_fire};
        else mine.must_fire = mine.must_fire || h.must_fire;
        return;
    }
    b->held.push_back(h);
}

// Releases the held events of `b` that have fired; true when none is left.
bool CachingAllocator::drop_fired_events(Block* b) {
    auto keep = b->held.begin();
    for (const HeldEvent& h : b->held) {
        int code = 0;
        Status s = rt_->event_query(h.event, &code);
        if (s == Status::ok) {
            events_.make_idle(h.event, h.device);
            continue;
        }
        if (s != Status::not_ready) runtime_error("event_query", code, b, h.stream);
        *keep++ = h;
    }
    b->held.erase(keep, b->held.end());
    return b->held.empty();
}

void CachingAllocator::drop_fired_events_of_cached(int device) {
    segments_.for_each_block(device, [&](Block* b) {
        if (b->state != BlockState::cached || b->held.empty()) return;
        pool_erase(b);
        drop_fired_events(b);
        pool_insert(b);
    });
}

// The cached blocks of graph pool `id` on `device` drop their fired events.
void CachingAllocator::drop_fired_events_of_pool(int device, PoolId id) {
    std::vector<Block*> carrying;
    pools_.for_each([&](const Pool& p) {
        if (p.device != device || !(p.id == id)) return;
        for (Block* b = p.blocks.at_least(0); b != nullptr; b = p.blocks.after(b)) {
            if (!b->held.empty()) carrying.push_back(b);
        }
    });
    for (Block* b : carrying) {
        pool_erase(b);  // its statistics change with its events
        drop_fired_events(b);
        pool_insert(b);
    }
}

// The host waits for every event a freed block of `device` holds: in each
// stream's FIFO the last such event (the stream runs in order), the events
// pending blocks carry along without waiting in a FIFO (lazy_wait's use
// events), and the events cached blocks carry.
void CachingAllocator::synchronize_held_events(int device) {
    auto wait = [&](Event e, const Block* b, Stream stream) {
        if (thawed_ && capturing(stream)) return;  // pools are open: never a capturing stream
        int code = 0;
        if (rt_->event_synchronize(e, &code) != Status::ok) runtime_error("event_synchronize", code, b, stream);
    };
    events_.for_each_to_wait(device, [&](const HeldEvent& h) { return gates(h); }, wait);
    segments_.for_each_block(device, [&](const Block* b) {
        if (b->state != BlockState::cached) return;
        for (const HeldEvent& h : b->held) wait(h.event, b, h.stream);
    });
    dstats(device).count(CounterId::num_sync_all_streams);
}

void CachingAllocator::process_events() {
    Locked lock(this);
    if (rt_ == nullptr || graph_pools_.any_capture_underway()) return;
    process_deferred();
    process_events_locked();
}

// Polls each stream's FIFO head-first, stopping at the first event that has
// not fired (the later ones on that stream were recorded after it); a block
// whose gating events all fired leaves for its pool (or the quarantine).
// Never while a capture is underway.
void CachingAllocator::process_events_locked() {
    if (queries_frozen()) return;
    std::vector<Block*> ready = events_.poll(
        [&](Stream stream) { return thawed_ && capturing(stream); },  // pools are open: ask
        [&](Stream stream, Event e, const Block* b) {
            int code = 0;
            Status s = rt_->event_query(e, &code);
            if (s != Status::ok && s != Status::not_ready) runtime_error("event_query", code, b, stream);
            return s == Status::ok;
        });
    for (Block* b : ready) settle(b);
}

// After a policy or debug-mode change: which events gate a pending block
// changed, so every pending block is settled again.
void CachingAllocator::regate_pending() {
    for (Block* b : events_.unqueue_all()) settle(b);
}

// Frees made during a capture get their events now that none is underway.
void CachingAllocator::process_deferred() {
    if (queries_frozen()) return;
    for (Block* b : events_.take_deferred()) {
        bool stream_capturing = false;
        for (const StreamUse& u : b->uses) stream_capturing = stream_capturing || (u.recorded && capturing(u.stream));
        if (stream_capturing) {
            events_.defer(b);
            continue;
        }
        finish_free(b);
    }
}

}  // namespace npl
