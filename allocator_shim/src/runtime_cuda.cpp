// The CUDA runtime (libcudart), resolved at run time.  The copy the process
// already loaded (torch's) is preferred so streams and events are shared.
#include <cstdlib>
#include <mutex>

#include "device_guard.h"
#include "loader.h"
#include "runtime.h"

namespace npl {

namespace {

using cudaError = int;
constexpr cudaError kSuccess = 0;
constexpr cudaError kMemoryAllocation = 2;
constexpr cudaError kNotReady = 600;
constexpr unsigned kEventDisableTiming = 0x02;
constexpr int kCaptureStatusNone = 0;
constexpr int kMemcpyDeviceToHost = 2;
constexpr int kCaptureModeRelaxed = 2;  // cudaStreamCaptureModeRelaxed

struct Api {
    cudaError (*Malloc)(void**, size_t);
    cudaError (*Free)(void*);
    cudaError (*EventCreateWithFlags)(void**, unsigned);
    cudaError (*EventDestroy)(void*);
    cudaError (*EventRecord)(void*, void*);
    cudaError (*EventQuery)(void*);
    cudaError (*EventSynchronize)(void*);
    cudaError (*StreamWaitEvent)(void*, void*, unsigned);
    cudaError (*StreamIsCapturing)(void*, int*);
    cudaError (*StreamSynchronize)(void*);
    cudaError (*StreamGetDevice)(void*, int*);  // CUDA >= 12.8; optional
    cudaError (*GetDevice)(int*);
    cudaError (*SetDevice)(int);
    cudaError (*MemsetAsync)(void*, int, size_t, void*);
    cudaError (*Memcpy)(void*, const void*, size_t, int);
    cudaError (*MemGetInfo)(size_t*, size_t*);
    cudaError (*GetLastError)();
    cudaError (*ThreadExchangeStreamCaptureMode)(int*);
    cudaError (*GetDeviceCount)(int*);
    const char* (*GetErrorString)(cudaError);
} api;

// Runs a call that is not stream-ordered (cudaMalloc, cudaFree, event
// creation, ...) in relaxed capture mode, as torch's allocator does: under a
// global-mode graph capture on any thread these calls would otherwise fail
// and invalidate the capture.
template <typename Call>
cudaError relaxed(Call call) {
    int mode = kCaptureModeRelaxed;
    bool exchanged = api.ThreadExchangeStreamCaptureMode(&mode) == kSuccess;
    cudaError err = call();
    if (exchanged) api.ThreadExchangeStreamCaptureMode(&mode);
    return err;
}

Status status_of(cudaError err, int* code) {
    *code = err;
    if (err == kSuccess) return Status::ok;
    // Clear the (non-sticky) error this call left, so torch's next check does
    // not see it: not-ready and out-of-memory are handled by the shim, and
    // other errors are reported as findings.
    api.GetLastError();
    if (err == kNotReady) return Status::not_ready;
    return err == kMemoryAllocation ? Status::out_of_memory : Status::error;
}

template <typename Call>
Status on_device(int device, int* code, Call call) {
    return npl::on_device(device, code, api.GetDevice, api.SetDevice, kSuccess, status_of, call);
}

Status cu_malloc(void** ptr, size_t size, int device, int* code) {
    return on_device(device, code, [&] { return relaxed([&] { return api.Malloc(ptr, size); }); });
}
Status cu_free(void* ptr, int device, int* code) {
    return on_device(device, code, [&] { return relaxed([&] { return api.Free(ptr); }); });
}
Status cu_event_create(Event* event, int device, int* code) {
    return on_device(device, code,
                     [&] { return relaxed([&] { return api.EventCreateWithFlags(event, kEventDisableTiming); }); });
}
Status cu_event_destroy(Event event, int, int* code) {
    return status_of(relaxed([&] { return api.EventDestroy(event); }), code);
}
Status cu_event_record(Event event, Stream stream, int* code) {
    return status_of(api.EventRecord(event, stream), code);
}
Status cu_event_query(Event event, int* code) { return status_of(api.EventQuery(event), code); }
Status cu_event_sync(Event event, int* code) { return status_of(api.EventSynchronize(event), code); }
Status cu_stream_wait(Stream stream, Event event, int* code) {
    return status_of(api.StreamWaitEvent(stream, event, 0), code);
}
Status cu_capturing(Stream stream, bool* capturing, int* code) {
    int status = kCaptureStatusNone;
    Status s = status_of(api.StreamIsCapturing(stream, &status), code);
    *capturing = s == Status::ok && status != kCaptureStatusNone;
    return s;
}
Status cu_stream_sync(Stream stream, int* code) { return status_of(api.StreamSynchronize(stream), code); }
Status cu_stream_device(Stream stream, int* device, int* code) {
    if (api.StreamGetDevice == nullptr || stream == nullptr) return Status::unsupported;
    return status_of(api.StreamGetDevice(stream, device), code);
}
Status cu_current_device(int* device, int* code) { return status_of(api.GetDevice(device), code); }
Status cu_memset(void* ptr, int byte, size_t size, Stream stream, int* code) {
    return status_of(api.MemsetAsync(ptr, byte, size, stream), code);
}
Status cu_copy_to_host(void* dst, const void* src, size_t size, int device, int* code) {
    return on_device(device, code, [&] { return api.Memcpy(dst, src, size, kMemcpyDeviceToHost); });
}
Status cu_memory_total(int device, size_t* total, int* code) {
    size_t free_bytes = 0;
    return on_device(device, code, [&] { return relaxed([&] { return api.MemGetInfo(&free_bytes, total); }); });
}

Status cu_device_count(int* count, int* code) { return status_of(api.GetDeviceCount(count), code); }
const char* cu_error_string(int code) { return api.GetErrorString(code); }

// ---- virtual memory: the driver API (libcuda), for expandable segments.
// Its own prototypes and structures, as cuda.h lays them out (checked below).
using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUmemHandle = unsigned long long;  // CUmemGenericAllocationHandle
constexpr CUresult kDriverSuccess = 0;
constexpr CUresult kDriverOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY
constexpr int kAllocationPinned = 1;        // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int kLocationDevice = 1;          // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kAccessReadWrite = 3;         // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr int kGranularityRecommended = 1;  // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED

struct MemLocation {
    int type;
    int id;
};
struct MemAllocationProp {
    int type;
    int requested_handle_types;
    MemLocation location;
    void* win32_handle_meta_data;
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
};
struct MemAccessDesc {
    MemLocation location;
    int flags;
};
static_assert(sizeof(MemAllocationProp) == 32 && sizeof(MemAccessDesc) == 12, "cuda.h's layout");

struct DriverApi {
    CUresult (*AddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*AddressFree)(CUdeviceptr, size_t);
    CUresult (*Create)(CUmemHandle*, size_t, const MemAllocationProp*, unsigned long long);
    CUresult (*Release)(CUmemHandle);
    CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemHandle, unsigned long long);
    CUresult (*SetAccess)(CUdeviceptr, size_t, const MemAccessDesc*, size_t);
    CUresult (*Unmap)(CUdeviceptr, size_t);
    CUresult (*GetAllocationGranularity)(size_t*, const MemAllocationProp*, int);
} driver;

Status driver_status(CUresult err, int* code) {
    *code = err;
    if (err == kDriverSuccess) return Status::ok;
    return err == kDriverOutOfMemory ? Status::out_of_memory : Status::error;
}

// A driver call on `device` (its primary context current, through the
// runtime's cudaSetDevice) in relaxed capture mode: none of them is
// stream-ordered, and under another thread's global-mode capture they would
// fail and invalidate it.
template <typename Call>
Status on_device_driver(int device, int* code, Call call) {
    return npl::on_device(device, code, api.GetDevice, api.SetDevice, kSuccess, driver_status,
                          [&] { return relaxed(call); });
}

MemAllocationProp device_memory(int device) {
    MemAllocationProp prop{};
    prop.type = kAllocationPinned;
    prop.location = MemLocation{kLocationDevice, device};
    return prop;
}

Status cu_vm_granularity(int device, size_t* bytes, int* code) {
    MemAllocationProp prop = device_memory(device);
    return on_device_driver(device, code,
                            [&] { return driver.GetAllocationGranularity(bytes, &prop, kGranularityRecommended); });
}
Status cu_vm_reserve(void** base, size_t size, int device, int* code) {
    CUdeviceptr ptr = 0;
    Status s = on_device_driver(device, code, [&] { return driver.AddressReserve(&ptr, size, 0, 0, 0); });
    *base = reinterpret_cast<void*>(ptr);
    return s;
}
Status cu_vm_unreserve(void* base, size_t size, int device, int* code) {
    return on_device_driver(device, code,
                            [&] { return driver.AddressFree(reinterpret_cast<CUdeviceptr>(base), size); });
}
Status cu_vm_create(void** chunk, size_t size, int device, int* code) {
    MemAllocationProp prop = device_memory(device);
    CUmemHandle handle = 0;
    Status s = on_device_driver(device, code, [&] { return driver.Create(&handle, size, &prop, 0); });
    *chunk = reinterpret_cast<void*>(handle);
    return s;
}
Status cu_vm_release(void* chunk, int device, int* code) {
    return on_device_driver(device, code, [&] { return driver.Release(reinterpret_cast<CUmemHandle>(chunk)); });
}
Status cu_vm_map(void* at, size_t size, void* chunk, int device, int* code) {
    return on_device_driver(device, code, [&] {
        return driver.Map(reinterpret_cast<CUdeviceptr>(at), size, 0, reinterpret_cast<CUmemHandle>(chunk), 0);
    });
}
Status cu_vm_set_access(void* at, size_t size, int device, int* code) {
    MemAccessDesc desc{MemLocation{kLocationDevice, device}, kAccessReadWrite};
    return on_device_driver(device, code,
                            [&] { return driver.SetAccess(reinterpret_cast<CUdeviceptr>(at), size, &desc, 1); });
}
Status cu_vm_unmap(void* at, size_t size, int device, int* code) {
    return on_device_driver(device, code, [&] { return driver.Unmap(reinterpret_cast<CUdeviceptr>(at), size); });
}

const VirtualMemory kCudaVm = {cu_vm_granularity, cu_vm_reserve,   cu_vm_unreserve, cu_vm_create,
                               cu_vm_release,     cu_vm_map,       cu_vm_set_access, cu_vm_unmap};

bool load_driver(std::string* why) {
    void* h = open_runtime_library("", "libcuda.so", {"libcuda.so.1", "libcuda.so"}, why);
    if (h == nullptr) return false;
    bool ok = resolve(h, "cuMemAddressReserve", &driver.AddressReserve, why);
    ok &= resolve(h, "cuMemAddressFree", &driver.AddressFree, why);
    ok &= resolve(h, "cuMemCreate", &driver.Create, why);
    ok &= resolve(h, "cuMemRelease", &driver.Release, why);
    ok &= resolve(h, "cuMemMap", &driver.Map, why);
    ok &= resolve(h, "cuMemSetAccess", &driver.SetAccess, why);
    ok &= resolve(h, "cuMemUnmap", &driver.Unmap, why);
    ok &= resolve(h, "cuMemGetAllocationGranularity", &driver.GetAllocationGranularity, why);
    return ok;
}

// The driver's virtual-memory calls, loaded once (nullptr and why not).
const VirtualMemory* cu_virtual_memory(std::string* why) {
    static std::mutex mu;
    static int loaded = -1;  // not tried yet
    static std::string failure;
    std::lock_guard<std::mutex> lock(mu);
    if (loaded < 0) loaded = load_driver(&failure) ? 1 : 0;
    if (loaded == 0) *why = failure;
    return loaded == 1 ? &kCudaVm : nullptr;
}

const Runtime kCuda = {"cuda",          cu_malloc,        cu_free,        cu_event_create,  cu_event_destroy,
                       cu_event_record, cu_event_query,   cu_event_sync,  cu_stream_wait,   cu_capturing,
                       cu_stream_sync,  cu_stream_device, cu_current_device, cu_memset,     cu_copy_to_host,
                       cu_memory_total, cu_device_count, cu_error_string, cu_virtual_memory};

bool load(std::string* why) {
    const char* env = std::getenv("NPU_LIFETIME_CUDART");
    void* h = open_runtime_library(env ? env : "", "libcudart",
                                   {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}, why);
    if (h == nullptr) return false;
    bool ok = resolve(h, "cudaMalloc", &api.Malloc, why);
    ok &= resolve(h, "cudaFree", &api.Free, why);
    ok &= resolve(h, "cudaEventCreateWithFlags", &api.EventCreateWithFlags, why);
    ok &= resolve(h, "cudaEventDestroy", &api.EventDestroy, why);
    ok &= resolve(h, "cudaEventRecord", &api.EventRecord, why);
    ok &= resolve(h, "cudaEventQuery", &api.EventQuery, why);
    ok &= resolve(h, "cudaEventSynchronize", &api.EventSynchronize, why);
    ok &= resolve(h, "cudaStreamWaitEvent", &api.StreamWaitEvent, why);
    ok &= resolve(h, "cudaStreamIsCapturing", &api.StreamIsCapturing, why);
    ok &= resolve(h, "cudaStreamSynchronize", &api.StreamSynchronize, why);
    ok &= resolve(h, "cudaGetDevice", &api.GetDevice, why);
    ok &= resolve(h, "cudaSetDevice", &api.SetDevice, why);
    ok &= resolve(h, "cudaMemsetAsync", &api.MemsetAsync, why);
    ok &= resolve(h, "cudaMemcpy", &api.Memcpy, why);
    ok &= resolve(h, "cudaMemGetInfo", &api.MemGetInfo, why);
    ok &= resolve(h, "cudaGetLastError", &api.GetLastError, why);
    ok &= resolve(h, "cudaThreadExchangeStreamCaptureMode", &api.ThreadExchangeStreamCaptureMode, why);
    ok &= resolve(h, "cudaGetDeviceCount", &api.GetDeviceCount, why);
    ok &= resolve(h, "cudaGetErrorString", &api.GetErrorString, why);
    api.StreamGetDevice = reinterpret_cast<cudaError (*)(void*, int*)>(resolve_symbol(h, "cudaStreamGetDevice"));
    return ok;
}

}  // namespace

const Runtime* cuda_runtime(std::string* why) {
    static std::mutex mu;
    static bool loaded = false;
    std::lock_guard<std::mutex> lock(mu);
    if (!loaded) loaded = load(why);
    return loaded ? &kCuda : nullptr;
}

}  // namespace npl
