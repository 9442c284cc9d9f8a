// The out-of-memory path, the memory fraction, and giving segments back.
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "caching_allocator.h"
#include "expansion.h"

namespace npl {

namespace {
thread_local std::string oom_message;

// Sizes as torch's out-of-memory message writes them (its tests match them).
std::string size_text(uint64_t bytes) {
    char buf[48];
    if (bytes <= 1024) {
        std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes", bytes);
    } else if (bytes <= (1ull << 20)) {
        std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(bytes) / 1024.0);
    } else if (bytes <= (1ull << 30)) {
        std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
    } else {
        std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
    }
    return buf;
}

// What torch's message calls the device: "GPU 0", "NPU 0".
std::string device_word(const char* runtime, int device) {
    std::string name = runtime;
    std::string kind = name == "cuda" ? "GPU" : name == "acl" ? "NPU" : "device";
    return kind + " " + std::to_string(device);
}
}  // namespace

const std::string& last_oom_message() { return oom_message; }
void set_last_failure(std::string why) { oom_message = std::move(why); }

// Whether reserving `bytes` more would pass the device's memory fraction.
bool CachingAllocator::over_fraction(int device, size_t bytes, int* code) {
    double fraction = static_cast<size_t>(device) < fractions_.size() ? fractions_[device] : 1.0;
    if (fraction >= 1.0) return false;
    size_t total = 0;
    if (rt_->memory_total(device, &total, code) != Status::ok) return false;
    auto limit = static_cast<uint64_t>(fraction * static_cast<double>(total));
    auto reserved = static_cast<uint64_t>(dstats(device).get(StatId::reserved_bytes).current);
    *code = 0;
    return reserved + bytes > limit;
}

Status CachingAllocator::device_malloc(void** ptr, size_t bytes, int device, int* code) {
    if (over_fraction(device, bytes, code)) return Status::out_of_memory;
    return rt_->malloc(ptr, bytes, device, code);
}

// A segment's memory: from its pool's own allocator if it has one, else the
// runtime's; the memory fraction applies to both, checked first, as torch does.
Status CachingAllocator::segment_malloc(const SegmentSource& source, void** ptr, size_t bytes, int device,
                                        Stream stream, int* code) {
    if (source.alloc == nullptr) return device_malloc(ptr, bytes, device, code);
    if (over_fraction(device, bytes, code)) return Status::out_of_memory;
    *code = 0;
    *ptr = source.alloc(bytes, device, stream, source.ctx);
    return *ptr != nullptr ? Status::ok : Status::out_of_memory;
}

Status CachingAllocator::segment_free(const Segment* seg, int* code) {
    if (seg->expansion != nullptr) {  // (reset) every page and the range
        Status s = Status::ok;
        return release_expansion(seg->expansion, &s, code) ? s : Status::error;
    }
    // The work queued on the segment's stream runs to its end first: a pool
    // allocator's free (torch.cuda.MemPool(allocator)) may unmap at once, and
    // so may aclrtFree; cudaFree waits for the device itself.  (Uses on other
    // streams were waited for through their events before the segment was
    // free; one the program never declared is its bug, which the simulated
    // runtime's free counts.)
    if (seg->source.ordered) return ordered_->free_async(seg->base, seg->device, seg->stream, code);  // oracle mode
    Status synced = rt_->stream_synchronize(seg->stream, code);
    if (synced != Status::ok) return synced;
    if (seg->source.alloc == nullptr) return rt_->free(seg->base, seg->device, code);
    seg->source.free(seg->base, seg->size, seg->device, seg->stream, seg->source.ctx);
    return Status::ok;
}

bool CachingAllocator::set_memory_fraction(double fraction, int device) {
    Locked lock(this);
    if (!(fraction >= 0.0 && fraction <= 1.0) || device < 0) {
        Finding f;
        f.kind = "invalid_argument";
        f.op = "set_memory_fraction";
        f.device = device;
        f.detail = "the fraction must be in [0, 1] and the device >= 0; ignored";
        report(std::move(f));
        return false;
    }
    if (static_cast<size_t>(device) >= fractions_.size()) fractions_.resize(device + 1, 1.0);
    fractions_[device] = fraction;
    return true;
}

double CachingAllocator::memory_fraction(int device) const {
    Locked lock(this);
    return device >= 0 && static_cast<size_t>(device) < fractions_.size() ? fractions_[device] : 1.0;
}

// Frees memory step by step, searching the pool again after each step that
// may have made a cached block fit, and retrying the runtime after each step
// that gave memory back.  During a capture on this device (the runtime says
// the allocating stream, or a stream an open capture of the device is known
// to use, captures) no event may be queried or waited on and no segment
// freed: the runtime is only asked again.  A pool opened with no capture
// (torch.cuda.MemPool, cudagraph trees' warm-up) or a capture on another
// device does not freeze it: it runs thawed, skipping capturing streams.
Block* CachingAllocator::out_of_memory_path(Pool* p, size_t size, Stream stream, Status first, int code) {
    int device = p->device;
    if (first != Status::out_of_memory) {
        runtime_error("malloc", code, nullptr, stream);
        const char* words = rt_->error_string(code);
        oom_message = std::string("npu_lifetime shim: the runtime failed to allocate on device ") +
                      std::to_string(device) + " (" + rt_->name + " error " + std::to_string(code) +
                      (words != nullptr && *words ? std::string(": ") + words : std::string()) + ")";
        return nullptr;
    }
    DeviceStats& st = dstats(device);
    st.count(CounterId::num_alloc_retries);
    auto retry = [&]() -> Block* {
        release_free_segments(device, false);
        Status s = Status::ok;
        int c = 0;
        return try_new_segment(p, size, &s, &c);
    };
    bool frozen = capturing(stream) || real_capture_on(device);
    struct Thaw {  // for the duration of this path only
        bool& flag;
        bool before;
        ~Thaw() { flag = before; }
    } thaw{thawed_, thawed_};
    thawed_ = !frozen;
    Block* b = nullptr;
    if (!frozen) {
        process_deferred();
        process_events_locked();
        if ((b = take_cached(p, size, stream)) != nullptr) return b;
        drop_fired_events_of_cached(device);
        // another stream's free segment behind GPU-side waits costs less than the
        // device synchronisation of giving cached memory back (cross_stream.cpp)
        if (cross_stream_ != CrossStream::off && p->id.eager() && (b = adopt_foreign(p, size, stream, true)) != nullptr)
            return b;
    }
    if ((b = retry()) != nullptr) return b;
    if (!frozen) {
        synchronize_held_events(device);
        process_events_locked();
        drop_fired_events_of_cached(device);
        if ((b = take_cached(p, size, stream)) != nullptr) return b;
        if (!quarantine_.empty()) {
            trim_quarantine(true);
            if ((b = take_cached(p, size, stream)) != nullptr) return b;
        }
        if ((b = retry()) != nullptr) return b;
    }
    if (p->id.eager() && (b = take_from_use_on_oom_pools(p, size, stream)) != nullptr) return b;
    st.count(CounterId::num_ooms);
    note_oom(device, size, segment_size_for(size, p->small), stream, code, frozen ? "during a graph capture" : "");
    return nullptr;
}

// torch's last resort before an eager allocation fails: the cached blocks
// (same stream and size class) of the device's MemPool(use_on_oom=True)
// pools, first marked first.  The block stays its pool's: it goes back there
// when freed.  No new segment is made for such a pool.
Block* CachingAllocator::take_from_use_on_oom_pools(const Pool* eager, size_t size, Stream stream) {
    for (PoolId id : graph_pools_.use_on_oom(eager->device)) {
        Pool* lender = pools_.find(PoolKey{eager->device, stream, eager->small, id});
        if (lender == nullptr) continue;
        if (Block* b = take_cached(lender, size, stream)) return b;
    }
    return nullptr;
}

void CachingAllocator::note_oom(int device, size_t size, size_t segment, Stream stream, int code, const char* why) {
    const DeviceStats& st = dstats(device);
    uint64_t reserved = st.get(StatId::reserved_bytes).current, allocated = st.get(StatId::allocated_bytes).current;
    uint64_t pending = st.get(StatId::pending_bytes).current, quarantined = st.get(StatId::quarantined_bytes).current;
    size_t total = 0;
    int c = 0;
    rt_->memory_total(device, &total, &c);
    double fraction = static_cast<size_t>(device) < fractions_.size() ? fractions_[device] : 1.0;
    // torch's sentences first (its own tests match them), then the shim's account
    std::string text = "npu_lifetime shim: out of memory on device " + std::to_string(device) + ". Tried to allocate " +
                       size_text(size) + ". " + device_word(rt_->name, device) + " has a total capacity of " +
                       (total ? size_text(total) : std::string("(not reported by the runtime)")) +
                       ". Of the allocated memory " + size_text(allocated) + " is allocated to live tensors, and " +
                       size_text(reserved - allocated) + " is reserved but unallocated: " + size_text(pending) +
                       " freed but waiting for other streams' events, " + size_text(reserved - allocated - pending) +
                       " cached";
    if (quarantined) text += " (" + size_text(quarantined) + " of it in the debug quarantine)";
    text += ". The request needed a " + size_text(segment) + " segment";
    if (fraction < 1.0) text += "; memory fraction " + std::to_string(fraction);
    if (*why) text += std::string("; ") + why;
    text += ".";
    oom_message = text;
    Finding f;
    f.kind = "out_of_memory";
    f.op = "alloc";
    f.size = static_cast<int64_t>(size);
    f.device = device;
    f.stream = stream;
    f.code = code;
    f.detail = text;
    report(std::move(f));
}

bool CachingAllocator::segment_releasable(const Segment* seg) const {
    const Block* b = seg->first;
    if (b->next != nullptr || b->state != BlockState::cached || !b->held.empty()) return false;
    return seg->pool_id.eager() || graph_pools_.freeable(seg->device, seg->pool_id);
}

// Gives fully free segments back (of `device`, or of every device); never
// while a capture is underway (freeing memory synchronises the device).
void CachingAllocator::release_free_segments(int device, bool any_device) {
    if (queries_frozen()) return;
    segments_.remove_if([&](Segment* seg) {
        if (!any_device && seg->device != device) return false;
        if (seg->expansion != nullptr) return shrink_expandable(seg);
        return segment_releasable(seg) && release_segment(seg);
    });
}

// Gives back the fully free segments of one graph pool (on `device`, < 0:
// every device), and nothing else: its other segments go as their last
// blocks are freed (cache_block) once the pool is released.
void CachingAllocator::release_pool_segments(int device, PoolId id) {
    if (queries_frozen()) return;
    segments_.remove_if([&](Segment* seg) {
        bool mine = (device < 0 || seg->device == device) && seg->pool_id == id;
        return mine && segment_releasable(seg) && release_segment(seg);
    });
}

// Frees one fully free segment's memory to the runtime and recycles its
// block; true when it went (the caller then removes it from segments_), false
// (the segment stays, and a finding says why) if the runtime refuses.
bool CachingAllocator::release_segment(Segment* seg) {
    Block* b = seg->first;
    int code = 0;
    if (segment_free(seg, &code) != Status::ok) {
        runtime_error("free", code, b, nullptr);
        return false;
    }
    trace(TraceKind::segment_free, b, nullptr);
    history_segment(NPL_HISTORY_SEGMENT_FREE, seg, seg->base, seg->size);
    pool_erase(b);
    recycle_block(b);
    DeviceStats& st = dstats(seg->device);
    st.add(StatId::segment, seg->small, -1);
    st.add(StatId::reserved_bytes, seg->small, -static_cast<int64_t>(seg->size));
    st.count(CounterId::num_device_free);
    return true;
}

// As torch's emptyCache(mempool_id): the host first waits for the events
// freed blocks hold (pending blocks and cached blocks carrying use events),
// so those blocks are free too, then every fully free segment goes back, or
// for a graph pool's id only that pool's.  While a capture may be underway
// only segments already free go (none do: frozen).
void CachingAllocator::empty_cache(PoolId id, int device) {
    Locked lock(this);
    if (rt_ == nullptr) return;
    if (!graph_pools_.any_capture_underway()) {
        process_deferred();
        for (size_t d = 0; d < stats_.size(); ++d) synchronize_held_events(static_cast<int>(d));
        process_events_locked();
        for (size_t d = 0; d < stats_.size(); ++d) drop_fired_events_of_cached(static_cast<int>(d));
        trim_quarantine(true);
    }
    if (id.eager()) release_free_segments(0, true);
    else release_pool_segments(device, id);
}

}  // namespace npl
