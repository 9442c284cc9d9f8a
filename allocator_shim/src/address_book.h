// Who owns each block start address, and who owned it last: live blocks by
// address (exact pointer), and for freed addresses the generation, size and
// stream of their last owner, so that a stale free (a double free after the
// block went to a new owner, or after it merged into a neighbour) is told
// apart from the current owner's free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
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
    // the book's list of freed addresses, oldest first (see AddressBook)
    bool listed = false;
    const void* key = nullptr;
    Address* older = nullptr;
    Address* newer = nullptr;
};

class AddressBook {
   public:
    // Freed addresses are remembered up to this many, in the order they were
    // first freed; past it the oldest is forgotten (a stale free of it then
    // reads as an unknown pointer), one per free: bounded work, however many
    // blocks are live.  An address on the list that has a live owner again
    // keeps its place; reaching the front it just leaves the list.
    static constexpr size_t kMaxFreed = 1 << 20;

    // A new owner at `b->ptr`: sets `b->generation`.
    void on_alloc(Block* b) {
        // most allocations take the address freed last (a cached pair): no hash then
        Address& a = last_freed_ != nullptr && last_freed_->key == b->ptr ? *last_freed_ : map_[b->ptr];
        a.key = b->ptr;
        a.live = b;
        b->generation = ++a.generation;
        last_allocated_ = &a;
    }
    Block* live(const void* ptr) const {
        const Address* a = find(ptr);
        return a == nullptr ? nullptr : a->live;
    }
    const Address* find(const void* ptr) const {
        // most frees are of the address allocated last (a cached pair): no hash then (a bucket
        // index costs a 64-bit division, a third of a pair's time on the C benchmark)
        if (last_allocated_ != nullptr && last_allocated_->key == ptr) return last_allocated_;
        auto it = map_.find(const_cast<void*>(ptr));
        return it == map_.end() ? nullptr : &it->second;
    }
    Address* find(const void* ptr) { return const_cast<Address*>(static_cast<const AddressBook*>(this)->find(ptr)); }
    // `a` is find(b->ptr).
    void on_free(Address* entry, Block* b) {
        Address& a = *entry;
        a.live = nullptr;
        a.freed = true;
        a.freed_size = b->requested;
        a.freed_stream = b->stream;
        last_freed_ = &a;
        if (!a.listed) append(&a);
    }
    void clear() {
        map_.clear();
        oldest_ = newest_ = last_freed_ = last_allocated_ = nullptr;
        listed_ = 0;
    }
    size_t size() const { return map_.size(); }
    size_t listed() const { return listed_; }
    template <typename F>
    void for_each(F f) const {
        for (const auto& entry : map_) f(entry.first, entry.second);
    }
    // Why the list of freed addresses is inconsistent, or "" (the invariant checker).
    std::string list_problem() const {
        size_t n = 0;
        const Address* older = nullptr;
        for (const Address* a = oldest_; a != nullptr; older = a, a = a->newer) {
            if (++n > listed_) return "the list of freed addresses is longer than its count";
            if (!a->listed || a->older != older) return "the list of freed addresses is broken";
            auto it = map_.find(const_cast<void*>(a->key));
            if (it == map_.end() || &it->second != a) return "a listed freed address is not in the book";
        }
        if (n != listed_ || older != newest_) return "the list of freed addresses is shorter than its count";
        for (const auto& entry : map_) {
            if (entry.second.live == nullptr && !entry.second.listed) return "a freed address is not on the list";
        }
        return listed_ > kMaxFreed ? "more freed addresses listed than the bound" : "";
    }

   private:
    // Entries are never moved by the map (std::unordered_map keeps its
    // nodes), so the list links them directly.
    void append(Address* a) {
        a->listed = true;
        a->older = newest_;
        a->newer = nullptr;
        if (newest_ != nullptr) newest_->newer = a;
        newest_ = a;
        if (oldest_ == nullptr) oldest_ = a;
        if (++listed_ > kMaxFreed) forget_oldest();
    }
    void forget_oldest() {
        Address* a = oldest_;
        oldest_ = a->newer;
        if (oldest_ != nullptr) oldest_->older = nullptr;
        else newest_ = nullptr;
        listed_--;
        a->listed = false;
        if (a->live != nullptr) return;
        if (a == last_freed_) last_freed_ = nullptr;
        if (a == last_allocated_) last_allocated_ = nullptr;
        map_.erase(const_cast<void*>(a->key));  // a freed address: forgotten
    }

    std::unordered_map<void*, Address> map_;
    Address* oldest_ = nullptr;  // the list of freed addresses
    Address* newest_ = nullptr;
    size_t listed_ = 0;
    Address* last_freed_ = nullptr;  // the entry on_free saw last (a hint: may be live again), or nullptr
    Address* last_allocated_ = nullptr;  // the entry on_alloc saw last (a hint: may be freed since), or nullptr
};

}  // namespace npl
