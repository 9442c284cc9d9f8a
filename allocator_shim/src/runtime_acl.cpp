// The Ascend ACL runtime (libascendcl.so), resolved at run time, against the
// published AscendCL API (aclrtMalloc, aclrtCreateEvent, aclrtRecordEvent,
// aclrtQueryEventStatus, aclrtStreamWaitEvent, aclmdlRICaptureGetInfo).
//
// Two tables: plain ACL calls, and ACL behind torch_npu's task queue
// (npl_queue_ops), where everything that orders against the user's work
// (events, stream waits and syncs, the device sync before a free, memset
// and read-back) goes through the queue and only memory and capture queries
// call ACL directly.
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "device_guard.h"
#include "loader.h"
#include "runtime.h"
#include "npu_lifetime_shim.h"

namespace npl {

namespace {

using aclError = int;
constexpr aclError kSuccess = 0;
constexpr aclError kMemoryAllocation = 207001;  // ACL_ERROR_RT_MEMORY_ALLOCATION
constexpr int kMallocHugeFirst = 0;              // ACL_MEM_MALLOC_HUGE_FIRST
constexpr int kEventComplete = 1;                // ACL_EVENT_RECORDED_STATUS_COMPLETE
constexpr int kCaptureNone = 0;                  // ACL_MODEL_RI_CAPTURE_STATUS_NONE
constexpr int kMemcpyDeviceToHost = 2;           // ACL_MEMCPY_DEVICE_TO_HOST
constexpr int kHbmMem = 1;                       // ACL_HBM_MEM
constexpr uint32_t kEventFlags = 0x2;            // ACL_EVENT_CAPTURE_STREAM_PROGRESS, as torch_npu's NPUEvent

struct Api {
    aclError (*Malloc)(void**, size_t, int);
    aclError (*Free)(void*);
    aclError (*CreateEvent)(void**);
    aclError (*CreateEventExWithFlag)(void**, uint32_t);  // optional (CANN 8 and later)
    aclError (*DestroyEvent)(void*);
    aclError (*RecordEvent)(void*, void*);
    aclError (*QueryEventStatus)(void*, int*);
    aclError (*StreamWaitEvent)(void*, void*);
    aclError (*SynchronizeEvent)(void*);
    aclError (*SynchronizeStream)(void*);
    aclError (*SynchronizeDevice)();
    aclError (*MemsetAsync)(void*, size_t, int32_t, size_t, void*);
    aclError (*Memcpy)(void*, size_t, const void*, size_t, int);
    aclError (*GetMemInfo)(int, size_t*, size_t*);
    aclError (*GetDevice)(int32_t*);
    aclError (*GetDeviceCount)(uint32_t*);
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
// As torch_npu does: aclrtFree does not wait for queued work (cudaFree
// does), so the device is synchronised first.
Status acl_free(void* ptr, int device, int* code) {
    return on_device(device, code, [&] {
        aclError err = api.SynchronizeDevice();
        return err != kSuccess ? err : api.Free(ptr);
    });
}
// The allocator re-records an idle event while a stream may still wait on
// its last record (a block reused behind a wait).  CANN documents that a
// wait keeps the record it saw only for aclrtCreateEventExWithFlag events
// (plain aclrtCreateEvent ones: record -> wait -> reset), so those are made
// where the library has them, with torch_npu's NPUEvent flag.
Status acl_event_create(Event* event, int device, int* code) {
    return on_device(device, code, [&] {
        return api.CreateEventExWithFlag != nullptr ? api.CreateEventExWithFlag(event, kEventFlags)
                                                    : api.CreateEvent(event);
    });
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
Status acl_event_sync(Event event, int* code) { return status_of(api.SynchronizeEvent(event), code); }
Status acl_stream_sync(Stream stream, int* code) { return status_of(api.SynchronizeStream(stream), code); }
// Not asked of ACL: behind torch_npu's task queue work may not have reached
// the stream yet, so only an event recorded through the queue can tell.
Status acl_stream_query(Stream, int*) { return Status::unsupported; }
Status acl_stream_device(Stream, int*, int*) { return Status::unsupported; }
Status acl_current_device(int* device, int* code) {
    int32_t d = 0;
    Status s = status_of(api.GetDevice(&d), code);
    *device = d;
    return s;
}
Status acl_memset(void* ptr, int byte, size_t size, Stream stream, int* code) {
    return status_of(api.MemsetAsync(ptr, size, byte, size, stream), code);
}
Status acl_copy_to_host(void* dst, const void* src, size_t size, int device, int* code) {
    return on_device(device, code, [&] { return api.Memcpy(dst, size, src, size, kMemcpyDeviceToHost); });
}
Status acl_memory_total(int device, size_t* total, int* code) {
    size_t free_bytes = 0;
    return on_device(device, code, [&] { return api.GetMemInfo(kHbmMem, &free_bytes, total); });
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

Status acl_device_count(int* count, int* code) {
    uint32_t n = 0;
    Status s = status_of(api.GetDeviceCount(&n), code);
    *count = static_cast<int>(n);
    return s;
}
const char* acl_error_string(int) { return ""; }

// --- behind torch_npu's task queue ---------------------------------------
const npl_queue_ops* queue = nullptr;  // set before the queued table is selected, never while it is in use

Status queued(int err, int* code) {
    *code = err;
    return err == 0 ? Status::ok : Status::error;
}
Status q_free(void* ptr, int device, int* code) {
    if (queued(queue->device_synchronize(device), code) != Status::ok) return Status::error;
    return on_device(device, code, [&] { return api.Free(ptr); });
}
Status q_event_create(Event* event, int device, int* code) { return queued(queue->event_create(event, device), code); }
Status q_event_destroy(Event event, int, int* code) { return queued(queue->event_destroy(event), code); }
Status q_event_record(Event event, Stream stream, int* code) { return queued(queue->event_record(event, stream), code); }
Status q_event_query(Event event, int* code) {
    int complete = 0;
    if (queued(queue->event_query(event, &complete), code) != Status::ok) return Status::error;
    return complete ? Status::ok : Status::not_ready;
}
Status q_event_sync(Event event, int* code) { return queued(queue->event_synchronize(event), code); }
Status q_stream_wait(Stream stream, Event event, int* code) {
    return queued(queue->stream_wait_event(stream, event), code);
}
Status q_stream_sync(Stream stream, int* code) { return queued(queue->stream_synchronize(stream), code); }
Status q_memset(void* ptr, int byte, size_t size, Stream stream, int* code) {
    if (queued(queue->stream_drain(stream), code) != Status::ok) return Status::error;
    return acl_memset(ptr, byte, size, stream, code);
}
Status q_copy_to_host(void* dst, const void* src, size_t size, int device, int* code) {
    if (queued(queue->device_synchronize(device), code) != Status::ok) return Status::error;
    return acl_copy_to_host(dst, src, size, device, code);
}
const char* q_error_string(int code) { return queue->error_string != nullptr ? queue->error_string(code) : ""; }

// ---- virtual memory, for expandable segments (aclrtReserveMemAddress,
// aclrtMallocPhysical, aclrtMapMem, ...): optional, CANN 8 and later.  ACL
// maps with access (no set-access call) and unmaps one mapping per call.
constexpr int kMemHandleNone = 0;      // ACL_MEM_HANDLE_TYPE_NONE
constexpr int kAllocationPinned = 0;   // ACL_MEM_ALLOCATION_TYPE_PINNED
constexpr int kHbmMemHuge = 4;         // ACL_HBM_MEM_HUGE
constexpr int kLocationDevice = 1;     // ACL_MEM_LOCATION_TYPE_DEVICE
constexpr int kGranularityRecommended = 1;  // ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED
constexpr size_t kDefaultGranularity = size_t(2) << 20;  // without aclrtMemGetAllocationGranularity

struct PhysicalMemProp {  // aclrtPhysicalMemProp
    int handle_type;
    int allocation_type;
    int mem_attr;
    struct {
        uint32_t id;
        int type;
    } location;
    uint64_t reserve;
};
static_assert(sizeof(PhysicalMemProp) == 32, "acl_rt.h's layout");

struct VmApi {
    aclError (*ReserveMemAddress)(void**, size_t, size_t, void*, uint64_t);
    aclError (*ReleaseMemAddress)(void*);
    aclError (*MallocPhysical)(void**, size_t, const PhysicalMemProp*, uint64_t);
    aclError (*FreePhysical)(void*);
    aclError (*MapMem)(void*, size_t, size_t, void*, uint64_t);
    aclError (*UnmapMem)(void*);
    aclError (*GetAllocationGranularity)(PhysicalMemProp*, int, size_t*);  // optional
} vm_api;
bool vm_loaded = false;
std::string vm_missing;  // why not, when not loaded

PhysicalMemProp device_memory(int device) {
    PhysicalMemProp prop{};
    prop.handle_type = kMemHandleNone;
    prop.allocation_type = kAllocationPinned;
    prop.mem_attr = kHbmMemHuge;
    prop.location.id = static_cast<uint32_t>(device);
    prop.location.type = kLocationDevice;
    return prop;
}

Status acl_vm_granularity(int device, size_t* bytes, int* code) {
    if (vm_api.GetAllocationGranularity == nullptr) {
        *bytes = kDefaultGranularity;
        *code = kSuccess;
        return Status::ok;
    }
    PhysicalMemProp prop = device_memory(device);
    return on_device(device, code,
                     [&] { return vm_api.GetAllocationGranularity(&prop, kGranularityRecommended, bytes); });
}
Status acl_vm_reserve(void** base, size_t size, int device, int* code) {
    return on_device(device, code, [&] { return vm_api.ReserveMemAddress(base, size, 0, nullptr, 0); });
}
Status acl_vm_unreserve(void* base, size_t, int device, int* code) {
    return on_device(device, code, [&] { return vm_api.ReleaseMemAddress(base); });
}
Status acl_vm_create(void** chunk, size_t size, int device, int* code) {
    PhysicalMemProp prop = device_memory(device);
    return on_device(device, code, [&] { return vm_api.MallocPhysical(chunk, size, &prop, 0); });
}
Status acl_vm_release(void* chunk, int device, int* code) {
    return on_device(device, code, [&] { return vm_api.FreePhysical(chunk); });
}
Status acl_vm_map(void* at, size_t size, void* chunk, int device, int* code) {
    return on_device(device, code, [&] { return vm_api.MapMem(at, size, 0, chunk, 0); });
}
Status acl_vm_set_access(void*, size_t, int, int* code) {  // mapped memory is accessible already
    *code = kSuccess;
    return Status::ok;
}
Status acl_vm_unmap(void* at, size_t, int device, int* code) {
    return on_device(device, code, [&] { return vm_api.UnmapMem(at); });
}

const VirtualMemory kAclVm = {acl_vm_granularity, acl_vm_reserve, acl_vm_unreserve,  acl_vm_create,
                              acl_vm_release,     acl_vm_map,     acl_vm_set_access, acl_vm_unmap};

void load_virtual_memory(void* h) {
    vm_loaded = resolve(h, "aclrtReserveMemAddress", &vm_api.ReserveMemAddress, &vm_missing);
    vm_loaded &= resolve(h, "aclrtReleaseMemAddress", &vm_api.ReleaseMemAddress, &vm_missing);
    vm_loaded &= resolve(h, "aclrtMallocPhysical", &vm_api.MallocPhysical, &vm_missing);
    vm_loaded &= resolve(h, "aclrtFreePhysical", &vm_api.FreePhysical, &vm_missing);
    vm_loaded &= resolve(h, "aclrtMapMem", &vm_api.MapMem, &vm_missing);
    vm_loaded &= resolve(h, "aclrtUnmapMem", &vm_api.UnmapMem, &vm_missing);
    vm_api.GetAllocationGranularity = reinterpret_cast<aclError (*)(PhysicalMemProp*, int, size_t*)>(
        resolve_symbol(h, "aclrtMemGetAllocationGranularity"));
}

// Loaded with the runtime (load() below, under acl_runtime's lock).
const VirtualMemory* acl_virtual_memory(std::string* why) {
    if (!vm_loaded) *why = "libascendcl: " + vm_missing;
    return vm_loaded ? &kAclVm : nullptr;
}

const Runtime kAclQueued = {"acl",          acl_malloc,     q_free,       q_event_create, q_event_destroy,
                            q_event_record, q_event_query,  q_event_sync, q_stream_wait,  acl_capturing,
                            q_stream_sync,  acl_stream_query, acl_stream_device, acl_current_device, q_memset, q_copy_to_host,
                            acl_memory_total, acl_device_count, q_error_string, acl_virtual_memory};

const Runtime kAcl = {"acl",            acl_malloc,        acl_free,          acl_event_create,  acl_event_destroy,
                      acl_event_record, acl_event_query,   acl_event_sync,    acl_stream_wait,   acl_capturing,
                      acl_stream_sync,  acl_stream_query, acl_stream_device, acl_current_device, acl_memset,       acl_copy_to_host,
                      acl_memory_total, acl_device_count, acl_error_string, acl_virtual_memory};

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
    ok &= resolve(h, "aclrtSynchronizeEvent", &api.SynchronizeEvent, why);
    ok &= resolve(h, "aclrtSynchronizeStream", &api.SynchronizeStream, why);
    ok &= resolve(h, "aclrtSynchronizeDevice", &api.SynchronizeDevice, why);
    ok &= resolve(h, "aclrtMemsetAsync", &api.MemsetAsync, why);
    ok &= resolve(h, "aclrtMemcpy", &api.Memcpy, why);
    ok &= resolve(h, "aclrtGetMemInfo", &api.GetMemInfo, why);
    ok &= resolve(h, "aclrtGetDevice", &api.GetDevice, why);
    ok &= resolve(h, "aclrtGetDeviceCount", &api.GetDeviceCount, why);
    ok &= resolve(h, "aclrtSetDevice", &api.SetDevice, why);
    api.CaptureGetInfo = reinterpret_cast<aclError (*)(void*, int*, void**)>(
        resolve_symbol(h, "aclmdlRICaptureGetInfo"));
    api.CreateEventExWithFlag =
        reinterpret_cast<aclError (*)(void**, uint32_t)>(resolve_symbol(h, "aclrtCreateEventExWithFlag"));
    load_virtual_memory(h);
    return ok;
}

}  // namespace

bool set_acl_queue_ops(const npl_queue_ops* ops, const Runtime* in_use, std::string* why) {
    if (in_use == &kAcl || in_use == &kAclQueued) {
        *why = "torch_npu's task-queue operations must be set before the ACL runtime is selected";
        return false;
    }
    if (ops != nullptr && (!ops->event_create || !ops->event_destroy || !ops->event_record || !ops->event_query ||
                           !ops->event_synchronize || !ops->stream_wait_event || !ops->stream_synchronize ||
                           !ops->stream_drain || !ops->device_synchronize)) {
        *why = "npl_queue_ops: every operation but error_string is required";
        return false;
    }
    queue = ops;
    return true;
}

// The process has one ACL runtime: the first library that loads.  Asking
// for another library afterwards is an error, not a silent reuse.
const Runtime* acl_runtime(const char* library_path, std::string* why) {
    static std::mutex mu;
    static bool loaded = false;
    static std::string loaded_from;
    std::lock_guard<std::mutex> lock(mu);
    std::string wanted = library_path != nullptr ? library_path : "";
    if (!loaded) {
        loaded = load(library_path, why);
        if (loaded) loaded_from = wanted;
    } else if (!wanted.empty() && wanted != loaded_from) {
        *why = "the ACL runtime is already loaded in this process" +
               (loaded_from.empty() ? std::string() : " from " + loaded_from) + "; it cannot switch to " + wanted;
        return nullptr;
    }
    if (!loaded) return nullptr;
    return queue != nullptr ? &kAclQueued : &kAcl;
}

}  // namespace npl
