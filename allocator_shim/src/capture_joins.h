// Blocks freed during a graph capture that wait for the capture's graph to
// join their streams (graph_capture_record_stream_reuse): torch's rule that
// a block freed in a capture while other streams it was recorded on may
// still use it is reusable inside that capture once every stream's work up
// to the free is an ancestor of the allocating stream's frontier.
//
// Each waiting block carries its markers: the last captured work that may
// touch it.  For its allocation stream and each stream recorded with
// record_stream (only with the setting on), their frontiers at the free; for
// a stream whose use was stated with record_use in the same capture, that
// stream's frontier at the record_use call, with no setting needed: the call
// follows the use's last work, so later work on that stream (a communication
// stream's next collective) does not hold the block back.  This is safe as
// record_stream's rule is: the block is handed out only on its own stream,
// once every marker is at or before that stream's frontier, so all its
// captured uses are ancestors, in the graph, of whatever the new owner does.  It is reused on its own stream (pools
// are per stream) once all its markers lie at or before that stream's
// frontier in the same capture (capture_reach.h); whatever is still
// waiting when its pool's capture ends becomes an ordinary deferred free.
//
// ---- Invariants (check() tells which do not hold) -------------------------
// - The list holds exactly the awaiting_join blocks, each once.
// - Each has at least one marker and a capture id, belongs to a graph pool
//   (never the eager pool: an eager block is never handed into a capture),
//   holds no event, and has use records (its recorded streams).
// ---------------------------------------------------------------------------
// No runtime call and no lock of its own (the allocator's mutex guards it).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "block.h"

namespace npl {

class CaptureJoins {
   public:
    void add(Block* b, uint64_t capture, std::vector<GraphNode> markers);
    bool empty() const { return waiting_.empty(); }
    bool any_on(Stream stream) const;  // a block of `stream` waits
    // Takes out the blocks of `stream` in `capture` whose every marker
    // `reached(node)` says lies at or before the stream's frontier.
    template <typename Reached>
    std::vector<Block*> take_joined(uint64_t capture, Stream stream, Reached reached);
    // Takes out the blocks of graph pool `id` on `device` (its capture ended).
    std::vector<Block*> take_pool(int device, PoolId id);
    std::vector<uint64_t> captures() const;  // the captures blocks wait in
    void clear() { waiting_.clear(); }
    void check(const std::function<void(const std::string&)>& fail, size_t awaiting_walked) const;

   private:
    struct Waiting {
        Block* block;
        uint64_t capture;
        std::vector<GraphNode> markers;
    };
    std::vector<Waiting> waiting_;  // in free order
};

template <typename Reached>
std::vector<Block*> CaptureJoins::take_joined(uint64_t capture, Stream stream, Reached reached) {
    std::vector<Block*> joined;
    auto keep = waiting_.begin();
    for (Waiting& w : waiting_) {
        bool all = w.capture == capture && w.block->stream == stream;
        for (size_t i = 0; all && i < w.markers.size(); ++i) all = reached(w.markers[i]);
        if (all) {
            joined.push_back(w.block);
        } else {
            if (&*keep != &w) *keep = std::move(w);  // (a vector moved onto itself would empty)
            ++keep;
        }
    }
    waiting_.erase(keep, waiting_.end());
    return joined;
}

}  // namespace npl
