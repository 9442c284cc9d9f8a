// The invariant checker: walks every segment, block, pool, event and
// statistic and says which of the invariants stated at the top of
// caching_allocator.cpp do not hold, and asks the data structures that
// state their own (segments.h, event_queues.h, address_book.h,
// capture_joins.h) about theirs.  Tests call it after every step of the
// stress and property tests (npl_check_invariants); a build with
// -DNPL_CHECK_INVARIANTS (NPL_DEBUG_INVARIANTS=1 pip install -e .) also runs
// it after every C entry point and reports a violation as an
// `invariant_violation` finding, as mimalloc and torch assert theirs in
// debug builds.  It only reads: no runtime call, no change (its lock, as
// every entry point's, first merges a block the last free left unmerged:
// caching_allocator.cpp, "the cached pair").
#include <array>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "caching_allocator.h"
#include "describe.h"

namespace npl {

namespace {

constexpr size_t kMaxReported = 32;

// The statistics a walk of the blocks can recount (the others are event
// counts or peaks).
constexpr StatId kRecounted[] = {
    StatId::allocation,     StatId::segment,        StatId::inactive_split, StatId::allocated_bytes,
    StatId::reserved_bytes, StatId::inactive_split_bytes, StatId::requested_bytes, StatId::pending,
    StatId::pending_bytes,  StatId::waiting,        StatId::waiting_bytes,  StatId::quarantined,
    StatId::quarantined_bytes};

struct Recount {
    std::array<std::array<int64_t, kPoolKinds>, kStatCount> v{};
    void add(StatId id, bool small, int64_t n) {
        v[static_cast<int>(id)][kAllPools] += n;
        v[static_cast<int>(id)][small ? kSmallPool : kLargePool] += n;
    }
};

const char* const kFields[4] = {"current", "peak", "allocated", "freed"};

}  // namespace

std::vector<std::string> CachingAllocator::invariant_violations() const {
    Locked lock(this);
    return invariant_violations_locked();
}

std::vector<std::string> CachingAllocator::invariant_violations_locked() const {
    std::vector<std::string> bad;
    auto fail = [&](const std::string& what) {
        if (bad.size() < kMaxReported) bad.push_back(what);
    };
    std::map<int, Recount> recount;
    std::unordered_set<Event> events;
    auto note_event = [&](Event e, const std::string& holder) {
        if (e == nullptr) {
            fail(holder + " holds a null event");
        } else if (!events.insert(e).second) {
            fail(holder + " holds event " + hex(e) + " that something else holds too");
        }
    };
    std::unordered_map<const Pool*, size_t> cached_in;
    size_t pending_blocks = 0, deferred_blocks = 0, quarantined_blocks = 0, awaiting_blocks = 0;
    int expandable_segments = 0;
    std::unordered_set<const Segment*> expandable_seen;

    // The segments and the blocks that tile them (segments.h states those
    // invariants); then each block in its state, pool and statistics.
    segments_.check(fail);
    segments_.for_each([&](const Segment* seg) {
        Recount& r = recount[seg->device];
        if (seg->expansion == nullptr) r.add(StatId::segment, seg->small, 1);  // torch counts plain ones
        if (seg->expansion != nullptr) {
            expandable_segments++;
            expandable_seen.insert(seg);
            const Pool* owner = seg->first->pool;
            if (owner == nullptr || owner->expandable != seg) {
                fail("expandable segment " + hex(seg->base) + " is not the one its pool grows");
            }
        }
        r.add(StatId::reserved_bytes, seg->small, static_cast<int64_t>(seg->size));
        const Block* prev = nullptr;
        for (const Block* b = seg->first; b != nullptr; prev = b, b = b->next) {
            std::string at = where(b);
            const Pool* p = b->pool;
            if (p == nullptr || p->device != seg->device || p->stream != seg->stream || p->small != seg->small ||
                !(p->id == seg->pool_id)) {
                fail(at + " belongs to a pool other than its segment's (device, stream, size class, graph pool)");
            } else if (static_cast<size_t>(p->device) >= stats_.size() || p->stats != &stats_[p->device]) {
                fail(at + ": its pool does not count into its device's statistics");
            }
            std::unordered_set<Stream> streams;
            for (const HeldEvent& h : b->held) {
                if (!streams.insert(h.stream).second) fail(at + " holds two events of stream " + hex(h.stream));
                note_event(h.event, at);
            }
            streams.clear();
            for (const StreamUse& u : b->uses) {
                if (!streams.insert(u.stream).second) fail(at + " has two use records of stream " + hex(u.stream));
                if (u.stream == b->stream) fail(at + " records a use on its own allocation stream");
                if (u.event != nullptr) note_event(u.event, at);
            }
            if (b->state != BlockState::live && b->state != BlockState::deferred &&
                b->state != BlockState::awaiting_join && !b->uses.empty()) {
                fail(at + " is freed but still has use records");
            }
            switch (b->state) {
                case BlockState::live: {
                    r.add(StatId::allocation, b->small, 1);
                    r.add(StatId::allocated_bytes, b->small, static_cast<int64_t>(b->size));
                    r.add(StatId::requested_bytes, b->small, static_cast<int64_t>(b->requested));
                    if (!b->held.empty()) fail(at + " is live but holds events of a freed block");
                    if (b->requested == 0 || b->requested > b->size) fail(at + ": requested size out of range");
                    const Address* a = book_.find(b->ptr);
                    if (a == nullptr || a->live != b) {
                        fail(at + " is live but the address book does not know it");
                    } else if (a->generation != b->generation) {
                        fail(at + ": its generation differs from the address book's");
                    }
                    break;
                }
                case BlockState::pending:
                    pending_blocks++;
                    r.add(StatId::pending, b->small, 1);
                    r.add(StatId::pending_bytes, b->small, static_cast<int64_t>(b->size));
                    if (b->held.empty()) fail(at + " is pending with no event to wait for");
                    break;
                case BlockState::awaiting_join:
                    awaiting_blocks++;
                    if (!graph_pools_.open(b->device, b->pool->id)) {
                        fail(at + " waits for the join of a capture whose pool is not open");
                    }
                    r.add(StatId::pending, b->small, 1);
                    r.add(StatId::pending_bytes, b->small, static_cast<int64_t>(b->size));
                    break;
                case BlockState::deferred:
                    deferred_blocks++;
                    r.add(StatId::pending, b->small, 1);
                    r.add(StatId::pending_bytes, b->small, static_cast<int64_t>(b->size));
                    break;
                case BlockState::quarantined:
                    quarantined_blocks++;
                    r.add(StatId::quarantined, b->small, 1);
                    r.add(StatId::quarantined_bytes, b->small, static_cast<int64_t>(b->size));
                    break;
                case BlockState::cached:
                    cached_in[p]++;
                    if (b->split() && seg->expansion == nullptr) {
                        r.add(StatId::inactive_split, b->small, 1);
                        r.add(StatId::inactive_split_bytes, b->small, static_cast<int64_t>(b->size));
                    }
                    if (!b->held.empty()) {
                        r.add(StatId::waiting, b->small, 1);
                        r.add(StatId::waiting_bytes, b->small, static_cast<int64_t>(b->size));
                    }
                    if (prev != nullptr && prev->state == BlockState::cached) {
                        fail(at + " and its cached predecessor were not merged");
                    }
                    break;
            }
        }
    });

    // Pools (pools.h states their invariants): each set holds exactly the
    // blocks cached in it.
    size_t cached_total = pools_.check(fail);
    pools_.for_each([&](const Pool& p) {
        auto it = cached_in.find(&p);
        size_t n = p.blocks.size(), cached = it == cached_in.end() ? 0 : it->second;
        if (n != cached) {
            fail("pool (device " + std::to_string(p.device) + ", stream " + hex(p.stream) + ") holds " +
                 std::to_string(n) + " blocks, " + std::to_string(cached) + " are cached in it");
        }
        if (p.expandable != nullptr && (expandable_seen.count(p.expandable) == 0 || !p.id.eager())) {
            fail("pool (device " + std::to_string(p.device) + ", stream " + hex(p.stream) +
                 ") grows a segment that is not an expandable segment of the eager pool");
        }
    });
    if (expandable_segments != expansions_) {
        fail(std::to_string(expansions_) + " expandable segments counted, " + std::to_string(expandable_segments) +
             " exist");
    }
    size_t cached_blocks = 0;
    for (const auto& entry : cached_in) cached_blocks += entry.second;
    if (cached_total != cached_blocks) fail("cached blocks outside any pool's set");

    // The events of freed blocks (event_queues.h states their invariants).
    events_.check(fail, [&](const HeldEvent& h) { return gates(h); }, pending_blocks, deferred_blocks);
    joins_.check(fail, awaiting_blocks);  // (capture_joins.h)
    size_t q_bytes = 0;
    for (const Block* b : quarantine_.blocks()) {
        if (b->state != BlockState::quarantined) fail(where(b) + " is in the quarantine but not quarantined");
        q_bytes += b->size;
    }
    if (quarantine_.blocks().size() != quarantined_blocks || q_bytes != quarantine_.bytes()) {
        fail("the quarantine does not hold exactly the quarantined blocks");
    }

    // Idle events are nobody's.
    events_.for_each_idle([&](Event e, int device) {
        note_event(e, "the event pool of device " + std::to_string(device));
    });

    // The address book: every live entry is a live block at that address,
    // every freed one on its bounded list of freed addresses.
    std::string book = book_.list_problem();
    if (!book.empty()) fail("address book: " + book);
    book_.for_each([&](const void* ptr, const Address& a) {
        if (a.live == nullptr) return;
        if (a.live->ptr != ptr || a.live->state != BlockState::live) {
            fail("the address book names a block at " + hex(ptr) + " that is not live there");
        }
    });

    // Statistics: what the walk recounts, and no field below zero.
    for (size_t d = 0; d < stats_.size(); ++d) {
        const Recount& r = recount[static_cast<int>(d)];
        for (StatId id : kRecounted) {
            for (int pool = 0; pool < kPoolKinds; ++pool) {
                int64_t counted = stats_[d].stats[static_cast<int>(id)][pool].current;
                int64_t walked = r.v[static_cast<int>(id)][pool];
                if (counted != walked) {
                    fail("device " + std::to_string(d) + ": statistic " + stat_name(id) + "[" + std::to_string(pool) + "].current is " + std::to_string(counted) +
                         ", the blocks say " + std::to_string(walked));
                }
            }
        }
        DeviceStats s = stats_[d];
        s.derive_active();
        for (int id = 0; id < kStatCount; ++id) {
            for (int pool = 0; pool < kPoolKinds; ++pool) {
                const Stat& v = s.stats[id][pool];
                const int64_t fields[4] = {v.current, v.peak, v.allocated, v.freed};
                for (int f = 0; f < 4; ++f) {
                    if (fields[f] < 0) {
                        fail("device " + std::to_string(d) + ": statistic " + stat_name(static_cast<StatId>(id)) +
                             "[" + std::to_string(pool) + "]." + kFields[f] + " is negative (" +
                             std::to_string(fields[f]) + ")");
                    }
                }
                if (v.peak < v.current) fail("device " + std::to_string(d) + ": a peak below its current value");
            }
        }
    }
    for (const auto& entry : recount) {
        if (static_cast<size_t>(entry.first) >= stats_.size()) {
            fail("blocks of device " + std::to_string(entry.first) + " that has no statistics");
        }
    }
    return bad;
}

void CachingAllocator::check_invariants(const char* op) {
    std::vector<std::string> bad;
    {
        Locked lock(this);
        bad = invariant_violations_locked();
    }
    for (const std::string& what : bad) {
        Finding f;
        f.kind = "invariant_violation";
        f.op = op;
        f.detail = what;
        findings_.push(std::move(f));
    }
}

}  // namespace npl
