// The segments the runtime gave the allocator, by base address, and the
// blocks that tile each one: a doubly linked list in address order that
// covers the segment exactly.  It owns the Segment objects (the blocks are
// the allocator's: it recycles them), answers which segment or block holds
// an address, and is the only place that links blocks into a segment
// (split, cut_front, merge).
//
// It makes no runtime call (the allocator mallocs and frees the memory) and
// has no lock of its own: CachingAllocator's single mutex guards it with
// the rest of the allocator's state.
//
// ---- Invariants (check() tells which do not hold) -------------------------
//
// - Each segment is filed under its base address.
// - Its first block has no predecessor; each block starts where its
//   predecessor ends, links back to it and points to the segment; the
//   blocks cover the segment exactly.
// - A block's size is a positive multiple of 512, and the block agrees with
//   its segment on device, stream and size class.
// - An expandable segment starts at its range's base, its size is what the
//   range has mapped, and it belongs to the eager pool.
// ---------------------------------------------------------------------------
#pragma once

#include <cstddef>
#include <functional>
#include <iterator>
#include <map>
#include <string>

#include "block.h"

namespace npl {

class Segments {
   public:
    Segments() = default;
    Segments(const Segments&) = delete;
    Segments& operator=(const Segments&) = delete;

    bool empty() const { return map_.empty(); }

    // A new segment at `base` whose one block is `first` (which gets the
    // segment's bytes, device, stream and size class).
    Segment* add(char* base, size_t size, int device, Stream stream, bool small, PoolId pool_id, Block* first);
    // Forgets and deletes `seg` (its memory went back; its blocks are the caller's).
    void remove(Segment* seg) {
        map_.erase(seg->base);
        delete seg;
    }
    // Removes (and deletes) each segment for which `gone(seg)` is true, in
    // address order; `gone` gives its memory back and its blocks away.
    template <typename F>
    void remove_if(F gone) {
        for (auto it = map_.begin(); it != map_.end();) {
            Segment* seg = it->second;
            if (!gone(seg)) {
                ++it;
                continue;
            }
            delete seg;
            it = map_.erase(it);
        }
    }
    // `each(seg)` for every segment (which then gives its memory and blocks
    // back), and forgets them all.
    template <typename F>
    void clear(F each) {
        for (auto& entry : map_) {
            each(entry.second);
            delete entry.second;
        }
        map_.clear();
    }

    const Segment* containing(const char* p) const {
        auto it = map_.upper_bound(const_cast<char*>(p));
        if (it == map_.begin()) return nullptr;
        const Segment* seg = std::prev(it)->second;
        return p < seg->base + seg->size ? seg : nullptr;
    }
    Block* block_at(const char* p) const;  // the block (in any state) whose memory holds `p`

    // `f(seg)` for each segment, in address order.
    template <typename F>
    void for_each(F f) const {
        for (const auto& entry : map_) f(entry.second);
    }
    // `f(block)` for each block of `device`'s segments, in address order.
    template <typename F>
    void for_each_block(int device, F f) const {
        for (const auto& entry : map_) {
            if (entry.second->device != device) continue;
            for (Block* b = entry.second->first; b != nullptr; b = b->next) f(b);
        }
    }

    // ---- the blocks of a segment (no pool or state changes here)
    // `rest`, a new block, takes the bytes of `b` after its first `size`
    // (with b's device, stream, size class, segment and pool).
    static void split(Block* b, size_t size, Block* rest);
    // `front`, a copy of `b`, takes the bytes of `b` before `at`.
    static void cut_front(Block* b, char* at, Block* front);
    // `b` takes the bytes of `n`, its neighbour, which leaves the segment.
    static void merge(Block* b, Block* n);
    // ---- expandable segments: their mapped part grows and shrinks at the end
    // `added`, a new block, takes `bytes` more at the segment's end.
    static void append(Segment* seg, size_t bytes, Block* added);
    // The segment ends at `at`, inside or at the start of its last block:
    // that block is cut short, or unlinked and returned (else nullptr).
    static Block* truncate(Segment* seg, char* at);
    static Block* last(const Segment* seg);

    // The invariants above that do not hold, each told to `fail`.
    void check(const std::function<void(const std::string&)>& fail) const;

   private:
    std::map<char*, Segment*> map_;
};

// split and merge run on every cached allocation and free: inline.
inline void Segments::split(Block* b, size_t size, Block* rest) {
    rest->ptr = b->ptr + size;
    rest->size = b->size - size;
    rest->device = b->device;
    rest->stream = b->stream;
    rest->small = b->small;
    rest->segment = b->segment;
    rest->pool = b->pool;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) {
        b->next->prev = rest;
    } else {
        b->segment->last = rest;
    }
    b->next = rest;
    b->size = size;
}

inline void Segments::merge(Block* b, Block* n) {
    if (n == b->prev) {
        b->ptr = n->ptr;
        b->prev = n->prev;
        if (n->prev != nullptr) n->prev->next = b;
        if (b->segment->first == n) b->segment->first = b;
    } else {
        b->next = n->next;
        if (n->next != nullptr) {
            n->next->prev = b;
        } else {
            b->segment->last = b;
        }
    }
    b->size += n->size;
}

}  // namespace npl
