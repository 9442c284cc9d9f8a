// npu_lifetime.recording._holds: the torch-allocator fallback's per-call path in C++
// (torch_allocator_fallback.py keeps the policy: segment table, capture gate, reaper,
// resize_ guard, fork; _holds_py.py is the same table in Python, used where
// this extension is not built).
//
// A Table holds, per stream handle, a FIFO of entries (storage, event) in
// record order, and a hash map (storage object, stream handle) -> entry.
// Each entry owns a reference to the storage's Python object (torch keeps
// one per storage while it lives): the memory stays allocated until the
// entry is released.  Events come from a per-device pool of fired events and
// are only created when the pool is empty.
//
// Events: either the device API's Python objects, recorded and queried
// through its callables (torch_npu: its records go through its task queue),
// or, given a CudaRuntime, raw CUDA events made, recorded and queried
// through the CUDA runtime directly (cuda_runtime.h): no Python call per
// event, and a poll runs without the GIL.
//
// Locking: one mutex per table, taken with the GIL held; when it is busy the
// GIL is released while waiting (the holder may be inside a device call that
// released the GIL).  References are dropped after the mutex is released:
// a storage's deallocation may run Python code.  A Python exception raised
// by a device callable is returned as NULL; no C++ exception crosses into
// Python.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../seam.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_runtime.h"

namespace {

using npl_holds::CudaCalls;

struct Entry {
    PyObject* storage;  // owned
    PyObject* event;    // owned; nullptr for a raw event
    void* raw;          // the raw CUDA event (a table with a runtime)
    uintptr_t handle;
    Entry* prev;
    Entry* next;
};

struct Fifo {
    Entry* head = nullptr;
    Entry* tail = nullptr;
    PyObject* stream = nullptr;  // owned: the typed stream the entries were recorded on
    long device = 0;
    size_t size = 0;
};

struct Key {
    PyObject* storage;
    uintptr_t handle;
    bool operator==(const Key& o) const { return storage == o.storage && handle == o.handle; }
};

struct KeyHash {
    size_t operator()(const Key& k) const {
        uint64_t h = reinterpret_cast<uintptr_t>(k.storage) * 0x9E3779B97F4A7C15ull;
        return static_cast<size_t>(h ^ (k.handle + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2)));
    }
};

// A segment of the caching allocator: every block in [start, end) was
// allocated on `owner` (a stream handle) of `device`.
struct Segment {
    uintptr_t start;
    uintptr_t end;
    long device;
    uintptr_t owner;
};

// The state that a forked child abandons (it never touches the parent's
// storages or events): everything behind one pointer.
struct Core {
    std::mutex mu;
    std::unordered_map<Key, Entry*, KeyHash> entries;
    std::unordered_map<uintptr_t, Fifo> fifos;
    std::unordered_map<long, std::vector<PyObject*>> idle_events;  // device -> fired events, owned
    std::unordered_map<long, std::vector<void*>> idle_raw;          // device -> fired raw events
    std::vector<Segment> segments;  // sorted by start: the segment table's last rebuild
};

// Whether the cached segment table says `handle` is not the allocation
// stream of the memory at ptr (a "no" needs no fresher table: recording when
// the table is stale is only slower; any other answer asks first_use).
bool another_streams_memory(const Core* core, uintptr_t ptr, long device, uintptr_t handle) {
    const std::vector<Segment>& segs = core->segments;
    size_t lo = 0, hi = segs.size();
    while (lo < hi) {  // the first segment starting after ptr
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].start <= ptr) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return false;
    const Segment& seg = segs[lo - 1];
    return ptr < seg.end && seg.device == device && seg.owner != handle;
}

enum Count {
    RECORDED, EVENTS_CREATED, QUERIES, RELEASED, ON_ALLOCATION_STREAM, IN_CAPTURE, CAPTURING_SKIPPED, N_COUNTS
};
const char* const kCountNames[N_COUNTS] = {"recorded",   "events_created", "queries",
                                           "released",   "on_allocation_stream", "in_capture",
                                           "capturing_streams_skipped"};

// The device API as Python callables, and what the fast path checks.
enum Callable {
    RECORD_EVENT,   // (event, stream) -> None
    QUERY,          // (event) -> bool: fired
    NEW_EVENT,      // () -> event
    IS_CAPTURING,   // () -> bool: the calling thread's current stream captures
    RECORD_STREAM,  // (tensor, stream) -> None: the degraded call during capture
    HANDLE,         // (stream) -> int: the raw stream handle
    DEVICE_INDEX,   // (stream) -> int
    FIRST_USE,      // (storage, ptr, device, handle) -> bool: the allocation stream (skip)
    ON_FIRST,       // () -> None: the table was empty and holds an entry now
    N_CALLABLES
};
const char* const kCallableNames[N_CALLABLES] = {"record_event", "query",     "new_event",
                                                 "is_capturing", "record_stream", "handle",
                                                 "device_index", "first_use", "on_first"};

struct Table {
    PyObject_HEAD
    Core* core;
    PyObject* call[N_CALLABLES];
    PyObject* device_flag;   // str: the tensor attribute that is True on this device ("is_cuda")
    PyObject* stream_type;   // the one stream type the fast path takes
    PyObject* tensor_type;   // torch.Tensor
    PyObject* runtime;       // a CudaRuntime, or nullptr: events through the callables
    const CudaCalls* cu;     // the runtime's calls, or nullptr
    PyObject* underway;      // a set: the graph captures underway (the capture gate's), or nullptr
    std::atomic<unsigned long long> counts[N_COUNTS];  // written with or without the GIL
};

// CudaRuntime(path): the CUDA runtime calls of a library already loaded.
struct CudaRuntime {
    PyObject_HEAD
    void* library;
    CudaCalls calls;
};

// Runs an entry point's body: a C++ exception (bad_alloc from a container)
// becomes a Python MemoryError, never crossing into Python.
template <typename Body>
PyObject* guarded(Body body) {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    } catch (...) {
        PyErr_SetString(PyExc_RuntimeError, "npu_lifetime._holds: unexpected C++ exception");
        return nullptr;
    }
}

PyObject* s_untyped_storage;
PyObject* s_data_ptr;
PyObject* s_device_index;
PyObject* s_get_device;
PyObject* s_synchronize;

// -- locking ---------------------------------------------------------------------
class Locked {
public:
    explicit Locked(Core* core) : mu_(core->mu) {
        if (!mu_.try_lock()) {
            Py_BEGIN_ALLOW_THREADS mu_.lock();
            Py_END_ALLOW_THREADS
        }
    }
    ~Locked() { mu_.unlock(); }
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;

private:
    std::mutex& mu_;
};

// References to drop once the mutex is released.
struct Drops {
    std::vector<PyObject*> refs;
    ~Drops() {
        for (PyObject* o : refs) seam_release(o);
    }
};

void unlink(Fifo& fifo, Entry* e) {
    (e->prev ? e->prev->next : fifo.head) = e->next;
    (e->next ? e->next->prev : fifo.tail) = e->prev;
    e->prev = e->next = nullptr;
    fifo.size--;
}

void append(Fifo& fifo, Entry* e) {
    e->prev = fifo.tail;
    e->next = nullptr;
    (fifo.tail ? fifo.tail->next : fifo.head) = e;
    fifo.tail = e;
    fifo.size++;
}

// -- recording ---------------------------------------------------------------------
void bump(Table* self, Count count, unsigned long long n = 1) {
    self->counts[count].fetch_add(n, std::memory_order_relaxed);
}

// A CUDA runtime call that failed: its status is cleared (cuda_runtime.h,
// forget) and raised.  Returns -1.
int cuda_failed(Table* self, const char* call, npl_holds::cudaError err) {
    npl_holds::forget(*self->cu, err);
    PyErr_Format(PyExc_RuntimeError, "npu_lifetime: %s failed with CUDA error %d", call, err);
    return -1;
}

// The event for a new entry on `device`: a fired one from the pool, else a
// new one.  0, or -1 with an exception.
int take_event(Table* self, Core* core, long device, Entry* entry) {
    if (self->cu != nullptr) {
        std::vector<void*>& idle = core->idle_raw[device];
        if (!idle.empty()) {
            entry->raw = idle.back();
            idle.pop_back();
            return 0;
        }
        bump(self, EVENTS_CREATED);
        npl_holds::cudaError err = npl_holds::create_event(*self->cu, static_cast<int>(device), &entry->raw);
        return err == npl_holds::kSuccess ? 0 : cuda_failed(self, "cudaEventCreateWithFlags", err);
    }
    auto it = core->idle_events.find(device);
    if (it != core->idle_events.end() && !it->second.empty()) {
        entry->event = it->second.back();
        it->second.pop_back();
        return 0;
    }
    bump(self, EVENTS_CREATED);
    entry->event = PyObject_CallNoArgs(self->call[NEW_EVENT]);
    return entry->event == nullptr ? -1 : 0;
}

// A released (fired) or never-recorded entry's event goes back to the pool.
void pool_event(Core* core, long device, Entry* entry) {
    if (entry->event != nullptr) core->idle_events[device].push_back(entry->event);  // the pool takes the reference
    else core->idle_raw[device].push_back(entry->raw);
}

// Records the entry's event on its stream (of `device`).  0, or -1 with an exception.
int record_event(Table* self, Entry* entry, PyObject* stream, long device) {
    if (self->cu != nullptr) {
        const CudaCalls& cu = *self->cu;
        void* raw_stream = reinterpret_cast<void*>(entry->handle);
        // on the stream's device: the legacy default stream (handle 0) is the current device's
        npl_holds::cudaError err =
            npl_holds::on_device(cu, static_cast<int>(device), [&] { return cu.EventRecord(entry->raw, raw_stream); });
        return err == npl_holds::kSuccess ? 0 : cuda_failed(self, "cudaEventRecord", err);
    }
    PyObject* done = PyObject_CallFunctionObjArgs(self->call[RECORD_EVENT], entry->event, stream, nullptr);
    if (done == nullptr) return -1;
    seam_release(done);
    return 0;
}

// Records under the lock: a hit moves its entry to the tail, a miss adds one
// (an entry on `device`, the stream's).  Returns 1 recorded, 2 recorded as
// the table's first entry, -1 error.
int record_locked(Table* self, PyObject* storage, PyObject* stream, uintptr_t handle, long device,
                  Drops& drops) {
    Core* core = self->core;
    Key key{storage, handle};
    auto found = core->entries.find(key);
    bool first = core->entries.empty();
    Entry* entry;
    bool fresh = found == core->entries.end();
    if (!fresh) {
        entry = found->second;
        Fifo& fifo = core->fifos[handle];
        if (fifo.tail != entry) {
            unlink(fifo, entry);
            append(fifo, entry);
        }
        device = fifo.device;
    } else {
        entry = new (std::nothrow) Entry{storage, nullptr, nullptr, handle, nullptr, nullptr};
        if (entry == nullptr) {
            PyErr_NoMemory();
            return -1;
        }
        if (take_event(self, core, device, entry) < 0) {
            delete entry;
            return -1;
        }
        Py_INCREF(storage);
        auto fifo_it = core->fifos.find(handle);
        if (fifo_it == core->fifos.end()) {
            fifo_it = core->fifos.emplace(handle, Fifo{}).first;
            Py_INCREF(stream);
            fifo_it->second.stream = stream;
            fifo_it->second.device = device;
        }
        append(fifo_it->second, entry);
        core->entries.emplace(key, entry);
    }
    if (record_event(self, entry, stream, device) < 0) {
        if (fresh) {  // nothing recorded: no entry
            Fifo& fifo = core->fifos[handle];
            unlink(fifo, entry);
            core->entries.erase(key);
            drops.refs.push_back(entry->storage);
            pool_event(core, device, entry);
            delete entry;
            if (fifo.head == nullptr) {
                drops.refs.push_back(fifo.stream);
                core->fifos.erase(handle);
            }
        }
        return -1;
    }
    bump(self, RECORDED);
    return first ? 2 : 1;
}

bool holds_key(Core* core, PyObject* storage, uintptr_t handle) {
    return core->entries.find(Key{storage, handle}) != core->entries.end();
}

// Python int -> handle; -1 with an exception on error.
int as_handle(PyObject* value, uintptr_t* handle) {
    if (value == nullptr) return -1;
    unsigned long long h = PyLong_AsUnsignedLongLongMask(value);
    seam_release(value);
    if (h == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return -1;
    *handle = static_cast<uintptr_t>(h);
    return 0;
}

long as_long(PyObject* value) {  // -1 with an exception on error
    if (value == nullptr) return -1;
    long v = PyLong_AsLong(value);
    seam_release(value);
    return v;
}

PyObject* record_memory(Table* self, PyObject* tensor, PyObject* stream, PyObject* storage, PyObject* ptr_obj);

// The whole call, after the caller's checks.  Returns Py_True when done,
// Py_False when the storage has no memory (nothing recorded), NULL on error.
PyObject* record_storage(Table* self, PyObject* tensor, PyObject* stream, PyObject* storage) {
    PyObject* ptr_obj = PyObject_CallMethodNoArgs(storage, s_data_ptr);
    if (ptr_obj == nullptr) return nullptr;
    int has_memory = PyObject_IsTrue(ptr_obj);
    if (has_memory <= 0) {
        seam_release(ptr_obj);
        if (has_memory < 0) return nullptr;
        Py_RETURN_FALSE;
    }
    PyObject* recorded = guarded([&] { return record_memory(self, tensor, stream, storage, ptr_obj); });
    seam_release(ptr_obj);
    return recorded;
}

// record_storage for a storage with memory at ptr_obj (borrowed).
// Whether the call must not record (1), 0 when it may, -1 on error.  With a
// runtime: the use stream captures (the runtime's answer), or a capture
// through torch's graph classes is underway and the calling thread's
// current stream captures (IS_CAPTURING, asked only then); without one,
// IS_CAPTURING.
int in_capture(Table* self, uintptr_t handle) {
    if (self->cu != nullptr) {
        if (npl_holds::capturing(*self->cu, reinterpret_cast<void*>(handle))) return 1;
        if (self->underway == nullptr || PySet_GET_SIZE(self->underway) == 0) return 0;
    }
    PyObject* capturing = PyObject_CallNoArgs(self->call[IS_CAPTURING]);
    if (capturing == nullptr) return -1;
    int answer = PyObject_IsTrue(capturing);
    seam_release(capturing);
    return answer;
}

PyObject* record_memory(Table* self, PyObject* tensor, PyObject* stream, PyObject* storage, PyObject* ptr_obj) {
    uintptr_t handle;
    if (as_handle(PyObject_CallOneArg(self->call[HANDLE], stream), &handle) < 0) return nullptr;
    int capturing = in_capture(self, handle);
    if (capturing < 0) return nullptr;
    if (capturing) {  // nothing may be recorded or queried: the allocator's own deferral
        PyObject* done = PyObject_CallFunctionObjArgs(self->call[RECORD_STREAM], tensor, stream, nullptr);
        if (done == nullptr) return nullptr;
        seam_release(done);
        bump(self, IN_CAPTURE);
        Py_RETURN_TRUE;
    }
    Core* core = self->core;
    {  // a held entry (the common case): re-record it, one lock
        Drops drops;
        Locked lock(core);
        if (holds_key(core, storage, handle)) {
            if (record_locked(self, storage, stream, handle, 0, drops) < 0) return nullptr;
            Py_RETURN_TRUE;  // (a hit is never the table's first entry)
        }
    }
    // the storage's first call on this stream: is it the allocation stream?
    long device = as_long(PyObject_CallOneArg(self->call[DEVICE_INDEX], stream));
    if (device == -1 && PyErr_Occurred()) return nullptr;
    uintptr_t ptr = static_cast<uintptr_t>(PyLong_AsUnsignedLongLongMask(ptr_obj));
    if (ptr == static_cast<uintptr_t>(-1) && PyErr_Occurred()) return nullptr;
    bool ask_first_use;
    {
        Locked lock(core);
        ask_first_use = !another_streams_memory(core, ptr, device, handle);
    }
    if (ask_first_use) {
        PyObject* skip = PyObject_CallFunction(self->call[FIRST_USE], "OOlK", storage, ptr_obj, device,
                                               static_cast<unsigned long long>(handle));
        if (skip == nullptr) return nullptr;
        int on_allocation_stream = PyObject_IsTrue(skip);
        seam_release(skip);
        if (on_allocation_stream < 0) return nullptr;
        if (on_allocation_stream) {
            bump(self, ON_ALLOCATION_STREAM);
            Py_RETURN_TRUE;
        }
    }
    int recorded;
    {
        Drops drops;
        Locked lock(core);
        recorded = record_locked(self, storage, stream, handle, device, drops);  // (a hit if another thread won)
    }
    if (recorded < 0) return nullptr;
    if (recorded == 2) {
        PyObject* done = PyObject_CallNoArgs(self->call[ON_FIRST]);
        if (done == nullptr) return nullptr;
        seam_release(done);
    }
    Py_RETURN_TRUE;
}

PyObject* Table_record(Table* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "record(tensor, stream, storage=None)");
        return nullptr;
    }
    PyObject* tensor = args[0];
    PyObject* stream = args[1];
    if (nargs == 3 && args[2] != Py_None) return record_storage(self, tensor, stream, args[2]);
    PyObject* storage = PyObject_CallMethodNoArgs(tensor, s_untyped_storage);
    if (storage == nullptr) return nullptr;
    PyObject* result = record_storage(self, tensor, stream, storage);
    seam_release(storage);
    return result;
}

// fast(tensor, stream): the call with the checks the common case needs (a
// tensor of this device, a stream of the fast path's type on the tensor's
// device, memory to keep).  False when any fails (nothing done: the
// checked path says what was wrong).
PyObject* Table_fast(Table* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fast(tensor, stream)");
        return nullptr;
    }
    PyObject* tensor = args[0];
    PyObject* stream = args[1];
    if (!PyObject_TypeCheck(tensor, reinterpret_cast<PyTypeObject*>(self->tensor_type)) ||
        Py_TYPE(stream) != reinterpret_cast<PyTypeObject*>(self->stream_type))
        Py_RETURN_FALSE;
    PyObject* on_device = PyObject_GetAttr(tensor, self->device_flag);
    if (on_device == nullptr) return nullptr;
    seam_release(on_device);
    if (on_device != Py_True) Py_RETURN_FALSE;
    long stream_device = as_long(PyObject_GetAttr(stream, s_device_index));
    if (stream_device == -1 && PyErr_Occurred()) return nullptr;
    long tensor_device = as_long(PyObject_CallMethodNoArgs(tensor, s_get_device));
    if (tensor_device == -1 && PyErr_Occurred()) return nullptr;
    if (stream_device != tensor_device) Py_RETURN_FALSE;
    PyObject* storage = PyObject_CallMethodNoArgs(tensor, s_untyped_storage);
    if (storage == nullptr) return nullptr;
    PyObject* result = record_storage(self, tensor, stream, storage);
    seam_release(storage);
    return result;
}

// -- releasing ---------------------------------------------------------------------
// poll(stream_capturing=None): releases every FIFO's fired head entries,
// stopping at the first unfired one (a stream's events fire in order);
// skips a FIFO whose stream stream_capturing(stream) says captures (with a
// runtime: whose stream the runtime says captures, always).  The caller
// holds the capture gate.  Returns how many were released.
PyObject* poll(Table* self, PyObject* stream_capturing);
PyObject* poll_raw(Table* self);

PyObject* Table_poll(Table* self, PyObject* const* args, Py_ssize_t nargs) {
    PyObject* stream_capturing = nargs > 0 ? args[0] : Py_None;
    if (self->cu != nullptr) return poll_raw(self);
    return guarded([&] { return poll(self, stream_capturing); });
}

// Unlinks a fired head entry; its storage reference goes to `drops`, its event to the pool.
void release_head(Core* core, Fifo& fifo, uintptr_t handle, std::vector<PyObject*>& drops) {
    Entry* head = fifo.head;
    unlink(fifo, head);
    core->entries.erase(Key{head->storage, handle});
    drops.push_back(head->storage);
    pool_event(core, fifo.device, head);
    delete head;
}

Entry* nth(Entry* e, size_t n) {
    while (n-- > 0) e = e->next;
    return e;
}

// How many of the FIFO's oldest entries have fired.  Events on one stream
// fire in record order, so the fired entries are a prefix: found with
// O(log fired) queries (galloping over the 1st, 2nd, 4th, ... entry until
// one has not fired, then bisecting), where asking head after head costs one
// query per fired entry and holds the mutex that long.  fired(entry): 1
// fired, 0 not yet, -1 stop (an error): the prefix known so far is returned
// and *stopped set.  _holds_py.py's fired_prefix is the same search.
template <class Fired>
size_t fired_prefix(const Fifo& fifo, Fired fired, bool* stopped) {
    size_t known = 0, bound = fifo.size;  // entries [0, known) fired, entry `bound` (if any) has not
    Entry* first_unknown = fifo.head;
    bool galloping = true;
    size_t span = 1;
    *stopped = false;
    while (known < bound) {
        span = galloping ? std::min(span, bound - known) : (bound - known + 1) / 2;
        Entry* probe = nth(first_unknown, span - 1);
        int answer = fired(probe);
        if (answer < 0) {
            *stopped = true;
            break;
        }
        if (answer > 0) {
            known += span;
            first_unknown = probe->next;
            if (galloping) span *= 2;
        } else {
            bound = known + span - 1;
            galloping = false;
        }
    }
    return known;
}

PyObject* poll(Table* self, PyObject* stream_capturing) {
    Core* core = self->core;
    Py_ssize_t released = 0;
    Drops drops;
    Locked lock(core);
    std::vector<uintptr_t> handles;
    handles.reserve(core->fifos.size());
    for (auto& item : core->fifos) handles.push_back(item.first);
    for (uintptr_t handle : handles) {
        Fifo& fifo = core->fifos[handle];
        if (stream_capturing != Py_None) {
            PyObject* answer = PyObject_CallOneArg(stream_capturing, fifo.stream);
            int capturing = answer == nullptr ? -1 : PyObject_IsTrue(answer);
            seam_release(answer);
            if (capturing < 0) return nullptr;
            if (capturing) continue;
        }
        bool failed;
        size_t fired = fired_prefix(fifo, [&](Entry* e) {
            bump(self, QUERIES);
            PyObject* answer = PyObject_CallOneArg(self->call[QUERY], e->event);
            int done = answer == nullptr ? -1 : PyObject_IsTrue(answer);
            seam_release(answer);
#ifdef NPL_MUTANT_HOLDS  // tests/test_seam_mutants.py: a poll releases a storage whose event has not fired
            if (done == 0) done = 1;
#endif
            return done;
        }, &failed);
        if (failed) return nullptr;  // the exception is set; what fired goes at the next poll
        for (size_t i = 0; i < fired; i++) release_head(core, fifo, handle, drops.refs);
        released += static_cast<Py_ssize_t>(fired);
        if (fifo.head == nullptr) {
            drops.refs.push_back(fifo.stream);
            core->fifos.erase(handle);
        }
    }
    bump(self, RELEASED, static_cast<unsigned long long>(released));
    return PyLong_FromSsize_t(released);
}

// poll() with a runtime, under the mutex, without the GIL (no Python call):
// the first query error other than not-ready goes to `failure`.
Py_ssize_t release_fired_raw(Table* self, Core* core, std::vector<PyObject*>& drops, npl_holds::cudaError* failure) {
    const CudaCalls& cu = *self->cu;
    Py_ssize_t released = 0;
    for (auto it = core->fifos.begin(); it != core->fifos.end();) {
        Fifo& fifo = it->second;
        if (npl_holds::capturing(cu, reinterpret_cast<void*>(it->first))) {  // no query on a capturing stream
            bump(self, CAPTURING_SKIPPED);
            ++it;
            continue;
        }
        bool failed;
        size_t fired = fired_prefix(fifo, [&](Entry* e) {
            bump(self, QUERIES);
            npl_holds::cudaError err = cu.EventQuery(e->raw);
            if (err == npl_holds::kSuccess) return 1;
            npl_holds::forget(cu, err);
            if (err == npl_holds::kNotReady) return 0;
            if (*failure == npl_holds::kSuccess) *failure = err;
            return -1;
        }, &failed);
        if (!failed) {  // after an error nothing on this stream is released: it stays for the next poll
            for (size_t i = 0; i < fired; i++) release_head(core, fifo, it->first, drops);
            released += static_cast<Py_ssize_t>(fired);
        }
        if (fifo.head == nullptr) {
            drops.push_back(fifo.stream);
            it = core->fifos.erase(it);
        } else {
            ++it;
        }
    }
    return released;
}

PyObject* poll_raw(Table* self) {
    Core* core = self->core;
    Drops drops;  // dropped last, with the GIL
    npl_holds::cudaError failure = npl_holds::kSuccess;
    bool out_of_memory = false;
    Py_ssize_t released = 0;
    Py_BEGIN_ALLOW_THREADS
    try {
        std::lock_guard<std::mutex> lock(core->mu);  // no holder waits for the GIL: no Python call runs under it
        released = release_fired_raw(self, core, drops.refs, &failure);
    } catch (const std::bad_alloc&) {
        out_of_memory = true;
    }
    Py_END_ALLOW_THREADS
    bump(self, RELEASED, static_cast<unsigned long long>(released));
    if (out_of_memory) return PyErr_NoMemory();
    if (failure != npl_holds::kSuccess) {
        PyErr_Format(PyExc_RuntimeError, "npu_lifetime: cudaEventQuery failed with CUDA error %d", failure);
        return nullptr;
    }
    return PyLong_FromSsize_t(released);
}

// set_segments([(start, end, device, owner handle)]): the segment table's
// rebuild, for the "another stream's memory" answer of a first call.
PyObject* Table_set_segments(Table* self, PyObject* rows) {
    PyObject* seq = PySequence_Fast(rows, "set_segments takes a list of (start, end, device, owner)");
    if (seq == nullptr) return nullptr;
    std::vector<Segment> segments;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject* result = guarded([&]() -> PyObject* {
        segments.reserve(static_cast<size_t>(n));
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned long long start, end, owner;
            long device;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KKlK;set_segments: (start, end, device, owner)",
                                  &start, &end, &device, &owner))
                return nullptr;
            segments.push_back(Segment{static_cast<uintptr_t>(start), static_cast<uintptr_t>(end), device,
                                       static_cast<uintptr_t>(owner)});
        }
        std::sort(segments.begin(), segments.end(),
                  [](const Segment& a, const Segment& b) { return a.start < b.start; });
        Locked lock(self->core);
        self->core->segments.swap(segments);
        Py_RETURN_NONE;
    });
    seam_release(seq);
    return result;  // the old table goes with `segments`, outside the lock
}

// -- reading ---------------------------------------------------------------------
PyObject* Table_held(Table* self, PyObject*) {
    Locked lock(self->core);
    return PyLong_FromSize_t(self->core->entries.size());
}

PyObject* Table_has_entries(Table* self, PyObject*) {
    Locked lock(self->core);
    return PyBool_FromLong(!self->core->fifos.empty());
}

// Whether an entry's event has not fired: 1 pending, 0 fired, -1 error.
// With a runtime a stream that captures counts as pending (no query), and
// so does a query error (the memory stays: never early).
int pending(Table* self, uintptr_t handle, PyObject* event, void* raw) {
    if (self->cu != nullptr) {
        const CudaCalls& cu = *self->cu;
        if (npl_holds::capturing(cu, reinterpret_cast<void*>(handle))) return 1;
        npl_holds::cudaError err = cu.EventQuery(raw);
        npl_holds::forget(cu, err);
        return err != npl_holds::kSuccess;
    }
    PyObject* answer = PyObject_CallOneArg(self->call[QUERY], event);
    int fired = answer == nullptr ? -1 : PyObject_IsTrue(answer);
    seam_release(answer);
    return fired < 0 ? -1 : !fired;
}

// pending_streams(storage, may_query): the typed streams whose entry for
// storage has not fired; with may_query false (a capture may be underway:
// nothing is queried), every stream holding it.
PyObject* pending_streams(Table* self, PyObject* storage, bool may_query) {
    struct Held {
        uintptr_t handle;
        PyObject* event;
        void* raw;
    };
    std::vector<Held> held;
    Drops refs;  // the streams and events collected, dropped after the mutex
    {
        Locked lock(self->core);
        for (auto& item : self->core->fifos) {
            auto found = self->core->entries.find(Key{storage, item.first});
            if (found == self->core->entries.end()) continue;
            Entry* e = found->second;
            held.push_back(Held{item.first, e->event, e->raw});
            refs.refs.push_back(Py_NewRef(item.second.stream));
            if (e->event != nullptr) refs.refs.push_back(Py_NewRef(e->event));
        }
    }
    PyObject* out = PyList_New(0);
    if (out == nullptr) return nullptr;
    size_t stream_at = 0;  // held[i]'s stream in refs: after the previous entries' stream and event
    for (const Held& h : held) {
        PyObject* stream = refs.refs[stream_at];
        stream_at += h.event != nullptr ? 2 : 1;
        int is_pending = may_query ? pending(self, h.handle, h.event, h.raw) : 1;
        if (is_pending < 0 || (is_pending && PyList_Append(out, stream) < 0)) {
            seam_release(out);
            return nullptr;
        }
    }
    return out;
}

PyObject* Table_pending_streams(Table* self, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pending_streams(storage, may_query)");
        return nullptr;
    }
    int may_query = PyObject_IsTrue(args[1]);
    if (may_query < 0) return nullptr;
    return guarded([&] { return pending_streams(self, args[0], may_query != 0); });
}

PyObject* Table_guards(Table* self, PyObject* storage) {
    Core* core = self->core;
    Locked lock(core);
    for (auto& item : core->fifos)
        if (holds_key(core, storage, item.first)) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

// synchronize(): blocks until every held event has fired (the caller makes
// sure that no capture is underway).  Raw events are waited for without the GIL.
PyObject* synchronize(Table* self) {
    std::vector<void*> raws;
    Drops events;
    {
        Locked lock(self->core);
        for (auto& item : self->core->fifos)
            for (Entry* e = item.second.head; e != nullptr; e = e->next) {
                if (e->event == nullptr) raws.push_back(e->raw);
                else events.refs.push_back(Py_NewRef(e->event));
            }
    }
    for (void* raw : raws) {  // a pooled event is never destroyed while the table lives
        npl_holds::cudaError err;
        Py_BEGIN_ALLOW_THREADS err = self->cu->EventSynchronize(raw);
        Py_END_ALLOW_THREADS
        if (err != npl_holds::kSuccess) {
            cuda_failed(self, "cudaEventSynchronize", err);
            return nullptr;
        }
    }
    for (PyObject* event : events.refs) {
        PyObject* done = PyObject_CallMethodNoArgs(event, s_synchronize);
        if (done == nullptr) return nullptr;
        seam_release(done);
    }
    Py_RETURN_NONE;
}

PyObject* Table_synchronize(Table* self, PyObject*) {
    return guarded([&] { return synchronize(self); });
}

PyObject* Table_counts(Table* self, void*) {
    PyObject* out = PyDict_New();
    if (out == nullptr) return nullptr;
    for (int i = 0; i < N_COUNTS; i++) {
        PyObject* v = PyLong_FromUnsignedLongLong(self->counts[i].load(std::memory_order_relaxed));
        if (v == nullptr || PyDict_SetItemString(out, kCountNames[i], v) < 0) {
            seam_release(v);
            seam_release(out);
            return nullptr;
        }
        seam_release(v);
    }
    return out;
}

// -- fork --------------------------------------------------------------------------
PyObject* Table_acquire(Table* self, PyObject*) {
    Core* core = self->core;
    if (!core->mu.try_lock()) {
        Py_BEGIN_ALLOW_THREADS core->mu.lock();
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

PyObject* Table_release(Table* self, PyObject*) {
    self->core->mu.unlock();
    Py_RETURN_NONE;
}

PyObject* Table_exit(Table* self, PyObject*) { return Table_release(self, nullptr); }

// In a forked child: a new, empty core; the parent's (its locked mutex, its
// storages and events) is abandoned, never touched.
PyObject* Table_reset_after_fork(Table* self, PyObject*) {
    Core* fresh = new (std::nothrow) Core();
    if (fresh == nullptr) return PyErr_NoMemory();
    self->core = fresh;
    Py_RETURN_NONE;
}

// -- the type ----------------------------------------------------------------------
bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

// Drops everything a core holds.  Raw events are destroyed through `cu`,
// except at interpreter exit (the CUDA runtime may be shutting down: they
// go with the process).
void clear_core(Core* core, const CudaCalls* cu) {
    bool destroy = cu != nullptr && !finalizing();
    auto destroy_raw = [&](void* raw) {
        if (destroy) npl_holds::forget(*cu, cu->EventDestroy(raw));
    };
    for (auto& item : core->fifos) {
        Entry* e = item.second.head;
        while (e != nullptr) {
            Entry* next = e->next;
            seam_release(e->storage);
            if (e->event != nullptr) seam_release(e->event);
            else destroy_raw(e->raw);
            delete e;
            e = next;
        }
        seam_release(item.second.stream);
    }
    for (auto& item : core->idle_events)
        for (PyObject* event : item.second) seam_release(event);
    for (auto& item : core->idle_raw)
        for (void* raw : item.second) destroy_raw(raw);
    core->fifos.clear();
    core->entries.clear();
    core->idle_events.clear();
    core->idle_raw.clear();
}

int Table_traverse(Table* self, visitproc visit, void* arg) {
    for (PyObject* c : self->call) Py_VISIT(c);
    Py_VISIT(self->device_flag);
    Py_VISIT(self->stream_type);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->underway);
    return 0;
}

// (The runtime stays until dealloc: the core's raw events need its calls.)
int Table_clear(Table* self) {
    for (PyObject*& c : self->call) SEAM_CLEAR(c);
    SEAM_CLEAR(self->device_flag);
    SEAM_CLEAR(self->stream_type);
    SEAM_CLEAR(self->tensor_type);
    SEAM_CLEAR(self->underway);
    return 0;
}

void Table_dealloc(Table* self) {
    PyObject_GC_UnTrack(self);
    Table_clear(self);
    if (self->core != nullptr) {
        Core* core = self->core;
        self->core = nullptr;
        clear_core(core, self->cu);
        delete core;
    }
    self->cu = nullptr;
    SEAM_CLEAR(self->runtime);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyTypeObject CudaRuntimeType;  // filled in by PyInit__holds

// Table(record_event, query, new_event, is_capturing, record_stream, handle,
//       device_index, first_use, on_first, device_flag, stream_type, tensor_type,
//       runtime=None, captures_underway=None)
// runtime: a CudaRuntime (events made, recorded and queried through it; the
// record_event, query and new_event callables are then unused);
// captures_underway: the capture gate's set of captures underway (with a
// runtime, is_capturing is asked only while it is not empty).
int Table_init(Table* self, PyObject* args, PyObject* kwargs) {
    static const char* kw[] = {"record_event", "query",       "new_event",    "is_capturing", "record_stream",
                               "handle",       "device_index", "first_use",   "on_first",     "device_flag",
                               "stream_type",  "tensor_type",  "runtime",     "captures_underway", nullptr};
    PyObject* given[N_CALLABLES + 5] = {};
    given[12] = given[13] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOUOO|OO", const_cast<char**>(kw), &given[0], &given[1],
                                     &given[2], &given[3], &given[4], &given[5], &given[6], &given[7], &given[8],
                                     &given[9], &given[10], &given[11], &given[12], &given[13]))
        return -1;
    for (int i = 0; i < N_CALLABLES; i++)
        if (!PyCallable_Check(given[i])) {
            PyErr_Format(PyExc_TypeError, "Table: %s must be callable", kCallableNames[i]);
            return -1;
        }
    if (!PyType_Check(given[10]) || !PyType_Check(given[11])) {
        PyErr_SetString(PyExc_TypeError, "Table: stream_type and tensor_type must be types");
        return -1;
    }
    PyObject* runtime = given[12] == Py_None ? nullptr : given[12];
    PyObject* underway = given[13] == Py_None ? nullptr : given[13];
    if (runtime != nullptr && !PyObject_TypeCheck(runtime, &CudaRuntimeType)) {
        PyErr_SetString(PyExc_TypeError, "Table: runtime must be a CudaRuntime or None");
        return -1;
    }
    if (underway != nullptr && !PySet_Check(underway)) {
        PyErr_SetString(PyExc_TypeError, "Table: captures_underway must be a set or None");
        return -1;
    }
    if (self->core != nullptr && runtime != self->runtime) {  // the core's events are of one kind
        PyErr_SetString(PyExc_TypeError, "Table: a table's runtime cannot change");
        return -1;
    }
    Table_clear(self);
    for (int i = 0; i < N_CALLABLES; i++) self->call[i] = Py_NewRef(given[i]);
    self->device_flag = Py_NewRef(given[9]);
    self->stream_type = Py_NewRef(given[10]);
    self->tensor_type = Py_NewRef(given[11]);
    self->underway = Py_XNewRef(underway);
    if (self->core == nullptr) {
        self->core = new (std::nothrow) Core();
        if (self->core == nullptr) {
            PyErr_NoMemory();
            return -1;
        }
        self->runtime = Py_XNewRef(runtime);
        self->cu = runtime == nullptr ? nullptr : &reinterpret_cast<CudaRuntime*>(runtime)->calls;
    }
    return 0;
}

PyObject* Table_uses_runtime(Table* self, void*) { return PyBool_FromLong(self->cu != nullptr); }

PyMethodDef Table_methods[] = {
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Table_record)), METH_FASTCALL,
     "record(tensor, stream, storage=None) -> bool: records an event on stream and holds the storage "
     "(False: the storage has no memory, nothing done)"},
    {"fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Table_fast)), METH_FASTCALL,
     "fast(tensor, stream) -> bool: record() after the fast path's checks (False: a check failed, nothing done)"},
    {"poll", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Table_poll)), METH_FASTCALL,
     "poll(stream_capturing=None) -> int: releases what fired (the caller holds the capture gate)"},
    {"set_segments", reinterpret_cast<PyCFunction>(Table_set_segments), METH_O,
     "set_segments([(start, end, device, owner)]): the allocator's segments by owning stream"},
    {"held", reinterpret_cast<PyCFunction>(Table_held), METH_NOARGS, "entries held"},
    {"has_entries", reinterpret_cast<PyCFunction>(Table_has_entries), METH_NOARGS, "whether anything is held"},
    {"pending_streams", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Table_pending_streams)),
     METH_FASTCALL, "pending_streams(storage, may_query) -> [stream]: the streams whose entry has not fired"},
    {"guards", reinterpret_cast<PyCFunction>(Table_guards), METH_O, "whether a storage is held"},
    {"synchronize", reinterpret_cast<PyCFunction>(Table_synchronize), METH_NOARGS,
     "blocks until every held event has fired"},
    {"acquire", reinterpret_cast<PyCFunction>(Table_acquire), METH_NOARGS, "takes the table's lock"},
    {"release", reinterpret_cast<PyCFunction>(Table_release), METH_NOARGS, "gives the table's lock back"},
    {"__enter__", reinterpret_cast<PyCFunction>(Table_acquire), METH_NOARGS, nullptr},
    {"__exit__", reinterpret_cast<PyCFunction>(Table_exit), METH_VARARGS, nullptr},
    {"reset_after_fork", reinterpret_cast<PyCFunction>(Table_reset_after_fork), METH_NOARGS,
     "in a forked child: start empty, never touching the parent's entries"},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef Table_getset[] = {
    {"counts", reinterpret_cast<getter>(Table_counts), nullptr, "what the table did, by name", nullptr},
    {"uses_runtime", reinterpret_cast<getter>(Table_uses_runtime), nullptr,
     "whether events go through a CudaRuntime (not the device API's callables)", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject TableType;  // filled in by PyInit__holds (zero-initialised: a static)

// -- CudaRuntime ---------------------------------------------------------------------
// CudaRuntime(path): the calls of cuda_runtime.h from the library at path,
// which must already be loaded; OSError when it is not or lacks one.
int CudaRuntime_init(CudaRuntime* self, PyObject* args, PyObject* kwargs) {
    static const char* kw[] = {"path", nullptr};
    PyObject* path = nullptr;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&", const_cast<char**>(kw), PyUnicode_FSConverter, &path))
        return -1;
    if (self->library != nullptr) {
        PyErr_SetString(PyExc_TypeError, "CudaRuntime: already initialised");
        seam_release(path);
        return -1;
    }
    const char* missing = npl_holds::resolve(PyBytes_AS_STRING(path), &self->calls, &self->library);
    if (missing != nullptr) {
        if (std::string(missing) == "dlopen")
            PyErr_Format(PyExc_OSError, "npu_lifetime: %s is not loaded in this process", PyBytes_AS_STRING(path));
        else
            PyErr_Format(PyExc_OSError, "npu_lifetime: %s has no %s", PyBytes_AS_STRING(path), missing);
        seam_release(path);
        return -1;
    }
    seam_release(path);
    return 0;
}

void CudaRuntime_dealloc(CudaRuntime* self) {
    if (self->library != nullptr) dlclose(self->library);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyModuleDef holds_module = {PyModuleDef_HEAD_INIT, "_holds",
                            "The torch-allocator fallback's table of held storages (see _holds.cpp).", -1, nullptr,
                            nullptr, nullptr, nullptr, nullptr};

int ready_cuda_runtime_type() {
    CudaRuntimeType.ob_base = PyVarObject{PyObject_HEAD_INIT(nullptr) 0};
    CudaRuntimeType.tp_name = "npu_lifetime.recording._holds.CudaRuntime";
    CudaRuntimeType.tp_basicsize = sizeof(CudaRuntime);
    CudaRuntimeType.tp_flags = Py_TPFLAGS_DEFAULT;
    CudaRuntimeType.tp_doc = "CudaRuntime(path): the CUDA runtime calls of an already loaded library.";
    CudaRuntimeType.tp_new = PyType_GenericNew;
    CudaRuntimeType.tp_init = reinterpret_cast<initproc>(CudaRuntime_init);
    CudaRuntimeType.tp_dealloc = reinterpret_cast<destructor>(CudaRuntime_dealloc);
    return PyType_Ready(&CudaRuntimeType);
}

int add_type(PyObject* module, const char* name, PyTypeObject* type) {
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, reinterpret_cast<PyObject*>(type)) < 0) {
        seam_release(type);
        return -1;
    }
    return 0;
}

}  // namespace

PyMODINIT_FUNC PyInit__holds(void) {
    TableType.ob_base = PyVarObject{PyObject_HEAD_INIT(nullptr) 0};
    TableType.tp_name = "npu_lifetime.recording._holds.Table";
    TableType.tp_basicsize = sizeof(Table);
    TableType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    TableType.tp_doc = "Storages held until an event on a stream fired, by (storage, stream handle).";
    TableType.tp_new = PyType_GenericNew;
    TableType.tp_init = reinterpret_cast<initproc>(Table_init);
    TableType.tp_dealloc = reinterpret_cast<destructor>(Table_dealloc);
    TableType.tp_traverse = reinterpret_cast<traverseproc>(Table_traverse);
    TableType.tp_clear = reinterpret_cast<inquiry>(Table_clear);
    TableType.tp_methods = Table_methods;
    TableType.tp_getset = Table_getset;
    if (PyType_Ready(&TableType) < 0 || ready_cuda_runtime_type() < 0) return nullptr;
    s_untyped_storage = PyUnicode_InternFromString("untyped_storage");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_device_index = PyUnicode_InternFromString("device_index");
    s_get_device = PyUnicode_InternFromString("get_device");
    s_synchronize = PyUnicode_InternFromString("synchronize");
    if (!s_untyped_storage || !s_data_ptr || !s_device_index || !s_get_device || !s_synchronize) return nullptr;
    PyObject* module = PyModule_Create(&holds_module);
    if (module == nullptr) return nullptr;
    if (add_type(module, "Table", &TableType) < 0 || add_type(module, "CudaRuntime", &CudaRuntimeType) < 0) {
        seam_release(module);
        return nullptr;
    }
    return module;
}
