// The CUDA runtime (libcudart), resolved at run time.  The copy the process
// already loaded (torch's) is preferred so streams and events are shared.
#include <dlfcn.h>

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
    cudaError (*StreamQuery)(void*);            // optional (a fake runtime may lack it)
    cudaError (*GetDevice)(int*);
    cudaError (*SetDevice)(int);
    cudaError (*MemsetAsync)(void*, int, size_t, void*);
    cudaError (*Memcpy)(void*, const void*, size_t, int);
    cudaError (*MemGetInfo)(size_t*, size_t*);
    cudaError (*GetLastError)();
    cudaError (*ThreadExchangeStreamCaptureMode)(int*);
    cudaError (*GetDeviceCount)(int*);
    const char* (*GetErrorString)(cudaError);
    cudaError (*MallocAsync)(void**, size_t, void*);  // optional: the oracle mode's
    cudaError (*FreeAsync)(void*, void*);
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
Status cu_stream_query(Stream stream, int* code) {
    return api.StreamQuery == nullptr ? Status::unsupported : status_of(api.StreamQuery(stream), code);
}
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
                       cu_stream_sync,  cu_stream_query, cu_stream_device, cu_current_device, cu_memset,     cu_copy_to_host,
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
    api.StreamQuery = reinterpret_cast<cudaError (*)(void*)>(resolve_symbol(h, "cudaStreamQuery"));
    api.MallocAsync = reinterpret_cast<cudaError (*)(void**, size_t, void*)>(resolve_symbol(h, "cudaMallocAsync"));
    api.FreeAsync = reinterpret_cast<cudaError (*)(void*, void*)>(resolve_symbol(h, "cudaFreeAsync"));
    return ok;
}

// The oracle mode's segments: stream-ordered, on the device the segment is for.
Status cu_malloc_async(void** ptr, size_t size, int device, Stream stream, int* code) {
    return on_device(device, code, [&] { return api.MallocAsync(ptr, size, stream); });
}
Status cu_free_async(void* ptr, int device, Stream stream, int* code) {
    return on_device(device, code, [&] { return api.FreeAsync(ptr, stream); });
}
const StreamOrderedMemory kCudaOrdered = {cu_malloc_async, cu_free_async};

}  // namespace

const StreamOrderedMemory* cuda_stream_ordered_memory(std::string* why) {
    if (api.MallocAsync == nullptr || api.FreeAsync == nullptr) {
        *why = "the loaded libcudart has no cudaMallocAsync / cudaFreeAsync (CUDA 11.2 or later has them)";
        return nullptr;
    }
    return &kCudaOrdered;
}

const Runtime* cuda_runtime(std::string* why) {
    static std::mutex mu;
    static bool loaded = false;
    std::lock_guard<std::mutex> lock(mu);
    if (!loaded) loaded = load(why);
    return loaded ? &kCuda : nullptr;
}

// ---- capture topology ---------------------------------------------------------
// cudaStreamGetCaptureInfo and cudaGraphNodeGetDependencies changed
// signature across releases; the symbol with the signature declared here is
// chosen by the runtime's version (libcudart.so.12 exports _v2/_v3 and
// cudaGraphNodeGetDependencies_v2 besides the old names, .so.13 only the
// plain names, with the edge-data signatures).  The edge-data variants are
// preferred: without a place for edge data, a graph with programmatic
// (non-default) edges answers cudaErrorLossyQuery.

namespace {

constexpr int kCaptureStatusInvalidated = 2;  // cudaStreamCaptureStatusInvalidated

struct EdgeData {  // cudaGraphEdgeData: from_port, to_port, type, reserved[5]
    unsigned char bytes[8];
};
static_assert(sizeof(EdgeData) == 8, "cudaGraphEdgeData is 8 bytes");

struct TopologyApi {
    // (stream, status, id, graph, dependencies, [edge data,] count)
    cudaError (*CaptureInfo)(void*, int*, unsigned long long*, void**, void* const**, size_t*);
    cudaError (*CaptureInfoEdges)(void*, int*, unsigned long long*, void**, void* const**, const EdgeData**,
                                  size_t*);
    // (node, dependencies, [edge data,] count)
    cudaError (*NodeDependencies)(void*, void**, size_t*);
    cudaError (*NodeDependenciesEdges)(void*, void**, EdgeData*, size_t*);
} topology_api;

Status cu_capture_info(Stream stream, CaptureInfo* info, int* code) {
    int status = kCaptureStatusNone;
    unsigned long long id = 0;
    void* graph = nullptr;
    void* const* nodes = nullptr;
    const EdgeData* edges = nullptr;
    size_t count = 0;
    cudaError err = topology_api.CaptureInfoEdges != nullptr
                        ? topology_api.CaptureInfoEdges(stream, &status, &id, &graph, &nodes, &edges, &count)
                        : topology_api.CaptureInfo(stream, &status, &id, &graph, &nodes, &count);
    *info = CaptureInfo{};
    Status s = status_of(err, code);
    if (s != Status::ok || status == kCaptureStatusNone) return s;
    info->capturing = true;
    info->invalidated = status == kCaptureStatusInvalidated;
    info->id = id;
    if (nodes != nullptr) info->frontier.assign(nodes, nodes + count);  // valid until the stream's next call
    return s;
}

Status cu_node_parents(GraphNode node, std::vector<GraphNode>* parents, int* code) {
    size_t count = 0;
    std::vector<EdgeData> edges;
    auto query = [&](void** out) {
        if (topology_api.NodeDependenciesEdges == nullptr) return topology_api.NodeDependencies(node, out, &count);
        edges.resize(out != nullptr ? count : 0);
        return topology_api.NodeDependenciesEdges(node, out, out != nullptr ? edges.data() : nullptr, &count);
    };
    Status s = status_of(query(nullptr), code);
    parents->assign(count, nullptr);
    if (s != Status::ok || count == 0) return s;
    s = status_of(query(parents->data()), code);
    parents->resize(s == Status::ok ? count : 0);
    return s;
}

const CaptureTopology kCudaTopology = {cu_capture_info, cu_node_parents};

// The loaded libcudart's handle (the one api's functions came from).
void* loaded_cudart(std::string* why) {
    Dl_info where{};
    if (dladdr(reinterpret_cast<void*>(api.Malloc), &where) == 0 || where.dli_fname == nullptr) {
        *why = "can't tell which libcudart is loaded";
        return nullptr;
    }
    void* h = dlopen(where.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) *why = std::string("can't reopen ") + where.dli_fname;
    return h;
}

bool load_topology(std::string* why) {
    void* h = loaded_cudart(why);
    if (h == nullptr) return false;
    int version = 0;
    cudaError (*get_version)(int*) = nullptr;
    bool ok = resolve(h, "cudaRuntimeGetVersion", &get_version, why) && get_version(&version) == kSuccess;
    if (ok && version >= 13000) {
        ok = resolve(h, "cudaStreamGetCaptureInfo", &topology_api.CaptureInfoEdges, why) &&
             resolve(h, "cudaGraphNodeGetDependencies", &topology_api.NodeDependenciesEdges, why);
    } else if (ok && version >= 12030) {
        ok = resolve(h, "cudaStreamGetCaptureInfo_v3", &topology_api.CaptureInfoEdges, why) &&
             resolve(h, "cudaGraphNodeGetDependencies_v2", &topology_api.NodeDependenciesEdges, why);
    } else if (ok && version >= 11030) {
        ok = resolve(h, "cudaStreamGetCaptureInfo_v2", &topology_api.CaptureInfo, why) &&
             resolve(h, "cudaGraphNodeGetDependencies", &topology_api.NodeDependencies, why);
    } else if (ok) {
        *why = "CUDA runtime " + std::to_string(version) + " predates cudaStreamGetCaptureInfo_v2 (11.3)";
        ok = false;
    }
    dlclose(h);  // RTLD_NOLOAD took a reference; the runtime's own handle keeps it loaded
    if (!ok) topology_api = TopologyApi{};
    return ok;
}

}  // namespace

const CaptureTopology* cuda_capture_topology(std::string* why) {
    static std::mutex mu;
    static int loaded = -1;  // -1 not tried, 0 no, 1 yes
    static std::string reason;
    std::lock_guard<std::mutex> lock(mu);
    if (loaded < 0) {
        std::string missing;
        loaded = load_topology(&missing) ? 1 : 0;
        reason = "the CUDA runtime offers no capture topology (" + missing + ")";
    }
    if (loaded == 0) *why = reason;
    return loaded == 1 ? &kCudaTopology : nullptr;
}

}  // namespace npl
