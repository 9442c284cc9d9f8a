// npu_lifetime.recording._holds: the native fallback's per-call path in C++
// (native_fallback.py keeps the policy: segment table, capture gate, reaper,
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
// Locking: one mutex per table, taken with the GIL held; when it is busy the
// GIL is released while waiting (the holder may be inside a device call that
// released the GIL).  References are dropped after the mutex is released:
// a storage's deallocation may run Python code.  A Python exception raised
// by a device callable is returned as NULL; no C++ exception crosses into
// Python.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

struct Entry {
    PyObject* storage;  // owned
    PyObject* event;    // owned
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

enum Count { RECORDED, EVENTS_CREATED, QUERIES, RELEASED, ON_ALLOCATION_STREAM, IN_CAPTURE, N_COUNTS };
const char* const kCountNames[N_COUNTS] = {"recorded", "events_created", "queries",
                                           "released", "on_allocation_stream", "in_capture"};

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
    unsigned long long counts[N_COUNTS];
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
        for (PyObject* o : refs) Py_DECREF(o);
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
// The event for a new entry on `device`: a fired one from the pool, else a new one.
PyObject* take_event(Table* self, Core* core, long device) {
    auto it = core->idle_events.find(device);
    if (it != core->idle_events.end() && !it->second.empty()) {
        PyObject* event = it->second.back();
        it->second.pop_back();
        return event;
    }
    self->counts[EVENTS_CREATED]++;
    return PyObject_CallNoArgs(self->call[NEW_EVENT]);
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
    } else {
        PyObject* event = take_event(self, core, device);
        if (event == nullptr) return -1;
        entry = new (std::nothrow) Entry{storage, event, handle, nullptr, nullptr};
        if (entry == nullptr) {
            drops.refs.push_back(event);
            PyErr_NoMemory();
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
    PyObject* done = PyObject_CallFunctionObjArgs(self->call[RECORD_EVENT], entry->event, stream, nullptr);
    if (done == nullptr) {
        if (fresh) {  // nothing recorded: no entry
            Fifo& fifo = core->fifos[handle];
            unlink(fifo, entry);
            core->entries.erase(key);
            drops.refs.push_back(entry->storage);
            drops.refs.push_back(entry->event);
            delete entry;
            if (fifo.head == nullptr) {
                drops.refs.push_back(fifo.stream);
                core->fifos.erase(handle);
            }
        }
        return -1;
    }
    Py_DECREF(done);
    self->counts[RECORDED]++;
    return first ? 2 : 1;
}

bool holds_key(Core* core, PyObject* storage, uintptr_t handle) {
    return core->entries.find(Key{storage, handle}) != core->entries.end();
}

// Python int -> handle; -1 with an exception on error.
int as_handle(PyObject* value, uintptr_t* handle) {
    if (value == nullptr) return -1;
    unsigned long long h = PyLong_AsUnsignedLongLongMask(value);
    Py_DECREF(value);
    if (h == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return -1;
    *handle = static_cast<uintptr_t>(h);
    return 0;
}

long as_long(PyObject* value) {  // -1 with an exception on error
    if (value == nullptr) return -1;
    long v = PyLong_AsLong(value);
    Py_DECREF(value);
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
        Py_DECREF(ptr_obj);
        if (has_memory < 0) return nullptr;
        Py_RETURN_FALSE;
    }
    PyObject* recorded = guarded([&] { return record_memory(self, tensor, stream, storage, ptr_obj); });
    Py_DECREF(ptr_obj);
    return recorded;
}

// record_storage for a storage with memory at ptr_obj (borrowed).
PyObject* record_memory(Table* self, PyObject* tensor, PyObject* stream, PyObject* storage, PyObject* ptr_obj) {
    PyObject* capturing = PyObject_CallNoArgs(self->call[IS_CAPTURING]);
    if (capturing == nullptr) return nullptr;
    int in_capture = PyObject_IsTrue(capturing);
    Py_DECREF(capturing);
    if (in_capture < 0) return nullptr;
    if (in_capture) {  // nothing may be recorded or queried: the allocator's own deferral
        PyObject* done = PyObject_CallFunctionObjArgs(self->call[RECORD_STREAM], tensor, stream, nullptr);
        if (done == nullptr) return nullptr;
        Py_DECREF(done);
        self->counts[IN_CAPTURE]++;
        Py_RETURN_TRUE;
    }
    uintptr_t handle;
    if (as_handle(PyObject_CallOneArg(self->call[HANDLE], stream), &handle) < 0) return nullptr;
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
        Py_DECREF(skip);
        if (on_allocation_stream < 0) return nullptr;
        if (on_allocation_stream) {
            self->counts[ON_ALLOCATION_STREAM]++;
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
        Py_DECREF(done);
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
    Py_DECREF(storage);
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
    Py_DECREF(on_device);
    if (on_device != Py_True) Py_RETURN_FALSE;
    long stream_device = as_long(PyObject_GetAttr(stream, s_device_index));
    if (stream_device == -1 && PyErr_Occurred()) return nullptr;
    long tensor_device = as_long(PyObject_CallMethodNoArgs(tensor, s_get_device));
    if (tensor_device == -1 && PyErr_Occurred()) return nullptr;
    if (stream_device != tensor_device) Py_RETURN_FALSE;
    PyObject* storage = PyObject_CallMethodNoArgs(tensor, s_untyped_storage);
    if (storage == nullptr) return nullptr;
    PyObject* result = record_storage(self, tensor, stream, storage);
    Py_DECREF(storage);
    return result;
}

// -- releasing ---------------------------------------------------------------------
// poll(stream_capturing=None): releases every FIFO's fired head entries,
// stopping at the first unfired one (a stream's events fire in order);
// skips a FIFO whose stream stream_capturing(stream) says captures.  The
// caller holds the capture gate.  Returns how many were released.
PyObject* poll(Table* self, PyObject* stream_capturing);

PyObject* Table_poll(Table* self, PyObject* const* args, Py_ssize_t nargs) {
    PyObject* stream_capturing = nargs > 0 ? args[0] : Py_None;
    return guarded([&] { return poll(self, stream_capturing); });
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
            Py_XDECREF(answer);
            if (capturing < 0) return nullptr;
            if (capturing) continue;
        }
        while (fifo.head != nullptr) {
            Entry* head = fifo.head;
            self->counts[QUERIES]++;
            PyObject* answer = PyObject_CallOneArg(self->call[QUERY], head->event);
            int fired = answer == nullptr ? -1 : PyObject_IsTrue(answer);
            Py_XDECREF(answer);
            if (fired < 0) return nullptr;
            if (!fired) break;  // later entries on this stream were recorded after it
            unlink(fifo, head);
            core->entries.erase(Key{head->storage, handle});
            drops.refs.push_back(head->storage);
            std::vector<PyObject*>& idle = core->idle_events[fifo.device];
            idle.push_back(head->event);  // the pool takes the entry's reference
            delete head;
            released++;
        }
        if (fifo.head == nullptr) {
            drops.refs.push_back(fifo.stream);
            core->fifos.erase(handle);
        }
    }
    self->counts[RELEASED] += static_cast<unsigned long long>(released);
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
    Py_DECREF(seq);
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

// entries_of(storage): [(stream, event)] for each stream holding it.
PyObject* Table_entries_of(Table* self, PyObject* storage) {
    Core* core = self->core;
    PyObject* out = PyList_New(0);
    if (out == nullptr) return nullptr;
    Locked lock(core);
    for (auto& item : core->fifos) {
        auto found = core->entries.find(Key{storage, item.first});
        if (found == core->entries.end()) continue;
        PyObject* pair = PyTuple_Pack(2, item.second.stream, found->second->event);
        if (pair == nullptr || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return nullptr;
        }
        Py_DECREF(pair);
    }
    return out;
}

PyObject* Table_guards(Table* self, PyObject* storage) {
    Core* core = self->core;
    Locked lock(core);
    for (auto& item : core->fifos)
        if (holds_key(core, storage, item.first)) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

PyObject* Table_events(Table* self, PyObject*) {
    Core* core = self->core;
    PyObject* out = PyList_New(0);
    if (out == nullptr) return nullptr;
    Locked lock(core);
    for (auto& item : core->fifos)
        for (Entry* e = item.second.head; e != nullptr; e = e->next)
            if (PyList_Append(out, e->event) < 0) {
                Py_DECREF(out);
                return nullptr;
            }
    return out;
}

PyObject* Table_counts(Table* self, void*) {
    PyObject* out = PyDict_New();
    if (out == nullptr) return nullptr;
    for (int i = 0; i < N_COUNTS; i++) {
        PyObject* v = PyLong_FromUnsignedLongLong(self->counts[i]);
        if (v == nullptr || PyDict_SetItemString(out, kCountNames[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return nullptr;
        }
        Py_DECREF(v);
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
void clear_core(Core* core) {
    for (auto& item : core->fifos) {
        Entry* e = item.second.head;
        while (e != nullptr) {
            Entry* next = e->next;
            Py_DECREF(e->storage);
            Py_DECREF(e->event);
            delete e;
            e = next;
        }
        Py_DECREF(item.second.stream);
    }
    for (auto& item : core->idle_events)
        for (PyObject* event : item.second) Py_DECREF(event);
    core->fifos.clear();
    core->entries.clear();
    core->idle_events.clear();
}

int Table_traverse(Table* self, visitproc visit, void* arg) {
    for (PyObject* c : self->call) Py_VISIT(c);
    Py_VISIT(self->device_flag);
    Py_VISIT(self->stream_type);
    Py_VISIT(self->tensor_type);
    return 0;
}

int Table_clear(Table* self) {
    for (PyObject*& c : self->call) Py_CLEAR(c);
    Py_CLEAR(self->device_flag);
    Py_CLEAR(self->stream_type);
    Py_CLEAR(self->tensor_type);
    return 0;
}

void Table_dealloc(Table* self) {
    PyObject_GC_UnTrack(self);
    Table_clear(self);
    if (self->core != nullptr) {
        Core* core = self->core;
        self->core = nullptr;
        clear_core(core);
        delete core;
    }
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// Table(record_event, query, new_event, is_capturing, record_stream, handle,
//       device_index, first_use, on_first, device_flag, stream_type, tensor_type)
int Table_init(Table* self, PyObject* args, PyObject* kwargs) {
    static const char* kw[] = {"record_event", "query",  "new_event",   "is_capturing", "record_stream",
                               "handle",       "device_index", "first_use", "on_first",    "device_flag",
                               "stream_type",  "tensor_type",  nullptr};
    PyObject* given[N_CALLABLES + 3] = {};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOUOO", const_cast<char**>(kw), &given[0], &given[1],
                                     &given[2], &given[3], &given[4], &given[5], &given[6], &given[7], &given[8],
                                     &given[9], &given[10], &given[11]))
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
    Table_clear(self);
    for (int i = 0; i < N_CALLABLES; i++) self->call[i] = Py_NewRef(given[i]);
    self->device_flag = Py_NewRef(given[9]);
    self->stream_type = Py_NewRef(given[10]);
    self->tensor_type = Py_NewRef(given[11]);
    if (self->core == nullptr) {
        self->core = new (std::nothrow) Core();
        if (self->core == nullptr) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

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
    {"entries_of", reinterpret_cast<PyCFunction>(Table_entries_of), METH_O, "[(stream, event)] holding a storage"},
    {"guards", reinterpret_cast<PyCFunction>(Table_guards), METH_O, "whether a storage is held"},
    {"events", reinterpret_cast<PyCFunction>(Table_events), METH_NOARGS, "every held entry's event"},
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
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject TableType;  // filled in by PyInit__holds (zero-initialised: a static)

PyModuleDef holds_module = {PyModuleDef_HEAD_INIT, "_holds",
                            "The native fallback's table of held storages (see _holds.cpp).", -1, nullptr,
                            nullptr, nullptr, nullptr, nullptr};

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
    if (PyType_Ready(&TableType) < 0) return nullptr;
    s_untyped_storage = PyUnicode_InternFromString("untyped_storage");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_device_index = PyUnicode_InternFromString("device_index");
    s_get_device = PyUnicode_InternFromString("get_device");
    if (!s_untyped_storage || !s_data_ptr || !s_device_index || !s_get_device) return nullptr;
    PyObject* module = PyModule_Create(&holds_module);
    if (module == nullptr) return nullptr;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(module, "Table", reinterpret_cast<PyObject*>(&TableType)) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(module);
        return nullptr;
    }
    return module;
}
