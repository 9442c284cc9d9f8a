// The NPU bridge: the shim's events and stream waits through torch_npu's
// task queue, and the shim's statistics as torch_npu's DeviceStats.
//
// With the queue on (torch_npu's default, TASK_QUEUE_ENABLE unset, 1 or 2),
// ops reach the device from torch_npu's launch thread.  An event the shim
// recorded straight through ACL could land on the device before kernels the
// user had queued earlier, and a block would be reused under them.
// torch_npu's own caching allocator records its events with
// c10_npu::NPUEvent::record, which enqueues the record behind that work;
// this file does the same for the shim (npl_queue_ops in the shim's header),
// and is built at install('npu') time against the torch_npu in use
// (npu_lifetime/shim/bridge.py).  With the queue off, NPUEvent calls ACL
// directly, so the same code serves every level.
//
// NPUEvent needs torch_npu's NPUStream, while the pluggable allocator hands
// the shim bare aclrtStreams: the bridge remembers the NPUStream of every
// aclrtStream it meets.  It is torch_npu's allocation entry point (forwarding
// to the torch bridge or the shim), so it meets each allocation's stream, the
// current one, at the allocation; and it meets record_stream/erase_stream's
// streams and record_use's Python stream.  A stream it has never
// met (an external stream: NPUEvent refuses those) is synchronised instead,
// so the event is left unrecorded, which reads as complete: slower, never
// early.  That synchronisation is of the stream's device, whatever device
// is current (set, synchronise, set back): the device of the event being
// recorded (the shim creates an event on the device of the stream it will
// record it on), else the device the stream was met on, else every device.  No exception crosses the C ABI: each becomes an error code whose
// words error_string gives.
#include <c10/core/CachingDeviceAllocator.h>
#include <torch_npu/csrc/core/npu/NPUEvent.h>
#include <torch_npu/csrc/core/npu/NPUFunctions.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "npu_lifetime_shim.h"

#define NPL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kBridgeError = 0x4e504c;  // "NPL": a C++ exception from torch_npu
thread_local std::string last_error;

template <typename Call>
int guarded(Call call) {
    try {
        call();
        return 0;
    } catch (const std::exception& e) {
        last_error = e.what();
    } catch (...) {
        last_error = "unknown exception from torch_npu";
    }
    return kBridgeError;
}

// aclrtStream -> the NPUStream it belongs to.
std::mutex streams_mu;
std::unordered_map<aclrtStream, c10::StreamData3> streams;

aclrtStream remember(const c10_npu::NPUStream& s) {
    aclrtStream handle = s.stream(false);  // false: no drain of the queue
    std::lock_guard<std::mutex> lock(streams_mu);
    streams.emplace(handle, s.pack3());
    return handle;
}

bool known(aclrtStream handle, c10_npu::NPUStream* out) {
    std::lock_guard<std::mutex> lock(streams_mu);
    auto it = streams.find(handle);
    if (it == streams.end()) return false;
    *out = c10_npu::NPUStream::unpack3(it->second.stream_id, it->second.device_index, it->second.device_type);
    return true;
}

// Streams torch_npu does not manage -> their device, as met.
std::unordered_map<aclrtStream, int> foreign_devices;  // under streams_mu

void learn_foreign_device(aclrtStream handle, int device) {
    std::lock_guard<std::mutex> lock(streams_mu);
    foreign_devices[handle] = device;
}

int foreign_device(aclrtStream handle) {  // -1: never met
    std::lock_guard<std::mutex> lock(streams_mu);
    auto it = foreign_devices.find(handle);
    return it == foreign_devices.end() ? -1 : it->second;
}

void check_acl(aclError err, const char* what) {
    if (err != ACL_ERROR_NONE) throw std::runtime_error(std::string(what) + " failed with ACL error " + std::to_string(err));
}

// Synchronises `device` (its streams, after torch_npu's queue) from any
// current device: the current device is set back after, both calls checked.
void synchronize_device(int device) {
    int32_t current = 0;
    check_acl(c10_npu::GetDevice(&current), "aclrtGetDevice");
    if (current != device) check_acl(c10_npu::SetDevice(static_cast<c10::DeviceIndex>(device)), "aclrtSetDevice");
    bool synced = false;
    try {
        synced = c10_npu::npuSynchronizeDevice(true);
    } catch (...) {
        if (current != device) (void)c10_npu::SetDevice(static_cast<c10::DeviceIndex>(current));  // (the first error wins)
        throw;
    }
    if (current != device) check_acl(c10_npu::SetDevice(static_cast<c10::DeviceIndex>(current)), "aclrtSetDevice");
    if (!synced) throw std::runtime_error("npuSynchronizeDevice failed on device " + std::to_string(device));
}

// A stream torch_npu does not manage: its device's work done (every
// device's when its device was never met).
void synchronize_foreign(aclrtStream handle, int device) {
    if (device < 0) device = foreign_device(handle);
    if (device >= 0) {
        synchronize_device(device);
        return;
    }
    for (c10::DeviceIndex d = 0; d < c10_npu::device_count(); ++d) synchronize_device(d);
}

// The NPUStream of `handle`, learning the current and default streams of
// each device on first sight; false for a stream torch_npu does not manage.
bool find(aclrtStream handle, c10_npu::NPUStream* out) {
    if (known(handle, out)) return true;
    for (c10::DeviceIndex d = 0; d < c10_npu::device_count(); ++d) {
        for (const c10_npu::NPUStream& s : {c10_npu::getCurrentNPUStream(d), c10_npu::getDefaultNPUStream(d)}) {
            if (s.stream(false) == handle) {
                remember(s);
                *out = s;
                return true;
            }
        }
    }
    return false;
}

// Allocation: the stream torch_npu allocates on is the current stream of
// the device (getCurrentNPUStreamNoWait).  One comparison per allocation
// once a thread's stream is known.
void* (*forward_alloc)(size_t, int, void*) = nullptr;
void (*forward_free)(void*, size_t, int, void*) = nullptr;
thread_local aclrtStream last_allocation_stream = nullptr;

void learn_allocation_stream(int device, aclrtStream handle) {
    if (handle == last_allocation_stream) return;
    c10_npu::NPUStream s = c10_npu::getDefaultNPUStream();
    if (!known(handle, &s)) {
        c10_npu::NPUStream current = c10_npu::getCurrentNPUStream(static_cast<c10::DeviceIndex>(device));
        if (current.stream(false) != handle) {  // raw_alloc_with_stream on another stream: met later, or not
            if (foreign_device(handle) < 0 && !find(handle, &current)) learn_foreign_device(handle, device);
            return;
        }
        remember(current);
    }
    last_allocation_stream = handle;
}

// An event and the device it was created for (its stream's).
struct Event {
    c10_npu::NPUEvent npu{ACL_EVENT_CAPTURE_STREAM_PROGRESS};
    int device = 0;
};
c10_npu::NPUEvent* as_event(void* event) { return &static_cast<Event*>(event)->npu; }

int event_create(void** event, int device) {
    return guarded([&] {
        auto* e = new Event;
        e->device = device;
        *event = e;
    });
}
int event_destroy(void* event) {
    return guarded([&] { delete static_cast<Event*>(event); });
}
int event_record(void* event, void* stream) {
    return guarded([&] {
        c10_npu::NPUStream s = c10_npu::getDefaultNPUStream();
        if (find(stream, &s)) {
            as_event(event)->record(s);
        } else {  // an unmanaged stream: its work is done, the event reads complete
            int device = static_cast<Event*>(event)->device;
            learn_foreign_device(stream, device);
            synchronize_foreign(stream, device);
        }
    });
}
int event_query(void* event, int* complete) {
    return guarded([&] { *complete = as_event(event)->query() ? 1 : 0; });
}
int event_synchronize(void* event) {
    return guarded([&] { as_event(event)->synchronize(); });
}
int stream_wait_event(void* stream, void* event) {
    return guarded([&] {
        c10_npu::NPUStream s = c10_npu::getDefaultNPUStream();
        if (find(stream, &s)) {
            as_event(event)->block(s);
        } else {
            as_event(event)->synchronize();  // the host waits instead of the unmanaged stream
        }
    });
}
int stream_synchronize(void* stream) {
    return guarded([&] {
        c10_npu::NPUStream s = c10_npu::getDefaultNPUStream();
        if (find(stream, &s)) {
            s.synchronize();
        } else {
            synchronize_foreign(stream, -1);
        }
    });
}
int stream_drain(void* stream) {
    return guarded([&] {
        c10_npu::NPUStream s = c10_npu::getDefaultNPUStream();
        if (find(stream, &s)) {
            (void)s.stream();  // stream() empties the queue up to now
        } else {
            synchronize_foreign(stream, -1);
        }
    });
}
int device_synchronize(int device) {
    return guarded([&] {
        c10_npu::NPUGuard guard(static_cast<c10::DeviceIndex>(device));
        c10_npu::npuSynchronizeDevice(true);
    });
}
const char* error_string(int code) { return code == kBridgeError ? last_error.c_str() : ""; }

// --- statistics: NPUPluggableAllocator's get_device_stats / reset_peak_status hooks ---
// Without them torch_npu reads an uninitialised DeviceStats (its memory
// functions abort).  The shim keeps torch's names; `stats_layout` holds,
// for each StatArray of DeviceStats in declaration order, the index of its
// "<name>.all.current" value (then small_pool and large_pool, each current,
// peak, allocated, freed), followed by the five counters' indices.
size_t (*stats_values)(int, uint64_t*, size_t) = nullptr;
void (*stats_reset_peak)(int) = nullptr;
std::vector<int> stats_layout;
size_t stats_count = 0;
constexpr size_t kStatArrays = 9;
constexpr size_t kCounters = 5;

void fill(c10::CachingDeviceAllocator::StatArray* array, const std::vector<uint64_t>& v, int base) {
    for (size_t pool = 0; pool < array->size(); ++pool) {
        c10::CachingDeviceAllocator::Stat& stat = (*array)[pool];
        const uint64_t* x = &v[base + 4 * pool];
        stat.current = static_cast<int64_t>(x[0]);
        stat.peak = static_cast<int64_t>(x[1]);
        stat.allocated = static_cast<int64_t>(x[2]);
        stat.freed = static_cast<int64_t>(x[3]);
    }
}

c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex device) {
    c10::CachingDeviceAllocator::DeviceStats out;
    if (stats_values == nullptr || stats_layout.size() != kStatArrays + kCounters) return out;
    std::vector<uint64_t> v(stats_count);
    if (stats_values(device, v.data(), v.size()) != v.size()) return out;
    c10::CachingDeviceAllocator::StatArray* arrays[kStatArrays] = {
        &out.allocation,     &out.segment,        &out.active,
        &out.inactive_split, &out.allocated_bytes, &out.reserved_bytes,
        &out.active_bytes,   &out.inactive_split_bytes, &out.requested_bytes};
    for (size_t i = 0; i < kStatArrays; ++i) fill(arrays[i], v, stats_layout[i]);
    int64_t* counters[kCounters] = {&out.num_alloc_retries, &out.num_ooms, &out.num_sync_all_streams,
                                    &out.num_device_alloc, &out.num_device_free};
    for (size_t i = 0; i < kCounters; ++i) *counters[i] = static_cast<int64_t>(v[stats_layout[kStatArrays + i]]);
    return out;
}

void reset_peak_status(c10::DeviceIndex device) {
    if (stats_reset_peak != nullptr) stats_reset_peak(device);
}

const npl_queue_ops kOps = {event_create,      event_destroy,      event_record, event_query,        event_synchronize,
                            stream_wait_event, stream_synchronize, stream_drain, device_synchronize, error_string};

}  // namespace

NPL_EXPORT const npl_queue_ops* npl_npu_queue_ops() { return &kOps; }

// The shim's NPUStream resolver for torch_npu's record_stream/erase_stream
// hooks (they receive a pointer to the NPUStream): its aclrtStream, learnt.
NPL_EXPORT void* npl_npu_resolve_stream(const void* npu_stream) {
    void* handle = nullptr;
    guarded([&] { handle = remember(*static_cast<const c10_npu::NPUStream*>(npu_stream)); });
    return handle;
}

// The aclrtStream of a torch.npu.Stream given by its three fields, learnt
// (record_use from Python).  NULL with npl_npu_last_error() on failure.
NPL_EXPORT void* npl_npu_stream_handle(int64_t stream_id, int device_index, int device_type) {
    void* handle = nullptr;
    guarded([&] {
        handle = remember(c10_npu::NPUStream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device_index),
                                                      static_cast<c10::DeviceType>(device_type)));
    });
    return handle;
}

NPL_EXPORT const char* npl_npu_last_error() { return last_error.c_str(); }

// torch_npu's allocation entry points (NPUPluggableAllocator(path,
// "npl_npu_alloc", "npl_npu_free")): they learn the stream, then forward to
// `alloc`/`free` (the torch bridge's, which raise torch's out-of-memory
// error, or the shim's).  An exception from the forwarded allocation (out of
// memory) goes on to torch_npu as the torch bridge threw it.
NPL_EXPORT void npl_npu_connect_allocation(void* alloc, void* free) {
    forward_alloc = reinterpret_cast<void* (*)(size_t, int, void*)>(alloc);
    forward_free = reinterpret_cast<void (*)(void*, size_t, int, void*)>(free);
}

NPL_EXPORT void* npl_npu_alloc(size_t size, int device, void* stream) {
    guarded([&] { learn_allocation_stream(device, stream); });
    return forward_alloc(size, device, stream);
}

NPL_EXPORT void npl_npu_free(void* ptr, size_t size, int device, void* stream) {
    forward_free(ptr, size, device, stream);
}

// The shim's npl_stats_values (and how many values it writes), npl_reset_peak, and the layout above.
NPL_EXPORT void npl_npu_connect_stats(void* values, size_t count, void* reset_peak, const int* layout, size_t n) {
    stats_values = reinterpret_cast<size_t (*)(int, uint64_t*, size_t)>(values);
    stats_count = count;
    stats_reset_peak = reinterpret_cast<void (*)(int)>(reset_peak);
    stats_layout.assign(layout, layout + n);
}

// The functions torch_npu's set_get_device_stats_fn / set_reset_peak_status_fn take.
NPL_EXPORT void* npl_npu_device_stats_fn() { return reinterpret_cast<void*>(&device_stats); }
NPL_EXPORT void* npl_npu_reset_peak_status_fn() { return reinterpret_cast<void*>(&reset_peak_status); }
