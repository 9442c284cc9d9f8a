#include "capture_joins.h"

#include <algorithm>
#include <unordered_set>

#include "describe.h"

namespace npl {

void CaptureJoins::add(Block* b, uint64_t capture, std::vector<GraphNode> markers) {
    waiting_.push_back(Waiting{b, capture, std::move(markers)});
}

bool CaptureJoins::any_on(Stream stream) const {
    return std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.block->stream == stream; });
}

std::vector<uint64_t> CaptureJoins::captures() const {
    std::vector<uint64_t> ids;
    for (const Waiting& w : waiting_) {
        if (std::find(ids.begin(), ids.end(), w.capture) == ids.end()) ids.push_back(w.capture);
    }
    return ids;
}

std::vector<Block*> CaptureJoins::take_pool(int device, PoolId id) {
    std::vector<Block*> taken;
    auto keep = waiting_.begin();
    for (Waiting& w : waiting_) {
        if (w.block->device == device && w.block->pool->id == id) {
            taken.push_back(w.block);
        } else {
            if (&*keep != &w) *keep = std::move(w);
            ++keep;
        }
    }
    waiting_.erase(keep, waiting_.end());
    return taken;
}

void CaptureJoins::check(const std::function<void(const std::string&)>& fail, size_t awaiting_walked) const {
    std::unordered_set<const Block*> seen;
    for (const Waiting& w : waiting_) {
        const Block* b = w.block;
        if (b->state != BlockState::awaiting_join) fail(where(b) + " waits for a capture's join but is not awaiting_join");
        if (!seen.insert(b).second) fail(where(b) + " waits for a capture's join twice");
        if (w.markers.empty() || w.capture == 0) fail(where(b) + " waits for a capture's join with no marker or capture");
        if (b->pool == nullptr || b->pool->id.eager()) fail(where(b) + " of the eager pool waits for a capture's join");
        if (!b->held.empty()) fail(where(b) + " waits for a capture's join but holds events");
        if (b->uses.empty()) fail(where(b) + " waits for a capture's join without recorded streams");
    }
    if (waiting_.size() != awaiting_walked) fail("the capture-join list does not hold exactly the awaiting_join blocks");
}

}  // namespace npl
