#include "findings.h"

#include <utility>

#include "json.h"

namespace npl {

void FindingQueue::push(Finding f) {
    std::lock_guard<std::mutex> lock(mu_);
    total_++;
    if (queue_.size() == kCapacity) {
        queue_.pop_front();
        dropped_++;
    }
    queue_.push_back(std::move(f));
}

std::string FindingQueue::drain_json() {
    std::deque<Finding> taken;
    {
        std::lock_guard<std::mutex> lock(mu_);
        taken.swap(queue_);
    }
    Json j;
    j.open_array();
    for (const Finding& f : taken) {
        j.open_object().key("kind").value(f.kind).key("op").value(f.op);
        j.key("address").pointer(f.address).key("device").value(f.device);
        if (f.size >= 0) j.key("size").value(f.size);
        if (f.expected_size >= 0) j.key("expected_size").value(f.expected_size);
        if (f.alloc_stream) j.key("alloc_stream").pointer(f.alloc_stream);
        if (f.stream) j.key("stream").pointer(f.stream);
        if (f.code) j.key("code").value(f.code);
        if (f.generation) j.key("generation").value(f.generation);
        if (!f.streams.empty()) {
            j.key("streams").open_array();
            for (const void* s : f.streams) j.pointer(s);
            j.close_array();
        }
        if (!f.detail.empty()) j.key("detail").value(f.detail);
        j.close_object();
    }
    j.close_array();
    return j.str();
}

uint64_t FindingQueue::total() const {
    std::lock_guard<std::mutex> lock(mu_);
    return total_;
}

uint64_t FindingQueue::dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
}

void FindingQueue::lock_for_fork() { mu_.lock(); }
void FindingQueue::unlock_after_fork() { mu_.unlock(); }

void FindingQueue::clear() {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    total_ = dropped_ = 0;
}

}  // namespace npl
