// The events of freed blocks, as a data structure: idle events pooled per
// device, the record order, the per-stream FIFOs pending blocks wait in
// (torch's per-stream deques of (event, block)), and the frees deferred
// until no capture is underway.
//
// It makes no runtime call: the allocator creates, records, queries, waits
// on and destroys events (allocator_events.cpp) and hands this class what
// the runtime said, through the callables below.  It has no lock of its
// own: CachingAllocator's single mutex guards it with the rest of the
// allocator's state.
//
// ---- Invariants (check() tells which do not hold) -------------------------
//
// - Each stream's FIFO holds (event, block, seq) entries in record order:
//   seq never decreases from head to tail (a stream runs in order, so the
//   head is the first to fire and polling stops at the first head that has
//   not fired).
// - Every entry is a gating event its block holds: same event, stream and
//   seq, and the block is pending.  A block's `gates` is the number of its
//   entries, and equals the number of gating events it holds; so a pending
//   block waits in the FIFO of each stream it holds a gating event of.
// - pending_blocks() is the number of blocks with entries, which are
//   exactly the pending blocks (the walk of the segments counts them).
// - The deferred list holds exactly the deferred blocks, each once.
// - Only streams with entries have a FIFO: a poll walks the streams with
//   pending events, not every stream ever seen.
// - An idle event is held by no block (checked by invariants.cpp with every
//   event the blocks hold: for_each_idle()).
// ---------------------------------------------------------------------------
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include "block.h"

namespace npl {

class EventQueues {
   public:
    // ---- idle events, per device
    // An idle event of `device` (nullptr if none: the caller creates one).
    Event take_idle(int device) {
        auto& idle = idle_[device];
        if (idle.empty()) return nullptr;
        Event e = idle.back();
        idle.pop_back();
        return e;
    }
    void make_idle(Event e, int device) { idle_[device].push_back(e); }
    template <typename F>
    void for_each_idle(F f) const {
        for (const auto& entry : idle_) {
            for (Event e : entry.second) f(e, entry.first);
        }
    }

    // ---- record order: the seq of the last event recorded
    void note_record() { seq_++; }
    uint64_t last_record() const { return seq_; }

    // ---- pending blocks
    // `b` (pending) waits for gating event `h` it holds, in h.stream's FIFO
    // in record order (nearly always an append).
    void enqueue(Block* b, const HeldEvent& h);
    size_t pending_blocks() const { return pending_; }

    // Pops each stream's FIFO head while `fired(stream, event, block)` says
    // it has fired, and stops at the first that has not (the later ones on
    // that stream were recorded after it).  A fired event leaves its block's
    // held events and becomes idle.  A non-empty FIFO for which
    // `skip(stream)` is true is left alone.  Returns the blocks whose last
    // gate fired (no longer pending here: the caller settles them).
    template <typename Skip, typename Fired>
    std::vector<Block*> poll(Skip skip, Fired fired);

    // Takes every pending block out of the FIFOs, each once, in FIFO order
    // (which events gate changed: the caller settles each again).
    std::vector<Block*> unqueue_all();

    // The events the host waits for so that every pending block of `device`
    // is free: in each FIFO the last entry of the device (it subsumes those
    // before it), and the held events of those blocks that do not gate (they
    // wait in no FIFO).  `wait(event, block, stream)`.
    template <typename Gates, typename Wait>
    void for_each_to_wait(int device, Gates gates, Wait wait) const;

    // ---- frees deferred until no capture is underway (their events can't be recorded or queried yet)
    void defer(Block* b) { deferred_.push_back(b); }
    bool any_deferred() const { return !deferred_.empty(); }
    std::vector<Block*> take_deferred() {
        std::vector<Block*> blocks;
        blocks.swap(deferred_);
        return blocks;
    }

    // Forgets everything, after `destroy(event, device)` for each idle event.
    template <typename Destroy>
    void clear(Destroy destroy) {
        for_each_idle(destroy);
        fifos_.clear();
        pending_ = 0;
        deferred_.clear();
        idle_.clear();
    }

    // The invariants above that do not hold, each told to `fail` (except the
    // idle events', which the caller checks).  `gates`: whether a held event
    // gates its block; the counts of pending and deferred blocks the walk of
    // the segments found.
    void check(const std::function<void(const std::string&)>& fail,
               const std::function<bool(const HeldEvent&)>& gates, size_t pending_walked,
               size_t deferred_walked) const;

   private:
    struct Entry {
        Event event;
        Block* block;
        uint64_t seq;
    };

    std::unordered_map<int, std::vector<Event>> idle_;
    uint64_t seq_ = 0;
    std::unordered_map<Stream, std::deque<Entry>> fifos_;
    size_t pending_ = 0;  // blocks with entries in the FIFOs
    std::vector<Block*> deferred_;
};

template <typename Skip, typename Fired>
std::vector<Block*> EventQueues::poll(Skip skip, Fired fired) {
    std::vector<Block*> ready;
    for (auto it = fifos_.begin(); it != fifos_.end();) {
        auto& entry = *it;
        std::deque<Entry>& fifo = entry.second;
        if (skip(entry.first)) {
            ++it;
            continue;
        }
        while (!fifo.empty()) {
            const Entry head = fifo.front();
            if (!fired(entry.first, head.event, head.block)) break;
            fifo.pop_front();
            Block* b = head.block;
            for (auto h = b->held.begin(); h != b->held.end(); ++h) {
                if (h->event != head.event) continue;
                make_idle(h->event, h->device);
                b->held.erase(h);
                break;
            }
            if (--b->gates == 0) {
                pending_--;
                ready.push_back(b);
            }
        }
        it = fifo.empty() ? fifos_.erase(it) : std::next(it);
    }
    return ready;
}

template <typename Gates, typename Wait>
void EventQueues::for_each_to_wait(int device, Gates gates, Wait wait) const {
    for (const auto& entry : fifos_) {
        const Entry* last = nullptr;
        for (const Entry& pe : entry.second) {
            if (pe.block->device != device) continue;
            last = &pe;
            for (const HeldEvent& h : pe.block->held) {
                if (!gates(h)) wait(h.event, pe.block, h.stream);
            }
        }
        if (last != nullptr) wait(last->event, last->block, entry.first);
    }
}

}  // namespace npl
