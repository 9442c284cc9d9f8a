// Blocks, segments and pools: the allocator's data, with no behaviour.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "block_set.h"
#include "npu_lifetime_shim.h"
#include "runtime.h"

namespace npl {

// A graph's private memory pool (torch's MempoolId_t); {0, 0} is the
// eager (default) pool.
struct PoolId {
    uint64_t first = 0, second = 0;
    bool eager() const { return first == 0 && second == 0; }
    bool operator==(const PoolId& o) const { return first == o.first && second == o.second; }
};

enum class BlockState : uint8_t {
    live,         // handed out
    pending,      // freed; held until events that must fire before reuse have fired
    deferred,     // freed during a graph capture; its events are recorded once no capture is underway
    awaiting_join,  // freed during a capture, reusable in it once its graph joins the block's streams
                    // (graph_capture_record_stream_reuse: capture_joins.h)
    quarantined,  // freed, poisoned and held back (debug mode)
    cached,       // in its pool (perhaps carrying use events: reused behind a GPU-side wait)
};

// An event a freed block waits for.  `must_fire`: the block stays out of
// the pool until it has fired (record_stream and note_use events, or any
// event under the poll policy); otherwise the allocating stream waits on it
// GPU-side when the block is reused.
struct HeldEvent {
    Stream stream;
    Event event;
    int device;    // the event's device (its stream's): it returns to that device's pool
    uint64_t seq;  // record order: of two events on one stream the later subsumes
    bool must_fire;
};

// What a live block knows about one stream other than its allocation stream.
struct StreamUse {
    Stream stream = nullptr;
    Event event = nullptr;  // the one live use event on this stream, if any
    int event_device = 0;
    uint64_t seq = 0;
    bool recorded = false;  // record_stream: record an event here at the free
    bool noted = false;     // `event` witnesses a use nothing recorded (the sanitizer saw it)
    // record_use inside a graph capture (no event may be recorded there): the
    // capture it was made in and this stream's frontier at the call, the last
    // captured work that may touch the block (`recorded` is set too, so that
    // outside that capture it is covered as record_stream covers it).
    uint64_t capture = 0;
    std::vector<GraphNode> markers;
};

struct Segment;
struct Block;
struct Expansion;
struct Pool;
struct DeviceStats;

// A block's fields other than its lists: what recycling a block resets
// (the lists are only cleared, keeping their capacity).
struct BlockFields {
    char* ptr = nullptr;
    size_t size = 0;       // rounded size
    size_t requested = 0;  // what the live owner asked for
    int device = 0;
    Stream stream = nullptr;  // allocation stream: the pool it belongs to
    bool small = false;
    uint64_t generation = 0;  // owners of this address, this one included (live blocks)
    Segment* segment = nullptr;
    Pool* pool = nullptr;
    Block* prev = nullptr;  // neighbours inside the segment
    Block* next = nullptr;
    BlockState state = BlockState::cached;
    BlockSet::Slot slot;  // its node in the pool's set, while cached
    uint32_t gates = 0;      // pending: its entries in the per-stream event FIFOs (event_queues.h)
    bool poisoned = false;   // debug mode: filled with the poison when quarantined

    // `*this = BlockFields()` field by field (GCC copies a temporary: twice the stores).
    void reset_fields() {
        static_assert(sizeof(BlockFields) == 112, "a field was added: reset it here");
        ptr = nullptr;
        size = requested = 0;
        device = 0;
        stream = nullptr;
        small = false;
        generation = 0;
        segment = nullptr;
        pool = nullptr;
        prev = next = nullptr;
        state = BlockState::cached;
        slot = BlockSet::Slot();
        gates = 0;
        poisoned = false;
    }
};

struct Block : BlockFields {
    std::vector<StreamUse> uses;
    std::vector<HeldEvent> held;
    std::vector<Stream> last_streams;  // debug mode: the other streams of the last owner

    bool split() const { return prev != nullptr || next != nullptr; }
    bool must_fire() const {
        for (const HeldEvent& h : held) {
            if (h.must_fire) return true;
        }
        return false;
    }
};

// Where a graph pool's segments come from when not from the runtime: the
// allocator of a torch.cuda.MemPool(allocator).
struct SegmentSource {
    npl_segment_alloc_fn alloc = nullptr;  // nullptr: the runtime
    npl_segment_free_fn free = nullptr;
    void* ctx = nullptr;
    bool ordered = false;  // the oracle mode's: one block, freed stream-ordered when reusable
};

struct Segment {
    char* base = nullptr;
    size_t size = 0;
    int device = 0;
    Stream stream = nullptr;
    bool small = false;
    PoolId pool_id;
    Block* first = nullptr;
    SegmentSource source;  // kept with the segment: it outlives its pool
    // An expandable segment's address range (expansion.h; its `size` is the
    // mapped part); nullptr for a plain segment.  Owned: released with it.
    Expansion* expansion = nullptr;
    Block* last = nullptr;  // its last block: an expandable segment grows and shrinks there (O(1))
};

// The cached blocks of one (device, stream, size class, graph pool).
struct Pool {
    int device = 0;
    Stream stream = nullptr;
    bool small = false;
    PoolId id;
    bool no_split = false;  // torch.cuda.MemPool(no_split=True): each block is its whole segment
    DeviceStats* stats = nullptr;  // its device's
    Segment* expandable = nullptr;  // the segment it grows (expandable segments), if any
    BlockSet blocks;
};

struct PoolKey {
    int device;
    Stream stream;
    bool small;
    PoolId id;
    bool operator==(const PoolKey& o) const {
        return device == o.device && stream == o.stream && small == o.small && id == o.id;
    }
};

struct PoolKeyHash {
    size_t operator()(const PoolKey& k) const {
        size_t h = std::hash<const void*>()(k.stream) ^ (static_cast<size_t>(k.device) << 1) ^ (k.small ? 0x9e37 : 0);
        return h ^ (k.id.first * 0x9e3779b97f4a7c15ull) ^ (k.id.second << 7);
    }
};

}  // namespace npl

#include "block_set_inline.h"  // BlockSet's operations need Block
