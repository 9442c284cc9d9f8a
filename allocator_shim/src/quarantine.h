// Debug mode's quarantine: freed blocks, poisoned, held back in FIFO order
// until the bytes they hold exceed a bound; then the oldest is checked (is
// it still all poison?) and returned to its pool.
#pragma once

#include <cstddef>
#include <deque>

#include "block.h"

namespace npl {

// Every byte of a freed block is set to this: read as float16/bfloat16/
// float32/float64 it is a NaN, as an integer -1.
constexpr unsigned char kPoisonByte = 0xFF;

class Quarantine {
   public:
    bool enabled() const { return enabled_; }
    size_t capacity() const { return capacity_; }
    size_t bytes() const { return bytes_; }
    bool empty() const { return fifo_.empty(); }
    bool over_capacity() const { return bytes_ > capacity_; }

    void configure(bool enabled, size_t capacity) {
        enabled_ = enabled;
        capacity_ = capacity;
    }
    void push(Block* b) {
        fifo_.push_back(b);
        bytes_ += b->size;
    }
    Block* pop_oldest() {
        Block* b = fifo_.front();
        fifo_.pop_front();
        bytes_ -= b->size;
        return b;
    }
    const std::deque<Block*>& blocks() const { return fifo_; }  // oldest first
    void clear() {
        fifo_.clear();
        bytes_ = 0;
    }

   private:
    bool enabled_ = false;
    size_t capacity_ = 0;
    size_t bytes_ = 0;
    std::deque<Block*> fifo_;
};

}  // namespace npl
