// Which runtime offers the capture topology calls and stream-ordered memory
// (runtime.h): the simulated one, and CUDA's where libcudart has them.  ACL's capture API
// (aclmdlRICaptureGetInfo) tells only whether a stream captures, not the
// graph's dependencies: it has none.
#include <cstring>

#include "runtime.h"

namespace npl {

const CaptureTopology* capture_topology(const Runtime* rt, std::string* why) {
    if (rt == nullptr) {
        *why = "no runtime is selected";
        return nullptr;
    }
    if (rt == sim_runtime()) return sim_capture_topology();
    if (std::strcmp(rt->name, "cuda") == 0) return cuda_capture_topology(why);  // its table: cuda_runtime() loaded
    *why = std::string("the ") + rt->name + " runtime offers no capture topology";
    return nullptr;
}

const StreamOrderedMemory* stream_ordered_memory(const Runtime* rt, std::string* why) {
    if (rt == nullptr) {
        *why = "no runtime is selected";
        return nullptr;
    }
    if (rt == sim_runtime()) return sim_stream_ordered_memory();
    if (std::strcmp(rt->name, "cuda") == 0) return cuda_stream_ordered_memory(why);
    *why = std::string("the ") + rt->name + " runtime offers no stream-ordered memory";
    return nullptr;
}

}  // namespace npl
