// The caching allocator: blocks cached per (device, stream), carved from
// segments, with per-block recorded streams and use events.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "findings.h"
#include "runtime.h"

struct npl_stats;

namespace npl {

enum class BlockState : uint8_t { live, pending, cached };
enum class Policy : int { poll = 0, stream_wait = 1 };

// What a block knows about one stream other than its allocation stream.
struct StreamUse {
    Stream stream = nullptr;
    Event event = nullptr;  // the one live use event on this stream, if any
    bool recorded = false;  // record_stream: record an event here at the free
    bool noted = false;     // `event` witnesses a use nothing recorded
};

struct Segment;
struct Block;

struct BlockBySize {
    bool operator()(const Block* a, const Block* b) const;
};
using Pool = std::set<Block*, BlockBySize>;

struct Block {
    char* ptr = nullptr;
    size_t size = 0;       // rounded size
    size_t requested = 0;  // what the live owner asked for
    int device = 0;
    Stream stream = nullptr;  // allocation stream: the pool it belongs to
    bool small = false;
    Segment* segment = nullptr;
    Pool* pool = nullptr;   // where it is cached: its (device, stream, small) pool
    Block* prev = nullptr;  // neighbours inside the segment
    Block* next = nullptr;
    BlockState state = BlockState::cached;
    std::vector<StreamUse> uses;
    std::vector<Event> held;  // events to wait for before the memory is reused
};

struct Segment {
    char* base = nullptr;
    size_t size = 0;
    int device = 0;
    Stream stream = nullptr;
    bool small = false;
    Block* first = nullptr;
};

inline bool BlockBySize::operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
}

struct PoolKey {
    int device;
    Stream stream;
    bool small;
    bool operator==(const PoolKey& o) const {
        return device == o.device && stream == o.stream && small == o.small;
    }
};

struct PoolKeyHash {
    size_t operator()(const PoolKey& k) const {
        return std::hash<const void*>()(k.stream) ^ (static_cast<size_t>(k.device) << 1) ^ (k.small ? 0x9e37 : 0);
    }
};

class CachingAllocator {
   public:
    explicit CachingAllocator(FindingQueue& findings) : findings_(findings) {}
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;

    // Chooses the runtime; fails (returns false) while segments are held.
    bool set_runtime(const Runtime* runtime, std::string* why);
    const Runtime* runtime() const;

    void* allocate(ssize_t size, int device, Stream stream);
    void free(void* ptr, ssize_t size);
    int record_stream(void* ptr, Stream stream);
    int erase_stream(void* ptr, Stream stream);
    int record_use(void* ptr, Stream stream, bool noted);

    void set_policy(Policy p);
    Policy policy() const;
    void process_events();
    void empty_cache();
    void stats(npl_stats* out) const;
    void reset_peak();
    std::string snapshot_json() const;
    void reset();

   private:
    // All private members run with mu_ held.
    bool ensure_runtime();
    bool capturing(Stream stream);
    Block* take_cached(const PoolKey& key, size_t size, Stream stream);
    Block* new_segment(const PoolKey& key, size_t size, Stream stream);
    void split(Block* b, size_t size);
    void cache_block(Block* b);
    void pool_insert(Block* b);
    void pool_erase(Block* b);
    Block* new_block();
    void recycle_block(Block* b);
    StreamUse& use_of(Block* b, Stream stream);
    Block* live_block(void* ptr, const char* op, Stream stream);
    bool freed_block_start(void* ptr) const;
    Event acquire_event(int device);
    void release_event(Event e, int device);
    bool record(Event e, Stream stream, Block* b, const char* op);
    bool drop_fired_events(Block* b);
    void process_events_locked();
    void release_free_segments();
    void destroy_event(Event e, int device);
    void runtime_error(const char* op, int code, const Block* b, Stream stream);
    void report(Finding f);
    void note_active_peak();

    FindingQueue& findings_;
    mutable std::mutex mu_;
    const Runtime* rt_ = nullptr;
    Policy policy_ = Policy::poll;
    std::unordered_map<PoolKey, Pool, PoolKeyHash> pools_;  // nodes are stable: blocks point into it
    std::unordered_map<void*, Block*> live_;
    std::map<char*, Segment*> segments_;
    std::vector<Block*> pending_;
    std::vector<Block*> spare_blocks_;
    std::unordered_map<int, std::vector<Event>> event_pool_;

    struct Counters {
        uint64_t live_bytes = 0, live_blocks = 0, cached_bytes = 0, cached_blocks = 0;
        uint64_t pending_bytes = 0, pending_blocks = 0, reserved_bytes = 0, segments = 0;
        uint64_t peak_live_bytes = 0, peak_reserved_bytes = 0, peak_active_bytes = 0, requested_live_bytes = 0;
        uint64_t allocations = 0, frees = 0, cache_hits = 0, segment_allocs = 0, segment_frees = 0;
        uint64_t oom_retries = 0, oom_failures = 0, events_created = 0, events_recorded = 0;
        uint64_t stream_waits = 0, deferred_frees = 0;
    } c_;
};

}  // namespace npl
