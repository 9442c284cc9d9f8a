#include "stats.h"

#include <utility>

#include "json.h"

namespace npl {

namespace {

const char* const kPoolNames[kPoolKinds] = {"all", "small_pool", "large_pool"};
const char* const kFieldNames[4] = {"current", "peak", "allocated", "freed"};

struct Entry {
    const char* name;
    const char* meaning;
    bool stat;
};

const Entry kEntries[] = {
#define NPL_STAT_ENTRY(name, meaning) {#name, meaning, true},
#define NPL_COUNTER_ENTRY(name, meaning) {#name, meaning, false},
    NPL_STATS(NPL_STAT_ENTRY, NPL_COUNTER_ENTRY)
#undef NPL_STAT_ENTRY
#undef NPL_COUNTER_ENTRY
};

}  // namespace

const char* stat_name(StatId id) {
    int i = static_cast<int>(id);
    return i >= 0 && i < kStatCount ? kEntries[i].name : "?";  // the stats come first in NPL_STATS
}

void DeviceStats::derive_active() {
    const std::pair<StatId, std::pair<StatId, StatId>> derived[] = {
        {StatId::active, {StatId::allocation, StatId::pending}},
        {StatId::active_bytes, {StatId::allocated_bytes, StatId::pending_bytes}}};
    for (int i = 0; i < 2; ++i) {
        const auto& d = derived[i];
        for (int pool = 0; pool < kPoolKinds; ++pool) {
            const Stat& live = stats[static_cast<int>(d.second.first)][pool];
            const Stat& pending = stats[static_cast<int>(d.second.second)][pool];
            Stat& a = stats[static_cast<int>(d.first)][pool];
            a.current = live.current + pending.current;
            a.allocated = live.allocated;  // every allocation makes a block active
            // Blocks that left the active set since the last reset: the frees
            // since then, less those still pending, plus the blocks pending at
            // the reset that have left since (never below zero).
            a.freed = live.freed - pending.current + pending_at_reset[i][pool];
            if (a.current > a.peak) a.peak = a.current;
        }
    }
}

void DeviceStats::reset_peaks() {
    derive_active();
    for (auto& row : stats) {
        for (Stat& s : row) s.reset_peak();
    }
}

void DeviceStats::reset_accumulated() {
    for (auto& row : stats) {
        for (Stat& s : row) s.reset_accumulated();
    }
    // the counters torch's resetAccumulatedStats zeroes too (the shim's own
    // diagnostics, cache hits, events, findings..., run on)
    for (CounterId id : {CounterId::num_alloc_retries, CounterId::num_ooms, CounterId::num_sync_all_streams,
                         CounterId::num_device_alloc, CounterId::num_device_free}) {
        counters[static_cast<int>(id)] = 0;
    }
    for (int pool = 0; pool < kPoolKinds; ++pool) {
        pending_at_reset[0][pool] = stats[static_cast<int>(StatId::pending)][pool].current;
        pending_at_reset[1][pool] = stats[static_cast<int>(StatId::pending_bytes)][pool].current;
    }
}

const std::vector<std::string>& stat_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> out;
        for (const Entry& e : kEntries) {
            if (!e.stat) {
                out.emplace_back(e.name);
                continue;
            }
            for (const char* pool : kPoolNames) {
                for (const char* field : kFieldNames) out.push_back(std::string(e.name) + "." + pool + "." + field);
            }
        }
        return out;
    }();
    return names;
}

void stat_values(const DeviceStats& s, uint64_t* out) {
    int stat = 0, counter = 0;
    for (const Entry& e : kEntries) {
        if (!e.stat) {
            *out++ = s.counters[counter++];
            continue;
        }
        for (const Stat& v : s.stats[stat++]) {
            *out++ = static_cast<uint64_t>(v.current);
            *out++ = static_cast<uint64_t>(v.peak);
            *out++ = static_cast<uint64_t>(v.allocated);
            *out++ = static_cast<uint64_t>(v.freed);
        }
    }
}

std::string stat_meanings_json() {
    Json j;
    j.open_object();
    for (const Entry& e : kEntries) j.key(e.name).value(e.meaning);
    j.close_object();
    return j.str();
}

}  // namespace npl
