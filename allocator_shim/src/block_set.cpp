#include "block_set.h"

#include <iterator>

#include "block.h"

namespace npl {

namespace {
bool before(const Block* a, const Block* b) { return a->size != b->size ? a->size < b->size : a->ptr < b->ptr; }
}  // namespace

bool BlockSet::BySize::operator()(const Entry& a, const Entry& b) const { return before(a.block, b.block); }
bool BlockSet::BySize::operator()(const Entry& a, size_t size) const { return a.block->size < size; }
bool BlockSet::BySize::operator()(size_t size, const Entry& b) const { return size < b.block->size; }

void BlockSet::insert(Block* b) { b->slot = tree_.insert(Entry{b}).first; }

void BlockSet::erase(Block* b) { tree_.erase(b->slot); }

// Old's neighbours bound the position: a smaller newcomer need only sort
// after the one before old's node, a larger one before the one after (a
// split shrinks a block, a merge grows one: one neighbour to look at).
void BlockSet::replace(Block* old, Block* fresh, Order order) {
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

Block* BlockSet::at_least(size_t size) const {
    auto it = tree_.lower_bound(size);
    return it == tree_.end() ? nullptr : it->block;
}

Block* BlockSet::after(const Block* b) const {
    auto it = std::next(b->slot);
    return it == tree_.end() ? nullptr : it->block;
}

}  // namespace npl
