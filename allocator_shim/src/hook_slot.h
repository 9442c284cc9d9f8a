// The sanitizer's allocation/free hooks: set and cleared at any time while
// other threads allocate, never torn down under a thread that is inside
// them, never called with another hook set's context.
//
// A hook set is one immutable object swapped in atomically.  A caller
// announces itself (an in-flight count) before loading the current set;
// replacing the set waits until no other thread is in flight, so the old set
// (and whatever its context points to) may be released once set() returns.
// The fast path with no hooks set is one relaxed load.
#pragma once

#include <atomic>
#include <thread>

#include "npu_lifetime_shim.h"

namespace npl {

class HookSlot {
   public:
    template <typename Call>
    void call(Call call) {
        if (current_.load(std::memory_order_relaxed) == nullptr) return;
        in_flight_.fetch_add(1, std::memory_order_seq_cst);
        depth_++;
        const Hooks* h = current_.load(std::memory_order_seq_cst);
        if (h != nullptr) call(*h);
        depth_--;
        in_flight_.fetch_sub(1, std::memory_order_seq_cst);
    }

    void set(npl_alloc_hook on_alloc, npl_free_hook on_free, void* ctx) {
        const Hooks* next = on_alloc == nullptr && on_free == nullptr ? nullptr : new Hooks{on_alloc, on_free, ctx};
        const Hooks* old = current_.exchange(next, std::memory_order_seq_cst);
        // A thread calling set() from inside a hook counts itself in flight.
        while (in_flight_.load(std::memory_order_seq_cst) > depth_) std::this_thread::yield();
        delete old;
    }

    // In a forked child only the forking thread exists.
    void after_fork_in_child() { in_flight_.store(depth_); }

    struct Hooks {
        npl_alloc_hook on_alloc;
        npl_free_hook on_free;
        void* ctx;
    };

   private:
    std::atomic<const Hooks*> current_{nullptr};
    std::atomic<long> in_flight_{0};
    static thread_local long depth_;
};

}  // namespace npl
