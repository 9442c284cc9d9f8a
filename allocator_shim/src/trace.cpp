#include "trace.h"

#include <time.h>

#include "json.h"

namespace npl {

namespace {

const char* const kKindNames[] = {
#define NPL_TRACE_NAME(kind) #kind,
    NPL_TRACE_KINDS(NPL_TRACE_NAME)
#undef NPL_TRACE_NAME
};

uint64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

void TraceRing::configure(bool enabled, size_t capacity) {
    enabled_ = enabled && capacity > 0;
    if (capacity != ring_.size()) {
        ring_.assign(capacity, TraceEvent{});
        head_ = size_ = 0;
    }
}

void TraceRing::add(TraceKind kind, int device, const void* ptr, uint64_t size, Stream stream, Stream alloc_stream,
                    uint64_t generation) {
    if (!enabled_) return;
    if (size_ == ring_.size()) {  // full: the oldest goes
        head_ = (head_ + 1) % ring_.size();
        size_--;
        dropped_++;
    }
    ring_[(head_ + size_) % ring_.size()] = TraceEvent{now_ns(), kind, device, ptr, size, stream, alloc_stream,
                                                       generation};
    size_++;
}

std::string TraceRing::drain_json() {
    Json j;
    j.open_array();
    for (size_t i = 0; i < size_; ++i) {
        const TraceEvent& e = ring_[(head_ + i) % ring_.size()];
        j.open_object().key("t_ns").value(e.t_ns).key("kind").value(kKindNames[static_cast<int>(e.kind)]);
        j.key("ptr").pointer(e.ptr).key("size").value(e.size).key("device").value(e.device);
        j.key("stream").pointer(e.stream).key("alloc_stream").pointer(e.alloc_stream);
        j.key("generation").value(e.generation).close_object();
    }
    j.close_array();
    head_ = size_ = 0;
    return j.str();
}

void TraceRing::clear() {
    head_ = size_ = 0;
    dropped_ = 0;
}

}  // namespace npl
