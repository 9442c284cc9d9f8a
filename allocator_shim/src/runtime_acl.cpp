// The Ascend ACL runtime (libascendcl.so), resolved at run time, against the
// published AscendCL API (aclrtMalloc, aclrtCreateEvent, aclrtRecordEvent,
// aclrtQueryEventStatus, aclrtStreamWaitEvent, aclmdlRICaptureGetInfo).
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "device_guard.h"
#include "loader.h"
#include "runtime.h"

namespace npl {

namespace {

using aclError = int;
constexpr aclError kSuccess = 0;
constexpr aclError kMemoryAllocation = 207001;  // ACL_ERROR_RT_MEMORY_ALLOCATION
constexpr int kMallocHugeFirst = 0;              // ACL_MEM_MALLOC_HUGE_FIRST
constexpr int kEventComplete = 1;                // ACL_EVENT_RECORDED_STATUS_COMPLETE
constexpr int kCaptureNone = 0;                  // ACL_MODEL_RI_CAPTURE_STATUS_NONE

struct Api {
    aclError (*Malloc)(void**, size_t, int);
    aclError (*Free)(void*);
    aclError (*CreateEvent)(void**);
    aclError (*DestroyEvent)(void*);
    aclError (*RecordEvent)(void*, void*);
    aclError (*QueryEventStatus)(void*, int*);
    aclError (*StreamWaitEvent)(void*, void*);
    aclError (*GetDevice)(int32_t*);
    aclError (*SetDevice)(int32_t);
    aclError (*CaptureGetInfo)(void*, int*, void**);  // optional (newer CANN)
} api;

Status status_of(aclError err, int* code) {
    *code = err;
    if (err == kSuccess) return Status::ok;
    return err == kMemoryAllocation ? Status::out_of_memory : Status::error;
}

template <typename Call>
Status on_device(int device, int* code, Call call) {
    return npl::on_device(device, code, api.GetDevice, api.SetDevice, kSuccess, status_of, call);
}

Status acl_malloc(void** ptr, size_t size, int device, int* code) {
    return on_device(device, code, [&] { return api.Malloc(ptr, size, kMallocHugeFirst); });
}
Status acl_free(void* ptr, int, int* code) { return status_of(api.Free(ptr), code); }
Status acl_event_create(Event* event, int device, int* code) {
    return on_device(device, code, [&] { return api.CreateEvent(event); });
}
Status acl_event_destroy(Event event, int, int* code) { return status_of(api.DestroyEvent(event), code); }
Status acl_event_record(Event event, Stream stream, int* code) {
    return status_of(api.RecordEvent(event, stream), code);
}
Status acl_event_query(Event event, int* code) {
    int recorded = 0;
    Status s = status_of(api.QueryEventStatus(event, &recorded), code);
    if (s != Status::ok) return s;
    return recorded == kEventComplete ? Status::ok : Status::not_ready;
}
Status acl_stream_wait(Stream stream, Event event, int* code) {
    return status_of(api.StreamWaitEvent(stream, event), code);
}
Status acl_capturing(Stream stream, bool* capturing, int* code) {
    *capturing = false;
    if (api.CaptureGetInfo == nullptr) {  // a CANN without graph capture
        *code = kSuccess;
        return Status::ok;
    }
    int status = kCaptureNone;
    void* model = nullptr;
    Status s = status_of(api.CaptureGetInfo(stream, &status, &model), code);
    *capturing = s == Status::ok && status != kCaptureNone;
    return s;
}

const Runtime kAcl = {"acl", acl_malloc, acl_free, acl_event_create, acl_event_destroy,
                      acl_event_record, acl_event_query, acl_stream_wait, acl_capturing};

bool load(const char* library_path, std::string* why) {
    const char* env = std::getenv("NPU_LIFETIME_ACL_LIBRARY");
    std::string preferred = library_path && *library_path ? library_path : (env ? env : "");
    void* h = open_runtime_library(preferred, "libascendcl", {"libascendcl.so"}, why);
    if (h == nullptr) return false;
    bool ok = resolve(h, "aclrtMalloc", &api.Malloc, why);
    ok &= resolve(h, "aclrtFree", &api.Free, why);
    ok &= resolve(h, "aclrtCreateEvent", &api.CreateEvent, why);
    ok &= resolve(h, "aclrtDestroyEvent", &api.DestroyEvent, why);
    ok &= resolve(h, "aclrtRecordEvent", &api.RecordEvent, why);
    ok &= resolve(h, "aclrtQueryEventStatus", &api.QueryEventStatus, why);
    ok &= resolve(h, "aclrtStreamWaitEvent", &api.StreamWaitEvent, why);
    ok &= resolve(h, "aclrtGetDevice", &api.GetDevice, why);
    ok &= resolve(h, "aclrtSetDevice", &api.SetDevice, why);
    api.CaptureGetInfo = reinterpret_cast<aclError (*)(void*, int*, void**)>(
        resolve_symbol(h, "aclmdlRICaptureGetInfo"));
    return ok;
}

}  // namespace

const Runtime* acl_runtime(const char* library_path, std::string* why) {
    static std::mutex mu;
    static bool loaded = false;
    std::lock_guard<std::mutex> lock(mu);
    if (!loaded) loaded = load(library_path, why);
    return loaded ? &kAcl : nullptr;
}

}  // namespace npl
