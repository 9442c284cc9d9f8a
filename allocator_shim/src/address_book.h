// Who owns each block start address, and who owned it last: live blocks by
// address (exact pointer), and for freed addresses the generation, size and
// stream of their last owner, so that a stale free (a double free after the
// block went to a new owner, or after it merged into a neighbour) is told
// apart from the current owner's free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "block.h"

namespace npl {

struct Address {
    Block* live = nullptr;  // the current owner's block, if live
    uint64_t generation = 0;
    // the last owner that freed it
    size_t freed_size = 0;
    Stream freed_stream = nullptr;
    bool freed = false;
};

class AddressBook {
   public:
    // Entries for freed addresses are kept up to this many; past it they
    // are forgotten (then a stale free reads as an unknown pointer).
    static constexpr size_t kMaxEntries = 1 << 20;

    // A new owner at `b->ptr`: sets `b->generation`.
    void on_alloc(Block* b) {
        Address& a = map_[b->ptr];
        a.live = b;
        b->generation = ++a.generation;
    }
    Block* live(const void* ptr) const {
        auto it = map_.find(const_cast<void*>(ptr));
        return it == map_.end() ? nullptr : it->second.live;
    }
    const Address* find(const void* ptr) const {
        auto it = map_.find(const_cast<void*>(ptr));
        return it == map_.end() ? nullptr : &it->second;
    }
    Address* find(const void* ptr) {
        auto it = map_.find(const_cast<void*>(ptr));
        return it == map_.end() ? nullptr : &it->second;
    }
    // `a` is find(b->ptr).
    void on_free(Address* entry, Block* b) {
        Address& a = *entry;
        a.live = nullptr;
        a.freed = true;
        a.freed_size = b->requested;
        a.freed_stream = b->stream;
        if (map_.size() > kMaxEntries) forget_freed();
    }
    void clear() { map_.clear(); }
    size_t size() const { return map_.size(); }
    template <typename F>
    void for_each(F f) const {
        for (const auto& entry : map_) f(entry.first, entry.second);
    }

   private:
    void forget_freed() {
        for (auto it = map_.begin(); it != map_.end();) {
            it = it->second.live == nullptr ? map_.erase(it) : std::next(it);
        }
    }

    std::unordered_map<void*, Address> map_;
};

}  // namespace npl
