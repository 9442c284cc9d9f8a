// The caching allocator: allocation, free, and the lifetime calls.
//
// ---- Invariants ----------------------------------------------------------
//
// Memory.  Segments come from the runtime (cudaMalloc / aclrtMalloc / host
// memory) and are carved into blocks, a doubly linked list per segment that
// covers it exactly (segments.h, which alone links blocks into a segment).  Requests round up to 512 B; up to 1 MiB they share
// 2 MiB segments (the small pool), 1-10 MiB requests carve 20 MiB segments,
// larger ones get their own segment rounded to 2 MiB.  A segment belongs to
// one (device, stream, size class, graph pool): blocks never move between
// streams, so a block handed out again on its stream is ordered after
// everything that stream did before, and never between the eager pool and
// a graph's private pool.  A pool's cached blocks sit in a BlockSet ordered
// by (size, address) (pools.h owns the pools and states their invariants); a cached block's size and address change only while
// it is out of the set, or as the newcomer in BlockSet::replace (the order
// never sees a key change under it).
//
// Block states (block.h) and transitions:
//   cached -> live            allocation (best fit in its pool; the rest of
//                             the block is split off when worth it)
//   live -> deferred          free during a graph capture of a block with
//                             recorded streams (no event may be recorded now)
//                             or noted uses (none may be queried now);
//                             or a recorded stream got no event (the runtime
//                             failed) and the host could not wait for it:
//                             retried, never reusable before
//   live -> awaiting_join     the same free, when the block is its capture's
//                             pool's, has no use event, and its stream and
//                             every recorded stream capture into one graph:
//                             each recorded stream marked by a record_use in
//                             that capture, or any with
//                             graph_capture_record_stream_reuse on
//                             (capture_joins.h)
//   awaiting_join -> cached   an allocation on its stream in that capture
//                             finds every marker (those streams' frontiers at
//                             the free) at or before the stream's frontier:
//                             the graph orders the old uses before new work
//   awaiting_join -> deferred its pool's capture ends first
//   live | deferred -> pending | cached | quarantined
//                             free: recorded streams get an event recorded
//                             at the free, record_use events are kept (one
//                             per stream: the later record subsumes), a noted
//                             unrecorded use still queued is a finding.  Then:
//                             pending while an event that must fire before
//                             reuse has not (poll: every event; lazy_wait:
//                             record_stream and note_use events; stream_wait:
//                             none; debug mode: every event); otherwise
//                             really free: quarantined (debug mode, eager
//                             pool) or cached, carrying its remaining events
//   pending -> cached | quarantined   its must-fire events fired (polled)
//   quarantined -> cached     FIFO overflow, out of memory or empty_cache,
//                             after checking the poison is intact
// A cached block carrying events is handed out only after the allocating
// stream was made to wait on each one still pending (GPU-side; fired ones
// are dropped) and its events are then released: the part handed out waits,
// the split-off remainder stays on the same stream behind that wait and
// never waits again.  Merging two cached neighbours unions their events,
// keeping one event per stream (the later record).  So every block holds at
// most one event per stream, live or freed.
//
// Events.  Recorded by record_use (at the call), at the free for recorded
// streams, and by note_use (the sanitizer's witness of an unrecorded use).
// Created on the device of the stream they are recorded on, pooled per
// device.  A runtime failure never makes a block reusable early: a free
// whose event can't be recorded waits for the stream on the host, else stays
// deferred and is retried; record_use without an event falls back to
// record_stream.  A pending block waits in the FIFO of each stream it holds
// a gating event of (EventQueues, kept in record order); polling pops each
// FIFO's head while it has fired and stops at the first that has not, and a
// block leaves when its last gate fired.  Queried only when no graph capture
// is underway (torch forbids event queries during capture): pending blocks
// are polled at allocation, at free of a block with uses, on
// npl_process_events and on the out-of-memory path, never during a capture.
// An event recorded during a capture would be captured into the graph, so
// none is: record_use on a capturing stream marks the use with the stream's
// place in the capture's graph instead (a free in that capture waits for the
// graph to join it: capture_joins.h; anywhere else it is covered as
// record_stream covers it, by an event at the free), and a free during a
// capture that must record an event or ask whether a noted use finished is
// deferred until no capture is underway.  empty_cache first waits (host) for every freed block's events.
//
// Graph captures (graph_pools.h).  Between begin_allocate_to_pool and
// end_allocate_to_pool, allocations from the streams the capture claims go
// to its private pool; private blocks return to that pool whenever freed and
// are never handed to eager allocations; eager cached blocks are never
// handed into a capture (a claim included: it must match the allocation's
// device, stream and, in a capture, pool).  Opening a pool drops the fired
// events of its cached blocks (the capture could not take them).  A private
// pool's free segments, and only its own, go back to the runtime once the
// pool has no references (release_pool, then as its blocks are freed).
//
// Out of memory (oom.cpp).  Before failing: process events and search the
// pool again, drop fired events from cached blocks, release free segments
// and retry; then wait on every pending event (host), search again, release
// and retry; in debug mode, empty the quarantine.  During a real capture on
// the device (the runtime says a stream it uses captures) nothing beyond
// asking the runtime again; an open pool without a capture (MemPool,
// warm-up) or a capture on another device does not freeze it.  The memory
// fraction limits reserved bytes per device.  A failure returns NULL with an
// out_of_memory finding and sets the thread's last_oom_message() (the torch
// bridge raises it); every other NULL sets its own reason there.
//
// These invariants are checked by invariants.cpp (npl_check_invariants),
// after every step of the stress and property tests, and after every entry
// point in a build with -DNPL_CHECK_INVARIANTS.
//
// Locking.  One mutex, mu_ (allocator_lock.h), guards every block,
// segment, pool, event, statistic, the address book, the event queues,
// graph pools, quarantine and trace (none of those classes has a lock of
// its own).  Runtime
// calls happen under it (as in torch's allocator).  The findings queue has
// its own lock, taken after mu_.  No callback into the caller runs under
// mu_ (the sanitizer's hooks run in exports.cpp, outside it).  Every entry
// point but allocate and free takes it through Locked, which first counts
// the statistics of repeated pairs and merges the block the last free may
// have left unmerged (see "the cached pair" and "the cached pair
// repeated"): the invariants above hold whenever any other code looks.
// ---------------------------------------------------------------------------
#include "caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "json.h"

#pragma GCC diagnostic ignored "-Wattributes"  // NPL_HOT (caching_allocator.h)

namespace npl {

namespace {

constexpr size_t kRound = 512;
constexpr size_t kSmallLimit = 1 << 20;
constexpr size_t kSmallSegment = 2 << 20;
constexpr size_t kMidLimit = 10 << 20;
constexpr size_t kMidSegment = 20 << 20;
constexpr size_t kLargeRound = 2 << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The cached pair's block `b` and its cached successor are not the whole
// segment: merged, they stay an inactive split block (else they are the
// whole segment, which counts as no split at all).
bool pair_in_a_larger_split(const Block* b) { return b->prev != nullptr || b->next->next != nullptr; }

std::string hex_address(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return buf;
}

bool worth_splitting(const Block* b, size_t size) {
    if (b->pool->no_split) return false;
    size_t rest = b->size - size;
    return b->small || b->segment->expansion != nullptr ? rest >= kRound : rest > kSmallLimit;
}

// Counted in inactive_split: a split block of a plain segment (torch leaves
// expandable segments out: their free pages can always go back).
bool counts_as_split(const Block* b) { return b->split() && b->segment->expansion == nullptr; }

}  // namespace

constexpr uint64_t kOneExbibyte = 1ull << 60;

size_t segment_size_for(size_t size, bool small) {
    if (small) return kSmallSegment;
    return size < kMidLimit ? kMidSegment : round_up(size, kLargeRound);
}

bool CachingAllocator::set_runtime(const Runtime* runtime, std::string* why) {
    Locked lock(this);
    if (!segments_.empty() && runtime != rt_) {
        *why = "the runtime can't change while the allocator holds memory";
        return false;
    }
    rt_ = runtime;
    topology_asked_ = false;
    return true;
}

const Runtime* CachingAllocator::runtime() const {
    Locked lock(this);
    return rt_;
}

bool CachingAllocator::holds_memory() const {
    Locked lock(this);
    return !segments_.empty();
}

void CachingAllocator::set_policy(Policy p) {
    Locked lock(this);
    if (p == policy_) return;
    policy_ = p;
    regate_pending();
}

Policy CachingAllocator::policy() const {
    Locked lock(this);
    return policy_;
}

void CachingAllocator::init(int device_count) {
    Locked lock(this);
    device_count_ = device_count;
}

bool CachingAllocator::ensure_runtime() {
    if (rt_ != nullptr) return true;
    std::string why;
    if (library_loaded("libcudart", nullptr)) rt_ = cuda_runtime(&why);
    if (rt_ == nullptr && library_loaded("libascendcl", nullptr)) rt_ = acl_runtime(nullptr, &why);
    if (rt_ == nullptr) rt_ = sim_runtime();
    return true;
}

bool CachingAllocator::capturing(Stream stream) {
    bool yes = false;
    int code = 0;
    if (rt_->stream_capturing(stream, &yes, &code) != Status::ok) {
        runtime_error("stream_capturing", code, nullptr, stream);
        return true;  // unknown: behave as during capture
    }
    return yes;
}

// The device of `stream`: the caller's hint, the runtime's answer (cached),
// else the current device, else `fallback`.
int CachingAllocator::device_of(Stream stream, int hint, int fallback) {
    if (hint >= 0) return hint;
    auto it = stream_devices_.find(stream);
    if (it != stream_devices_.end()) return it->second;
    int device = -1, code = 0;
    if (rt_->stream_device(stream, &device, &code) == Status::ok) {
        stream_devices_[stream] = device;
        return device;
    }
    if (rt_->current_device(&device, &code) == Status::ok) return device;
    return fallback;
}

void CachingAllocator::report(Finding f) {
    trace(TraceKind::finding, nullptr, const_cast<void*>(f.stream), f.address);
    findings_.push(std::move(f));
}

// A finding about block `b` (its address, size, device, stream, owner).
Finding CachingAllocator::about(const Block* b, const char* kind, const char* op) {
    Finding f;
    f.kind = kind;
    f.op = op;
    f.address = b->ptr;
    f.size = static_cast<int64_t>(b->state == BlockState::live ? b->requested : b->size);
    f.device = b->device;
    f.alloc_stream = b->stream;
    f.generation = b->generation;
    return f;
}

void CachingAllocator::runtime_error(const char* op, int code, const Block* b, Stream stream) {
    Finding f;
    if (b != nullptr) f = about(b, "runtime_error", op);
    f.kind = "runtime_error";
    f.op = op;
    f.code = code;
    f.stream = stream;
    const char* words = rt_ != nullptr ? rt_->error_string(code) : nullptr;
    if (words != nullptr && *words) f.detail = std::string(rt_->name) + ": " + words;
    report(std::move(f));
}

void CachingAllocator::history_segment(npl_history_action action, const Segment* seg, const void* ptr,
                                       size_t size) {
    history(action, ptr, size, seg->device, seg->stream, seg->pool_id);
}

void CachingAllocator::set_history_hook(npl_history_hook hook, void* ctx) {
    Locked lock(this);
    history_hook_ = hook;
    history_ctx_ = ctx;
}

void CachingAllocator::trace_add(TraceKind kind, const Block* b, Stream stream, const void* ptr) {
    if (b == nullptr) {
        trace_.add(kind, -1, ptr, 0, stream, nullptr, 0);
        return;
    }
    trace_.add(kind, b->device, ptr ? ptr : b->ptr, b->size, stream ? stream : b->stream, b->stream, b->generation);
}

// ---- allocation --------------------------------------------------------------

void* CachingAllocator::allocate(ssize_t size, int device, Stream stream) {
    if (size <= 0) {
        if (size < 0) {
            Finding f;
            f.kind = "invalid_size";
            f.op = "alloc";
            f.size = size;
            f.device = device;
            f.stream = stream;
            report(std::move(f));
            set_last_failure("npu_lifetime shim: invalid allocation size " + std::to_string(size) + " on device " +
                             std::to_string(device));
        }
        return nullptr;  // a zero-byte request needs no memory
    }
    if (static_cast<uint64_t>(size) > kOneExbibyte) {  // as torch's allocator: no device has it
        set_last_failure("npu_lifetime shim: out of memory on device " + std::to_string(device) +
                         ". Tried to allocate more than 1EB memory.");
        return nullptr;
    }
    // Every NULL for a positive size leaves its own reason in
    // last_oom_message() (what torch's bridge raises), never an earlier one's
    // (an exception's: internal_error, at the C boundary).
    std::lock_guard<AllocatorLock> lock(mu_);  // (not Locked: unmerged_ is looked at below)
    if (rt_ == nullptr) ensure_runtime();
    size_t rounded = round_up(static_cast<size_t>(size), kRound);
    if (unmerged_ != nullptr) {  // the cached pair: the block the last free left unmerged, if it fits
        if (Block* b = take_unmerged(device, stream, rounded)) {
            b->pool->stats->count(CounterId::cache_hits);
            b->pool->stats->count(CounterId::unmerged_reuses);
            if (static_cast<size_t>(size) == b->requested) {  // the pair repeated: counted when settled
                pair_ = b;
                pair_live_ = true;
                hand_out(b);
            } else {
                settle_pair();
                count_take_back(b);
                mark_live(b, static_cast<size_t>(size));
            }
            return b->ptr;
        }
    } else if (pair_ != nullptr) {
        settle_pair();  // its block is handed out: this allocation is another
    }
    if (claims_ != 0 && claim_ != nullptr) return claim(rounded, static_cast<size_t>(size), device, stream);
    bool capture = graph_pools_.any_capture_underway();
    PoolId id = capture ? graph_pools_.pool_for(device, stream) : PoolId{};  // (pool_for notes the stream)
    if (capture && !joins_.empty()) reclaim_joined(stream);  // blocks whose streams the graph joined
    if (!capture) {
        if (events_.any_deferred()) process_deferred();
        // Pending blocks may have become reusable; never poll from a stream
        // captured without torch's knowledge either (asked of the runtime
        // only where captures are not announced: design D19).
        if (events_.pending_blocks() != 0 && !unannounced_capture(stream)) process_events_locked();
    }
    Pool* p = pool(PoolKey{device, stream, rounded <= kSmallLimit, id});
    Block* b = take_cached(p, rounded, stream);
    if (b != nullptr) {
        p->stats->count(CounterId::cache_hits);
    } else if (cross_stream_ != CrossStream::off && !capture && id.eager() && !capturing(stream) &&
               (b = adopt_foreign(p, rounded, stream, cross_stream_ == CrossStream::always)) != nullptr) {
        p->stats->count(CounterId::cache_hits);  // another stream's free segment (cross_stream.cpp)
    } else if ((b = new_segment(p, rounded, stream)) == nullptr) {
        return nullptr;  // out_of_memory_path set the message
    }
    mark_live(b, static_cast<size_t>(size));
    return b->ptr;
}

// The next allocation of this thread takes the cached memory at `ptr`
// (cudagraph trees restoring a pool checkpoint re-allocate the blocks its
// graphs' outputs occupied, through torch, so torch knows them again).
void CachingAllocator::claim_next(void* ptr) {
    Locked lock(this);
    if (claim_ == nullptr) claims_++;
    claim_ = static_cast<char*>(ptr);
}

// The claimed memory must be free and belong where the allocation does: its
// device and stream (blocks never move between streams: that would need a
// wait on the old one), and, when a capture claims the allocation, that
// capture's pool (an eager block must not be baked into a graph).  Outside a
// capture a graph pool's block may be claimed: that is how a pool checkpoint
// is restored; it stays in its pool.  Events the block carries (a graph
// output given a record_use) are dropped once fired, and the claiming stream
// waits GPU-side on the others, as a reuse under lazy_wait does; during a
// capture a block carrying events is refused (its events can't be queried).
void* CachingAllocator::claim(size_t rounded, size_t requested, int device, Stream stream) {
    char* ptr = claim_;
    claim_ = nullptr;
    claims_--;
    bool capturing = graph_pools_.any_capture_underway();
    PoolId id = capturing ? graph_pools_.pool_for(device, stream) : PoolId{};
    Block* b = segments_.block_at(ptr);
    const char* why = nullptr;
    if (b == nullptr || b->state != BlockState::cached || ptr + rounded > b->ptr + b->size) {
        why = "the memory to claim is not free, or not all free";
    } else if (b->device != device || b->stream != stream) {
        why = "the memory to claim belongs to another device or stream than the allocation";
    } else if (!id.eager() && !(b->pool->id == id)) {
        why = "a capture's allocation may claim only memory of the capture's own graph pool";
    } else if (!b->held.empty() && capturing) {
        why = "the memory to claim carries events, which can't be waited for during a capture";
    } else if (!b->held.empty()) {
        pool_erase(b);  // its statistics change with its events
        bool waited = wait_for_held(b, stream);
        pool_insert(b);
        if (!waited) why = "the claiming stream could not wait for the events the memory carries";
    }
    if (why != nullptr) {
        Finding f;
        f.kind = "invalid_argument";
        f.op = "claim";
        f.address = ptr;
        f.size = static_cast<int64_t>(requested);
        f.device = device;
        f.stream = stream;
        if (b != nullptr) f.alloc_stream = b->stream;
        f.detail = why;
        report(std::move(f));
        set_last_failure(std::string("npu_lifetime shim: the claim of the memory at ") + hex_address(ptr) +
                         " failed: " + why);
        return nullptr;
    }
    pool_erase(b);
    if (b->ptr < ptr) {  // keep the front cached: split it off
        Block* front = new_block();
        *front = *b;
        front->uses.clear();
        front->held.clear();
        front->last_streams.clear();
        Segments::cut_front(b, ptr, front);
        front->state = BlockState::cached;
        pool_insert(front);
    }
    split(b, rounded);
    mark_live(b, requested);
    return b->ptr;
}

NPL_HOT Pool* CachingAllocator::pool(const PoolKey& key) {
    Pool* p = pools_.find(key);
    return __builtin_expect(p != nullptr, 1) ? p : new_pool(key);
}

Pool* CachingAllocator::new_pool(const PoolKey& key) {
    Pool* p = pools_.make(key);
    p->no_split = !key.id.eager() && graph_pools_.no_split(key.device, key.id);
    p->stats = &dstats(key.device);
    return p;
}

NPL_HOT void CachingAllocator::mark_live(Block* b, size_t requested) {
    b->requested = requested;
    count_live(b);
    hand_out(b);
}

// `b`, a block of the pool, to its owner (its size requested already set).
NPL_HOT void CachingAllocator::hand_out(Block* b) {
    b->state = BlockState::live;
    book_.on_alloc(b);
    trace(TraceKind::alloc, b, nullptr);
}

// The statistics of `b` handed out.
NPL_HOT void CachingAllocator::count_live(const Block* b) {
    DeviceStats& s = *b->pool->stats;
    s.grow(StatId::allocation, b->small, 1);
    s.grow(StatId::allocated_bytes, b->small, static_cast<int64_t>(b->size));
    s.grow(StatId::requested_bytes, b->small, static_cast<int64_t>(b->requested));
    s.note_active_peak(b->small);
}

// Best fit in the pool, taken out of it with `size` bytes (the remainder
// stays cached).  A block carrying events is taken once the allocating
// stream waits on them, never while a capture is underway (the wait would
// pull outside work into the graph; the query is forbidden).
NPL_HOT Block* CachingAllocator::take_cached(Pool* p, size_t size, Stream stream) {
    int frozen = -1;  // asked once, only if a block with events comes up
    for (Block* b = p->blocks.at_least(size); b != nullptr; b = p->blocks.after(b)) {
        if (hidden_expandable(b)) continue;
        if (!b->held.empty()) {
            if (frozen < 0) frozen = queries_frozen() || capturing(stream) ? 1 : 0;
            if (frozen) continue;
            count_cached<-1>(b);  // its events change while it sits in the pool
            bool waited = wait_for_held(b, stream);
            count_cached<+1>(b);
            if (!waited) continue;  // the wait failed (a finding says why): leave it
        }
        take(b, size);
        return b;
    }
    return nullptr;
}

// Takes cached `b` out of its pool for `size` bytes; a remainder worth
// keeping takes b's place in the pool.
NPL_HOT void CachingAllocator::take(Block* b, size_t size) {
    if (!worth_splitting(b, size)) {
        pool_erase(b);
        return;
    }
    if (counts_as_split(b) && b->held.empty()) {  // the common case, as torch counts it: a split block shrinks
        Block* rest = split_off(b, size);
        b->pool->blocks.replace(b, rest, BlockSet::Order::smaller);
        b->pool->stats->shrink(StatId::inactive_split_bytes, b->small, static_cast<int64_t>(size));
        return;
    }
    count_cached<-1>(b);  // before the split changes its size and neighbours
    Block* rest = split_off(b, size);
    b->pool->blocks.replace(b, rest, BlockSet::Order::smaller);
    count_cached<+1>(rest);
}

// Makes `stream` wait on each of b's events still pending (all of them
// under stream_wait) and releases them: the block is then safe on `stream`.
bool CachingAllocator::wait_for_held(Block* b, Stream stream) {
    bool waited = false;
    for (const HeldEvent& h : b->held) {
        int code = 0;
#ifdef NPL_MUTANT_HELD_WAIT  // a reuse that ignores its pending uses, built only by the test that must catch it
        continue;
#endif
        if (policy_ != Policy::stream_wait && rt_->event_query(h.event, &code) == Status::ok) continue;
        if (rt_->stream_wait_event(stream, h.event, &code) != Status::ok) {
            runtime_error("stream_wait_event", code, b, stream);
            return false;
        }
        dstats(b->device).count(CounterId::stream_waits);
        waited = true;
    }
    for (const HeldEvent& h : b->held) events_.make_idle(h.event, h.device);
    b->held.clear();
    if (waited) trace(TraceKind::reuse_wait, b, stream);
    return true;
}

// A new segment's block of `size` bytes (the rest of the segment cached).
Block* CachingAllocator::new_segment(Pool* p, size_t size, Stream stream) {
    Status s = Status::ok;
    int code = 0;
    Block* b = try_new_segment(p, size, &s, &code);
    return b != nullptr ? b : out_of_memory_path(p, size, stream, s, code);
}

Block* CachingAllocator::try_new_segment(Pool* p, size_t size, Status* status, int* code) {
    if (__builtin_expect(expandable_, 0) && grows(p)) {
        Block* b = try_grow(p, size, status, code);
        if (b != nullptr || *status != Status::unsupported) return b;  // unsupported: a plain segment instead
    }
    bool ordered = ordered_ != nullptr && p->id.eager();  // the oracle mode: a block of its own
    size_t bytes = ordered ? size : segment_size_for(size, p->small);
    void* ptr = nullptr;
    SegmentSource source = ordered ? ordered_source()
                                   : p->id.eager() ? SegmentSource{} : graph_pools_.source(p->device, p->id);
    *status = segment_malloc(source, &ptr, bytes, p->device, p->stream, code);
    if (*status != Status::ok) return nullptr;
    Block* b = new_block();
    b->pool = p;
    Segment* seg = segments_.add(static_cast<char*>(ptr), bytes, p->device, p->stream, p->small, p->id, b);
    seg->source = source;
    DeviceStats& st = dstats(p->device);
    st.add(StatId::segment, p->small, 1);
    st.add(StatId::reserved_bytes, p->small, static_cast<int64_t>(bytes));
    st.count(CounterId::num_device_alloc);
    trace(TraceKind::segment_alloc, b, nullptr);
    history_segment(NPL_HISTORY_SEGMENT_ALLOC, seg, seg->base, seg->size);
    split(b, size);
    return b;
}

// Cuts `b` (out of any pool) to `size` bytes, caching the rest if worth it.
void CachingAllocator::split(Block* b, size_t size) {
    if (worth_splitting(b, size)) pool_insert(split_off(b, size));
}

// The block after the first `size` bytes of `b`, linked in its segment (not cached yet).
NPL_HOT Block* CachingAllocator::split_off(Block* b, size_t size) {
    Block* rest = new_block();
    Segments::split(b, size, rest);
    rest->state = BlockState::cached;
    return rest;
}

NPL_HOT Block* CachingAllocator::new_block() {
    if (spare_blocks_.empty()) return new Block();
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    return b;
}

// Keeps the lists' capacity: recycled blocks allocate nothing.
NPL_HOT void CachingAllocator::recycle_block(Block* b) {
    b->reset_fields();
    b->uses.clear();
    b->held.clear();
    b->last_streams.clear();
    spare_blocks_.push_back(b);
}

void CachingAllocator::pool_insert(Block* b) {
    b->pool->blocks.insert(b);
    count_cached<+1>(b);
}

NPL_HOT void CachingAllocator::pool_erase(Block* b) {
    b->pool->blocks.erase(b);
    count_cached<-1>(b);
}

// The statistics of cached blocks (Sign +1 as `b` enters its pool, -1 as
// it leaves); a cached block's events or neighbours change only between
// the two.
template <int Sign>
NPL_HOT void CachingAllocator::count_cached(const Block* b) {
    bool split = counts_as_split(b), waiting = !b->held.empty();
    if (!split && !waiting) return;
    DeviceStats& s = *b->pool->stats;
    auto n = static_cast<int64_t>(b->size);
    auto count = [&](StatId id, int64_t by) { Sign > 0 ? s.grow(id, b->small, by) : s.shrink(id, b->small, by); };
    if (split) {
        count(StatId::inactive_split, 1);
        count(StatId::inactive_split_bytes, n);
    }
    if (waiting) {
        count(StatId::waiting, 1);
        count(StatId::waiting_bytes, n);
    }
}

// count_cached<-1> of a split block without events that is gone (merged).
NPL_HOT void CachingAllocator::uncount_plain_split(const Block* like, size_t size) {
    like->pool->stats->shrink(StatId::inactive_split, like->small, 1);
    like->pool->stats->shrink(StatId::inactive_split_bytes, like->small, static_cast<int64_t>(size));
}

// Caches a block, merging it with cached neighbours of its segment; the
// merged block takes the first neighbour's place in the pool.
NPL_HOT void CachingAllocator::cache_block(Block* b) {
    if (__builtin_expect(b->segment->source.ordered, 0)) {
        release_ordered(b);
        return;
    }
    b->state = BlockState::cached;
    Block* prev = b->prev != nullptr && b->prev->state == BlockState::cached ? b->prev : nullptr;
    Block* next = b->next != nullptr && b->next->state == BlockState::cached ? b->next : nullptr;
    if (prev == nullptr && next == nullptr) {
        pool_insert(b);
    } else {
        Block* seat = prev != nullptr ? prev : next;  // it leaves the pool when b takes its node
        bool plain_seat = counts_as_split(seat) && seat->held.empty();  // split, no events
        if (!plain_seat) count_cached<-1>(seat);
        size_t seat_size = seat->size;
        absorb(b, seat);
        if (prev != nullptr && next != nullptr) {
            pool_erase(next);
            absorb(b, next);
            recycle_block(next);
        }
        b->pool->blocks.replace(seat, b, BlockSet::Order::larger);
        recycle_block(seat);
        if (plain_seat && counts_as_split(b) && b->held.empty()) {  // the common case, as torch counts it: it grows
            b->pool->stats->grow(StatId::inactive_split_bytes, b->small, static_cast<int64_t>(b->size - seat_size));
        } else {
            if (plain_seat) uncount_plain_split(b, seat_size);
            count_cached<+1>(b);
        }
    }
    // (A released graph pool's segments go back at empty_cache and on the
    // out-of-memory path, as torch's do, never from a free: work may still be
    // queued on them, and a pool allocator's free would run under it.)
}

// `b` takes the bytes and events of `n`, its cached neighbour (leaving the segment).
NPL_HOT void CachingAllocator::absorb(Block* b, Block* n) {
    Segments::merge(b, n);
    if (__builtin_expect(n->held.empty(), 1)) return;
    for (const HeldEvent& h : n->held) hold(b, h);
    n->held.clear();
}

// ---- the cached pair --------------------------------------------------------
//
// The hot path is a free and an allocation of the same size on the same
// stream: the free merges the block into its cached successor, the
// allocation splits it off again at the same place.  So a free whose merge
// is that simple (eager pool, plain segment, the successor cached without
// events, the predecessor not cached) leaves the block unmerged (unmerged_),
// counting the statistics as the merge would.  The next allocation takes it
// back when the merged block is what its best-fit search would pick and
// split at the block's end (counting as that split would): the state is
// then the one merge + split leaves.  Otherwise, and before any other entry
// point runs (Locked), the merge is done.  So nothing else ever sees the
// block unmerged, and the outcome of every call is as without the shortcut
// (test_shim_hot_path.py compares the two).

// The merge cache_block would make of `b` (no events: not a "waiting" block), if that simple.
NPL_HOT bool CachingAllocator::leave_unmerged(Block* b) {
    Block* next = b->next;
    if (next == nullptr || next->state != BlockState::cached || !next->held.empty() ||
        (b->prev != nullptr && b->prev->state == BlockState::cached) || b->segment->expansion != nullptr ||
        !b->pool->id.eager()) {
        return false;
    }
    // next counts as an inactive split block; the merged block does if still split
    DeviceStats& s = *b->pool->stats;
    if (pair_in_a_larger_split(b)) {
        s.grow(StatId::inactive_split_bytes, b->small, static_cast<int64_t>(b->size));
    } else {
        uncount_plain_split(b, next->size);
    }
    b->state = BlockState::cached;
    unmerged_ = b;
    return true;
}

// `b` = unmerged_, taken back for `rounded` bytes on (`device`, `stream`),
// or nullptr after merging it (the allocation then searches as usual).
NPL_HOT Block* CachingAllocator::take_unmerged(int device, Stream stream, size_t rounded) {
    Block* b = unmerged_;
    Block* next = b->next;
    size_t merged = b->size + next->size;
    bool same_pool = b->size == rounded && b->device == device && b->stream == stream &&
                     b->small == (rounded <= kSmallLimit);
    // what allocate() would do before its search: nothing (no claim, capture, deferral or pending block)
    bool quiet = !(claims_ != 0 && claim_ != nullptr) && !graph_pools_.any_capture_underway() &&
                 !events_.any_deferred() && events_.pending_blocks() == 0;
    if (!same_pool || !quiet || b->pool->no_split || (!b->small && next->size <= kSmallLimit)) {  // (worth_splitting)
        merge_unmerged();
        return nullptr;
    }
    // best fit: the first cached block of at least `rounded` bytes, the merged one included
    BlockSet& set = b->pool->blocks;
    Block* rival = set.at_least(rounded);
    if (rival == next) rival = set.after(next);
    if (rival != nullptr && (rival->size != merged ? rival->size < merged : rival->ptr < b->ptr)) {
        merge_unmerged();
        return nullptr;
    }
    unmerged_ = nullptr;
    return b;
}

// The statistics of `b` taken back from unmerged_ as take() splits the
// merged block: its successor is the rest, in its node.
NPL_HOT void CachingAllocator::count_take_back(const Block* b) {
    DeviceStats& s = *b->pool->stats;
    if (pair_in_a_larger_split(b)) {
        s.shrink(StatId::inactive_split_bytes, b->small, static_cast<int64_t>(b->size));
    } else {
        s.grow(StatId::inactive_split, b->small, 1);
        s.grow(StatId::inactive_split_bytes, b->small, static_cast<int64_t>(b->next->size));
    }
}

// What cache_block would have done with unmerged_ (its statistics are counted).
void CachingAllocator::merge_unmerged() {
    settle_pair();
    Block* b = unmerged_;
    unmerged_ = nullptr;
    Block* next = b->next;
    Segments::merge(b, next);
    b->pool->blocks.replace(next, b, BlockSet::Order::larger);
    recycle_block(next);
}

// ---- the cached pair repeated ----------------------------------------------
//
// A repeat of the pair (the allocation takes back the block the free before
// it left unmerged, for the size its last owner asked; the free of it is
// its owner's, with nothing to wait for) changes no current value of any
// statistic, and raises no peak: its allocation restores the state from
// before its block's last free, which every peak already covers (a reset in
// between is an entry point, which settles).  So a repeat counts nothing:
// its allocation hands the block out (pair_live_) and its free leaves it
// unmerged again (one more of pair_repeats_), and settle_pair counts them
// before anything else runs: the allocated and freed sums of each repeat
// (count_pair_repeats), and the take-back and allocation of a block still
// handed out.  test_shim_hot_path.py compares every outcome, statistics
// included, with a run that settles and merges after every step.

// The free of `b` at `a`: true if it repeats pair_'s pair (done), else false
// after settling the pair.
NPL_HOT bool CachingAllocator::repeat_pair_free(Address* a, Block* b, ssize_t size, int device, Stream stream) {
    if (b != pair_ || !pair_live_ || classify_free(a, b, size, device, stream) != FreeKind::owner ||
        !b->uses.empty() || !b->held.empty() || quarantine_.enabled()) {
        settle_pair();
        return false;
    }
    book_.on_free(a, b);
    trace(TraceKind::free, b, nullptr);
    trace(TraceKind::reusable, b, nullptr);
    history(NPL_HISTORY_FREE_COMPLETED, b->ptr, b->requested, b->device, b->stream, b->pool->id);
    b->state = BlockState::cached;  // as leave_unmerged leaves it: nothing else ran since it did
    unmerged_ = b;
    pair_live_ = false;
    pair_repeats_++;
    return true;
}

// Counts what the repeats of pair_ left uncounted (see above).
void CachingAllocator::settle_pair() {
    const Block* b = pair_;
    if (b == nullptr) return;
    pair_ = nullptr;
    if (pair_repeats_ != 0) count_pair_repeats(b, pair_repeats_);
    pair_repeats_ = 0;
    if (pair_live_) {
        pair_live_ = false;
        count_take_back(b);
#ifndef NPL_MUTANT_PAIR_SETTLE /* tests/shim/test_shim_reuse_fuzz.py: a repeat's allocation never counted */
        count_live(b);
#endif
    }
}

// The allocated and freed sums of `repeats` pairs of `b`, each its
// take-back and allocation (count_take_back, count_live) and its free
// (free, leave_unmerged): every statistic they move goes up and down by
// the same amount.
void CachingAllocator::count_pair_repeats(const Block* b, uint64_t repeats) {
    DeviceStats& s = *b->pool->stats;
    auto k = static_cast<int64_t>(repeats);
    s.churn(StatId::allocation, b->small, k);
    s.churn(StatId::allocated_bytes, b->small, k * static_cast<int64_t>(b->size));
    s.churn(StatId::requested_bytes, b->small, k * static_cast<int64_t>(b->requested));
    if (pair_in_a_larger_split(b)) {
        s.churn(StatId::inactive_split_bytes, b->small, k * static_cast<int64_t>(b->size));
    } else {
        s.churn(StatId::inactive_split, b->small, k);
        s.churn(StatId::inactive_split_bytes, b->small, k * static_cast<int64_t>(b->next->size));
    }
}

// ---- free and validation ---------------------------------------------------

void CachingAllocator::free(void* ptr, ssize_t size, int device, Stream stream) {
    if (ptr == nullptr) return;  // the zero-byte allocation
    std::lock_guard<AllocatorLock> lock(mu_);
    if (unmerged_ != nullptr) merge_unmerged();  // (a cached pair frees with none)
    Address* a = book_.find(ptr);
    Block* b = a != nullptr ? a->live : nullptr;
    if (pair_ != nullptr && repeat_pair_free(a, b, size, device, stream)) return;
    if (b == nullptr) {
        report_bad_free(ptr, size, device, stream);
        return;
    }
    FreeKind kind = classify_free(a, b, size, device, stream);
    if (kind != FreeKind::owner && stale_free(kind, size, stream, b)) return;
    book_.on_free(a, b);
    DeviceStats& s = *b->pool->stats;
    auto n = static_cast<int64_t>(b->size);
    s.shrink(StatId::allocation, b->small, 1);
    s.shrink(StatId::allocated_bytes, b->small, n);
    s.shrink(StatId::requested_bytes, b->small, static_cast<int64_t>(b->requested));
    trace(TraceKind::free, b, nullptr);
    if (b->uses.empty() && b->held.empty() && !quarantine_.enabled()) {  // nothing to wait for (finish_free's
        trace(TraceKind::reusable, b, nullptr);                          // outcome, without its steps)
        history(NPL_HISTORY_FREE_COMPLETED, b->ptr, b->requested, b->device, b->stream, b->pool->id);
        if (!leave_unmerged(b)) cache_block(b);
        return;
    }
    if (quarantine_.enabled()) {  // a write after the free is reported with these
        b->last_streams.clear();
        for (const StreamUse& u : b->uses) b->last_streams.push_back(u.stream);
    }
    if (!b->uses.empty() && !graph_pools_.any_capture_underway() && events_.any_deferred()) process_deferred();
    if (!b->uses.empty() && needs_capture_deferral(b)) {
        if (await_join(b)) return;  // graph_capture_record_stream_reuse
        b->state = BlockState::deferred;
        events_.defer(b);
        s.add(StatId::pending, b->small, 1);
        s.add(StatId::pending_bytes, b->small, n);
        s.count(CounterId::capture_deferred_frees);
        return;
    }
    finish_free(b);
}

// What a free of a live block's address is (`a`: its entry in the book):
// the owner's own; a stale (double) free, matching the last owner that freed
// the address, not the live one; one of another size than the live owner's
// (torch frees with the size it allocated, so it is a stale free of an owner
// the book no longer remembers, past kMaxFreed frees, or a caller's bug);
// or one of the right size on another stream or device.  The first and the
// last free the block; the others never do (freeing would hand the live
// owner's memory out twice).  free, stale_free and would_free all ask here.
NPL_HOT CachingAllocator::FreeKind CachingAllocator::classify_free(const Address* a, const Block* b, ssize_t size,
                                                                  int device, Stream stream) const {
    bool size_ok = size == static_cast<ssize_t>(b->requested);
    if (size_ok && stream == b->stream && device == b->device) return FreeKind::owner;
    if (a->freed && static_cast<ssize_t>(a->freed_size) == size && a->freed_stream == stream) return FreeKind::stale;
    return size_ok ? FreeKind::wrong_stream : FreeKind::wrong_size;
}

// Whether free(ptr, size, device, stream) would free a block, with no
// effect: the hooks hear only of such frees.
bool CachingAllocator::would_free(void* ptr, ssize_t size, int device, Stream stream) {
    std::lock_guard<AllocatorLock> lock(mu_);
    const Address* a = book_.find(ptr);
    if (a == nullptr || a->live == nullptr) return false;
    FreeKind kind = classify_free(a, a->live, size, device, stream);
    return kind == FreeKind::owner || kind == FreeKind::wrong_stream;
}

// Reports a free that is not the live owner's own (classify_free's `kind`);
// true when the block is not to be freed.
bool CachingAllocator::stale_free(FreeKind kind, ssize_t size, Stream stream, Block* b) {
    Finding f = about(b, "", "free");
    f.size = size;
    f.expected_size = static_cast<int64_t>(b->requested);
    f.stream = stream;
    if (kind == FreeKind::stale) {
        f.kind = "double_free";
        f.detail = "a stale free: the address was freed before and now belongs to a new owner "
                   "(generation " + std::to_string(b->generation) + "); the new owner's block was not freed";
    } else if (kind == FreeKind::wrong_size) {
        f.kind = "size_mismatch";
        f.detail = "freed with another size than its live owner was allocated with: not freed, the owner "
                   "keeps its memory (a stale free of an earlier owner no longer remembered reads the same)";
    } else {
        f.kind = "stream_mismatch";
        f.detail = "freed with another stream or device than it was allocated on; freed anyway";
    }
    report(std::move(f));
    return kind != FreeKind::wrong_stream;
}

void CachingAllocator::report_bad_free(void* ptr, ssize_t size, int device, Stream stream) {
    Finding f;
    f.op = "free";
    f.address = ptr;
    f.size = size;
    f.device = device;
    f.stream = stream;
    const Address* a = book_.find(ptr);
    if (a != nullptr && a->freed) {
        f.kind = "double_free";
        f.generation = a->generation;
        f.detail = "the address was already freed by its last owner";
    } else if (block_containing(ptr) != nullptr) {
        f.kind = "interior_pointer";
        f.detail = "the address is inside a live block, not its start; nothing was freed";
    } else {
        f.kind = "unknown_pointer";
    }
    report(std::move(f));
}

// A free is deferred until no capture may be underway when it must record
// an event (a recorded stream), or when it must ask whether a noted use has
// finished (a query now could only answer "not yet": a false unrecorded_use).
bool CachingAllocator::needs_capture_deferral(const Block* b) {
    for (const StreamUse& u : b->uses) {
        if (u.recorded) {
            if (graph_pools_.any_capture_underway() || capturing(u.stream)) return true;
        } else if (u.noted && u.event != nullptr && queries_frozen()) {
            return true;
        }
    }
    return false;
}

// The free's events: recorded streams get one recorded now; record_use
// events are kept; a noted use still queued is a finding.  Then settle.
// A recorded stream whose event can't be created or recorded is waited for
// by the host instead (torch raises there; a free has no error to return);
// if that fails too, the block stays deferred, out of every pool, and the
// free is retried with its remaining streams (process_deferred).  So a
// failed runtime call never makes a block reusable early.
void CachingAllocator::finish_free(Block* b) {
    bool frozen = queries_frozen();
    size_t unresolved = 0;  // recorded streams neither evented nor waited for: kept at the front
    for (StreamUse& u : b->uses) {
        int ev_device = u.event != nullptr ? u.event_device : device_of(u.stream, -1, b->device);
        if (u.recorded) {
            if (u.event == nullptr) u.event = acquire_event(ev_device);
            if (u.event != nullptr && record(u.event, u.stream, b, "record_event(free)")) {
                hold(b, HeldEvent{u.stream, u.event, ev_device, events_.last_record(), true});
                continue;
            }
            if (u.event != nullptr) events_.make_idle(u.event, ev_device);
            u.event = nullptr;
            int code = 0;
            if (rt_->stream_synchronize(u.stream, &code) != Status::ok) {
                runtime_error("stream_synchronize(free)", code, b, u.stream);
                b->uses[unresolved++] = u;
            }
            continue;
        }
        if (u.event == nullptr) continue;
        if (u.noted) {
            int code = 0;
            Status s = frozen ? Status::not_ready : rt_->event_query(u.event, &code);
            if (s == Status::ok) {  // the unrecorded use already finished
                events_.make_idle(u.event, ev_device);
                continue;
            }
            Finding f = about(b, "unrecorded_use", "free");
            f.size = static_cast<int64_t>(b->requested);
            f.stream = u.stream;
            f.detail = "freed while a use on another stream, neither recorded nor finished, was queued; reuse deferred";
            report(std::move(f));
        }
        hold(b, HeldEvent{u.stream, u.event, ev_device, u.seq, u.noted});
    }
    b->uses.resize(unresolved);
    if (unresolved != 0) {  // retried once no capture is underway (process_deferred)
        if (b->state == BlockState::live) {
            DeviceStats& s = *b->pool->stats;
            s.add(StatId::pending, b->small, 1);
            s.add(StatId::pending_bytes, b->small, static_cast<int64_t>(b->size));
            trace(TraceKind::pending, b, nullptr);
        }
        b->state = BlockState::deferred;
        events_.defer(b);
        return;
    }
    if (!b->held.empty()) dstats(b->device).count(CounterId::deferred_frees);
    settle(b);
}

// Whether a held event must fire before its block enters the pool: every
// event under poll and in debug mode, none under stream_wait, record_stream
// and note_use events under lazy_wait.
bool CachingAllocator::gates(const HeldEvent& h) const {
    if (quarantine_.enabled() || policy_ == Policy::poll) return true;
    return policy_ == Policy::lazy_wait && h.must_fire;
}

// Whether a freed block may enter its pool with the events it holds.
bool CachingAllocator::ready_for_pool(const Block* b) const {
    for (const HeldEvent& h : b->held) {
        if (gates(h)) return false;
    }
    return true;
}

void CachingAllocator::settle(Block* b) {
    DeviceStats& s = *b->pool->stats;
    auto n = static_cast<int64_t>(b->size);
    bool was_pending = b->state == BlockState::pending || b->state == BlockState::deferred;
    if (!ready_for_pool(b)) {
        if (!was_pending) {
            s.add(StatId::pending, b->small, 1);
            s.add(StatId::pending_bytes, b->small, n);
            trace(TraceKind::pending, b, nullptr);
        }
        b->state = BlockState::pending;
        for (const HeldEvent& h : b->held) {  // it waits in the FIFO of each stream it holds a gating event of
            if (gates(h)) events_.enqueue(b, h);
        }
        return;
    }
    if (was_pending) {
        s.add(StatId::pending, b->small, -1);
        s.add(StatId::pending_bytes, b->small, -n);
    }
    release(b);
}

void CachingAllocator::release(Block* b) {
    trace(TraceKind::reusable, b, nullptr);
    history(NPL_HISTORY_FREE_COMPLETED, b->ptr, b->requested, b->device, b->stream, b->pool->id);
    if (quarantine_.enabled() && b->pool->id.eager()) {
        quarantine(b);
        return;
    }
    cache_block(b);
}

// ---- record_stream / record_use ------------------------------------------------

Block* CachingAllocator::block_containing(void* ptr) const {
    Block* b = segments_.block_at(static_cast<char*>(ptr));
    return b != nullptr && b->state == BlockState::live ? b : nullptr;
}

Block* CachingAllocator::live_block(void* ptr, const char* op, Stream stream) {
    Block* b = book_.live(ptr);
    if (b == nullptr) b = block_containing(ptr);  // a view's address
    if (b != nullptr) return b;
    Finding f;
    const Address* a = book_.find(ptr);
    f.kind = a != nullptr && a->freed ? "use_after_free" : "unknown_pointer";
    f.op = op;
    f.address = ptr;
    f.stream = stream;
    if (a != nullptr) f.generation = a->generation;
    report(std::move(f));
    return nullptr;
}

StreamUse& CachingAllocator::use_of(Block* b, Stream stream) {
    for (StreamUse& u : b->uses) {
        if (u.stream == stream) return u;
    }
    b->uses.emplace_back();
    b->uses.back().stream = stream;
    return b->uses.back();
}

int CachingAllocator::record_stream(void* ptr, Stream stream, int stream_device) {
    Locked lock(this);
    ensure_runtime();
    Block* b = live_block(ptr, "record_stream", stream);
    if (b == nullptr) return -1;
    if (stream == b->stream) return 0;
    if (stream_device >= 0) stream_devices_[stream] = stream_device;
    StreamUse& u = use_of(b, stream);
    u.recorded = true;
    u.capture = 0;  // covered until the free: a record_use's capture marker no longer bounds it
    u.markers.clear();
    trace(TraceKind::record_stream, b, stream);
    return 0;
}

int CachingAllocator::erase_stream(void* ptr, Stream stream) {
    Locked lock(this);
    ensure_runtime();
    Block* b = live_block(ptr, "erase_stream", stream);
    if (b == nullptr) return -1;
    for (StreamUse& u : b->uses) {
        if (u.stream == stream) u.recorded = false;
    }
    trace(TraceKind::erase_stream, b, stream);
    return 0;
}

int CachingAllocator::record_use(void* ptr, Stream stream, int stream_device, bool noted) {
    Locked lock(this);
    ensure_runtime();
    Block* b = live_block(ptr, noted ? "note_use" : "record_use", stream);
    if (b == nullptr) return -1;
    if (stream == b->stream) return 0;  // the free itself is ordered after it
    StreamUse& u = use_of(b, stream);
    if (u.recorded && noted) return 0;  // record_stream covers it already
    if (graph_pools_.any_capture_underway() || capturing(stream)) {
        // An event recorded inside a graph can't be polled later.  The use is
        // marked with the stream's place in the capture's graph, so a free in
        // the same capture waits only for it (capture_joins.h); anywhere else
        // it is covered as record_stream covers it, by an event at the free.
        bool covered = u.recorded && u.capture == 0;  // a record_stream covers it until the free already
        u.recorded = true;
        if (!covered && mark_capture_use(u)) {
            trace(TraceKind::record_use, b, stream);
        } else {
            trace(TraceKind::record_stream, b, stream);
        }
        return 0;
    }
    if (u.event == nullptr) {
        u.event_device = device_of(stream, stream_device, b->device);
        u.event = acquire_event(u.event_device);
    }
    // One live event per stream: re-recording subsumes the earlier record,
    // since the stream runs in order.  Without an event (the runtime failed:
    // a finding says so) the use is covered as record_stream covers it, by
    // an event at the free.
    if (u.event == nullptr || !record(u.event, stream, b, noted ? "record_event(note_use)" : "record_event(record_use)")) {
        u.recorded = true;
        trace(TraceKind::record_stream, b, stream);
        return 0;
    }
    u.seq = events_.last_record();
    u.noted = noted;
    trace(noted ? TraceKind::note_use : TraceKind::record_use, b, stream);
    return 0;
}

}  // namespace npl
