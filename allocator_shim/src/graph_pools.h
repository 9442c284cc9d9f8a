// Graph-capture private pools, as torch's caching allocator keeps them.
//
// Between begin(device, id, filter) and end(device, id), allocations on
// `device` from a stream the filter accepts come from pool `id` (torch's
// MempoolId_t; each torch.cuda.graph capture, or cudagraph tree, has one).
// Blocks of a private pool return to it when freed, whenever that is, and
// are never handed to an eager allocation; an eager block is never handed
// into a capture.  Pools are reference-counted: each begin takes a
// reference, release() drops one; a pool without references gives its
// free segments back (empty_cache, or as its last blocks are freed).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "block.h"

namespace npl {

using StreamFilter = std::function<bool(Stream)>;

class GraphPools {
   public:
    void begin(int device, PoolId id, StreamFilter filter);
    bool end(int device, PoolId id);  // false: no capture into it was underway
    // Drops one reference; true when the pool has none left.
    bool release(int device, PoolId id);
    bool known(int device, PoolId id) const;

    // The private pool an allocation on (device, stream) goes to, if a
    // capture on `device` claims the stream; else the eager pool.
    PoolId pool_for(int device, Stream stream) const;
    bool any_capture_underway() const { return !captures_.empty(); }
    bool freeable(int device, PoolId id) const;  // no references left
    void clear();

   private:
    struct Capture {
        int device;
        PoolId id;
        StreamFilter filter;
    };
    struct Refs {
        int device;
        PoolId id;
        int count;
    };
    Refs* refs(int device, PoolId id);
    const Refs* refs(int device, PoolId id) const;

    std::vector<Capture> captures_;  // underway, in begin order
    std::vector<Refs> refs_;
};

}  // namespace npl
