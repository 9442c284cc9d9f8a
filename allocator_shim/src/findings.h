// Structured findings: what the shim reports instead of crashing.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace npl {

struct Finding {
    std::string kind;  // unknown_pointer, double_free, size_mismatch, stream_mismatch,
                       // unrecorded_use, use_after_free, invalid_size, invalid_argument,
                       // out_of_memory, write_after_free, runtime_error, internal_error
    std::string op;    // the call that found it (free, record_use, ...) or the runtime call
    const void* address = nullptr;
    int64_t size = -1;
    int64_t expected_size = -1;
    int device = -1;
    const void* alloc_stream = nullptr;
    const void* stream = nullptr;
    int code = 0;  // the runtime's status code, for runtime_error
    uint64_t generation = 0;             // which owner of the address (1 = the first)
    std::vector<const void*> streams;    // the other streams of the block's last owner
    std::string detail;
};

// A bounded, thread-safe queue: past its capacity the oldest are dropped
// and counted.
class FindingQueue {
   public:
    static constexpr size_t kCapacity = 4096;

    void push(Finding f);
    std::string drain_json();
    uint64_t total() const;
    uint64_t dropped() const;
    void clear();
    void lock_for_fork();
    void unlock_after_fork();

   private:
    mutable std::mutex mu_;
    std::deque<Finding> queue_;
    uint64_t total_ = 0, dropped_ = 0;
};

}  // namespace npl
