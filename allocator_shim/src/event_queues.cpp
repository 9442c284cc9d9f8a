// The events of freed blocks: the FIFOs' order and the checker of the
// invariants stated in event_queues.h.
#include "event_queues.h"

#include <iterator>
#include <unordered_set>

#include "describe.h"

namespace npl {

void EventQueues::enqueue(Block* b, const HeldEvent& h) {
    std::deque<Entry>& fifo = fifos_[h.stream];
    auto at = fifo.end();
    while (at != fifo.begin() && std::prev(at)->seq > h.seq) --at;
    fifo.insert(at, Entry{h.event, b, h.seq});
    if (b->gates++ == 0) pending_++;
}

std::vector<Block*> EventQueues::unqueue_all() {
    std::vector<Block*> blocks;
    for (auto& entry : fifos_) {
        for (const Entry& pe : entry.second) {
            if (pe.block->gates == 0) continue;  // seen already
            pe.block->gates = 0;
            blocks.push_back(pe.block);
        }
    }
    fifos_.clear();
    pending_ = 0;
    return blocks;
}

void EventQueues::check(const std::function<void(const std::string&)>& fail,
                        const std::function<bool(const HeldEvent&)>& gates, size_t pending_walked,
                        size_t deferred_walked) const {
    // The FIFOs hold exactly the gating events of pending blocks, in record order.
    std::unordered_map<const Block*, uint32_t> entries;
    for (const auto& entry : fifos_) {
        if (entry.second.empty()) fail("stream " + hex(entry.first) + " keeps an empty event FIFO (a poll walks it)");
        const Entry* prev_entry = nullptr;
        for (const Entry& pe : entry.second) {
            const Block* b = pe.block;
            entries[b]++;
            if (b->state != BlockState::pending) fail(where(b) + " is in an event FIFO but not pending");
            bool held = false;
            for (const HeldEvent& h : b->held) {
                held = held || (h.event == pe.event && h.stream == entry.first && h.seq == pe.seq && gates(h));
            }
            if (!held) fail(where(b) + " waits in stream " + hex(entry.first) + "'s FIFO on an event it does not hold");
            if (prev_entry != nullptr && prev_entry->seq > pe.seq) {
                fail("stream " + hex(entry.first) + "'s FIFO is out of record order");
            }
            prev_entry = &pe;
        }
    }
    size_t listed_pending = entries.size();
    for (const auto& entry : entries) {
        size_t gating = 0;
        for (const HeldEvent& h : entry.first->held) gating += gates(h) ? 1 : 0;
        if (entry.second != entry.first->gates || gating != entry.second) {
            fail(where(entry.first) + " counts " + std::to_string(entry.first->gates) + " gates, has " +
                 std::to_string(entry.second) + " FIFO entries and " + std::to_string(gating) + " gating events");
        }
    }
    if (listed_pending != pending_walked || pending_ != pending_walked) {
        fail("pending blocks: " + std::to_string(pending_walked) + " walked, " + std::to_string(listed_pending) +
             " in the event FIFOs, " + std::to_string(pending_) + " counted");
    }

    // The deferred list holds exactly the deferred blocks, each once.
    std::unordered_set<const Block*> seen;
    for (const Block* b : deferred_) {
        if (b->state != BlockState::deferred) fail(where(b) + " is on the deferred list but not deferred");
        if (!seen.insert(b).second) fail(where(b) + " is on the deferred list twice");
    }
    if (deferred_.size() != deferred_walked) fail("the deferred list does not hold every deferred block");
}

}  // namespace npl
