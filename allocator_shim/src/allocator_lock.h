// The allocator's lock (CachingAllocator::mu_): the algorithm of glibc's
// default mutex (Drepper, "Futexes Are Tricky", mutex 3) without its
// bookkeeping (owner, user count, kind dispatch), which cost ~90 of the
// ~110 instructions that std::mutex's lock + unlock took per cached
// allocation and free.  Uncontended, lock and unlock are one atomic
// operation each.  It never spins: a thread that finds it held sleeps in
// the kernel at once, as on std::mutex (a variant that spun before sleeping
// made FSDP2's record_use step 4-11% slower: design/allocator-shim.md, "The
// hot path").  Not recursive; Linux only, as the shim is.
//
// Built only with -DNPL_FUTEX_LOCK (NPL_FUTEX_LOCK=1 at install): until
// its FSDP2 A/B on two GPUs has run (design/measurements/hot_path/
// fsdp2_lock_ab_2026-11-27.sh), the lock is std::mutex, which the team's
// last FSDP2 measurement stands behind.
#pragma once

#ifndef NPL_FUTEX_LOCK
#include <mutex>

namespace npl {
using AllocatorLock = std::mutex;
}  // namespace npl
#else

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace npl {

class AllocatorLock {
   public:
    AllocatorLock() = default;
    AllocatorLock(const AllocatorLock&) = delete;
    AllocatorLock& operator=(const AllocatorLock&) = delete;

    void lock() {
        int expected = kFree;
        if (__builtin_expect(!state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire), 0)) {
            wait();
        }
    }
    void unlock() {
        if (__builtin_expect(state_.exchange(kFree, std::memory_order_release) == kContended, 0)) wake_one();
    }

   private:
    static constexpr int kFree = 0, kLocked = 1, kContended = 2;  // kContended: a thread may sleep on it

    // Marks the lock contended and sleeps until it is free, then holds it
    // (still marked contended: its unlock wakes the next sleeper, if any).
    void wait() {
        while (state_.exchange(kContended, std::memory_order_acquire) != kFree) {
            syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAIT_PRIVATE, kContended, nullptr, nullptr, 0);
        }
    }
    void wake_one() { syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }

    std::atomic<int> state_{kFree};
    static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free,
                  "the futex word is the atomic's int");
};

}  // namespace npl
#endif  // NPL_FUTEX_LOCK
