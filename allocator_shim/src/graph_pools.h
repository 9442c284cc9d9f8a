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
//
// An open pool is not necessarily a capture: torch opens one for
// torch.cuda.MemPool/use_mem_pool and for cudagraph trees' warm-up too.  A
// capture records the streams it is known to use (the stream it was begun
// for, if given, and each stream it claimed an allocation of), so the
// allocator can ask the runtime whether one of them really captures.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "block.h"

namespace npl {

using StreamFilter = std::function<bool(Stream)>;

class GraphPools {
   public:
    void begin(int device, PoolId id, StreamFilter filter, Stream stream = nullptr);
    bool end(int device, PoolId id);  // false: no capture into it was underway
    // Drops one reference; true when the pool has none left.
    bool release(int device, PoolId id);
    bool known(int device, PoolId id) const;
    // torch.cuda.MemPool: a reference without a capture (created at one).
    void incref(int device, PoolId id);
    int use_count(int device, PoolId id) const;  // 0 for a pool never opened
    // torch.cuda.MemPool(allocator): where the pool's segments come from.
    void set_source(int device, PoolId id, SegmentSource source);
    SegmentSource source(int device, PoolId id) const;  // the runtime's (empty) by default
    // torch.cuda.MemPool(use_on_oom=True): an eager allocation about to fail
    // may take the pool's cached blocks (torch's MemPool turns it off as it goes).
    void set_use_on_oom(int device, PoolId id, bool on);
    // Such pools of `device` still referenced and not open (a capture or
    // use_mem_pool allocating into one keeps its blocks: torch refuses to
    // lend it then), in the order they were marked.
    std::vector<PoolId> use_on_oom(int device) const;
    bool open(int device, PoolId id) const;  // between a begin and its end
    // torch.cuda.MemPool(no_split=True): the pool's segments are never split.
    void set_no_split(int device, PoolId id);
    bool no_split(int device, PoolId id) const;

    // The private pool an allocation on (device, stream) goes to, if a
    // capture on `device` claims the stream (which it then knows); else the
    // eager pool.
    PoolId pool_for(int device, Stream stream);
    // Whether `pred` holds for a stream known to an open capture on `device`.
    template <typename Pred>
    bool any_stream_on(int device, Pred pred) const {
        for (const Capture& c : captures_) {
            if (c.device != device) continue;
            for (Stream s : c.streams) {
                if (pred(s)) return true;
            }
        }
        return false;
    }
    bool any_capture_underway() const { return !captures_.empty(); }
    bool freeable(int device, PoolId id) const;  // no references left
    void clear();

   private:
    struct Capture {
        int device;
        PoolId id;
        StreamFilter filter;
        std::vector<Stream> streams;  // known to allocate into it
    };
    struct Refs {
        int device;
        PoolId id;
        int count;
        SegmentSource source;
        bool use_on_oom = false;
        bool no_split = false;
        uint64_t use_on_oom_order = 0;  // when it was marked: torch tries such pools in that order
    };
    Refs* refs(int device, PoolId id);
    const Refs* refs(int device, PoolId id) const;

    std::vector<Capture> captures_;  // underway, in begin order
    std::vector<Refs> refs_;
    uint64_t marks_ = 0;  // use_on_oom marks so far
    Refs& refs_or_new(int device, PoolId id);
};

}  // namespace npl
