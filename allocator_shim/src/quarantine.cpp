// Debug mode: freed blocks are poisoned once really free (every event they
// waited for has fired) and quarantined; a block leaving the quarantine is
// checked, so a write into freed memory is reported with the last owner.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "caching_allocator.h"

namespace npl {

namespace {
// A block up to kFullCheck is checked whole; a larger one at kSamples
// evenly spaced chunks of kSample bytes, the first and last included (a
// kernel writing into freed memory writes far more than a chunk).
constexpr size_t kFullCheck = 64 << 10;
constexpr size_t kSample = 4 << 10;
constexpr size_t kSamples = 16;

std::vector<std::pair<size_t, size_t>> check_ranges(size_t size) {
    if (size <= kFullCheck) return {{0, size}};
    std::vector<std::pair<size_t, size_t>> ranges;
    for (size_t i = 0; i < kSamples; ++i) {
        size_t off = (size - kSample) / (kSamples - 1) * i;
        ranges.emplace_back(off, kSample);
    }
    return ranges;
}
}  // namespace

void CachingAllocator::set_debug(bool enabled, size_t quarantine_bytes) {
    Locked lock(this);
    if (!enabled && rt_ != nullptr) trim_quarantine(true);
    bool changed = enabled != quarantine_.enabled();
    quarantine_.configure(enabled, quarantine_bytes);
    if (changed) regate_pending();  // debug mode holds every event until it fired
}

bool CachingAllocator::debug() const {
    Locked lock(this);
    return quarantine_.enabled();
}

void CachingAllocator::quarantine(Block* b) {
    b->state = BlockState::quarantined;
    DeviceStats& s = dstats(b->device);
    s.add(StatId::quarantined, b->small, 1);
    s.add(StatId::quarantined_bytes, b->small, static_cast<int64_t>(b->size));
    int code = 0;
    // A fill on a capturing stream would become part of the graph: such a
    // block is quarantined unpoisoned (and not checked).
    b->poisoned = !queries_frozen() && !capturing(b->stream);
    if (b->poisoned && rt_->memset_async(b->ptr, kPoisonByte, b->size, b->stream, &code) != Status::ok) {
        runtime_error("memset(poison)", code, b, b->stream);
        b->poisoned = false;
    }
    if (b->poisoned) trace(TraceKind::poison, b, nullptr);
    quarantine_.push(b);
    trim_quarantine(false);
}

// Releases the oldest quarantined blocks while over capacity (all of them
// with `all`), each after a check of its poison.
void CachingAllocator::trim_quarantine(bool all) {
    if (queries_frozen()) return;  // a check synchronises: after the capture
    while (!quarantine_.empty() && (all || quarantine_.over_capacity())) {
        Block* b = quarantine_.pop_oldest();
        check_poison(b);
        DeviceStats& s = dstats(b->device);
        s.add(StatId::quarantined, b->small, -1);
        s.add(StatId::quarantined_bytes, b->small, -static_cast<int64_t>(b->size));
        b->last_streams.clear();
        trace(TraceKind::reusable, b, nullptr);
        cache_block(b);
    }
}

void CachingAllocator::check_poison(Block* b) {
    if (!b->poisoned) return;
    int code = 0;
    if (rt_->stream_synchronize(b->stream, &code) != Status::ok) {
        runtime_error("stream_synchronize(poison check)", code, b, b->stream);
        return;
    }
    dstats(b->device).count(CounterId::poison_checks);
    std::vector<unsigned char> host(std::min(b->size, kFullCheck));
    size_t first_dirty = SIZE_MAX, dirty = 0;
    for (const auto& range : check_ranges(b->size)) {
        size_t off = range.first, n = range.second;
        if (rt_->copy_to_host(host.data(), b->ptr + off, n, b->device, &code) != Status::ok) {
            runtime_error("copy_to_host(poison check)", code, b, b->stream);
            return;
        }
        for (size_t i = 0; i < n; ++i) {
            if (host[i] == kPoisonByte) continue;
            if (first_dirty == SIZE_MAX) first_dirty = off + i;
            dirty++;
        }
    }
    if (dirty == 0) return;
    dstats(b->device).count(CounterId::poison_violations);
    Finding f = about(b, "write_after_free", "quarantine_check");
    for (Stream s : b->last_streams) f.streams.push_back(s);
    f.detail = std::to_string(dirty) + " byte(s) seen written after the free (" +
               (b->size <= kFullCheck ? std::string("whole block checked") : std::string("sampled")) +
               "), the first at offset " +
               std::to_string(first_dirty) + ": a kernel of the last owner (generation " +
               std::to_string(b->generation) + ") still wrote into it; its streams are `alloc_stream` and `streams`. "
               "A record_stream/record_use for the writing stream is missing";
    report(std::move(f));
}

}  // namespace npl
