// The caching allocator: blocks cached per (device, stream, size class,
// graph pool), carved from segments, with per-block recorded streams and
// use events.  Its invariants are stated at the top of caching_allocator.cpp.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "npu_lifetime_shim.h"
#include "address_book.h"
#include "allocator_lock.h"
#include "block.h"
#include "capture_joins.h"
#include "capture_reach.h"
#include "event_queues.h"
#include "findings.h"
#include "graph_pools.h"
#include "pools.h"
#include "quarantine.h"
#include "segments.h"
#include "runtime.h"
#include "stats.h"
#include "trace.h"

namespace npl {

// Whether a graph pool may be checkpointed or restored (npl_prepare_pool_checkpoint).
enum class PoolCheckpointable { yes = 0, freeable = 1, unknown = 2 };


// On a function of the allocation or free path that a cached pair runs:
// inlined where caching_allocator.cpp calls it (an out-of-line copy serves
// the other files).
// (GCC's -Wattributes warns that such a non-inline function "might not be
// inlinable": it is, in this file; caching_allocator.cpp silences it.)
#define NPL_HOT __attribute__((always_inline))

enum class Policy : int {
    poll = 0,         // a freed block waiting on events is reusable once they all fired (polled)
    stream_wait = 1,  // reusable at once; the allocating stream waits GPU-side on its events
    lazy_wait = 2,    // record_use events: reusable at once, waited GPU-side only if still pending
                      // at reuse; record_stream / note_use events: held until fired (torch's rule)
};

// Cross-stream reuse's modes (npl_set_cross_stream_reuse's values).
enum class CrossStream { off = 0, always = 1, idle = 2 };

class CachingAllocator {
   public:
    explicit CachingAllocator(FindingQueue& findings) : findings_(findings) {}
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;

    // Chooses the runtime; fails (returns false) while segments are held.
    bool set_runtime(const Runtime* runtime, std::string* why);
    const Runtime* runtime() const;
    bool holds_memory() const;

    void* allocate(ssize_t size, int device, Stream stream);
    void free(void* ptr, ssize_t size, int device, Stream stream);
    // Whether that free would free a block (no effect; free still reports what it refuses).
    bool would_free(void* ptr, ssize_t size, int device, Stream stream);
    // `ptr` may point anywhere inside a live block; `stream_device` is the
    // stream's device when the caller knows it, else -1.
    int record_stream(void* ptr, Stream stream, int stream_device);
    int erase_stream(void* ptr, Stream stream);
    int record_use(void* ptr, Stream stream, int stream_device, bool noted);

    void set_policy(Policy p);
    Policy policy() const;
    // Expandable segments (expandable_segments.cpp): new eager-pool memory
    // grows one segment per (device, stream, size class) by mapping pages.
    // Takes effect for the next allocations; segments already made stay.
    void set_expandable_segments(bool on);
    bool expandable_segments() const;
    // torch's graph_capture_record_stream_reuse (off by default): a block
    // freed during a capture with recorded streams is reused inside it once
    // the capture's graph joins them (allocator_capture_reuse.cpp).  Returns
    // false when it is on but the selected runtime can't tell the capture's
    // topology (such frees then wait for the capture's end, as when off).
    bool set_capture_reuse(bool on);
    bool capture_reuse() const;
    // The oracle mode (stream_ordered.cpp): each eager block is its own
    // stream-ordered allocation, given back with a stream-ordered free on its
    // stream once the shim says it is reusable, after that stream waited on
    // its events; compute-sanitizer then checks every reuse decision.  Only
    // while the allocator holds no memory; false (and `why`) otherwise or
    // where the runtime has no stream-ordered memory.
    bool set_stream_ordered(bool on, std::string* why);
    bool stream_ordered() const;
    // Cross-stream reuse (off by default here; cross_stream.cpp): an eager
    // allocation its own stream's pool can't serve takes a whole free segment
    // of another stream's pool: in `idle` mode only once that stream's work
    // and the block's events are done (no GPU-side wait added), in `always`
    // mode behind GPU-side waits on them; both take one with waits before
    // the out-of-memory path gives cached memory back.
    void set_cross_stream_reuse(CrossStream mode);
    CrossStream cross_stream_reuse() const;
    // Captures are announced (off by default; allocator_graphs.cpp): every
    // capture on these streams begins with begin_allocate_to_pool and ends
    // with end_allocate_to_pool (torch's CUDA graphs do), so an allocation
    // polls events whenever no pool is open, as torch's allocator does,
    // without asking the runtime whether its stream captures.
    void set_captures_announced(bool on);
    bool captures_announced() const;
    // Debug mode: freed blocks are poisoned and quarantined (0: off).
    void set_debug(bool enabled, size_t quarantine_bytes);
    bool debug() const;
    void init(int device_count);
    bool set_memory_fraction(double fraction, int device);
    double memory_fraction(int device) const;
    void* base_allocation(void* ptr, size_t* size) const;

    // Graph capture (see graph_pools.h).
    // `stream`: the stream the capture is begun for, if the caller knows it.
    void begin_allocate_to_pool(int device, PoolId id, StreamFilter filter, Stream stream = nullptr);
    void end_allocate_to_pool(int device, PoolId id);
    void release_pool(int device, PoolId id);
    std::vector<void*> pool_live_allocations(int device, PoolId id) const;
    void create_or_incref_pool(int device, PoolId id);
    void set_pool_allocator(int device, PoolId id, SegmentSource source);
    // torch.cuda.MemPool(use_on_oom=True / no_split=True); see graph_pools.h.
    void set_pool_use_on_oom(int device, PoolId id, bool on);
    void set_pool_no_split(int device, PoolId id);
    int pool_use_count(int device, PoolId id) const;
    // Before a pool checkpoint (torch's getCheckpointState): runs the
    // deferred frees, then says whether the pool can be checkpointed.
    PoolCheckpointable prepare_pool_checkpoint(int device, PoolId id);
    // Every block, segments in address order (npl_block_records).
    std::vector<npl_block_record> block_records() const;

    // The calling thread's next allocation takes the cached memory at `ptr`.
    void claim_next(void* ptr);

    void process_events();
    // torch's memory history's allocator-side actions (npl_set_history_hook).
    void set_history_hook(npl_history_hook hook, void* ctx);
    // {0, 0}: every fully free segment; another id: that graph pool's, on `device` (< 0: every device).
    void empty_cache(PoolId id = PoolId{}, int device = -1);
    void stats(int device, uint64_t* out) const;
    void reset_peak(int device);
    void reset_accumulated(int device);
    std::string snapshot_json() const;
    void configure_trace(bool enabled, size_t capacity);
    std::string drain_trace_json();
    void reset();

    // The invariants (stated in caching_allocator.cpp) that do not hold now,
    // in words; empty when all hold.  Reads only (invariants.cpp).
    std::vector<std::string> invariant_violations() const;
    // Reports each violation as an `invariant_violation` finding about `op`.
    void check_invariants(const char* op);

    // pthread_atfork: the allocator's state is consistent in the child.
    void lock_for_fork();
    void unlock_after_fork();

   private:
    // Holds mu_ for an entry point, after counting a repeated pair's
    // statistics (pair_) and merging the block the last free left unmerged
    // (unmerged_): no entry point but allocate and free (which take mu_
    // themselves) ever sees either.
    class Locked {
       public:
        explicit Locked(const CachingAllocator* a) : a_(const_cast<CachingAllocator*>(a)) {
            a_->mu_.lock();
            if (__builtin_expect(a_->unmerged_ == nullptr && a_->pair_ == nullptr, 1)) return;
            try {
                a_->settle_pair();
                if (a_->unmerged_ != nullptr) a_->merge_unmerged();
            } catch (...) {
                a_->mu_.unlock();
                throw;
            }
        }
        ~Locked() { a_->mu_.unlock(); }
        Locked(const Locked&) = delete;
        Locked& operator=(const Locked&) = delete;

       private:
        CachingAllocator* a_;
    };

    // All private members run with mu_ held.
    std::vector<std::string> invariant_violations_locked() const;
    bool ensure_runtime();
    DeviceStats& dstats(int device) {
        auto i = static_cast<size_t>(device < 0 ? 0 : device);
        if (__builtin_expect(i < stats_.size(), 1)) return stats_[i];
        stats_.resize(i + 1);
        return stats_[i];
    }
    bool capturing(Stream stream);
    // A capture on `stream` that no begin_allocate_to_pool announced: never
    // when captures are announced (no runtime call), else the runtime's answer.
    bool unannounced_capture(Stream stream) { return !captures_announced_ && capturing(stream); }
    // No event may be queried, recorded or waited on, and no segment freed:
    // a pool is open (a capture may be underway), unless the out-of-memory
    // path found that no capture really is on its device (thawed_).
    bool queries_frozen() const { return graph_pools_.any_capture_underway() && !thawed_; }
    bool real_capture_on(int device);
    int device_of(Stream stream, int hint, int fallback);

    // allocation
    Pool* pool(const PoolKey& key);  // made on first use (new_pool)
    Pool* new_pool(const PoolKey& key);
    Block* take_cached(Pool* pool, size_t size, Stream stream);
    void take(Block* b, size_t size);
    bool wait_for_held(Block* b, Stream stream);
    Block* new_segment(Pool* pool, size_t size, Stream stream);
    Block* try_new_segment(Pool* pool, size_t size, Status* status, int* code);
    Block* out_of_memory_path(Pool* pool, size_t size, Stream stream, Status first, int code);
    Block* take_from_use_on_oom_pools(const Pool* eager, size_t size, Stream stream);
    Status device_malloc(void** ptr, size_t bytes, int device, int* code);
    bool over_fraction(int device, size_t bytes, int* code);
    Status segment_malloc(const SegmentSource& source, void** ptr, size_t bytes, int device, Stream stream, int* code);
    Status segment_free(const Segment* seg, int* code);
    void split(Block* b, size_t size);
    Block* split_off(Block* b, size_t size);
    void mark_live(Block* b, size_t requested);
    void hand_out(Block* b);
    void count_live(const Block* b);
    void* claim(size_t rounded, size_t requested, int device, Stream stream);

    // graph_capture_record_stream_reuse (allocator_capture_reuse.cpp)
    const CaptureTopology* topology();  // nullptr: none (a finding says so, once)
    bool await_join(Block* b);
    bool mark_capture_use(StreamUse& u);
    bool capture_markers(const CaptureTopology& topo, const Block* b, uint64_t* capture,
                         std::vector<GraphNode>* markers);
    void reclaim_joined(Stream stream);
    void end_joins(int device, PoolId id);

    // free
    enum class FreeKind { owner, stale, wrong_size, wrong_stream };
    FreeKind classify_free(const Address* a, const Block* b, ssize_t size, int device, Stream stream) const;
    bool stale_free(FreeKind kind, ssize_t size, Stream stream, Block* b);
    void report_bad_free(void* ptr, ssize_t size, int device, Stream stream);
    bool needs_capture_deferral(const Block* b);
    void finish_free(Block* b);
    void settle(Block* b);  // a freed block with its held events decided: pending, cached or quarantined
    void release(Block* b);  // really free: quarantine (debug) or its pool
    void cache_block(Block* b);
    SegmentSource ordered_source() const;
    Block* adopt_foreign(Pool* p, size_t size, Stream stream, bool may_wait);
    bool events_fired(const Block* b);
    bool wait_for_stream(Block* b, Stream stream);
    Block* foreign_segment(const Pool* p, size_t size);
    void release_ordered(Block* b);
    void absorb(Block* b, Block* n);
    // The cached pair's shortcut (unmerged_) and its uncounted repeats (pair_)
    bool leave_unmerged(Block* b);
    Block* take_unmerged(int device, Stream stream, size_t rounded);
    void count_take_back(const Block* b);
    void merge_unmerged();
    bool repeat_pair_free(Address* a, Block* b, ssize_t size, int device, Stream stream);
    void settle_pair();
    void count_pair_repeats(const Block* b, uint64_t repeats);
    void pool_insert(Block* b);
    void pool_erase(Block* b);
    template <int Sign>
    NPL_HOT void count_cached(const Block* b);
    void uncount_plain_split(const Block* like, size_t size);
    Block* new_block();
    void recycle_block(Block* b);
    StreamUse& use_of(Block* b, Stream stream);
    Block* live_block(void* ptr, const char* op, Stream stream);
    Block* block_containing(void* ptr) const;  // a live block, else nullptr

    // events
    Event acquire_event(int device);  // an idle event, else a new one
    bool record(Event e, Stream stream, Block* b, const char* op);
    void hold(Block* b, const HeldEvent& h);  // keeps one event per stream: the later
    bool gates(const HeldEvent& h) const;  // must it fire before the block enters its pool?
    bool ready_for_pool(const Block* b) const;
    void regate_pending();
    bool drop_fired_events(Block* b);
    void drop_fired_events_of_cached(int device);
    void drop_fired_events_of_pool(int device, PoolId id);
    void synchronize_held_events(int device);
    void process_events_locked();
    void process_deferred();
    void destroy_event(Event e, int device);

    // debug mode
    void quarantine(Block* b);
    void trim_quarantine(bool all);
    void check_poison(Block* b);

    // expandable segments (expandable_segments.cpp)
    const VirtualMemory* virtual_memory();  // nullptr (warned once) when the runtime has none
    void refuse_virtual_memory(const std::string& why);
    void refused(Status* status, int code, const char* step);
    bool grows(const Pool* p);
    Block* try_grow(Pool* p, size_t size, Status* status, int* code);
    Segment* first_pages(Pool* p, size_t bytes, Status* status, int* code);
    Block* more_pages(Segment* seg, size_t bytes, Status* status, int* code);
    void count_mapped(const Segment* seg, int64_t bytes);
    bool shrink_expandable(Segment* seg);
    bool stream_idle(const Segment* seg);
    bool forget_expansion(Segment* seg);
    bool hidden_expandable(const Block* b) const {  // the setting is off: torch leaves such blocks alone
        return expansions_ != 0 && !expandable_ && b->segment->expansion != nullptr;
    }

    // segments
    void release_free_segments(int device, bool any_device);
    void release_pool_segments(int device, PoolId id);
    bool release_segment(Segment* seg);  // true: its memory went back (the caller removes it)
    bool segment_releasable(const Segment* seg) const;

    void runtime_error(const char* op, int code, const Block* b, Stream stream);
    static Finding about(const Block* b, const char* kind, const char* op);
    void report(Finding f);
    void unknown_pool(const char* op, int device, PoolId id);
    void trace(TraceKind kind, const Block* b, Stream stream, const void* ptr = nullptr) {
        if (__builtin_expect(trace_.enabled(), 0)) trace_add(kind, b, stream, ptr);
    }
    void trace_add(TraceKind kind, const Block* b, Stream stream, const void* ptr);
    void history(npl_history_action action, const void* ptr, size_t size, int device, Stream stream, PoolId id) {
        if (__builtin_expect(history_hook_ != nullptr, 0)) {
            history_hook_(action, const_cast<void*>(ptr), size, device, stream, id.first, id.second, history_ctx_);
        }
    }
    void history_segment(npl_history_action action, const Segment* seg, const void* ptr, size_t size);
    void note_oom(int device, size_t size, size_t rounded, Stream stream, int code, const char* why);

    FindingQueue& findings_;
    mutable AllocatorLock mu_;  // allocator_lock.h
    const Runtime* rt_ = nullptr;
    Policy policy_ = Policy::lazy_wait;
    Pools pools_;  // the free-block pools (pools.h)
    AddressBook book_;
    Segments segments_;  // by address, each tiled by its blocks
    EventQueues events_;  // idle events, record order, pending blocks' FIFOs, deferred frees
    CaptureJoins joins_;  // blocks freed in a capture waiting for its graph's join
    CaptureReach reach_;  // per capture and stream: the nodes at or before its frontier
    bool capture_reuse_ = false;
    const StreamOrderedMemory* ordered_ = nullptr;  // the oracle mode's calls, while it is on
    CrossStream cross_stream_ = CrossStream::off;
    bool topology_asked_ = false;  // topology_ is the selected runtime's answer
    const CaptureTopology* topology_ = nullptr;
    std::vector<Block*> spare_blocks_;
    std::unordered_map<Stream, int> stream_devices_;
    GraphPools graph_pools_;
    Quarantine quarantine_;
    TraceRing trace_;
    npl_history_hook history_hook_ = nullptr;  // set and called under mu_
    void* history_ctx_ = nullptr;
    std::deque<DeviceStats> stats_;  // a deque: pools keep pointers into it
    std::vector<double> fractions_;  // per device, as torch's: 1 (the default) the whole device, 0 nothing
    static thread_local char* claim_;
    int claims_ = 0;  // threads with a claim pending: the allocation path reads claim_ only then
    // A block the last free cached without merging it into its cached
    // successor (caching_allocator.cpp, "the cached pair"): the statistics already count it
    // merged; the next allocation takes it back if that merge's outcome
    // would be split again right there, else it is merged first.
    Block* unmerged_ = nullptr;
    // The cached pair repeated: pair_ is the block that each repeat takes
    // back from unmerged_ for its last owner's size and leaves unmerged
    // again, with the statistics of neither counted until settle_pair.
    Block* pair_ = nullptr;
    bool pair_live_ = false;     // pair_ is handed out (its take-back is not counted)
    uint64_t pair_repeats_ = 0;  // repeats whose allocated and freed sums are not counted
    bool expandable_ = false;
    bool expandable_warned_ = false;  // the runtime has no virtual memory: said once
    bool vm_refused_ = false;         // ... or it failed at first use: plain segments
    int expansions_ = 0;              // expandable segments now
    bool thawed_ = false;  // the out-of-memory path runs with pools open but no capture on its device
    bool captures_announced_ = false;  // set_captures_announced
    int device_count_ = 0;
};

size_t segment_size_for(size_t size, bool small);

// The message of this thread's last failed allocation ("" if none): each
// NULL for a positive size sets it, out of memory or not.
const std::string& last_oom_message();
void set_last_failure(std::string why);

}  // namespace npl
