#include "graph_pools.h"

#include <algorithm>
#include <utility>

namespace npl {

void GraphPools::begin(int device, PoolId id, StreamFilter filter, Stream stream) {
    captures_.push_back(Capture{device, id, std::move(filter), {}});
    if (stream != nullptr) captures_.back().streams.push_back(stream);
    incref(device, id);
}

void GraphPools::incref(int device, PoolId id) { refs_or_new(device, id).count++; }

void GraphPools::set_source(int device, PoolId id, SegmentSource source) {
    refs_or_new(device, id).source = source;
}

void GraphPools::set_use_on_oom(int device, PoolId id, bool on) {
    if (!on) {  // (~MemPool, after its release: no entry made for a pool already gone)
        if (Refs* r = refs(device, id)) r->use_on_oom = false;
        return;
    }
    Refs& r = refs_or_new(device, id);
    if (!r.use_on_oom) r.use_on_oom_order = ++marks_;
    r.use_on_oom = true;
}

std::vector<PoolId> GraphPools::use_on_oom(int device) const {
    std::vector<const Refs*> marked;
    for (const Refs& r : refs_) {
        if (r.device == device && r.use_on_oom && r.count > 0 && !open(device, r.id)) marked.push_back(&r);
    }
    std::sort(marked.begin(), marked.end(),
              [](const Refs* a, const Refs* b) { return a->use_on_oom_order < b->use_on_oom_order; });
    std::vector<PoolId> ids;
    for (const Refs* r : marked) ids.push_back(r->id);
    return ids;
}

void GraphPools::set_no_split(int device, PoolId id) { refs_or_new(device, id).no_split = true; }

bool GraphPools::no_split(int device, PoolId id) const {
    const Refs* r = refs(device, id);
    return r != nullptr && r->no_split;
}

GraphPools::Refs& GraphPools::refs_or_new(int device, PoolId id) {
    Refs* r = refs(device, id);
    if (r != nullptr) return *r;
    refs_.push_back(Refs{device, id, 0, {}});
    return refs_.back();
}

SegmentSource GraphPools::source(int device, PoolId id) const {
    const Refs* r = refs(device, id);
    return r == nullptr ? SegmentSource{} : r->source;
}

int GraphPools::use_count(int device, PoolId id) const {
    const Refs* r = refs(device, id);
    return r == nullptr ? 0 : r->count;
}

bool GraphPools::end(int device, PoolId id) {
    auto it = std::find_if(captures_.begin(), captures_.end(),
                           [&](const Capture& c) { return c.device == device && c.id == id; });
    if (it == captures_.end()) return false;
    captures_.erase(it);
    return true;
}

bool GraphPools::known(int device, PoolId id) const { return refs(device, id) != nullptr; }

bool GraphPools::open(int device, PoolId id) const {
    return std::any_of(captures_.begin(), captures_.end(),
                       [&](const Capture& c) { return c.device == device && c.id == id; });
}

bool GraphPools::release(int device, PoolId id) {
    Refs* r = refs(device, id);
    if (r == nullptr) return true;
    if (r->count > 0) r->count--;
    return r->count == 0;
}

// The latest begin that takes the stream: nested use_mem_pool blocks
// allocate to the innermost pool (torch's test_nested_mempool).
PoolId GraphPools::pool_for(int device, Stream stream) {
    for (auto it = captures_.rbegin(); it != captures_.rend(); ++it) {
        Capture& c = *it;
        if (c.device != device || (c.filter && !c.filter(stream))) continue;
        if (std::find(c.streams.begin(), c.streams.end(), stream) == c.streams.end()) c.streams.push_back(stream);
        return c.id;
    }
    return PoolId{};
}

bool GraphPools::freeable(int device, PoolId id) const {
    const Refs* r = refs(device, id);
    return r == nullptr || r->count == 0;
}

GraphPools::Refs* GraphPools::refs(int device, PoolId id) {
    for (Refs& r : refs_) {
        if (r.device == device && r.id == id) return &r;
    }
    return nullptr;
}

const GraphPools::Refs* GraphPools::refs(int device, PoolId id) const {
    return const_cast<GraphPools*>(this)->refs(device, id);
}

void GraphPools::clear() {
    captures_.clear();
    refs_.clear();
    marks_ = 0;
}

}  // namespace npl
