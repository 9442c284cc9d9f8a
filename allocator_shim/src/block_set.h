// The cached blocks of one pool, best fit first: ordered by (size, address).
//
// The allocator's hot path is a split on allocation (a cached block gives
// its front to the caller and its remainder goes back) and a merge on free
// (the block absorbs its cached neighbour).  Each time one cached block
// takes the place of another, so every block remembers its tree node, and
// `replace` reuses that node in place when the newcomer sorts to the same
// position: no search, no node, no rebalancing.  Only the allocator's lock
// guards a set.  The operations are inline (block_set_inline.h).
#pragma once

#include <cstddef>
#include <set>

namespace npl {

struct Block;

// Node allocator for the sets: nodes are recycled through a free list
// instead of malloc/free on every insert and erase.  Used only under the
// allocator's lock.
template <typename T>
struct RecyclingAllocator {
    using value_type = T;
    RecyclingAllocator() = default;
    template <typename U>
    RecyclingAllocator(const RecyclingAllocator<U>&) {}

    T* allocate(size_t n) {
        if (n == 1 && free_list() != nullptr) {
            Node* node = free_list();
            free_list() = node->next;
            return reinterpret_cast<T*>(node);
        }
        return static_cast<T*>(::operator new(n * sizeof(T) < sizeof(Node) ? sizeof(Node) : n * sizeof(T)));
    }
    void deallocate(T* p, size_t n) {
        if (n != 1) {
            ::operator delete(p);
            return;
        }
        Node* node = reinterpret_cast<Node*>(p);
        node->next = free_list();
        free_list() = node;
    }
    template <typename U>
    bool operator==(const RecyclingAllocator<U>&) const { return true; }
    template <typename U>
    bool operator!=(const RecyclingAllocator<U>&) const { return false; }

   private:
    struct Node {
        Node* next;
    };
    static Node*& free_list() {
        static Node* head = nullptr;
        return head;
    }
};

class BlockSet {
    // `block` is mutable so that a node can change hands in place; it only
    // ever does to a block that sorts to the same position.
    struct Entry {
        mutable Block* block;
    };
    struct BySize {
        using is_transparent = void;
        bool operator()(const Entry& a, const Entry& b) const;
        bool operator()(const Entry& a, size_t size) const;
        bool operator()(size_t size, const Entry& b) const;
    };
    using Tree = std::set<Entry, BySize, RecyclingAllocator<Entry>>;

   public:
    using Slot = Tree::const_iterator;  // a cached block's node (Block::slot)

    void insert(Block* b);
    void erase(Block* b);
    // How a newcomer compares with the key old's node was sorted by (old
    // itself may have changed since: a split shrinks it first).
    enum class Order { smaller, larger };
    // `fresh` takes the place of `old` (in the set), in old's node if it sorts there.
    void replace(Block* old, Block* fresh, Order order);
    // The smallest block of at least `size` bytes, and the one after `b`.
    Block* at_least(size_t size) const;
    Block* after(const Block* b) const;
    size_t size() const { return tree_.size(); }

   private:
    static bool before(const Block* a, const Block* b);  // best-fit order: size, then address
    Tree tree_;
};

}  // namespace npl
