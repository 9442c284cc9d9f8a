// The caching allocator's events: pooled per device, recorded, held by
// freed blocks, polled, and waited on by the host on the out-of-memory path.
#include <algorithm>

#include "caching_allocator.h"

namespace npl {

Event CachingAllocator::acquire_event(int device) {
    auto& pool = event_pool_[device];
    if (!pool.empty()) {
        Event e = pool.back();
        pool.pop_back();
        return e;
    }
    Event e = nullptr;
    int code = 0;
    if (rt_->event_create(&e, device, &code) != Status::ok) {
        runtime_error("event_create", code, nullptr, nullptr);
        return nullptr;
    }
    dstats(device).count(CounterId::events_created);
    return e;
}

void CachingAllocator::release_event(Event e, int device) { event_pool_[device].push_back(e); }

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
    event_seq_++;
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
        release_event(older.event, older.device);
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
            release_event(h.event, h.device);
            continue;
        }
        if (s != Status::not_ready) runtime_error("event_query", code, b, h.stream);
        *keep++ = h;
    }
    b->held.erase(keep, b->held.end());
    return b->held.empty();
}

void CachingAllocator::drop_fired_events_of_cached(int device) {
    for (auto& entry : segments_) {
        if (entry.second->device != device) continue;
        for (Block* b = entry.second->first; b != nullptr; b = b->next) {
            if (b->state != BlockState::cached || b->held.empty()) continue;
            pool_erase(b);
            drop_fired_events(b);
            pool_insert(b);
        }
    }
}

// The host waits for every event a freed block of `device` holds.
void CachingAllocator::synchronize_held_events(int device) {
    auto wait_all = [&](Block* b) {
        for (const HeldEvent& h : b->held) {
            int code = 0;
            if (rt_->event_synchronize(h.event, &code) != Status::ok) runtime_error("event_synchronize", code, b, h.stream);
        }
    };
    for (Block* b : pending_) {
        if (b->device == device) wait_all(b);
    }
    for (auto& entry : segments_) {
        if (entry.second->device != device) continue;
        for (Block* b = entry.second->first; b != nullptr; b = b->next) {
            if (b->state == BlockState::cached) wait_all(b);
        }
    }
    dstats(device).count(CounterId::num_sync_all_streams);
}

void CachingAllocator::process_events() {
    std::lock_guard<std::mutex> lock(mu_);
    if (rt_ == nullptr || graph_pools_.any_capture_underway()) return;
    process_deferred();
    process_events_locked();
}

// Pending blocks whose must-fire events fired leave for their pool (or the
// quarantine).  Never while a capture is underway.
void CachingAllocator::process_events_locked() {
    if (graph_pools_.any_capture_underway()) return;
    std::vector<Block*> ready;
    auto still_pending = pending_.begin();
    for (Block* b : pending_) {
        drop_fired_events(b);
        if (ready_for_pool(b)) {
            ready.push_back(b);
        } else {
            *still_pending++ = b;
        }
    }
    pending_.erase(still_pending, pending_.end());
    for (Block* b : ready) settle(b);
}

// Frees made during a capture get their events now that none is underway.
void CachingAllocator::process_deferred() {
    if (graph_pools_.any_capture_underway()) return;
    std::vector<Block*> blocks;
    blocks.swap(deferred_);
    for (Block* b : blocks) {
        bool stream_capturing = false;
        for (const StreamUse& u : b->uses) stream_capturing = stream_capturing || (u.recorded && capturing(u.stream));
        if (stream_capturing) {
            deferred_.push_back(b);
            continue;
        }
        finish_free(b);
    }
}

}  // namespace npl
