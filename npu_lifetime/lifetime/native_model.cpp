// npu_lifetime.lifetime._native_model: the lifetime model (model.py) in C++.
//
// Same public API, same findings (the dataclasses of findings.py, built by
// calling them), in the same order, with the same ReuseOutcome objects
// shared and mutated as model.py does.  model.py stays the reference: the
// differential tests and `npu-lifetime fuzz --model native` compare them.
//
// Streams, hosts, events and storages are arbitrary hashable Python
// objects.  Each stream key is interned into a small id on first sight (a
// Python dict maps it to its id), and vector clocks are dense arrays
// indexed by stream id.  Accesses are kept as small C++ records and turned
// into Python Access tuples only when a finding (or outcome) needs one.
//
// Python-side errors are carried through the C++ code as a PyErr exception
// and turned back into NULL returns at every entry point; no C++ exception
// crosses into Python.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace {

struct PyErr {};  // a Python exception is set

inline PyObject* chk(PyObject* o) {
    if (o == nullptr) throw PyErr();
    return o;
}
inline void chk_int(int r) {
    if (r < 0) throw PyErr();
}

// An owned reference.
class Ref {
public:
    Ref() = default;
    explicit Ref(PyObject* p) : p_(p) {}
    Ref(const Ref& o) : p_(o.p_) { Py_XINCREF(p_); }
    Ref(Ref&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    Ref& operator=(const Ref& o) {
        if (this != &o) {
            PyObject* old = p_;
            p_ = o.p_;
            Py_XINCREF(p_);
            Py_XDECREF(old);
        }
        return *this;
    }
    Ref& operator=(Ref&& o) noexcept {
        if (this != &o) {
            PyObject* old = p_;
            p_ = o.p_;
            o.p_ = nullptr;
            Py_XDECREF(old);
        }
        return *this;
    }
    ~Ref() { Py_XDECREF(p_); }
    static Ref borrow(PyObject* o) {
        Py_XINCREF(o);
        return Ref(o);
    }
    PyObject* get() const { return p_; }
    PyObject* release() {
        PyObject* p = p_;
        p_ = nullptr;
        return p;
    }
    explicit operator bool() const { return p_ != nullptr; }

private:
    PyObject* p_ = nullptr;
};

inline Ref own(PyObject* o) { return Ref(chk(o)); }

// -- module-level Python objects (set at import) -------------------------------
PyObject* g_model_module = nullptr;  // npu_lifetime.lifetime.model
PyObject* g_ModelInputError = nullptr;
PyObject* g_Access = nullptr;
PyObject* g_DataRace = nullptr;
PyObject* g_UncoveredFree = nullptr;
PyObject* g_ReuseOutcome = nullptr;
PyObject* g_ReuseRace = nullptr;
PyObject* g_InvalidFree = nullptr;
PyObject* g_UseAfterFree = nullptr;
PyObject* g_UnrecordedEventWait = nullptr;
PyObject* g_OrderedDict = nullptr;
long long g_freed_memory_default = 1 << 16;

PyObject* s_allocation = nullptr;     // "<allocation>"
PyObject* s_preexisting = nullptr;    // "<allocated before tracking>"
PyObject* s_read = nullptr;
PyObject* s_write = nullptr;
PyObject* s_record_stream = nullptr;
PyObject* s_erase_stream = nullptr;
PyObject* s_record_use = nullptr;
PyObject* s_unknown = nullptr;
PyObject* s_double = nullptr;
PyObject* s_outcome = nullptr;
PyObject* s_reuses = nullptr;
PyObject* s_safe_reuse = nullptr;
PyObject* s_race = nullptr;
PyObject* s_host_synced = nullptr;
PyObject* s_sync_site = nullptr;
PyObject* s_held_by_allocator = nullptr;
PyObject* s_forgotten = nullptr;
PyObject* s_OUTSTANDING_CAP = nullptr;
PyObject* s_pop = nullptr;
PyObject* s_popitem = nullptr;
PyObject* s_extend = nullptr;
PyObject* s_hashx = nullptr;  // "#x"

Ref call(PyObject* callable, std::initializer_list<PyObject*> args) {
    PyObject* argv[12];
    size_t n = 0;
    for (PyObject* a : args) argv[n++] = a;
    return own(PyObject_Vectorcall(callable, argv, n, nullptr));
}

[[noreturn]] void raise_input(PyObject* message) {
    PyErr_SetObject(g_ModelInputError, message);
    Py_DECREF(message);
    throw PyErr();
}

bool truthy(PyObject* o) {
    int r = PyObject_IsTrue(o);
    if (r < 0) throw PyErr();
    return r != 0;
}

bool py_eq(PyObject* a, PyObject* b) {
    Ref r = own(PyObject_RichCompare(a, b, Py_EQ));
    return truthy(r.get());
}

bool py_ne(PyObject* a, PyObject* b) {
    Ref r = own(PyObject_RichCompare(a, b, Py_NE));
    return truthy(r.get());
}

// dict.get(key) as a borrowed reference, or nullptr; raises on unhashable keys
PyObject* dget(PyObject* dict, PyObject* key) {
    PyObject* v = PyDict_GetItemWithError(dict, key);
    if (v == nullptr && PyErr_Occurred()) throw PyErr();
    return v;
}

long long as_ll(PyObject* o) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) throw PyErr();
    return v;
}

// -- vector clocks ---------------------------------------------------------------
// A stream's clock: dense, indexed by stream id, 0 where absent.
using Clock = std::vector<long long>;

inline long long cget(const Clock& c, int i) { return (size_t)i < c.size() ? c[i] : 0; }
inline void cset(Clock& c, int i, long long v) {
    if ((size_t)i >= c.size()) c.resize(i + 1, 0);
    c[i] = v;
}
// into = max(into, other); whether anything grew
bool cjoin(Clock& into, const Clock& other) {
    bool changed = false;
    if (into.size() < other.size()) into.resize(other.size(), 0);
    for (size_t i = 0; i < other.size(); ++i) {
        if (into[i] < other[i]) {
            into[i] = other[i];
            changed = true;
        }
    }
    return changed;
}

// A host's clock keeps which entries exist (host_clock() returns them), so
// absent entries are ABSENT and read as 0.
constexpr long long ABSENT = LLONG_MIN;
inline long long hget(const Clock& c, int i) {
    if ((size_t)i >= c.size()) return 0;
    return c[i] == ABSENT ? 0 : c[i];
}
bool hjoin(Clock& into, const Clock& other, bool other_is_host) {
    bool changed = false;
    if (into.size() < other.size()) into.resize(other.size(), ABSENT);
    for (size_t i = 0; i < other.size(); ++i) {
        long long v = other[i];
        if (other_is_host ? v == ABSENT : v == 0) continue;  // stream clocks: 0 entries change nothing here
        long long cur = into[i] == ABSENT ? 0 : into[i];
        if (cur < v) {
            into[i] = v;
            changed = true;
        }
    }
    return changed;
}
// a stream clock joins a host clock
bool sjoin_host(Clock& vc, const Clock& host) {
    bool changed = false;
    for (size_t i = 0; i < host.size(); ++i) {
        long long v = host[i];
        if (v == ABSENT) continue;
        if (cget(vc, (int)i) < v) {
            cset(vc, (int)i, v);
            changed = true;
        }
    }
    return changed;
}

// -- accesses -------------------------------------------------------------------
struct Acc {
    long refs = 1;
    int stream;
    long long clock;
    bool is_write;
    PyObject* stream_key;  // borrowed: interned stream keys live as long as the model
    PyObject* op;
    PyObject* site;
    PyObject* args;
    PyObject* obj = nullptr;  // the Access tuple, once made

    ~Acc() {
        Py_XDECREF(op);
        Py_XDECREF(site);
        Py_XDECREF(args);
        Py_XDECREF(obj);
    }
};

class AccRef {
public:
    AccRef() = default;
    explicit AccRef(Acc* a) : a_(a) {}  // takes the reference
    AccRef(const AccRef& o) : a_(o.a_) {
        if (a_) ++a_->refs;
    }
    AccRef(AccRef&& o) noexcept : a_(o.a_) { o.a_ = nullptr; }
    AccRef& operator=(const AccRef& o) {
        if (this != &o) {
            Acc* old = a_;
            a_ = o.a_;
            if (a_) ++a_->refs;
            drop(old);
        }
        return *this;
    }
    AccRef& operator=(AccRef&& o) noexcept {
        if (this != &o) {
            Acc* old = a_;
            a_ = o.a_;
            o.a_ = nullptr;
            drop(old);
        }
        return *this;
    }
    ~AccRef() { drop(a_); }
    Acc* operator->() const { return a_; }
    Acc* get() const { return a_; }
    explicit operator bool() const { return a_ != nullptr; }
    void reset() {
        drop(a_);
        a_ = nullptr;
    }

private:
    static void drop(Acc* a) {
        if (a && --a->refs == 0) delete a;
    }
    Acc* a_ = nullptr;
};

AccRef make_acc(int stream, PyObject* key, long long clock, bool is_write, PyObject* op, PyObject* site,
                PyObject* args) {
    Acc* a = new Acc;
    a->stream = stream;
    a->stream_key = key;
    a->clock = clock;
    a->is_write = is_write;
    Py_INCREF(op);
    a->op = op;
    Py_INCREF(site);
    a->site = site;
    Py_INCREF(args);
    a->args = args;
    return AccRef(a);
}

// The Access tuple of ``a`` (new reference), made once.
PyObject* acc_obj(Acc* a) {
    if (a->obj == nullptr) {
        PyObject* clock = PyLong_FromLongLong(a->clock);
        if (clock == nullptr) throw PyErr();
        PyObject* fields = PyTuple_New(6);
        if (fields == nullptr) {
            Py_DECREF(clock);
            throw PyErr();
        }
        Py_INCREF(a->stream_key);
        PyTuple_SET_ITEM(fields, 0, a->stream_key);
        PyTuple_SET_ITEM(fields, 1, clock);
        PyObject* w = a->is_write ? Py_True : Py_False;
        Py_INCREF(w);
        PyTuple_SET_ITEM(fields, 2, w);
        Py_INCREF(a->op);
        PyTuple_SET_ITEM(fields, 3, a->op);
        Py_INCREF(a->site);
        PyTuple_SET_ITEM(fields, 4, a->site);
        Py_INCREF(a->args);
        PyTuple_SET_ITEM(fields, 5, a->args);
        PyObject* targs = PyTuple_Pack(1, fields);
        Py_DECREF(fields);
        if (targs == nullptr) throw PyErr();
        // what namedtuple's __new__ does: tuple.__new__(Access, fields)
        PyObject* obj = PyTuple_Type.tp_new((PyTypeObject*)g_Access, targs, nullptr);
        Py_DECREF(targs);
        if (obj == nullptr) throw PyErr();
        a->obj = obj;
    }
    Py_INCREF(a->obj);
    return a->obj;
}
inline Ref acc_ref(const AccRef& a) { return Ref(acc_obj(a.get())); }

// An ordered stream -> access map (a small Python dict's behaviour).
using AccMap = std::vector<std::pair<int, AccRef>>;

AccRef* amap_find(AccMap& m, int stream) {
    for (auto& e : m)
        if (e.first == stream) return &e.second;
    return nullptr;
}
void amap_set(AccMap& m, int stream, const AccRef& a) {
    AccRef* slot = amap_find(m, stream);
    if (slot)
        *slot = a;
    else
        m.emplace_back(stream, a);
}

// -- outstanding uses ----------------------------------------------------------------
struct Outstanding {
    Ref storage;
    long long address;
    long long end;
    AccRef last_use;
    AccRef last_write;  // may be empty
    Ref free;           // the UncoveredFree
    Ref outcome;        // its ReuseOutcome
    bool retired = false;
    int stream() const { return last_use->stream; }
};
using OutPtr = std::shared_ptr<Outstanding>;

long long outstanding_cap() {
    Ref v = own(PyObject_GetAttr(g_model_module, s_OUTSTANDING_CAP));
    return as_ll(v.get());
}

struct OutstandingIndex {
    std::vector<long long> starts;
    std::vector<OutPtr> records;
    std::deque<OutPtr> order;
    long long max_size = 0;

    // returns the record forgotten to stay under the cap
    OutPtr add(const OutPtr& rec) {
        long long cap = outstanding_cap();
        size_t i = std::upper_bound(starts.begin(), starts.end(), rec->address) - starts.begin();
        starts.insert(starts.begin() + i, rec->address);
        records.insert(records.begin() + i, rec);
        order.push_back(rec);
        max_size = std::max(max_size, rec->end - rec->address);
        if ((long long)records.size() > cap) {
            OutPtr oldest = order.front();
            order.pop_front();
            oldest->retired = true;
            remove(oldest);
            return oldest;
        }
        return OutPtr();
    }

    void remove(const OutPtr& rec) {
        size_t i = std::lower_bound(starts.begin(), starts.end(), rec->address) - starts.begin();
        while (records[i] != rec) ++i;
        starts.erase(starts.begin() + i);
        records.erase(records.begin() + i);
    }

    std::vector<OutPtr> overlapping(long long start, long long end) const {
        std::vector<OutPtr> found;
        long long i = (long long)(std::lower_bound(starts.begin(), starts.end(), end) - starts.begin()) - 1;
        while (i >= 0 && starts[i] + max_size > start) {
            const OutPtr& rec = records[i];
            if (rec->end > start && !rec->retired) found.push_back(rec);
            --i;
        }
        std::reverse(found.begin(), found.end());
        return found;
    }

    template <class F>
    std::vector<OutPtr> retire(F done) {
        std::vector<OutPtr> retired;
        for (const OutPtr& rec : records)
            if (done(*rec)) retired.push_back(rec);
        for (const OutPtr& rec : retired) rec->retired = true;
        if (!retired.empty()) prune();
        return retired;
    }

    void prune() {
        std::vector<long long> s2;
        std::vector<OutPtr> r2;
        for (size_t i = 0; i < records.size(); ++i) {
            if (!records[i]->retired) {
                s2.push_back(starts[i]);
                r2.push_back(records[i]);
            }
        }
        starts.swap(s2);
        records.swap(r2);
        std::deque<OutPtr> o2;
        for (const OutPtr& r : order)
            if (!r->retired) o2.push_back(r);
        order.swap(o2);
        max_size = 0;
        for (const OutPtr& r : records) max_size = std::max(max_size, r->end - r->address);
    }
};

// -- streams, hosts, events, storages ---------------------------------------------
struct StreamSlot {
    Ref key;
    bool created = false;
    Ref device;
    Clock vc;
    long long host_epoch = -1;
};

struct HostSlot {
    Clock clock;  // with ABSENT entries
    long long epoch = 0;
    bool ended = false;
    bool used = false;
};

struct EventSlot {
    bool recorded = false;
    Clock clock;
    bool used = false;
};

struct Storage {
    Ref address;  // None or an int
    bool has_address = false;
    long long addr = 0;
    long long size = 0;
    int alloc_stream = 0;
    Ref alloc_stream_obj;
    Ref alloc_site;
    AccRef last_write;
    AccMap concurrent_writes;  // empty: None
    AccMap reads;
    AccMap last_use;
    AccMap last_write_on;
    std::vector<int> recorded;
    Clock use_cover;
    bool has_previous = false;
    std::vector<OutPtr> previous;
    bool has_raced = false;
    std::vector<OutPtr> raced;
};

}  // namespace

// -- the type -------------------------------------------------------------------------
struct ModelObject {
    PyObject_HEAD
    PyObject* findings;
    PyObject* retain;
    PyObject* on_finding;
    PyObject* dict;      // __dict__
    PyObject* weakrefs;
    // Python containers
    PyObject* stream_ids;  // stream key -> id
    PyObject* events;      // event -> slot
    PyObject* hosts;       // host -> slot (insertion order: hosts())
    PyObject* live;        // storage -> slot (insertion order: uncovered_live())
    PyObject* by_address;  // address -> storage
    PyObject* freed;       // OrderedDict storage -> free site
    PyObject* host_key;
    long long remember_frees;
    long long next_epoch;
    // C++ state
    std::vector<std::unique_ptr<StreamSlot>>* streams;
    std::vector<int>* created_order;  // created stream ids, in creation order
    std::vector<std::unique_ptr<HostSlot>>* host_slots;
    std::vector<std::unique_ptr<EventSlot>>* event_slots;
    std::vector<size_t>* free_event_slots;
    // shared: an operation keeps its storage alive through the Python calls it makes
    std::vector<std::shared_ptr<Storage>>* storages;
    std::vector<Py_ssize_t>* free_storage_slots;
    OutstandingIndex* outstanding;
    int host;  // the current host's slot
    // a one-entry cache of the last stream key looked up (identity)
    PyObject* last_stream_key;
    int last_stream_id;
};

namespace {

using M = ModelObject;

HostSlot& cur_host(M* m) { return *(*m->host_slots)[m->host]; }

long long next_epoch(M* m) { return m->next_epoch++; }

// -- ids -------------------------------------------------------------------------
// The id of a stream key (interning it if new).
int intern_stream(M* m, PyObject* key) {
    PyObject* v = dget(m->stream_ids, key);
    if (v) return (int)PyLong_AsLong(v);
    int id = (int)m->streams->size();
    auto slot = std::make_unique<StreamSlot>();
    slot->key = Ref::borrow(key);
    Ref idobj = own(PyLong_FromLong(id));
    chk_int(PyDict_SetItem(m->stream_ids, key, idobj.get()));
    m->streams->push_back(std::move(slot));
    return id;
}

// The id of a created stream, or -1.
int find_stream(M* m, PyObject* key) {
    if (key == m->last_stream_key) return m->last_stream_id;
    PyObject* v = dget(m->stream_ids, key);
    if (v == nullptr) return -1;
    int id = (int)PyLong_AsLong(v);
    if (!(*m->streams)[id]->created) return -1;
    m->last_stream_key = (*m->streams)[id]->key.get();  // interned: lives as long as the model
    m->last_stream_id = id;
    return id;
}

int stream_or_raise(M* m, PyObject* key) {
    int id = find_stream(m, key);
    if (id < 0) raise_input(chk(PyUnicode_FromFormat("unknown stream %R; call create_stream first", key)));
    return id;
}

StreamSlot& slot(M* m, int id) { return *(*m->streams)[id]; }

// _now: the stream's clock as of an operation the host queues now
Clock& now(M* m, int id) {
    StreamSlot& st = slot(m, id);
    HostSlot& h = cur_host(m);
    if (st.host_epoch != h.epoch) {
        sjoin_host(st.vc, h.clock);
        st.host_epoch = h.epoch;
    }
    return st.vc;
}

EventSlot* find_event(M* m, PyObject* event) {
    PyObject* v = dget(m->events, event);
    if (v == nullptr) return nullptr;
    return (*m->event_slots)[PyLong_AsLong(v)].get();
}

EventSlot& event_or_raise(M* m, PyObject* event) {
    EventSlot* e = find_event(m, event);
    if (e == nullptr) raise_input(chk(PyUnicode_FromFormat("unknown event %R; call create_event first", event)));
    return *e;
}

using StoragePtr = std::shared_ptr<Storage>;

StoragePtr find_live(M* m, PyObject* storage) {
    PyObject* v = dget(m->live, storage);
    if (v == nullptr) return StoragePtr();
    return (*m->storages)[PyLong_AsSsize_t(v)];
}

// -- delivering findings ----------------------------------------------------------
[[noreturn]] void no_attribute(const char* name) {
    PyErr_Format(PyExc_AttributeError, "'LifetimeModel' object has no attribute '%s'", name);
    throw PyErr();
}

Ref deliver(M* m, Ref found) {
    if (PyList_GET_SIZE(found.get())) {
        if (!m->retain) no_attribute("retain");
        if (!m->findings && truthy(m->retain)) no_attribute("findings");
        if (!m->on_finding) no_attribute("on_finding");
        if (truthy(m->retain)) {
            Ref findings = Ref::borrow(m->findings);
            if (PyList_CheckExact(findings.get())) {
                Py_ssize_t n = PyList_GET_SIZE(findings.get());
                chk_int(PyList_SetSlice(findings.get(), n, n, found.get()));
            } else {
                own(PyObject_CallMethodOneArg(findings.get(), s_extend, found.get()));
            }
        }
        if (m->on_finding != Py_None) {
            Ref cb = Ref::borrow(m->on_finding);
            Ref items = own(PySequence_List(found.get()));
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items.get()); ++i)
                own(PyObject_CallOneArg(cb.get(), PyList_GET_ITEM(items.get(), i)));
        }
    }
    return found;
}

void append(PyObject* list, const Ref& item) { chk_int(PyList_Append(list, item.get())); }

// -- host synchronisation ------------------------------------------------------------
bool hosts_past(M* m, int stream, long long clock) {
    for (auto& h : *m->host_slots) {
        if (!h || !h->used || h->ended) continue;
        if (hget(h->clock, stream) < clock) return false;
    }
    return true;
}

void retire_completed(M* m, PyObject* site) {
    std::vector<OutPtr> retired =
        m->outstanding->retire([m](const Outstanding& r) { return hosts_past(m, r.stream(), r.last_use->clock); });
    Ref where = Ref::borrow(site);
    if (!retired.empty() && PyCallable_Check(where.get())) where = own(PyObject_CallNoArgs(where.get()));
    for (const OutPtr& rec : retired) {
        chk_int(PyObject_SetAttr(rec->outcome.get(), s_host_synced, Py_True));
        chk_int(PyObject_SetAttr(rec->outcome.get(), s_sync_site, where.get()));
    }
}

void after_host_join(M* m, bool changed, PyObject* site) {
    if (changed) {
        cur_host(m).epoch = next_epoch(m);
        if (!m->outstanding->records.empty()) retire_completed(m, site);
    }
}

// -- findings -----------------------------------------------------------------------
Ref data_race(PyObject* storage, Storage& s, const AccRef& acc, const AccRef& prior) {
    Ref a = acc_ref(acc), p = acc_ref(prior);
    return call(g_DataRace, {storage, s.address.get(), a.get(), p.get(), s.alloc_site.get()});
}

// _races: a race for each of priors that acc (at vc) is not ordered after; returns those
AccMap races(PyObject* storage, Storage& s, const AccRef& acc, const Clock& vc, const AccMap& priors,
             PyObject* found) {
    AccMap racing;
    for (const auto& e : priors) {
        const AccRef& prior = e.second;
        if (prior->stream != acc->stream && cget(vc, prior->stream) < prior->clock) {
            append(found, data_race(storage, s, acc, prior));
            amap_set(racing, prior->stream, prior);
        }
    }
    return racing;
}

Clock release_clock(M* m, Storage& s) {
    Clock cover;
    const Clock& h = cur_host(m).clock;
    cover.resize(h.size(), 0);
    for (size_t i = 0; i < h.size(); ++i) cover[i] = h[i] == ABSENT ? 0 : h[i];
    cjoin(cover, slot(m, s.alloc_stream).vc);
    if (!s.use_cover.empty()) cjoin(cover, s.use_cover);
    for (int r : s.recorded) cjoin(cover, slot(m, r).vc);
    return cover;
}

// _uncovered: appends the UncoveredFree findings to out
void uncovered(M* m, PyObject* storage, Storage& s, PyObject* site, bool live, PyObject* out) {
    const AccMap uses = s.last_use;  // a copy: the findings' constructors run Python code
    if (uses.empty()) return;
    bool all_alloc = true;
    for (const auto& e : uses)
        if (e.first != s.alloc_stream) all_alloc = false;
    if (all_alloc) return;
    Clock cover = release_clock(m, s);
    Ref size;
    for (const auto& e : uses) {
        if (cget(cover, e.first) < e.second->clock) {
            if (!size) size = own(PyLong_FromLongLong(s.size));
            Ref use = acc_ref(e.second);
            Ref outcome = live ? Ref::borrow(Py_None) : call(g_ReuseOutcome, {});
            append(out, call(g_UncoveredFree, {storage, s.address.get(), size.get(), s.alloc_stream_obj.get(),
                                               slot(m, e.first).key.get(), use.get(), s.alloc_site.get(), site,
                                               live ? Py_True : Py_False, outcome.get()}));
        }
    }
}

void leave_outstanding(M* m, PyObject* storage, Storage& s, PyObject* free, int stream, const AccRef& last_use) {
    if (!s.has_address || !s.size) return;
    AccRef write;
    if (AccRef* w = amap_find(s.last_write_on, stream)) write = *w;
    if (write && hosts_past(m, stream, write->clock)) write.reset();
    if (write) {
        Clock cover = release_clock(m, s);
        if (cget(cover, stream) >= write->clock) write.reset();
    }
    auto rec = std::make_shared<Outstanding>();
    rec->storage = Ref::borrow(storage);
    rec->address = s.addr;
    rec->end = s.addr + s.size;
    rec->last_use = last_use;
    rec->last_write = write;
    rec->free = Ref::borrow(free);
    rec->outcome = own(PyObject_GetAttr(free, s_outcome));
    OutPtr forgotten = m->outstanding->add(rec);
    if (forgotten) chk_int(PyObject_SetAttr(forgotten->outcome.get(), s_forgotten, Py_True));
}

void link_previous_owners(M* m, Storage& s) {
    if (m->outstanding->records.empty()) return;
    std::vector<OutPtr> previous = m->outstanding->overlapping(s.addr, s.addr + s.size);
    if (!previous.empty()) {
        s.previous = previous;
        s.has_previous = true;
        for (const OutPtr& rec : previous) {
            Ref n = own(PyObject_GetAttr(rec->outcome.get(), s_reuses));
            Ref one = own(PyLong_FromLong(1));
            Ref n2 = own(PyNumber_Add(n.get(), one.get()));
            chk_int(PyObject_SetAttr(rec->outcome.get(), s_reuses, n2.get()));
        }
    }
}

void check_reuse(PyObject* storage, Storage& s, const AccRef& acc, const Clock& vc, PyObject* found) {
    bool pending = false;
    std::vector<OutPtr> previous = s.previous;  // a copy: Python code below may not touch it, but be safe
    for (const OutPtr& rec : previous) {
        if (rec->retired) continue;
        pending = true;
        const AccRef& target = acc->is_write ? rec->last_use : rec->last_write;
        if (!target) continue;
        PyObject* outcome = rec->outcome.get();
        if (cget(vc, target->stream) >= target->clock) {
            Ref safe = own(PyObject_GetAttr(outcome, s_safe_reuse));
            if (safe.get() == Py_None) {
                Ref a = acc_ref(acc);
                chk_int(PyObject_SetAttr(outcome, s_safe_reuse, a.get()));
            }
            continue;
        }
        if (!s.has_raced) {
            s.has_raced = true;
        } else if (std::find(s.raced.begin(), s.raced.end(), rec) != s.raced.end()) {
            continue;
        }
        s.raced.push_back(rec);
        Ref a = acc_ref(acc), t = acc_ref(target);
        Ref race = call(g_ReuseRace, {storage, s.address.get(), a.get(), s.alloc_site.get(), rec->storage.get(),
                                      t.get(), rec->free.get()});
        Ref old = own(PyObject_GetAttr(outcome, s_race));
        if (old.get() == Py_None) chk_int(PyObject_SetAttr(outcome, s_race, race.get()));
        append(found, race);
    }
    if (!pending) {
        s.has_previous = false;
        s.previous.clear();
    }
}

StoragePtr live_or_report(M* m, PyObject* storage, PyObject* stream, PyObject* op, PyObject* site,
                          PyObject* found) {
    StoragePtr s = find_live(m, storage);
    if (s == nullptr) {
        PyObject* first = dget(m->freed, storage);
        if (first == nullptr) raise_input(chk(PyUnicode_FromFormat("unknown storage %R", storage)));
        Ref first_ref = Ref::borrow(first);
        append(found, call(g_UseAfterFree, {storage, stream, op, site, first_ref.get()}));
    }
    return s;
}

// -- argument parsing -------------------------------------------------------------
// Fills out[0..n) from positional and keyword arguments; nullptr where not given.
bool parse(const char* fname, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, const char* const* names,
           int n, int required, PyObject** out) {
    for (int i = 0; i < n; ++i) out[i] = nullptr;
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)", fname, n, nargs);
        return false;
    }
    for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; ++k) {
            PyObject* name = PyTuple_GET_ITEM(kwnames, k);
            int found = -1;
            for (int i = 0; i < n; ++i) {
                if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) {
                    found = i;
                    break;
                }
            }
            if (found < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, name);
                return false;
            }
            if (out[found]) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[found]);
                return false;
            }
            out[found] = args[nargs + k];
        }
    }
    for (int i = 0; i < required; ++i) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return false;
        }
    }
    return true;
}

inline PyObject* orv(PyObject* o, PyObject* dflt) { return o ? o : dflt; }

#define GUARD_BEGIN try {
#define GUARD_END                                                         \
    }                                                                     \
    catch (PyErr&) {                                                      \
        return nullptr;                                                   \
    }                                                                     \
    catch (std::bad_alloc&) {                                             \
        PyErr_NoMemory();                                                 \
        return nullptr;                                                   \
    }                                                                     \
    catch (std::exception & e) {                                          \
        PyErr_Format(PyExc_RuntimeError, "native lifetime model: %s", e.what()); \
        return nullptr;                                                   \
    }                                                                     \
    catch (...) {                                                         \
        PyErr_SetString(PyExc_RuntimeError, "native lifetime model: unknown C++ exception"); \
        return nullptr;                                                   \
    }

#define PARSE(fname, n, required, ...)                                           \
    static const char* const names_[] = {__VA_ARGS__};                          \
    PyObject* a[n];                                                              \
    if (!parse(fname, args, nargs, kwnames, names_, n, required, a)) return nullptr;

#define FASTARGS PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames

// -- methods: streams and events ----------------------------------------------------
PyObject* m_create_stream(M* m, FASTARGS) {
    PARSE("create_stream", 2, 1, "stream", "device")
    GUARD_BEGIN
    int id = intern_stream(m, a[0]);
    StreamSlot& st = slot(m, id);
    if (!st.created) {
        st.created = true;
        st.device = Ref::borrow(a[1] ? a[1] : nullptr);
        if (!a[1]) st.device = own(PyLong_FromLong(0));
        st.vc.assign(id + 1, 0);
        st.host_epoch = -1;
        m->created_order->push_back(id);
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_has_stream(M* m, PyObject* stream) {
    GUARD_BEGIN
    return PyBool_FromLong(find_stream(m, stream) >= 0);
    GUARD_END
}

PyObject* m_create_event(M* m, PyObject* event) {
    GUARD_BEGIN
    if (find_event(m, event)) Py_RETURN_NONE;
    auto& slots = *m->event_slots;
    size_t i;
    if (!m->free_event_slots->empty()) {
        i = m->free_event_slots->back();
        m->free_event_slots->pop_back();
    } else {
        i = slots.size();
        slots.push_back(std::make_unique<EventSlot>());
    }
    slots[i]->used = true;
    slots[i]->recorded = false;
    slots[i]->clock.clear();
    Ref idx = own(PyLong_FromSize_t(i));
    if (PyDict_SetItem(m->events, event, idx.get()) < 0) {
        slots[i]->used = false;
        m->free_event_slots->push_back(i);
        throw PyErr();
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_has_event(M* m, PyObject* event) {
    GUARD_BEGIN
    return PyBool_FromLong(find_event(m, event) != nullptr);
    GUARD_END
}

PyObject* m_event_recorded(M* m, PyObject* event) {
    GUARD_BEGIN
    EventSlot* e = find_event(m, event);
    return PyBool_FromLong(e != nullptr && e->recorded);
    GUARD_END
}

PyObject* m_delete_event(M* m, PyObject* event) {
    GUARD_BEGIN
    PyObject* v = dget(m->events, event);
    if (v) {
        long i = PyLong_AsLong(v);
        chk_int(PyDict_DelItem(m->events, event));
        (*m->event_slots)[i]->used = false;
        (*m->event_slots)[i]->clock.clear();
        m->free_event_slots->push_back((size_t)i);
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_record_event(M* m, FASTARGS) {
    PARSE("record_event", 2, 2, "event", "stream")
    GUARD_BEGIN
    EventSlot& e = event_or_raise(m, a[0]);
    int sid = stream_or_raise(m, a[1]);
    e.clock = now(m, sid);
    e.recorded = true;
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_wait_event(M* m, FASTARGS) {
    PARSE("wait_event", 3, 2, "stream", "event", "site")
    GUARD_BEGIN
    PyObject* site = orv(a[2], Py_None);
    int sid = stream_or_raise(m, a[0]);
    Clock& vc = now(m, sid);
    Ref found = own(PyList_New(0));
    EventSlot& e = event_or_raise(m, a[1]);
    if (!e.recorded)
        append(found.get(), call(g_UnrecordedEventWait, {a[1], a[0], site}));
    else
        cjoin(vc, e.clock);
    return deliver(m, std::move(found)).release();
    GUARD_END
}

PyObject* m_wait_stream(M* m, FASTARGS) {
    PARSE("wait_stream", 2, 2, "waiter", "waitee")
    GUARD_BEGIN
    int w = stream_or_raise(m, a[0]);
    Clock& vc = now(m, w);
    int e = stream_or_raise(m, a[1]);
    Clock& other = now(m, e);
#ifndef NPL_MUTANT_NATIVE_MODEL  // tests/test_seam_mutants.py: a stream's wait orders nothing
    if (w != e) cjoin(vc, other);
#else
    (void)vc, (void)other;
#endif
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* synchronize_event(M* m, FASTARGS, const char* fname) {
    static const char* const names_[] = {"event", "site"};
    PyObject* a[2];
    if (!parse(fname, args, nargs, kwnames, names_, 2, 1, a)) return nullptr;
    GUARD_BEGIN
    PyObject* site = orv(a[1], Py_None);
    Ref found = own(PyList_New(0));
    EventSlot& e = event_or_raise(m, a[0]);
    if (!e.recorded) {
        append(found.get(), call(g_UnrecordedEventWait, {a[0], Py_None, site}));
    } else {
        Clock copy = e.clock;
        after_host_join(m, hjoin(cur_host(m).clock, copy, false), site);
    }
    return deliver(m, std::move(found)).release();
    GUARD_END
}

PyObject* m_synchronize_event(M* m, FASTARGS) { return synchronize_event(m, args, nargs, kwnames, "synchronize_event"); }
PyObject* m_event_query_complete(M* m, FASTARGS) {
    return synchronize_event(m, args, nargs, kwnames, "synchronize_event");
}

PyObject* m_synchronize_stream(M* m, FASTARGS) {
    PARSE("synchronize_stream", 2, 1, "stream", "site")
    GUARD_BEGIN
    int sid = stream_or_raise(m, a[0]);
    Clock copy = slot(m, sid).vc;
    after_host_join(m, hjoin(cur_host(m).clock, copy, false), orv(a[1], Py_None));
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_synchronize_device(M* m, FASTARGS) {
    PARSE("synchronize_device", 2, 0, "device", "site")
    GUARD_BEGIN
    PyObject* device = orv(a[0], Py_None);
    bool changed = false;
    std::vector<int> ids = *m->created_order;
    for (int id : ids) {
        StreamSlot& st = slot(m, id);
        if (device == Py_None || py_eq(st.device.get(), device)) {
            Clock copy = st.vc;
            changed |= hjoin(cur_host(m).clock, copy, false);
        }
    }
    after_host_join(m, changed, orv(a[1], Py_None));
    Py_RETURN_NONE;
    GUARD_END
}

// -- methods: host threads -------------------------------------------------------------
int find_host(M* m, PyObject* host) {
    PyObject* v = dget(m->hosts, host);
    return v ? (int)PyLong_AsLong(v) : -1;
}

int new_host_slot(M* m) {
    auto& slots = *m->host_slots;
    size_t i = 0;
    while (i < slots.size() && slots[i]->used) ++i;
    if (i == slots.size()) slots.push_back(std::make_unique<HostSlot>());
    HostSlot& h = *slots[i];
    h.used = true;
    h.ended = false;
    h.clock.clear();
    h.epoch = 0;
    return (int)i;
}

void add_host(M* m, PyObject* host, int i) {
    Ref idx = own(PyLong_FromLong(i));
    if (PyDict_SetItem(m->hosts, host, idx.get()) < 0) {
        (*m->host_slots)[i]->used = false;
        throw PyErr();
    }
}

void pop_host(M* m, PyObject* host, int i) {
    chk_int(PyDict_DelItem(m->hosts, host));
    HostSlot& h = *(*m->host_slots)[i];
    h.used = false;
    h.ended = false;
    h.clock.clear();
}

PyObject* m_set_host(M* m, PyObject* host) {
    GUARD_BEGIN
    if (py_eq(host, m->host_key)) Py_RETURN_NONE;
    int i = find_host(m, host);
    if (i < 0) {
        i = new_host_slot(m);
        (*m->host_slots)[i]->epoch = next_epoch(m);
        add_host(m, host, i);
    }
    Py_INCREF(host);
    Py_SETREF(m->host_key, host);
    m->host = i;
    Py_RETURN_NONE;
    GUARD_END
}

Ref clock_dict(M* m, const Clock& c) {
    Ref d = own(PyDict_New());
    for (size_t i = 0; i < c.size(); ++i) {
        if (c[i] == ABSENT) continue;
        Ref v = own(PyLong_FromLongLong(c[i]));
        chk_int(PyDict_SetItem(d.get(), slot(m, (int)i).key.get(), v.get()));
    }
    return d;
}

PyObject* m_host_clock(M* m, PyObject*) {
    GUARD_BEGIN
    return clock_dict(m, cur_host(m).clock).release();
    GUARD_END
}

// A host clock from a mapping (what dict(clock) accepts); ticks must be ints.
Clock clock_from(M* m, PyObject* clock) {
    Ref d = call((PyObject*)&PyDict_Type, {clock});  // dict(clock)
    Clock c;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d.get(), &pos, &k, &v)) {
        Ref kr = Ref::borrow(k), vr = Ref::borrow(v);
        long long tick = as_ll(vr.get());
        if (tick == ABSENT) tick = ABSENT + 1;
        int id = intern_stream(m, kr.get());
        if ((size_t)id >= c.size()) c.resize(id + 1, ABSENT);
        c[id] = tick;
    }
    return c;
}

PyObject* m_fork_host(M* m, FASTARGS) {
    PARSE("fork_host", 2, 1, "child", "clock")
    GUARD_BEGIN
    Clock clock = (a[1] == nullptr || a[1] == Py_None) ? cur_host(m).clock : clock_from(m, a[1]);
    if (py_eq(a[0], m->host_key)) {
        hjoin(cur_host(m).clock, clock, true);
        cur_host(m).epoch = next_epoch(m);
    } else {
        int i = find_host(m, a[0]);
        if (i < 0) {
            i = new_host_slot(m);
            add_host(m, a[0], i);
        }
        HostSlot& h = *(*m->host_slots)[i];
        h.clock = std::move(clock);
        h.epoch = next_epoch(m);
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_join_host(M* m, PyObject* child) {
    GUARD_BEGIN
    if (py_eq(child, m->host_key)) Py_RETURN_NONE;
    int i = find_host(m, child);
    if (i < 0) Py_RETURN_NONE;
    Clock clock = (*m->host_slots)[i]->clock;
    pop_host(m, child, i);
    after_host_join(m, hjoin(cur_host(m).clock, clock, true), Py_None);
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_follow_hosts(M* m, PyObject* hosts) {
    GUARD_BEGIN
    std::vector<Clock> clocks;
    Ref it = own(PyObject_GetIter(hosts));
    while (PyObject* raw = PyIter_Next(it.get())) {
        Ref h(raw);
        int i = find_host(m, h.get());
        if (i >= 0 && py_ne(h.get(), m->host_key)) clocks.push_back((*m->host_slots)[i]->clock);
    }
    if (PyErr_Occurred()) throw PyErr();
    bool changed = false;
    for (const Clock& c : clocks) changed |= hjoin(cur_host(m).clock, c, true);
    after_host_join(m, changed, Py_None);
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_end_host(M* m, PyObject* host) {
    GUARD_BEGIN
    int i = find_host(m, host);
    if (i >= 0 && py_ne(host, m->host_key) && !(*m->host_slots)[i]->ended) {
        (*m->host_slots)[i]->ended = true;
        if (!m->outstanding->records.empty()) retire_completed(m, Py_None);
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_forget_host(M* m, PyObject* host) {
    GUARD_BEGIN
    if (py_ne(host, m->host_key)) {
        int i = find_host(m, host);
        if (i >= 0) {
            pop_host(m, host, i);
            if (!m->outstanding->records.empty()) retire_completed(m, Py_None);
        }
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_hosts(M* m, PyObject*) {
    GUARD_BEGIN
    Ref keys = own(PyDict_Keys(m->hosts));
    return PyList_AsTuple(keys.get());
    GUARD_END
}

// -- methods: storages -------------------------------------------------------------------
PyObject* m_allocate(M* m, FASTARGS) {
    PARSE("allocate", 6, 2, "storage", "stream", "address", "size", "site", "preexisting")
    GUARD_BEGIN
    PyObject* storage = a[0];
    PyObject* stream = a[1];
    PyObject* address = orv(a[2], Py_None);
    PyObject* site = orv(a[4], Py_None);
    bool preexisting = a[5] ? truthy(a[5]) : false;
    long long size = 0;
    bool size_true = false;
    if (a[3]) {
        size_true = truthy(a[3]);
        size = as_ll(a[3]);
    }
    if (find_live(m, storage)) raise_input(chk(PyUnicode_FromFormat("storage %R allocated while live", storage)));
    if (address != Py_None) {
        PyObject* there = dget(m->by_address, address);
        if (there) {
            Ref keep = Ref::borrow(there);
            Ref hex = own(PyObject_Format(address, s_hashx));
            raise_input(chk(PyUnicode_FromFormat("address %U allocated while storage %R is live there", hex.get(),
                                                 keep.get())));
        }
    }
    auto s = std::make_shared<Storage>();
    int sid = stream_or_raise(m, stream);
    Ref empty = own(PyTuple_New(0));
    if (preexisting) {
        s->last_write = make_acc(sid, slot(m, sid).key.get(), 0, true, s_preexisting, site, empty.get());
    } else {
        Clock& vc = now(m, sid);
        long long tick = ++vc[sid];
        s->last_write = make_acc(sid, slot(m, sid).key.get(), tick, true, s_allocation, site, empty.get());
    }
    if (PyDict_GET_SIZE(m->freed)) {  // self._freed.pop(storage, None)
        int there = PyDict_Contains(m->freed, storage);  // an OrderedDict is a dict: a plain lookup first
        chk_int(there);
        if (there) Ref r = own(PyObject_CallMethodObjArgs(m->freed, s_pop, storage, Py_None, nullptr));
    }
    s->address = Ref::borrow(address);
    if (address != Py_None) {
        s->has_address = true;
        s->addr = as_ll(address);
    }
    s->size = size;
    s->alloc_stream = sid;
    s->alloc_stream_obj = Ref::borrow(stream);
    s->alloc_site = Ref::borrow(site);
    // a slot for it
    Py_ssize_t idx;
    if (!m->free_storage_slots->empty()) {
        idx = m->free_storage_slots->back();
        m->free_storage_slots->pop_back();
    } else {
        idx = (Py_ssize_t)m->storages->size();
        m->storages->push_back(nullptr);
    }
    StoragePtr sp = s;
    (*m->storages)[idx] = std::move(s);
    Ref idxobj = own(PyLong_FromSsize_t(idx));
    if (PyDict_SetItem(m->live, storage, idxobj.get()) < 0) {
        (*m->storages)[idx].reset();
        m->free_storage_slots->push_back(idx);
        throw PyErr();
    }
    if (address != Py_None) {
        chk_int(PyDict_SetItem(m->by_address, address, storage));
        if (size_true && !preexisting && !m->outstanding->records.empty()) link_previous_owners(m, *sp);
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_set_size(M* m, FASTARGS) {
    PARSE("set_size", 2, 2, "storage", "size")
    GUARD_BEGIN
    StoragePtr s = find_live(m, a[0]);
    if (s && !s->size && truthy(a[1])) {
        s->size = as_ll(a[1]);
        if (s->has_address) link_previous_owners(m, *s);
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_storage_at(M* m, PyObject* address) {
    GUARD_BEGIN
    PyObject* v = dget(m->by_address, address);
    if (!v) v = Py_None;
    Py_INCREF(v);
    return v;
    GUARD_END
}

PyObject* m_is_live(M* m, PyObject* storage) {
    GUARD_BEGIN
    return PyBool_FromLong(find_live(m, storage) != nullptr);
    GUARD_END
}

PyObject* do_access(M* m, PyObject* storage, PyObject* stream, bool is_write, PyObject* op, PyObject* site,
                    PyObject* args) {
    StoragePtr s = find_live(m, storage);
    int sid = find_stream(m, stream);
    if (!s || sid < 0) {
        Ref missing = own(PyList_New(0));
        PyObject* what = truthy(op) ? op : (is_write ? s_write : s_read);
        stream_or_raise(m, stream);
        s = live_or_report(m, storage, stream, what, site, missing.get());
        if (!s) return deliver(m, std::move(missing)).release();
    }
    StreamSlot& st = slot(m, sid);
    Clock& vc = st.vc;
    HostSlot& h = cur_host(m);
    if (st.host_epoch != h.epoch) {
        sjoin_host(vc, h.clock);
        st.host_epoch = h.epoch;
    }
    long long tick = ++vc[sid];
    AccRef acc = make_acc(sid, st.key.get(), tick, is_write, op, site, args);
    Ref found = own(PyList_New(0));
    PyObject* fl = found.get();
    {
        AccRef prior = s->last_write;
        if (prior->stream != sid && cget(vc, prior->stream) < prior->clock) append(fl, data_race(storage, *s, acc, prior));
    }
    if (!s->concurrent_writes.empty()) {
        AccMap cw = s->concurrent_writes;
        races(storage, *s, acc, vc, cw, fl);
    }
    if (is_write) {
        // the writes acc is not ordered after stay beside it (the racing
        // priors found above, by the same tests, in the same order)
        AccMap racing_writes;
        {
            AccRef prior = s->last_write;
            if (prior->stream != sid && cget(vc, prior->stream) < prior->clock) amap_set(racing_writes, prior->stream, prior);
            for (const auto& e : s->concurrent_writes) {
                const AccRef& p = e.second;
                if (p->stream != sid && cget(vc, p->stream) < p->clock && p->is_write) amap_set(racing_writes, p->stream, p);
            }
        }
        if (!s->reads.empty()) {
            AccMap rd = s->reads;
            s->reads = races(storage, *s, acc, vc, rd, fl);
        }
        s->concurrent_writes = std::move(racing_writes);
        s->last_write = acc;
        amap_set(s->last_write_on, sid, acc);
    } else {
        amap_set(s->reads, sid, acc);
    }
    amap_set(s->last_use, sid, acc);
    if (s->has_previous) check_reuse(storage, *s, acc, vc, fl);
    if (PyList_GET_SIZE(fl)) return deliver(m, std::move(found)).release();
    return found.release();
}

PyObject* m_access(M* m, FASTARGS) {
    PARSE("access", 6, 3, "storage", "stream", "is_write", "op", "site", "args")
    GUARD_BEGIN
    PyObject* args_t = a[5];
    Ref empty;
    if (!args_t) {
        empty = own(PyTuple_New(0));
        args_t = empty.get();
    }
    return do_access(m, a[0], a[1], truthy(a[2]), orv(a[3], Py_None), orv(a[4], Py_None), args_t);
    GUARD_END
}

PyObject* rw(M* m, FASTARGS, bool is_write, const char* fname) {
    static const char* const names_[] = {"storage", "stream", "op", "site"};
    PyObject* a[4];
    if (!parse(fname, args, nargs, kwnames, names_, 4, 2, a)) return nullptr;
    GUARD_BEGIN
    Ref empty = own(PyTuple_New(0));
    return do_access(m, a[0], a[1], is_write, orv(a[2], Py_None), orv(a[3], Py_None),
                     empty.get());
    GUARD_END
}
PyObject* m_read(M* m, FASTARGS) { return rw(m, args, nargs, kwnames, false, "read"); }
PyObject* m_write(M* m, FASTARGS) { return rw(m, args, nargs, kwnames, true, "write"); }

enum class Rec { record_stream, erase_stream, record_use };

PyObject* recording(M* m, FASTARGS, Rec kind, const char* fname) {
    static const char* const names_[] = {"storage", "stream", "site"};
    PyObject* a[3];
    if (!parse(fname, args, nargs, kwnames, names_, 3, 2, a)) return nullptr;
    GUARD_BEGIN
    PyObject* site = orv(a[2], Py_None);
    Ref found = own(PyList_New(0));
    int sid = stream_or_raise(m, a[1]);
    PyObject* op = kind == Rec::record_stream ? s_record_stream : kind == Rec::erase_stream ? s_erase_stream : s_record_use;
    StoragePtr s = live_or_report(m, a[0], a[1], op, site, found.get());
    if (s) {
        if (kind == Rec::record_stream) {
            if (sid != s->alloc_stream && std::find(s->recorded.begin(), s->recorded.end(), sid) == s->recorded.end())
                s->recorded.push_back(sid);
        } else if (kind == Rec::erase_stream) {
            auto it = std::find(s->recorded.begin(), s->recorded.end(), sid);
            if (it != s->recorded.end()) s->recorded.erase(it);
        } else if (sid != s->alloc_stream) {
            Clock& vc = now(m, sid);
            cjoin(s->use_cover, vc);
        }
    }
    return deliver(m, std::move(found)).release();
    GUARD_END
}
PyObject* m_record_stream(M* m, FASTARGS) { return recording(m, args, nargs, kwnames, Rec::record_stream, "record_stream"); }
PyObject* m_erase_stream(M* m, FASTARGS) { return recording(m, args, nargs, kwnames, Rec::erase_stream, "erase_stream"); }
PyObject* m_record_use(M* m, FASTARGS) { return recording(m, args, nargs, kwnames, Rec::record_use, "record_use"); }

PyObject* m_free(M* m, FASTARGS) {
    PARSE("free", 2, 1, "storage", "site")
    GUARD_BEGIN
    PyObject* storage = a[0];
    Ref site = Ref::borrow(orv(a[1], Py_None));
    PyObject* v = dget(m->live, storage);
    if (v == nullptr) {
        if (PyCallable_Check(site.get())) site = own(PyObject_CallNoArgs(site.get()));
        PyObject* first = dget(m->freed, storage);
        Ref first_ref = Ref::borrow(first ? first : Py_None);
        Ref found = own(PyList_New(0));
        append(found.get(), call(g_InvalidFree, {storage, first ? s_double : s_unknown, site.get(), first_ref.get()}));
        return deliver(m, std::move(found)).release();
    }
    Py_ssize_t idx = PyLong_AsSsize_t(v);
    chk_int(PyDict_DelItem(m->live, storage));
    StoragePtr owned = std::move((*m->storages)[idx]);
    m->free_storage_slots->push_back(idx);
    Storage& s = *owned;
    if (s.has_address) {
        PyObject* there = dget(m->by_address, s.address.get());
        if (there) chk_int(PyDict_DelItem(m->by_address, s.address.get()));
    }
    if (m->remember_frees) {
        if (PyCallable_Check(site.get())) site = own(PyObject_CallNoArgs(site.get()));
        chk_int(PyObject_SetItem(m->freed, storage, site.get()));
        if ((long long)PyDict_GET_SIZE(m->freed) > m->remember_frees) {
            Ref r = own(PyObject_CallMethodOneArg(m->freed, s_popitem, Py_False));
        }
    }
    Ref found = own(PyList_New(0));
    bool deferred = PyCallable_Check(site.get());
    uncovered(m, storage, s, deferred ? Py_None : site.get(), false, found.get());
    Py_ssize_t n = PyList_GET_SIZE(found.get());
    if (n == 0) return found.release();
    if (deferred) {
        site = own(PyObject_CallNoArgs(site.get()));
        // dataclasses.replace(f, free_site=site): the same fields, the same outcome
        Ref replaced = own(PyList_New(0));
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* f = PyList_GET_ITEM(found.get(), i);
            Ref st = own(PyObject_GetAttrString(f, "storage"));
            Ref ad = own(PyObject_GetAttrString(f, "address"));
            Ref sz = own(PyObject_GetAttrString(f, "size"));
            Ref as = own(PyObject_GetAttrString(f, "alloc_stream"));
            Ref us = own(PyObject_GetAttrString(f, "usage_stream"));
            Ref lu = own(PyObject_GetAttrString(f, "last_use"));
            Ref asite = own(PyObject_GetAttrString(f, "alloc_site"));
            Ref lv = own(PyObject_GetAttrString(f, "live"));
            Ref oc = own(PyObject_GetAttr(f, s_outcome));
            append(replaced.get(), call(g_UncoveredFree, {st.get(), ad.get(), sz.get(), as.get(), us.get(), lu.get(),
                                                         asite.get(), site.get(), lv.get(), oc.get()}));
        }
        found = std::move(replaced);
    }
    // the uncovered uses, in the order of the findings
    std::vector<std::pair<int, AccRef>> left;
    {
        Clock cover;  // recomputed as _uncovered did (nothing changed since)
        cover = release_clock(m, s);
        for (const auto& e : s.last_use)
            if (cget(cover, e.first) < e.second->clock) left.push_back(e);
    }
    for (Py_ssize_t i = 0; i < n && (size_t)i < left.size(); ++i)
        leave_outstanding(m, storage, s, PyList_GET_ITEM(found.get(), i), left[i].first, left[i].second);
    return deliver(m, std::move(found)).release();
    GUARD_END
}

// -- methods: reading findings --------------------------------------------------------
void uncovered_live_into(M* m, PyObject* storages, PyObject* out) {
    Ref keys;
    if (storages == Py_None)
        keys = own(PyDict_Keys(m->live));
    else
        keys = Ref::borrow(storages);
    Ref it = own(PyObject_GetIter(keys.get()));
    while (PyObject* raw = PyIter_Next(it.get())) {
        Ref storage(raw);
        StoragePtr s = find_live(m, storage.get());
        if (s) uncovered(m, storage.get(), *s, Py_None, true, out);
    }
    if (PyErr_Occurred()) throw PyErr();
}

PyObject* m_uncovered_live(M* m, FASTARGS) {
    PARSE("uncovered_live", 1, 0, "storages")
    GUARD_BEGIN
    Ref out = own(PyList_New(0));
    uncovered_live_into(m, orv(a[0], Py_None), out.get());
    return out.release();
    GUARD_END
}

PyObject* m_flush(M* m, PyObject*) {
    GUARD_BEGIN
    if (!m->findings) no_attribute("findings");
    Ref retained(m->findings);
    m->findings = chk(PyList_New(0));
    Ref live = own(PyList_New(0));
    uncovered_live_into(m, Py_None, live.get());
    return PyNumber_Add(retained.get(), live.get());
    GUARD_END
}

PyObject* m_allocator_holds(M* m, PyObject* free) {
    GUARD_BEGIN
    std::vector<OutPtr> retired = m->outstanding->retire([free](const Outstanding& r) { return r.free.get() == free; });
    for (const OutPtr& rec : retired) {
        Ref oc = own(PyObject_GetAttr(rec->free.get(), s_outcome));
        chk_int(PyObject_SetAttr(oc.get(), s_held_by_allocator, Py_True));
    }
    Py_RETURN_NONE;
    GUARD_END
}

PyObject* m_outstanding_uses(M* m, PyObject*) {
    return PyLong_FromSize_t(m->outstanding->records.size());
}

// -- construction ---------------------------------------------------------------------
void free_state(M* m) {
    delete m->outstanding;
    m->outstanding = nullptr;
    delete m->storages;
    m->storages = nullptr;
    delete m->free_storage_slots;
    m->free_storage_slots = nullptr;
    delete m->event_slots;
    m->event_slots = nullptr;
    delete m->free_event_slots;
    m->free_event_slots = nullptr;
    delete m->host_slots;
    m->host_slots = nullptr;
    delete m->created_order;
    m->created_order = nullptr;
    delete m->streams;  // last: accesses borrow the stream keys
    m->streams = nullptr;
}

PyObject* model_new(PyTypeObject* type, PyObject*, PyObject*) {
    M* m = (M*)type->tp_alloc(type, 0);
    if (m == nullptr) return nullptr;
    try {
        m->streams = new std::vector<std::unique_ptr<StreamSlot>>();
        m->created_order = new std::vector<int>();
        m->host_slots = new std::vector<std::unique_ptr<HostSlot>>();
        m->event_slots = new std::vector<std::unique_ptr<EventSlot>>();
        m->free_event_slots = new std::vector<size_t>();
        m->storages = new std::vector<std::shared_ptr<Storage>>();
        m->free_storage_slots = new std::vector<Py_ssize_t>();
        m->outstanding = new OutstandingIndex();
    } catch (std::bad_alloc&) {
        Py_DECREF(m);
        PyErr_NoMemory();
        return nullptr;
    }
    m->last_stream_key = nullptr;
    m->last_stream_id = -1;
    return (PyObject*)m;
}

int model_init(M* m, PyObject* args, PyObject* kwds) {
    static const char* kwlist[] = {"on_finding", "retain", "remember_frees", "host", nullptr};
    PyObject* on_finding = Py_None;
    PyObject* retain = Py_True;
    PyObject* remember = nullptr;
    PyObject* host = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOOO:LifetimeModel", (char**)kwlist, &on_finding, &retain,
                                     &remember, &host))
        return -1;
    try {
        if (m->stream_ids) {
            PyErr_SetString(PyExc_RuntimeError, "LifetimeModel.__init__ called twice");
            return -1;
        }
        long long rf = g_freed_memory_default;
        if (remember) rf = as_ll(remember);
        m->remember_frees = rf;
        m->stream_ids = chk(PyDict_New());
        m->events = chk(PyDict_New());
        m->hosts = chk(PyDict_New());
        m->live = chk(PyDict_New());
        m->by_address = chk(PyDict_New());
        m->freed = chk(PyObject_CallNoArgs(g_OrderedDict));
        m->findings = chk(PyList_New(0));
        Py_INCREF(retain);
        Py_XSETREF(m->retain, retain);
        Py_INCREF(on_finding);
        Py_XSETREF(m->on_finding, on_finding);
        Py_INCREF(host);
        m->host_key = host;
        m->next_epoch = 1;
        int i = new_host_slot(m);  // epoch 0
        add_host(m, host, i);
        m->host = i;
    } catch (PyErr&) {
        return -1;
    } catch (std::bad_alloc&) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

int model_traverse(M* m, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(m));
    Py_VISIT(m->findings);
    Py_VISIT(m->retain);
    Py_VISIT(m->on_finding);
    Py_VISIT(m->dict);
    Py_VISIT(m->stream_ids);
    Py_VISIT(m->events);
    Py_VISIT(m->hosts);
    Py_VISIT(m->live);
    Py_VISIT(m->by_address);
    Py_VISIT(m->freed);
    Py_VISIT(m->host_key);
    return 0;
}

int model_clear(M* m) {
    Py_CLEAR(m->findings);
    Py_CLEAR(m->retain);
    Py_CLEAR(m->on_finding);
    Py_CLEAR(m->dict);
    return 0;
}

void model_dealloc(M* m) {
    PyObject_GC_UnTrack(m);
    if (m->weakrefs) PyObject_ClearWeakRefs((PyObject*)m);
    model_clear(m);
    free_state(m);
    Py_CLEAR(m->stream_ids);
    Py_CLEAR(m->events);
    Py_CLEAR(m->hosts);
    Py_CLEAR(m->live);
    Py_CLEAR(m->by_address);
    Py_CLEAR(m->freed);
    Py_CLEAR(m->host_key);
    PyTypeObject* tp = Py_TYPE(m);
    tp->tp_free((PyObject*)m);
    Py_DECREF(tp);
}

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))m_##name, METH_FASTCALL | METH_KEYWORDS, doc}
#define ONE(name, doc) {#name, (PyCFunction)(void (*)(void))m_##name, METH_O, doc}
#define NOARGS(name, doc) {#name, (PyCFunction)(void (*)(void))m_##name, METH_NOARGS, doc}

PyMethodDef model_methods[] = {
    FAST(create_stream, "create_stream(stream, device=0)"),
    ONE(has_stream, nullptr),
    ONE(create_event, nullptr),
    ONE(has_event, nullptr),
    ONE(event_recorded, nullptr),
    ONE(delete_event, nullptr),
    FAST(record_event, "record_event(event, stream)"),
    FAST(wait_event, "wait_event(stream, event, site=None) -> findings"),
    FAST(wait_stream, "wait_stream(waiter, waitee)"),
    FAST(synchronize_event, "synchronize_event(event, site=None) -> findings"),
    FAST(event_query_complete, "event_query_complete(event, site=None) -> findings"),
    FAST(synchronize_stream, "synchronize_stream(stream, site=None)"),
    FAST(synchronize_device, "synchronize_device(device=None, site=None)"),
    ONE(set_host, nullptr),
    NOARGS(host_clock, nullptr),
    FAST(fork_host, "fork_host(child, clock=None)"),
    ONE(join_host, nullptr),
    ONE(follow_hosts, nullptr),
    ONE(end_host, nullptr),
    ONE(forget_host, nullptr),
    NOARGS(hosts, nullptr),
    FAST(allocate, "allocate(storage, stream, address=None, size=0, site=None, preexisting=False)"),
    FAST(set_size, "set_size(storage, size)"),
    ONE(storage_at, nullptr),
    ONE(is_live, nullptr),
    FAST(access, "access(storage, stream, is_write, op=None, site=None, args=()) -> findings"),
    FAST(read, "read(storage, stream, op=None, site=None) -> findings"),
    FAST(write, "write(storage, stream, op=None, site=None) -> findings"),
    FAST(record_stream, "record_stream(storage, stream, site=None) -> findings"),
    FAST(erase_stream, "erase_stream(storage, stream, site=None) -> findings"),
    FAST(record_use, "record_use(storage, stream, site=None) -> findings"),
    FAST(free, "free(storage, site=None) -> findings"),
    FAST(uncovered_live, "uncovered_live(storages=None) -> findings"),
    NOARGS(flush, nullptr),
    ONE(allocator_holds, nullptr),
    NOARGS(outstanding_uses, nullptr),
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef model_members[] = {
    {"findings", T_OBJECT_EX, offsetof(ModelObject, findings), 0, "retained findings"},
    {"retain", T_OBJECT_EX, offsetof(ModelObject, retain), 0, nullptr},
    {"on_finding", T_OBJECT_EX, offsetof(ModelObject, on_finding), 0, nullptr},
    {"__dictoffset__", T_PYSSIZET, offsetof(ModelObject, dict), READONLY, nullptr},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ModelObject, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot model_slots[] = {
    {Py_tp_doc, (void*)"The lifetime model of npu_lifetime.lifetime.model, in C++ (same API and findings)."},
    {Py_tp_new, (void*)model_new},
    {Py_tp_init, (void*)model_init},
    {Py_tp_dealloc, (void*)model_dealloc},
    {Py_tp_traverse, (void*)model_traverse},
    {Py_tp_clear, (void*)model_clear},
    {Py_tp_methods, (void*)model_methods},
    {Py_tp_members, (void*)model_members},
    {0, nullptr},
};

PyType_Spec model_spec = {
    "npu_lifetime.lifetime._native_model.LifetimeModel",
    sizeof(ModelObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    model_slots,
};

int intern(PyObject** slot, const char* s) {
    *slot = PyUnicode_InternFromString(s);
    return *slot ? 0 : -1;
}

int module_exec(PyObject* module) {
    PyObject* findings = PyImport_ImportModule("npu_lifetime.lifetime.findings");
    if (!findings) return -1;
    struct {
        PyObject** slot;
        const char* name;
    } names[] = {
        {&g_Access, "Access"},           {&g_DataRace, "DataRace"},
        {&g_UncoveredFree, "UncoveredFree"}, {&g_ReuseOutcome, "ReuseOutcome"},
        {&g_ReuseRace, "ReuseRace"},     {&g_InvalidFree, "InvalidFree"},
        {&g_UseAfterFree, "UseAfterFree"}, {&g_UnrecordedEventWait, "UnrecordedEventWait"},
    };
    for (auto& n : names) {
        *n.slot = PyObject_GetAttrString(findings, n.name);
        if (!*n.slot) {
            Py_DECREF(findings);
            return -1;
        }
    }
    Py_DECREF(findings);
    g_model_module = PyImport_ImportModule("npu_lifetime.lifetime.model");
    if (!g_model_module) return -1;
    g_ModelInputError = PyObject_GetAttrString(g_model_module, "ModelInputError");
    if (!g_ModelInputError) return -1;
    PyObject* fm = PyObject_GetAttrString(g_model_module, "_FREED_MEMORY");
    if (!fm) return -1;
    g_freed_memory_default = PyLong_AsLongLong(fm);
    Py_DECREF(fm);
    if (g_freed_memory_default == -1 && PyErr_Occurred()) return -1;
    PyObject* collections = PyImport_ImportModule("collections");
    if (!collections) return -1;
    g_OrderedDict = PyObject_GetAttrString(collections, "OrderedDict");
    Py_DECREF(collections);
    if (!g_OrderedDict) return -1;
    if (intern(&s_allocation, "<allocation>") || intern(&s_preexisting, "<allocated before tracking>") ||
        intern(&s_read, "read") || intern(&s_write, "write") || intern(&s_record_stream, "record_stream") ||
        intern(&s_erase_stream, "erase_stream") || intern(&s_record_use, "record_use") ||
        intern(&s_unknown, "unknown") || intern(&s_double, "double") || intern(&s_outcome, "outcome") ||
        intern(&s_reuses, "reuses") || intern(&s_safe_reuse, "safe_reuse") || intern(&s_race, "race") ||
        intern(&s_host_synced, "host_synced") || intern(&s_sync_site, "sync_site") ||
        intern(&s_held_by_allocator, "held_by_allocator") || intern(&s_forgotten, "forgotten") ||
        intern(&s_OUTSTANDING_CAP, "_OUTSTANDING_CAP") || intern(&s_pop, "pop") || intern(&s_popitem, "popitem") ||
        intern(&s_extend, "extend") || intern(&s_hashx, "#x"))
        return -1;
    PyObject* type = PyType_FromModuleAndSpec(module, &model_spec, nullptr);
    if (!type) return -1;
    if (PyModule_AddObject(module, "LifetimeModel", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void*)module_exec},
    {0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_native_model",
    "The lifetime model in C++: npu_lifetime.lifetime.model's LifetimeModel, with the same API and findings.",
    0,
    nullptr,
    module_slots,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__native_model(void) { return PyModuleDef_Init(&module_def); }
