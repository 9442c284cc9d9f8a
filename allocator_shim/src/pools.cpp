#include "pools.h"

#include "describe.h"

namespace npl {

Pool* Pools::find_filed(const PoolKey& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    remember(key, &it->second);
    return &it->second;
}

Pool* Pools::make(const PoolKey& key) {
    Pool& p = map_[key];
    p.device = key.device;
    p.stream = key.stream;
    p.small = key.small;
    p.id = key.id;
    remember(key, &p);
    return &p;
}

void Pools::clear() {
    map_.clear();
    last_ = nullptr;
}

size_t Pools::check(const std::function<void(const std::string&)>& fail) const {
    size_t total = 0;
    for (const auto& entry : map_) {
        const Pool& p = entry.second;
        if (!(PoolKey{p.device, p.stream, p.small, p.id} == entry.first)) fail("a pool is filed under another key");
        size_t n = 0;
        const Block* last = nullptr;
        for (const Block* b = p.blocks.at_least(0); b != nullptr; b = p.blocks.after(b)) {
            n++;
            if (b->pool != &p || b->state != BlockState::cached) fail(where(b) + " is in a pool it is not cached in");
            if (last != nullptr && !(last->size < b->size || (last->size == b->size && last->ptr < b->ptr))) {
                fail(where(b) + " is out of best-fit order in its pool");
            }
            last = b;
        }
        if (n != p.blocks.size()) fail("a pool's set size disagrees with its walk");
        total += n;
    }
    if (last_ != nullptr) {
        auto it = map_.find(last_key_);
        if (it == map_.end() || &it->second != last_) fail("the remembered pool is not the one filed under its key");
    }
    return total;
}

}  // namespace npl
