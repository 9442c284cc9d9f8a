// A simulated device runtime on host memory.  Streams are any non-null
// handle; work never runs by itself.  Each stream is a FIFO of positions:
// event records, kernels (sim::launch), waits on another stream's event, and
// fills (memset).  A stream runs when the test says so (sim::complete): up
// to its end, or to the first wait whose event has not completed; a fill
// lands on host memory when its stream runs past it.  The host waiting
// (event/stream synchronize) runs whatever that needs, as a device would.
// Tests count each call and can make the next calls of one fail
// (sim::fail_next), as a device runtime can.  Graph captures build a graph
// of dependencies (sim_capture_graph.h) the capture topology calls answer.
#include "runtime_sim.h"
#include "sim_capture_graph.h"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace npl {

namespace {

constexpr int kOk = 0, kInvalid = 1, kOutOfMemory = 2, kIllegalAddress = 3;
constexpr size_t kAlignment = 512;
constexpr size_t kDefaultTotal = size_t(64) << 30;  // what memory_total reports without a limit
constexpr int kDevices = 8;                          // devices the simulated runtime has

thread_local int current_device = 0;

struct Wait {
    uint64_t position;  // in the waiting stream
    Stream on;          // the event's stream, and its position there
    uint64_t until;
};

struct Fill {
    uint64_t position;
    void* ptr;
    int byte;
    size_t size;
};

struct SimStream {
    uint64_t queued = 0;     // operations queued so far
    uint64_t completed = 0;  // operations finished so far
    uint64_t waits = 0;
    std::vector<Wait> pending_waits;  // not yet passed, in order
    std::vector<Fill> pending_fills;
};

struct SimEvent {
    Stream stream = nullptr;  // null: never recorded (complete, as in CUDA)
    uint64_t position = 0;
};

// The calls tests can count and make fail (sim::calls, sim::fail_next).
enum Call : int {
    kMalloc, kFree, kEventCreate, kEventDestroy, kEventRecord, kEventQuery, kEventSynchronize, kStreamWaitEvent,
    kStreamCapturing, kStreamSynchronize, kMemset, kVmReserve, kVmCreate, kVmMap, kVmSetAccess, kVmUnmap,
    kVmRelease, kVmUnreserve, kCaptureInfo, kNodeParents, kCalls
};
const char* const kCallNames[kCalls] = {"malloc",       "free",          "event_create",      "event_destroy",
                                        "event_record", "event_query",   "event_synchronize", "stream_wait_event",
                                        "stream_capturing", "stream_synchronize", "memset",
                                        "vm_reserve",   "vm_create",     "vm_map",            "vm_set_access",
                                        "vm_unmap",     "vm_release",    "vm_unreserve",
                                        "capture_info",     "node_parents"};

struct State {
    std::mutex mu;
    std::unordered_map<Stream, SimStream> streams;
    std::unordered_set<SimEvent*> events;
    std::unordered_map<void*, size_t> memory;
    uint64_t in_use = 0, limit = 0;
    uint64_t event_syncs = 0;
    uint64_t calls[kCalls] = {};
    uint64_t failing[kCalls] = {};  // the next this many calls fail
    sim::CaptureGraphs graphs;
};

State& state() {
    static State* s = new State();  // never destroyed: safe during exit
    return *s;
}

// Runs `st` up to `target`, stopping before a wait on an event not yet
// complete (`run_dependencies`: run that stream first, as the host waiting
// on the device would make happen).  Fills passed land.
void advance(State& s, SimStream& st, uint64_t target, bool run_dependencies) {
    target = std::min(target, st.queued);
    while (st.completed < target) {
        uint64_t stop = target;
        auto wait = st.pending_waits.begin();
        if (wait != st.pending_waits.end() && wait->position <= target) {
            SimStream& on = s.streams[wait->on];
            if (on.completed < wait->until && run_dependencies) advance(s, on, wait->until, true);
            stop = on.completed >= wait->until ? wait->position : wait->position - 1;
        }
        if (stop <= st.completed) break;  // blocked by the wait
        st.completed = stop;
        if (wait != st.pending_waits.end() && wait->position <= stop) st.pending_waits.erase(wait);
        auto fill = st.pending_fills.begin();
        for (; fill != st.pending_fills.end() && fill->position <= st.completed; ++fill) {
            if (sim::detail::accessible(fill->ptr, fill->size)) std::memset(fill->ptr, fill->byte, fill->size);
        }
        st.pending_fills.erase(st.pending_fills.begin(), fill);
    }
}

// Counts a call (under s.mu); true when a test asked for it to fail.
bool injected_failure(State& s, Call call) {
    s.calls[call]++;
    if (s.failing[call] == 0) return false;
    s.failing[call]--;
    return true;
}

int call_index(const char* name) {
    for (int i = 0; i < kCalls; ++i) {
        if (name != nullptr && std::strcmp(name, kCallNames[i]) == 0) return i;
    }
    return -1;
}

Status result(int code, int* out) {
    *out = code;
    if (code == kOk) return Status::ok;
    return code == kOutOfMemory ? Status::out_of_memory : Status::error;
}

Status sim_malloc(void** ptr, size_t size, int, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kMalloc)) return result(kInvalid, code);
    if (s.limit != 0 && s.in_use + size > s.limit) return result(kOutOfMemory, code);
    size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
    *ptr = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
    if (*ptr == nullptr) return result(kOutOfMemory, code);
    s.memory[*ptr] = size;
    s.in_use += size;
    return result(kOk, code);
}

// As cudaFree, the free waits for the device: every stream runs to its end
// first (so no queued fill lands in freed memory).  Work still queued on
// the memory itself is counted as an illegal access: a runtime whose free
// does not wait (aclrtFree, a pool allocator's free) would run it on freed
// memory, so a test sees the synchronisation the shim left out.
Status sim_free(void* ptr, int, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kFree)) return result(kInvalid, code);
    auto it = s.memory.find(ptr);
    if (it == s.memory.end()) return result(kInvalid, code);
    const char* begin = static_cast<const char*>(ptr);
    const char* end = begin + it->second;
    uint64_t queued_on_it = 0;
    for (auto& entry : s.streams) {
        for (const Fill& f : entry.second.pending_fills) {
            const char* at = static_cast<const char*>(f.ptr);
            queued_on_it += at < end && begin < at + f.size;
        }
    }
    if (queued_on_it != 0) sim::detail::count_illegal(queued_on_it);
    for (auto& entry : s.streams) advance(s, entry.second, entry.second.queued, true);
    s.in_use -= it->second;
    s.memory.erase(it);
    std::free(ptr);
    return result(kOk, code);
}

// The oracle mode's free (stream-ordered, as cudaFreeAsync): the memory goes
// once `stream` has run to the free, with what it waits for; fills other
// streams still have queued on it are not ordered before the free, and are
// counted as illegal accesses (as compute-sanitizer reports them).
Status sim_free_async(void* ptr, int, Stream stream, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kFree)) return result(kInvalid, code);
    auto it = s.memory.find(ptr);
    if (it == s.memory.end()) return result(kInvalid, code);
    SimStream& own = s.streams[stream];
    advance(s, own, own.queued, true);
    const char* begin = static_cast<const char*>(ptr);
    const char* end = begin + it->second;
    uint64_t unordered = 0;
    for (auto& entry : s.streams) {  // counted, and dropped: they would land in freed host memory
        auto& fills = entry.second.pending_fills;
        auto on_it = [&](const Fill& f) {
            const char* at = static_cast<const char*>(f.ptr);
            return at < end && begin < at + f.size;
        };
        auto kept = std::remove_if(fills.begin(), fills.end(), on_it);
        unordered += static_cast<uint64_t>(fills.end() - kept);
        fills.erase(kept, fills.end());
    }
    if (unordered != 0) sim::detail::count_illegal(unordered);
    s.in_use -= it->second;
    s.memory.erase(it);
    std::free(ptr);
    return result(kOk, code);
}

Status sim_malloc_async(void** ptr, size_t size, int device, Stream, int* code) {
    return sim_malloc(ptr, size, device, code);
}

Status sim_event_create(Event* event, int, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kEventCreate)) return result(kInvalid, code);
    auto* e = new SimEvent();
    s.events.insert(e);
    *event = e;
    return result(kOk, code);
}

Status sim_event_destroy(Event event, int, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kEventDestroy)) return result(kInvalid, code);
    auto* e = static_cast<SimEvent*>(event);
    if (s.events.erase(e) == 0) return result(kInvalid, code);
    s.graphs.forget_event(e);
    delete e;
    return result(kOk, code);
}

Status sim_event_record(Event event, Stream stream, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kEventRecord)) return result(kInvalid, code);
    auto* e = static_cast<SimEvent*>(event);
    if (stream == nullptr || s.events.count(e) == 0) return result(kInvalid, code);
    SimStream& st = s.streams[stream];
    e->stream = stream;
    e->position = ++st.queued;
    s.graphs.record(e, stream);
    return result(kOk, code);
}

Status sim_event_query(Event event, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kEventQuery)) return result(kInvalid, code);
    auto* e = static_cast<SimEvent*>(event);
    if (s.events.count(e) == 0) return result(kInvalid, code);
    *code = kOk;
    if (e->stream == nullptr) return Status::ok;
    return s.streams[e->stream].completed >= e->position ? Status::ok : Status::not_ready;
}

// The host waits for `event`: its stream has run up to it.
Status sim_event_sync(Event event, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kEventSynchronize)) return result(kInvalid, code);
    auto* e = static_cast<SimEvent*>(event);
    if (s.events.count(e) == 0) return result(kInvalid, code);
    if (e->stream != nullptr) {
        advance(s, s.streams[e->stream], e->position, true);
        s.event_syncs++;
    }
    return result(kOk, code);
}

Status sim_stream_sync(Stream stream, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kStreamSynchronize)) return result(kInvalid, code);
    SimStream& st = s.streams[stream];
    advance(s, st, st.queued, true);
    return result(kOk, code);
}

Status sim_stream_query(Stream stream, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    SimStream& st = s.streams[stream];
    *code = kOk;
    return st.completed >= st.queued ? Status::ok : Status::not_ready;
}

Status sim_stream_device(Stream, int*, int*) { return Status::unsupported; }

Status sim_current_device(int* device, int* code) {
    *device = current_device;
    return result(kOk, code);
}

// Host memory: the fill lands when its stream runs past it.
Status sim_memset(void* ptr, int byte, size_t size, Stream stream, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kMemset)) return result(kInvalid, code);
    if (!sim::detail::accessible(ptr, size)) return result(kIllegalAddress, code);
    SimStream& st = s.streams[stream];
    st.pending_fills.push_back(Fill{++st.queued, ptr, byte, size});
    s.graphs.add_node(stream);
    advance(s, st, st.completed, false);
    return result(kOk, code);
}

Status sim_copy_to_host(void* dst, const void* src, size_t size, int, int* code) {
    if (!sim::detail::accessible(src, size)) return result(kIllegalAddress, code);
    std::memcpy(dst, src, size);
    return result(kOk, code);
}

Status sim_memory_total(int, size_t* total, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    *total = s.limit != 0 ? s.limit : kDefaultTotal;
    return result(kOk, code);
}

Status sim_device_count(int* count, int* code) {
    *count = kDevices;
    return result(kOk, code);
}

const char* sim_error_string(int code) {
    switch (code) {
        case kInvalid:
            return "invalid argument (simulated runtime)";
        case kOutOfMemory:
            return "out of memory (simulated runtime)";
        case kIllegalAddress:
            return "an address not mapped (simulated runtime)";
        default:
            return "";
    }
}

Status sim_stream_wait(Stream stream, Event event, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kStreamWaitEvent)) return result(kInvalid, code);
    auto* e = static_cast<SimEvent*>(event);
    if (stream == nullptr || s.events.count(e) == 0) return result(kInvalid, code);
    if (!s.graphs.wait(stream, e)) return result(kInvalid, code);  // another capture's event
    SimStream& st = s.streams[stream];
    st.waits++;
    uint64_t position = ++st.queued;
    if (e->stream != nullptr && s.streams[e->stream].completed < e->position) {
        st.pending_waits.push_back(Wait{position, e->stream, e->position});
    }
    return result(kOk, code);
}

Status sim_capturing(Stream stream, bool* capturing, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kStreamCapturing)) return result(kInvalid, code);
    *capturing = s.graphs.capturing(stream);
    return result(kOk, code);
}

const Runtime kSim = {"sim",          sim_malloc,         sim_free,         sim_event_create,   sim_event_destroy,
                      sim_event_record, sim_event_query,  sim_event_sync,   sim_stream_wait,    sim_capturing,
                      sim_stream_sync,  sim_stream_query, sim_stream_device, sim_current_device, sim_memset,      sim_copy_to_host,
                      sim_memory_total, sim_device_count, sim_error_string, sim::detail::virtual_memory};

}  // namespace

const Runtime* sim_runtime() { return &kSim; }

namespace sim {

namespace detail {

Status call_status(const char* call, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    return injected_failure(s, static_cast<Call>(call_index(call))) ? result(kInvalid, code) : result(kOk, code);
}

Status charge(size_t bytes, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.limit != 0 && s.in_use + bytes > s.limit) return result(kOutOfMemory, code);
    s.in_use += bytes;
    return result(kOk, code);
}

void refund(size_t bytes) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.in_use -= bytes;
}

Status invalid(int* code) { return result(kInvalid, code); }

}  // namespace detail

void complete(Stream stream) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    SimStream& st = s.streams[stream];
    advance(s, st, st.queued, false);
}

void complete_to(Stream stream, uint64_t position) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    advance(s, s.streams[stream], position, false);
}

Event record_event(Stream stream) {
    Event e = nullptr;
    int code = 0;
    if (sim_event_create(&e, 0, &code) != Status::ok || sim_event_record(e, stream, &code) != Status::ok) return nullptr;
    return e;
}

void wait_event(Stream stream, Event event) {
    int code = 0;
    sim_stream_wait(stream, event, &code);
}

uint64_t launch(Stream stream) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.graphs.add_node(stream);
    return ++s.streams[stream].queued;
}

void complete_all() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& entry : s.streams) advance(s, entry.second, entry.second.queued, true);
}

void set_capturing(Stream stream, bool capturing) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (capturing) {
        s.graphs.begin(stream);
    } else {
        s.graphs.end(stream);
    }
}

void set_memory_limit(uint64_t bytes) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.limit = bytes;
}

uint64_t stream_waits(Stream stream) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.streams.find(stream);
    return it == s.streams.end() ? 0 : it->second.waits;
}

uint64_t event_syncs() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.event_syncs;
}

void set_device(int device) { current_device = device; }

uint64_t incomplete_events() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    uint64_t n = 0;
    for (SimEvent* e : s.events) {
        if (e->stream != nullptr && s.streams[e->stream].completed < e->position) n++;
    }
    return n;
}

void reset_streams() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.streams.clear();
    s.graphs.clear();
    for (SimEvent* e : s.events) delete e;  // a test's own events (npl_sim_record_event) go too
    s.events.clear();
    s.event_syncs = 0;
    std::fill(std::begin(s.calls), std::end(s.calls), 0);
    std::fill(std::begin(s.failing), std::end(s.failing), 0);
}

bool fail_next(const char* call, uint64_t n) {
    int i = call_index(call);
    if (i < 0) return false;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.failing[i] = n;
    return true;
}

uint64_t calls(const char* call) {
    int i = call_index(call);
    if (i < 0) return UINT64_MAX;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.calls[i];
}

uint64_t completed(Stream stream) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.streams.find(stream);
    return it == s.streams.end() ? 0 : it->second.completed;
}

void lock_for_fork() {
    state().mu.lock();
    detail::lock_virtual_memory();  // the order every path takes them in
}
void unlock_after_fork() {
    detail::unlock_virtual_memory();
    state().mu.unlock();
}

}  // namespace sim

// ---- capture topology --------------------------------------------------------

namespace {

Status sim_capture_info(Stream stream, CaptureInfo* info, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kCaptureInfo)) return result(kInvalid, code);
    s.graphs.info(stream, info);
    return result(kOk, code);
}

Status sim_node_parents(GraphNode node, std::vector<GraphNode>* parents, int* code) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (injected_failure(s, kNodeParents)) return result(kInvalid, code);
    return result(s.graphs.parents(node, parents) ? kOk : kInvalid, code);
}

const CaptureTopology kSimTopology = {sim_capture_info, sim_node_parents};

}  // namespace

const CaptureTopology* sim_capture_topology() { return &kSimTopology; }

const StreamOrderedMemory* sim_stream_ordered_memory() {
    static const StreamOrderedMemory ordered = {sim_malloc_async, sim_free_async};
    return &ordered;
}

}  // namespace npl
