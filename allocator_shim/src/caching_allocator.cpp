#include "caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "json.h"
#include "npu_lifetime_shim.h"

namespace npl {

namespace {

// Size classes, as in PyTorch's caching allocators: small requests are
// packed into 2 MiB segments; 1-10 MiB requests carve 20 MiB segments;
// larger ones get their own segment rounded to 2 MiB.  Large blocks are
// split only when the remainder is itself large, which bounds fragmentation.
constexpr size_t kRound = 512;
constexpr size_t kSmallLimit = 1 << 20;
constexpr size_t kSmallSegment = 2 << 20;
constexpr size_t kMidLimit = 10 << 20;
constexpr size_t kMidSegment = 20 << 20;
constexpr size_t kLargeRound = 2 << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t segment_size(size_t size, bool small) {
    if (small) return kSmallSegment;
    return size < kMidLimit ? kMidSegment : round_up(size, kLargeRound);
}

bool worth_splitting(const Block* b, size_t size) {
    size_t rest = b->size - size;
    return b->small ? rest >= kRound : rest > kSmallLimit;
}

const char* state_name(BlockState s) {
    switch (s) {
        case BlockState::live:
            return "live";
        case BlockState::pending:
            return "pending";
        default:
            return "cached";
    }
}

}  // namespace

bool CachingAllocator::set_runtime(const Runtime* runtime, std::string* why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!segments_.empty() && runtime != rt_) {
        *why = "the runtime can't change while the allocator holds memory";
        return false;
    }
    rt_ = runtime;
    return true;
}

const Runtime* CachingAllocator::runtime() const {
    std::lock_guard<std::mutex> lock(mu_);
    return rt_;
}

void CachingAllocator::set_policy(Policy p) {
    std::lock_guard<std::mutex> lock(mu_);
    policy_ = p;
}

Policy CachingAllocator::policy() const {
    std::lock_guard<std::mutex> lock(mu_);
    return policy_;
}

bool CachingAllocator::ensure_runtime() {
    if (rt_ != nullptr) return true;
    std::string why;
    if (library_loaded("libcudart", nullptr)) rt_ = cuda_runtime(&why);
    if (rt_ == nullptr && library_loaded("libascendcl", nullptr)) rt_ = acl_runtime(nullptr, &why);
    if (rt_ == nullptr) rt_ = sim_runtime();
    return true;
}

void CachingAllocator::report(Finding f) { findings_.push(std::move(f)); }

void CachingAllocator::note_active_peak() {
    c_.peak_active_bytes = std::max(c_.peak_active_bytes, c_.live_bytes + c_.pending_bytes);
}

void CachingAllocator::runtime_error(const char* op, int code, const Block* b, Stream stream) {
    Finding f;
    f.kind = "runtime_error";
    f.op = op;
    f.code = code;
    f.stream = stream;
    if (b != nullptr) {
        f.address = b->ptr;
        f.device = b->device;
        f.alloc_stream = b->stream;
    }
    report(std::move(f));
}

bool CachingAllocator::capturing(Stream stream) {
    bool yes = false;
    int code = 0;
    if (rt_->stream_capturing(stream, &yes, &code) != Status::ok) {
        runtime_error("stream_capturing", code, nullptr, stream);
        return true;  // unknown: behave as during capture (no polling)
    }
    return yes;
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
        }
        return nullptr;  // a zero-byte request needs no memory
    }
    std::lock_guard<std::mutex> lock(mu_);
    ensure_runtime();
    size_t rounded = round_up(static_cast<size_t>(size), kRound);
    PoolKey key{device, stream, rounded <= kSmallLimit};
    // Pending blocks exist under the poll policy (and linger after a switch
    // to stream_wait); never poll while the allocating stream captures.
    if (!pending_.empty() && !capturing(stream)) process_events_locked();
    Block* b = take_cached(key, rounded, stream);
    if (b != nullptr) {
        c_.cache_hits++;
    } else if ((b = new_segment(key, rounded, stream)) == nullptr) {
        return nullptr;
    }
    split(b, rounded);
    b->state = BlockState::live;
    b->requested = static_cast<size_t>(size);
    live_[b->ptr] = b;
    c_.allocations++;
    c_.live_blocks++;
    c_.live_bytes += b->size;
    c_.requested_live_bytes += b->requested;
    c_.peak_live_bytes = std::max(c_.peak_live_bytes, c_.live_bytes);
    note_active_peak();
    return b->ptr;
}

Block* CachingAllocator::take_cached(const PoolKey& key, size_t size, Stream stream) {
    auto pool_it = pools_.find(key);
    if (pool_it == pools_.end()) return nullptr;
    auto& pool = pool_it->second;
    Block probe;
    probe.size = size;
    int during_capture = -1;  // asked once, only if a held block comes up
    for (auto it = pool.lower_bound(&probe); it != pool.end(); ++it) {
        Block* b = *it;
        if (!b->held.empty()) {
            // stream_wait policy: hand it out after a GPU-side wait on each
            // held event; never during capture, where the wait would pull
            // work from outside into the graph.
            if (during_capture < 0) during_capture = capturing(stream) ? 1 : 0;
            if (during_capture) continue;
            bool waited = true;
            for (Event e : b->held) {
                int code = 0;
                if (rt_->stream_wait_event(stream, e, &code) != Status::ok) {
                    runtime_error("stream_wait_event", code, b, stream);
                    waited = false;
                    break;
                }
                c_.stream_waits++;
            }
            if (!waited) continue;
            for (Event e : b->held) release_event(e, b->device);
            b->held.clear();
        }
        pool_erase(b);
        return b;
    }
    return nullptr;
}

Block* CachingAllocator::new_segment(const PoolKey& key, size_t size, Stream stream) {
    size_t bytes = segment_size(size, key.small);
    void* ptr = nullptr;
    int code = 0;
    Status s = rt_->malloc(&ptr, bytes, key.device, &code);
    if (s == Status::out_of_memory) {
        // Free what the cache holds and try once more.
        c_.oom_retries++;
        if (!capturing(stream)) process_events_locked();
        release_free_segments();
        s = rt_->malloc(&ptr, bytes, key.device, &code);
    }
    if (s != Status::ok) {
        if (s == Status::out_of_memory) {
            c_.oom_failures++;
            Finding f;
            f.kind = "out_of_memory";
            f.op = "alloc";
            f.size = static_cast<int64_t>(size);
            f.device = key.device;
            f.stream = stream;
            f.code = code;
            f.detail = "returned NULL after emptying the cache";
            report(std::move(f));
        } else {
            runtime_error("malloc", code, nullptr, stream);
        }
        return nullptr;
    }
    auto* seg = new Segment{static_cast<char*>(ptr), bytes, key.device, stream, key.small, nullptr};
    Block* b = new_block();
    b->ptr = seg->base;
    b->size = bytes;
    b->device = key.device;
    b->stream = stream;
    b->small = key.small;
    b->segment = seg;
    b->pool = &pools_[key];
    seg->first = b;
    segments_[seg->base] = seg;
    c_.segments++;
    c_.segment_allocs++;
    c_.reserved_bytes += bytes;
    c_.peak_reserved_bytes = std::max(c_.peak_reserved_bytes, c_.reserved_bytes);
    return b;
}

void CachingAllocator::split(Block* b, size_t size) {
    if (!worth_splitting(b, size)) return;
    Block* rest = new_block();
    rest->ptr = b->ptr + size;
    rest->size = b->size - size;
    rest->device = b->device;
    rest->stream = b->stream;
    rest->small = b->small;
    rest->segment = b->segment;
    rest->pool = b->pool;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    rest->state = BlockState::cached;
    pool_insert(rest);
}

Block* CachingAllocator::new_block() {
    if (spare_blocks_.empty()) return new Block();
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    return b;
}

void CachingAllocator::recycle_block(Block* b) {
    *b = Block();
    spare_blocks_.push_back(b);
}

void CachingAllocator::pool_insert(Block* b) {
    b->pool->insert(b);
    c_.cached_blocks++;
    c_.cached_bytes += b->size;
}

void CachingAllocator::pool_erase(Block* b) {
    b->pool->erase(b);
    c_.cached_blocks--;
    c_.cached_bytes -= b->size;
}

// Caches a block, merging it with cached neighbours of its segment.
void CachingAllocator::cache_block(Block* b) {
    b->state = BlockState::cached;
    for (Block* n : {b->prev, b->next}) {
        if (n == nullptr || n->state != BlockState::cached) continue;
        pool_erase(n);
        if (n == b->prev) {
            b->ptr = n->ptr;
            b->prev = n->prev;
            if (n->prev != nullptr) n->prev->next = b;
            if (b->segment->first == n) b->segment->first = b;
        } else {
            b->next = n->next;
            if (n->next != nullptr) n->next->prev = b;
        }
        b->size += n->size;
        b->held.insert(b->held.end(), n->held.begin(), n->held.end());
        recycle_block(n);
    }
    pool_insert(b);
}

// ---- free and validation ---------------------------------------------------

bool CachingAllocator::freed_block_start(void* ptr) const {
    char* p = static_cast<char*>(ptr);
    auto it = segments_.upper_bound(p);
    if (it == segments_.begin()) return false;
    const Segment* seg = std::prev(it)->second;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
        if (b->ptr == p) return b->state != BlockState::live;
    }
    return false;
}

void CachingAllocator::free(void* ptr, ssize_t size) {
    if (ptr == nullptr) return;  // the zero-byte allocation
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
        Finding f;
        f.kind = freed_block_start(ptr) ? "double_free" : "unknown_pointer";
        f.op = "free";
        f.address = ptr;
        f.size = size;
        report(std::move(f));
        return;
    }
    Block* b = it->second;
    live_.erase(it);
    if (size != static_cast<ssize_t>(b->requested)) {
        Finding f;
        f.kind = "size_mismatch";
        f.op = "free";
        f.address = ptr;
        f.size = size;
        f.expected_size = static_cast<int64_t>(b->requested);
        f.device = b->device;
        f.alloc_stream = b->stream;
        report(std::move(f));
    }
    c_.frees++;
    c_.live_blocks--;
    c_.live_bytes -= b->size;
    c_.requested_live_bytes -= b->requested;

    for (StreamUse& u : b->uses) {
        if (u.recorded) {
            // record_stream: wait for everything queued on u.stream by now.
            if (u.event == nullptr) u.event = acquire_event(b->device);
            if (u.event != nullptr && record(u.event, u.stream, b, "record_event(free)")) {
                b->held.push_back(u.event);
            }
            continue;
        }
        if (u.event == nullptr) continue;
        if (u.noted) {
            int code = 0;
            Status s = capturing(u.stream) ? Status::not_ready : rt_->event_query(u.event, &code);
            if (s == Status::ok) {  // the unrecorded use already finished
                release_event(u.event, b->device);
                continue;
            }
            Finding f;
            f.kind = "unrecorded_use";
            f.op = "free";
            f.address = ptr;
            f.size = static_cast<int64_t>(b->requested);
            f.device = b->device;
            f.alloc_stream = b->stream;
            f.stream = u.stream;
            f.detail = "freed while a use on another stream, neither recorded nor finished, was queued; reuse deferred";
            report(std::move(f));
        }
        b->held.push_back(u.event);
    }
    b->uses.clear();
    if (b->held.empty()) {
        cache_block(b);
        return;
    }
    c_.deferred_frees++;
    if (policy_ == Policy::stream_wait) {
        cache_block(b);
        return;
    }
    b->state = BlockState::pending;
    pending_.push_back(b);
    c_.pending_blocks++;
    c_.pending_bytes += b->size;
}

// ---- record_stream / record_use ------------------------------------------------

Block* CachingAllocator::live_block(void* ptr, const char* op, Stream stream) {
    auto it = live_.find(ptr);
    if (it != live_.end()) return it->second;
    Finding f;
    f.kind = freed_block_start(ptr) ? "use_after_free" : "unknown_pointer";
    f.op = op;
    f.address = ptr;
    f.stream = stream;
    report(std::move(f));
    return nullptr;
}

StreamUse& CachingAllocator::use_of(Block* b, Stream stream) {
    for (StreamUse& u : b->uses) {
        if (u.stream == stream) return u;
    }
    b->uses.push_back(StreamUse{stream, nullptr, false, false});
    return b->uses.back();
}

int CachingAllocator::record_stream(void* ptr, Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = live_block(ptr, "record_stream", stream);
    if (b == nullptr) return -1;
    if (stream != b->stream) use_of(b, stream).recorded = true;
    return 0;
}

int CachingAllocator::erase_stream(void* ptr, Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = live_block(ptr, "erase_stream", stream);
    if (b == nullptr) return -1;
    for (StreamUse& u : b->uses) {
        if (u.stream == stream) u.recorded = false;
    }
    return 0;
}

int CachingAllocator::record_use(void* ptr, Stream stream, bool noted) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = live_block(ptr, noted ? "note_use" : "record_use", stream);
    if (b == nullptr) return -1;
    if (stream == b->stream) return 0;  // the free itself is ordered after it
    StreamUse& u = use_of(b, stream);
    if (u.recorded && noted) return 0;  // record_stream covers it already
    if (capturing(stream)) {
        // An event recorded inside a graph can't be polled later: fall back to
        // record_stream, which records at the free (after the capture).
        u.recorded = true;
        return 0;
    }
    if (u.event == nullptr && (u.event = acquire_event(b->device)) == nullptr) return -1;
    // One live event per stream: re-recording subsumes the earlier record,
    // since the stream runs in order.
    if (!record(u.event, stream, b, noted ? "record_event(note_use)" : "record_event(record_use)")) return -1;
    u.noted = noted;
    return 0;
}

// ---- events ---------------------------------------------------------------------

Event CachingAllocator::acquire_event(int device) {
    auto& pool = event_pool_[device];
    if (!pool.empty()) {
        Event e = pool.back();
        pool.pop_back();
        return e;
    }
    Event e = nullptr;
    int code = 0;
    if (rt_->event_create(&e, device, &code) != Status::ok) {
        runtime_error("event_create", code, nullptr, nullptr);
        return nullptr;
    }
    c_.events_created++;
    return e;
}

void CachingAllocator::release_event(Event e, int device) { event_pool_[device].push_back(e); }

void CachingAllocator::destroy_event(Event e, int device) {
    int code = 0;
    if (rt_->event_destroy(e, device, &code) != Status::ok) runtime_error("event_destroy", code, nullptr, nullptr);
}

bool CachingAllocator::record(Event e, Stream stream, Block* b, const char* op) {
    int code = 0;
    if (rt_->event_record(e, stream, &code) != Status::ok) {
        runtime_error(op, code, b, stream);
        return false;
    }
    c_.events_recorded++;
    return true;
}

void CachingAllocator::process_events() {
    std::lock_guard<std::mutex> lock(mu_);
    if (rt_ != nullptr) process_events_locked();
}

// Releases the held events of `b` that have fired; true when none is left.
bool CachingAllocator::drop_fired_events(Block* b) {
    auto keep = b->held.begin();
    for (Event e : b->held) {
        int code = 0;
        Status s = rt_->event_query(e, &code);
        if (s == Status::ok) {
            release_event(e, b->device);
            continue;
        }
        if (s != Status::not_ready) runtime_error("event_query", code, b, nullptr);
        *keep++ = e;
    }
    b->held.erase(keep, b->held.end());
    return b->held.empty();
}

void CachingAllocator::process_events_locked() {
    auto still_pending = pending_.begin();
    for (Block* b : pending_) {
        if (!drop_fired_events(b)) {
            *still_pending++ = b;
            continue;
        }
        c_.pending_blocks--;
        c_.pending_bytes -= b->size;
        cache_block(b);
    }
    pending_.erase(still_pending, pending_.end());
}

// ---- cache release, stats, snapshot, reset --------------------------------------------

void CachingAllocator::empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    if (rt_ == nullptr) return;
    process_events_locked();
    // Under stream_wait, cached blocks may still hold events that have fired.
    for (auto& entry : segments_) {
        for (Block* b = entry.second->first; b != nullptr; b = b->next) {
            if (b->state == BlockState::cached && !b->held.empty()) drop_fired_events(b);
        }
    }
    release_free_segments();
}

void CachingAllocator::release_free_segments() {
    for (auto it = segments_.begin(); it != segments_.end();) {
        Segment* seg = it->second;
        Block* b = seg->first;
        bool whole = b->next == nullptr && b->state == BlockState::cached && b->held.empty();
        if (!whole) {
            ++it;
            continue;
        }
        int code = 0;
        if (rt_->free(seg->base, seg->device, &code) != Status::ok) {
            runtime_error("free", code, b, nullptr);
            ++it;
            continue;
        }
        pool_erase(b);
        recycle_block(b);
        c_.segments--;
        c_.segment_frees++;
        c_.reserved_bytes -= seg->size;
        it = segments_.erase(it);
        delete seg;
    }
}

void CachingAllocator::stats(npl_stats* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    *out = npl_stats{c_.live_bytes, c_.live_blocks, c_.cached_bytes, c_.cached_blocks,
                     c_.pending_bytes, c_.pending_blocks, c_.reserved_bytes, c_.segments,
                     c_.peak_live_bytes, c_.peak_reserved_bytes, c_.peak_active_bytes,
                     c_.requested_live_bytes,
                     c_.allocations, c_.frees, c_.cache_hits,
                     c_.segment_allocs, c_.segment_frees, c_.oom_retries, c_.oom_failures,
                     c_.events_created, c_.events_recorded, c_.stream_waits,
                     c_.deferred_frees, findings_.total(), findings_.dropped()};
}

void CachingAllocator::reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    c_.peak_live_bytes = c_.live_bytes;
    c_.peak_reserved_bytes = c_.reserved_bytes;
    c_.peak_active_bytes = c_.live_bytes + c_.pending_bytes;
}

std::string CachingAllocator::snapshot_json() const {
    std::lock_guard<std::mutex> lock(mu_);
    Json j;
    j.open_object().key("runtime").value(rt_ ? rt_->name : "none");
    j.key("policy").value(policy_ == Policy::poll ? "poll" : "stream_wait");
    j.key("segments").open_array();
    for (const auto& entry : segments_) {
        const Segment* seg = entry.second;
        j.open_object().key("address").pointer(seg->base).key("size").value(static_cast<uint64_t>(seg->size));
        j.key("device").value(seg->device).key("stream").pointer(seg->stream);
        j.key("pool").value(seg->small ? "small" : "large").key("blocks").open_array();
        for (const Block* b = seg->first; b != nullptr; b = b->next) {
            j.open_object().key("address").pointer(b->ptr).key("size").value(static_cast<uint64_t>(b->size));
            if (b->state == BlockState::live) j.key("requested").value(static_cast<uint64_t>(b->requested));
            j.key("state").value(state_name(b->state)).key("alloc_stream").pointer(b->stream);
            j.key("recorded_streams").open_array();
            for (const StreamUse& u : b->uses) {
                if (u.recorded) j.pointer(u.stream);
            }
            j.close_array().key("use_events").open_array();
            for (const StreamUse& u : b->uses) {
                if (u.event == nullptr) continue;
                j.open_object().key("stream").pointer(u.stream);
                j.key("kind").value(u.noted ? "note_use" : "record_use").close_object();
            }
            j.close_array().key("held_events").value(static_cast<uint64_t>(b->held.size()));
            j.close_object();
        }
        j.close_array().close_object();
    }
    j.close_array().close_object();
    return j.str();
}

void CachingAllocator::reset() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : segments_) {
        Segment* seg = entry.second;
        for (Block* b = seg->first; b != nullptr;) {
            for (const StreamUse& u : b->uses) {
                if (u.event != nullptr) destroy_event(u.event, b->device);
            }
            for (Event e : b->held) destroy_event(e, b->device);
            Block* next = b->next;
            delete b;
            b = next;
        }
        int code = 0;
        if (rt_->free(seg->base, seg->device, &code) != Status::ok) runtime_error("free", code, nullptr, nullptr);
        delete seg;
    }
    for (auto& entry : event_pool_) {
        for (Event e : entry.second) destroy_event(e, entry.first);
    }
    for (Block* b : spare_blocks_) delete b;
    segments_.clear();
    pools_.clear();
    live_.clear();
    pending_.clear();
    spare_blocks_.clear();
    event_pool_.clear();
    c_ = Counters();
}

}  // namespace npl
