// BlockSet's operations, inline: a cached allocation and its free each run
// a few of them.  They need Block's definition, and Block needs BlockSet's
// (its node), so block.h includes this file at its end.
#pragma once

#include <iterator>

#include "block.h"
#include "block_set.h"

namespace npl {

inline bool BlockSet::before(const Block* a, const Block* b) {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
}

inline bool BlockSet::BySize::operator()(const Entry& a, const Entry& b) const { return before(a.block, b.block); }
inline bool BlockSet::BySize::operator()(const Entry& a, size_t size) const { return a.block->size < size; }
inline bool BlockSet::BySize::operator()(size_t size, const Entry& b) const { return size < b.block->size; }

inline void BlockSet::insert(Block* b) { b->slot = tree_.insert(Entry{b}).first; }

inline void BlockSet::erase(Block* b) { tree_.erase(b->slot); }

// Old's neighbours bound the position: a smaller newcomer need only sort
// after the one before old's node, a larger one before the one after (a
// split shrinks a block, a merge grows one: one neighbour to look at).
inline void BlockSet::replace(Block* old, Block* fresh, Order order) {
    Slot at = old->slot;
    bool sorts_here;
    if (order == Order::smaller) {
        sorts_here = at == tree_.begin() || before(std::prev(at)->block, fresh);
    } else {
        Slot next = std::next(at);
        sorts_here = next == tree_.end() || before(fresh, next->block);
    }
    if (sorts_here) {
        at->block = fresh;
        fresh->slot = at;
        return;
    }
    tree_.erase(at);
    insert(fresh);
}

inline Block* BlockSet::at_least(size_t size) const {
    auto it = tree_.lower_bound(size);
    return it == tree_.end() ? nullptr : it->block;
}

inline Block* BlockSet::after(const Block* b) const {
    auto it = std::next(b->slot);
    return it == tree_.end() ? nullptr : it->block;
}

}  // namespace npl
