// The simulated runtime's graph captures: which capture each stream takes
// part in, the graph each capture builds, and each stream's frontier, as
// CUDA's stream capture builds them.  A stream begins a capture
// (sim::set_capturing) with an empty frontier; work queued on a capturing
// stream (a kernel, a fill) becomes a node that depends on the stream's
// frontier, and is then its frontier; an event recorded on a capturing
// stream takes a copy of its frontier; a stream waiting on such an event
// joins that capture (frontier: the event's nodes) or, already in it, adds
// the event's nodes to its frontier.  Ending a capture (from any of its
// streams) ends it for every stream in it.  Nodes live until clear().
//
// No lock of its own: the simulated runtime's mutex guards it.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "runtime.h"

namespace npl::sim {

class CaptureGraphs {
   public:
    void begin(Stream stream);  // `stream` (not capturing) begins a new capture
    void end(Stream stream);    // the capture `stream` takes part in ends
    bool capturing(Stream stream) const { return members_.count(stream) != 0; }
    void add_node(Stream stream);  // work queued on `stream` (nothing if it does not capture)
    void record(const void* event, Stream stream);  // `event` recorded on `stream`
    // `stream` waits on `event`; false when the event belongs to another
    // capture than the stream's (CUDA's capture isolation error).
    bool wait(Stream stream, const void* event);
    void forget_event(const void* event);
    void info(Stream stream, CaptureInfo* out) const;
    // false for a node this model did not make
    bool parents(GraphNode node, std::vector<GraphNode>* out) const;
    void clear();

   private:
    struct Node {
        uint64_t capture;
        std::vector<Node*> parents;
    };
    struct Member {  // a stream taking part in a capture
        uint64_t capture;
        std::vector<Node*> frontier;
    };
    std::deque<Node> nodes_;  // stable addresses: a node's handle is its address
    std::unordered_map<const Node*, size_t> index_;  // which handles are nodes
    std::unordered_map<Stream, Member> members_;
    std::unordered_map<const void*, Member> recorded_;  // events recorded during a capture
    uint64_t captures_ = 0;
};

}  // namespace npl::sim
