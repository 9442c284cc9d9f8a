#include "capture_reach.h"

#include <algorithm>
#include <iterator>
#include <set>

namespace npl {

bool CaptureReach::advance(const CaptureTopology& topology, uint64_t capture, Stream stream,
                           const std::vector<GraphNode>& frontier, int* code) {
    std::unordered_set<GraphNode>& seen = seen_[{capture, stream}];
    std::vector<GraphNode> to_visit(frontier.begin(), frontier.end());
    std::vector<GraphNode> parents;
    while (!to_visit.empty()) {
        GraphNode node = to_visit.back();
        to_visit.pop_back();
        if (seen.count(node) != 0) continue;  // it and its ancestors are known already
        if (topology.node_parents(node, &parents, code) != Status::ok) {
            seen_.erase({capture, stream});  // half walked: the next call walks again from scratch
            return false;
        }
        seen.insert(node);
        to_visit.insert(to_visit.end(), parents.begin(), parents.end());
    }
    return true;
}

bool CaptureReach::reached(uint64_t capture, Stream stream, GraphNode node) const {
    auto it = seen_.find({capture, stream});
    return it != seen_.end() && it->second.count(node) != 0;
}

void CaptureReach::keep_only(const std::vector<uint64_t>& captures) {
    for (auto it = seen_.begin(); it != seen_.end();) {
        bool kept = std::find(captures.begin(), captures.end(), it->first.first) != captures.end();
        it = kept ? std::next(it) : seen_.erase(it);
    }
}

size_t CaptureReach::captures() const {
    std::set<uint64_t> ids;
    for (const auto& entry : seen_) ids.insert(entry.first.first);
    return ids.size();
}

}  // namespace npl
