// The free-block pools: one per (device, stream, size class, graph pool),
// each a best-fit ordered set of its cached blocks (block_set.h), as torch
// keeps its BlockPools.  It owns the Pool objects (blocks point at theirs,
// so a pool never moves once made) and answers the lookup every allocation
// makes, remembering the last one (most allocations repeat it).
//
// It makes no runtime call and has no lock of its own: CachingAllocator's
// single mutex guards it with the rest of the allocator's state.  What a
// pool holds is the allocator's business (pool_insert / pool_erase keep the
// cached-block statistics with it).
//
// ---- Invariants (check() tells which do not hold) -------------------------
//
// - Each pool is filed under the key made of its own device, stream, size
//   class and graph pool.
// - Its set holds cached blocks that point back at it, in best-fit order
//   (size, then address), and its size agrees with its walk.
// - The remembered last lookup, if any, is the pool filed under its key.
// ---------------------------------------------------------------------------
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <unordered_map>

#include "block.h"

namespace npl {

class Pools {
   public:
    Pools() = default;
    Pools(const Pools&) = delete;
    Pools& operator=(const Pools&) = delete;

    // The pool filed under `key`, or nullptr (the hot path: inline).
    Pool* find(const PoolKey& key) {
        if (__builtin_expect(last_ != nullptr && key == last_key_, 1)) return last_;
        return find_filed(key);
    }
    // A new pool for `key` (not filed yet), its key fields filled; the
    // caller fills the rest (statistics, no_split).
    Pool* make(const PoolKey& key);

    template <typename F>
    void for_each(F f) {
        for (auto& entry : map_) f(entry.second);
    }
    template <typename F>
    void for_each(F f) const {
        for (const auto& entry : map_) f(entry.second);
    }
    void clear();

    // Calls fail(what) for each invariant above that does not hold; returns
    // the number of blocks in all sets.
    size_t check(const std::function<void(const std::string&)>& fail) const;

   private:
    Pool* find_filed(const PoolKey& key);  // find() past the remembered pool (out of line)
    void remember(const PoolKey& key, Pool* p) {
        last_key_ = key;
        last_ = p;
    }
    std::unordered_map<PoolKey, Pool, PoolKeyHash> map_;  // nodes are stable: blocks point into it
    PoolKey last_key_{-1, nullptr, false, PoolId{}};
    Pool* last_ = nullptr;
};

}  // namespace npl
