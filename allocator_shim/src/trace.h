// The allocator trace: a bounded ring of what happened to blocks, for
// timelines and torch's memory viewer.  Off by default; when on, each event
// costs a clock read and a copy, under the allocator's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime.h"

namespace npl {

// X(kind)
#define NPL_TRACE_KINDS(X)                                                                      \
    X(segment_alloc) X(segment_free) X(alloc) X(free) X(record_stream) X(erase_stream) X(record_use) \
    X(note_use) X(pending) X(reusable) X(reuse_wait) X(poison) X(finding)

enum class TraceKind : uint8_t {
#define NPL_TRACE_ENUM(kind) kind,
    NPL_TRACE_KINDS(NPL_TRACE_ENUM)
#undef NPL_TRACE_ENUM
};

struct TraceEvent {
    uint64_t t_ns;
    TraceKind kind;
    int device;
    const void* ptr;
    uint64_t size;
    Stream stream;        // the stream of the call (the allocation stream for alloc/free)
    Stream alloc_stream;  // the block's allocation stream
    uint64_t generation;  // owners of this address so far
};

class TraceRing {
   public:
    bool enabled() const { return enabled_; }
    void configure(bool enabled, size_t capacity);
    void add(TraceKind kind, int device, const void* ptr, uint64_t size, Stream stream, Stream alloc_stream,
             uint64_t generation);
    std::string drain_json();  // oldest first
    uint64_t dropped() const { return dropped_; }
    void clear();

   private:
    bool enabled_ = false;
    std::vector<TraceEvent> ring_;
    size_t head_ = 0, size_ = 0;  // oldest at head_
    uint64_t dropped_ = 0;
};

}  // namespace npl
