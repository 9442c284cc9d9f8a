// Which nodes of a capture's graph lie at or before a capturing stream's
// frontier (are its ancestors, or in it): what decides that a block freed
// during the capture may be reused on that stream (capture_joins.h).
//
// Per (capture, stream) it keeps the nodes found so far and walks the graph
// backwards (node_parents) only from nodes not seen before, so a capture's
// graph is walked about once per stream however many allocations ask.
// That relies on a stream's frontier only moving forward: each new
// frontier descends from the previous one, as captured work, event records
// and waits make it (user code replacing a stream's capture dependencies
// with cudaStreamUpdateCaptureDependencies could break it; torch's own
// implementation makes the same assumption).
//
// No lock of its own (the allocator's mutex guards it); its only runtime
// calls are the topology's, which are legal during a capture.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime.h"

namespace npl {

class CaptureReach {
   public:
    // Adds every ancestor of `frontier` (and the frontier) to what is known
    // to lie at or before (capture, stream)'s frontier.  False when a
    // node_parents call failed (`code`: the runtime's); what was known of
    // (capture, stream) is then forgotten (never a node half walked).
    bool advance(const CaptureTopology& topology, uint64_t capture, Stream stream,
                 const std::vector<GraphNode>& frontier, int* code);
    bool reached(uint64_t capture, Stream stream, GraphNode node) const;
    void keep_only(const std::vector<uint64_t>& captures);  // forgets the other captures' nodes
    void clear() { seen_.clear(); }
    size_t captures() const;  // captures it knows nodes of

   private:
    std::map<std::pair<uint64_t, Stream>, std::unordered_set<GraphNode>> seen_;
};

}  // namespace npl
