// The allocator's statistics: ONE list (NPL_STATS below) from which the
// counters, their names and their export are all generated.
//
// A "stat" is tracked per pool kind (all / small_pool / large_pool) with
// torch's four fields (current, peak, allocated = sum of increments,
// freed = sum of decrements) and exported as "name.pool.field", the keys
// torch.cuda.memory_stats() uses.  A "counter" is a plain event count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// X(name, meaning)
#define NPL_STATS(STAT, COUNTER)                                                                  \
    STAT(allocation, "live blocks")                                                               \
    STAT(segment, "plain segments reserved from the runtime (torch leaves expandable ones out)") \
    STAT(active, "live blocks + freed blocks that wait for events (not reusable)")              \
    STAT(inactive_split, "cached blocks that are part of a split plain segment")                \
    STAT(allocated_bytes, "bytes of live blocks (rounded sizes)")                               \
    STAT(reserved_bytes, "bytes of segments (of expandable ones: the mapped bytes)")           \
    STAT(active_bytes, "bytes of live blocks + freed blocks that wait for events")              \
    STAT(inactive_split_bytes, "bytes of cached blocks in split segments")                       \
    STAT(requested_bytes, "bytes the live owners asked for")                                     \
    STAT(pending, "freed blocks held until their events fire")                                   \
    STAT(pending_bytes, "bytes of freed blocks held until their events fire")                    \
    STAT(waiting, "cached blocks carrying use events (reused behind a GPU-side wait)")          \
    STAT(waiting_bytes, "bytes of cached blocks carrying use events")                            \
    STAT(quarantined, "freed blocks poisoned and held back (debug mode)")                        \
    STAT(quarantined_bytes, "bytes of quarantined blocks (debug mode)")                          \
    COUNTER(num_alloc_retries, "allocations that ran the out-of-memory path")                    \
    COUNTER(num_ooms, "allocations that failed after the out-of-memory path")                    \
    COUNTER(num_sync_all_streams, "out-of-memory paths that waited on every pending event")     \
    COUNTER(num_device_alloc, "segment allocations and page maps from the runtime")            \
    COUNTER(num_device_free, "segment frees and page unmaps to the runtime")                     \
    COUNTER(cache_hits, "allocations served from the cache")                                     \
    COUNTER(unmerged_reuses, "cache hits that took back the block the last free left unmerged")  \
    COUNTER(events_created, "runtime events created")                                            \
    COUNTER(events_recorded, "events recorded (record_use, record_stream at free, note_use)")    \
    COUNTER(stream_waits, "GPU-side waits issued when reusing a block")                          \
    COUNTER(cross_stream_segments, "free segments taken from another stream's pool")             \
    COUNTER(deferred_frees, "frees that had to wait for events")                                 \
    COUNTER(capture_deferred_frees, "frees during a graph capture whose events were deferred")  \
    COUNTER(poison_checks, "quarantined blocks checked before reuse (debug mode)")               \
    COUNTER(poison_violations, "quarantined blocks found written after their free (debug mode)") \
    COUNTER(findings, "findings reported")                                                       \
    COUNTER(findings_dropped, "findings dropped from a full queue")                              \
    COUNTER(trace_dropped, "trace events dropped from a full ring")

namespace npl {

enum class StatId : int {
#define NPL_STAT_ID(name, meaning) name,
#define NPL_SKIP(name, meaning)
    NPL_STATS(NPL_STAT_ID, NPL_SKIP)
#undef NPL_STAT_ID
        count_
};

enum class CounterId : int {
#define NPL_COUNTER_ID(name, meaning) name,
    NPL_STATS(NPL_SKIP, NPL_COUNTER_ID)
#undef NPL_COUNTER_ID
#undef NPL_SKIP
        count_
};

constexpr int kStatCount = static_cast<int>(StatId::count_);
constexpr int kCounterCount = static_cast<int>(CounterId::count_);

enum PoolKind : int { kAllPools = 0, kSmallPool = 1, kLargePool = 2, kPoolKinds = 3 };

struct Stat {
    int64_t current = 0, peak = 0, allocated = 0, freed = 0;

    void add(int64_t delta) {
        if (delta > 0) grow(delta);
        else shrink(-delta);
    }
    // add() with the sign known (the hot path: no branch on it).
    void grow(int64_t n) {
        current += n;
        allocated += n;
        if (current > peak) peak = current;
    }
    void shrink(int64_t n) {
        current -= n;
        freed += n;
    }
    // n up and n down again: the sums move, current and peak do not.
    void churn(int64_t n) {
        allocated += n;
        freed += n;
    }
    void reset_peak() { peak = current; }
    void reset_accumulated() { allocated = freed = 0; }
};

// One device's statistics.  "active" (live + pending) is not counted
// separately on the hot path: its current, allocated and freed values are
// derived from "allocation" and "pending" when read, and only its peak is
// kept, raised at each allocation (the only moment it can grow).
struct DeviceStats {
    Stat stats[kStatCount][kPoolKinds];
    uint64_t counters[kCounterCount] = {};
    // pending / pending_bytes when the accumulated values were last reset:
    // those blocks leave the active set later, as frees counted before it.
    int64_t pending_at_reset[2][kPoolKinds] = {};

    void add(StatId id, bool small, int64_t delta) {
        Stat* s = stats[static_cast<int>(id)];
        s[kAllPools].add(delta);
        s[small ? kSmallPool : kLargePool].add(delta);
    }
    void grow(StatId id, bool small, int64_t n) {
        Stat* s = stats[static_cast<int>(id)];
        s[kAllPools].grow(n);
        s[small ? kSmallPool : kLargePool].grow(n);
    }
    void shrink(StatId id, bool small, int64_t n) {
        Stat* s = stats[static_cast<int>(id)];
        s[kAllPools].shrink(n);
        s[small ? kSmallPool : kLargePool].shrink(n);
    }
    void churn(StatId id, bool small, int64_t n) {
        Stat* s = stats[static_cast<int>(id)];
        s[kAllPools].churn(n);
        s[small ? kSmallPool : kLargePool].churn(n);
    }
    // After an allocation: the active peaks of its pool kind and of all.
    void note_active_peak(bool small) {
        int kind = small ? kSmallPool : kLargePool;
        raise_peak(StatId::active, StatId::allocation, StatId::pending, kAllPools);
        raise_peak(StatId::active, StatId::allocation, StatId::pending, kind);
        raise_peak(StatId::active_bytes, StatId::allocated_bytes, StatId::pending_bytes, kAllPools);
        raise_peak(StatId::active_bytes, StatId::allocated_bytes, StatId::pending_bytes, kind);
    }
    // Fills the derived "active" stats from "allocation" and "pending".
    void derive_active();
    const Stat& get(StatId id, PoolKind pool = kAllPools) const { return stats[static_cast<int>(id)][pool]; }
    void count(CounterId id, uint64_t n = 1) { counters[static_cast<int>(id)] += n; }
    uint64_t counter(CounterId id) const { return counters[static_cast<int>(id)]; }
    void reset_peaks();
    void reset_accumulated();

   private:
    void raise_peak(StatId active, StatId live, StatId pending, int pool) {
        Stat& a = stats[static_cast<int>(active)][pool];
        int64_t now = stats[static_cast<int>(live)][pool].current + stats[static_cast<int>(pending)][pool].current;
        if (now > a.peak) a.peak = now;
    }
};

// A stat's name without the ".pool.field" suffix ("allocated_bytes").
const char* stat_name(StatId id);
// The exported names, in the order npl_stats_values writes them.
const std::vector<std::string>& stat_names();
// Writes every value of `s` in stat_names() order.
void stat_values(const DeviceStats& s, uint64_t* out);
// A JSON object {name: meaning} for documentation.
std::string stat_meanings_json();

}  // namespace npl
