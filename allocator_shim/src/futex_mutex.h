// The allocator's lock: a futex mutex (Drepper, "Futexes Are Tricky",
// mutex 3).  Uncontended, lock and unlock are one atomic operation each
// and a few instructions, about a fifth of pthread_mutex_lock/unlock's
// path; both run twice per allocation and free.  Contended, a waiter
// sleeps in the kernel (the lock is held across runtime calls that can
// block: spinning would burn a core).  Linux only, as the shim is.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace npl {

class FutexMutex {
   public:
    FutexMutex() = default;
    FutexMutex(const FutexMutex&) = delete;
    FutexMutex& operator=(const FutexMutex&) = delete;

    void lock() {
        int expected = kFree;
        if (!state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire)) lock_contended(expected);
    }
    void unlock() {
        if (state_.exchange(kFree, std::memory_order_release) == kContended) wake_one();
    }

   private:
    static constexpr int kFree = 0, kLocked = 1, kContended = 2;  // kContended: someone may sleep on it

    void lock_contended(int seen) {
        for (int spins = 0; spins < 64 && seen != kFree; ++spins) {  // a short critical section may end soon
            cpu_relax();
            seen = state_.load(std::memory_order_relaxed);
            if (seen == kFree && state_.compare_exchange_strong(seen, kLocked, std::memory_order_acquire)) return;
        }
        if (seen != kContended) seen = state_.exchange(kContended, std::memory_order_acquire);
        while (seen != kFree) {
            syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAIT_PRIVATE, kContended, nullptr, nullptr, 0);
            seen = state_.exchange(kContended, std::memory_order_acquire);
        }
    }
    void wake_one() { syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }

    static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
    }

    std::atomic<int> state_{kFree};
    static_assert(sizeof(std::atomic<int>) == sizeof(int), "the futex word is the atomic's int");
};

}  // namespace npl
