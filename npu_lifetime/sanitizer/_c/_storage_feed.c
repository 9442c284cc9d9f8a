/* The sanitizer's allocation and free feed, native: an allocation or free
 * (from the device's allocation trace or the shim's hooks) into one
 * sanitizer's storage table and lifetime model, in one C call.
 * LifetimeSanitizer.on_shim_alloc / _free with StorageTable.allocate / free
 * do the same in Python (the fallback, and what this file follows line by
 * line; storages.py).  The table stays StorageTable's dicts: the op feed
 * (_feed.c) and the Python paths read the same ones.
 *
 * StorageFeed(sanitizer, lock, shim, live, sizeless, ids, blocks_before,
 *             allocate, free, has_stream, stream, on_thread, capture)
 *   sanitizer:     its _host (the thread the model names as host) and
 *                  _set_host(), called, lock held, when another thread calls
 *   lock:          the sanitizer's RLock (acquire / release; the host check is here)
 *   shim:          ShimLink: while connected, the trace's reports are skipped
 *   live, sizeless, ids, blocks_before: StorageTable's
 *   allocate, free, has_stream: the model's bound methods
 *   stream:        sanitizer._stream(key): creates a stream the model lacks
 *   on_thread:     hub.on_thread (its frame: the op in progress, its site)
 *   capture:       () -> a site captured now (outside an op)
 *
 * Methods: allocate(address, size, key[, site]) -> storage id;
 *          free(address[, sid]) -> the model's findings (a list; with sid,
 *          only if that storage is still the one at address);
 *          trace_alloc(address, key) / trace_free(address) -> the findings
 *          or None: the same, skipped while the shim is connected;
 *          shim_alloc(ptr, size, device, stream) -> None and
 *          shim_free(ptr, size, device, stream) -> the findings: the same
 *          in the shim hooks' calling convention (hooks.py subscribes them
 *          directly, so an allocation or free runs no Python frame).
 */
#include "host_entry.h"

typedef struct {
    PyObject_HEAD
    PyObject *sanitizer, *acquire, *release, *shim;
    PyObject *live, *sizeless, *ids, *blocks_before;
    PyObject *allocate, *free, *has_stream, *stream;
    PyObject *on_thread, *capture;
} StorageFeed;

#define FEED_FIELDS(X)                                                                                        \
    X(sanitizer) X(acquire) X(release) X(shim) X(live) X(sizeless) X(ids) X(blocks_before) X(allocate) X(free) \
        X(has_stream) X(stream) X(on_thread) X(capture)

static PyObject *str_connected, *str_frame, *str_site, *str_free_found;

/* -- the lock: the sanitizer's, entered as _HostLock.__enter__ does (host_entry.h) ------------------ */

static int enter(StorageFeed *f) { return host_enter(f->acquire, f->release, f->sanitizer); }

/* 0, or -1 with a TypeError for a StorageFeed made by __new__ without __init__ (each method asks first). */
static int uninitialised(StorageFeed *f) {
    if (f->live != NULL) return 0;
    PyErr_SetString(PyExc_TypeError, "this StorageFeed was not initialised");
    return -1;
}

static PyObject *leave(StorageFeed *f, PyObject *result) { return host_leave(f->release, result); }

/* -- sites ------------------------------------------------------------------------------------------ */

/* The op in progress's site (a new reference), or NULL with no error when no op is in progress. */
static PyObject *op_site(StorageFeed *f) {
    PyObject *frame = PyObject_GetAttr(f->on_thread, str_frame);
    if (frame == NULL || frame == Py_None) {
        seam_release(frame);
        return NULL;
    }
    PyObject *site = PyObject_GetAttr(frame, str_site);
    seam_release(frame);
    return site;
}

/* sanitizer._site(): the op's site, else one captured now. */
static PyObject *site_now(StorageFeed *f) {
    PyObject *site = op_site(f);
    if (site != NULL || PyErr_Occurred()) return site;
    return PyObject_CallNoArgs(f->capture);
}

/* For a free: the op's site, else the capture itself (called only if a finding needs it). */
static PyObject *site_lazy(StorageFeed *f) {
    PyObject *site = op_site(f);
    if (site != NULL || PyErr_Occurred()) return site;
    return Py_NewRef(f->capture);
}

/* -- the table and the model (lock held) ------------------------------------------------------------ */

/* dict.pop(key, None) as a new reference (NULL with no error: absent). */
static PyObject *pop(PyObject *dict, PyObject *key) {
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL) return NULL;
    Py_INCREF(value);
    if (PyDict_DelItem(dict, key) < 0) {
        seam_release(value);
        return NULL;
    }
    return value;
}

/* sanitizer._stream(key): a stream the model lacks is created. */
static int ensure_stream(StorageFeed *f, PyObject *key) { return host_ensure_stream(f->has_stream, f->stream, key); }

/* StorageTable.allocate(address, size, key, site): a new reference to the storage id. */
static PyObject *table_allocate(StorageFeed *f, PyObject *address, PyObject *size, PyObject *key, PyObject *site) {
    if (PyDict_GET_SIZE(f->blocks_before) > 0) {
        seam_release(pop(f->blocks_before, address));
        if (PyErr_Occurred()) return NULL;
    }
    PyObject *old = pop(f->live, address);
    if (old != NULL) { /* its free was not seen (e.g. a storage resized in place) */
        int gone = PySet_Discard(f->sizeless, old);
        PyObject *args[2] = {old, site};
        PyObject *found = gone < 0 ? NULL : PyObject_Vectorcall(f->free, args, 2, NULL);
        seam_release(old);
        if (found == NULL) return NULL;
        /* what is known of the old storage is reported (StorageTable's on_found: sanitizer._free_found) */
        int any = PyObject_IsTrue(found);
        PyObject *kept = any > 0 ? PyObject_CallMethodOneArg(f->sanitizer, str_free_found, found) : NULL;
        seam_release(found);
        if (any < 0 || (any > 0 && kept == NULL)) return NULL;
        seam_release(kept);
    } else if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *sid = PyIter_Next(f->ids);
    if (sid == NULL) return NULL;
    int truth = PyObject_IsTrue(size);
    if (truth < 0 || PyDict_SetItem(f->live, address, sid) < 0 || (!truth && PySet_Add(f->sizeless, sid) < 0)) {
        seam_release(sid);
        return NULL;
    }
    PyObject *args[5] = {sid, key, address, size, site};
    PyObject *done = PyObject_Vectorcall(f->allocate, args, 5, NULL);
    if (done == NULL) {
        seam_release(sid);
        return NULL;
    }
    seam_release(done);
    return sid;
}

/* StorageTable.free(address, site): the model's findings (a new reference). */
static PyObject *table_free(StorageFeed *f, PyObject *address, PyObject *site) {
    PyObject *sid = pop(f->live, address);
    if (sid == NULL) {
        if (PyErr_Occurred()) return NULL;
        if (PyDict_GET_SIZE(f->blocks_before) > 0) { /* allocated before the sanitizer was enabled */
            seam_release(pop(f->blocks_before, address));
            if (PyErr_Occurred()) return NULL;
        }
        return PyList_New(0);
    }
    PyObject *found = NULL;
    if (PySet_Discard(f->sizeless, sid) >= 0) {
        PyObject *args[2] = {sid, site};
        found = PyObject_Vectorcall(f->free, args, 2, NULL);
    }
    seam_release(sid);
    return found;
}

/* -- the methods ------------------------------------------------------------------------------------ */

/* site: NULL for the op's site, or one captured now. */
static PyObject *allocate_at(StorageFeed *f, PyObject *address, PyObject *size, PyObject *key, PyObject *site) {
    site = site != NULL ? Py_NewRef(site) : site_now(f);
    if (site == NULL) return NULL;
    PyObject *sid = NULL;
    if (enter(f) == 0) {
        sid = ensure_stream(f, key) < 0 ? NULL : table_allocate(f, address, size, key, site);
        sid = leave(f, sid);
    }
    seam_release(site);
    return sid;
}

/* sid: NULL, or free only if that storage is still the one at address (a watched storage's death). */
static PyObject *free_at(StorageFeed *f, PyObject *address, PyObject *sid) {
#ifdef NPL_MUTANT_STORAGE_FEED /* tests/test_sanitizer_seam_mutants.py: a free finds nothing */
    (void)f, (void)address, (void)sid;
    return PyList_New(0);
#endif
    PyObject *site = site_lazy(f);
    if (site == NULL) return NULL;
    PyObject *found = NULL;
    if (enter(f) == 0) {
        PyObject *there = sid != NULL ? PyDict_GetItemWithError(f->live, address) : NULL;
        int same = sid == NULL ? 1 : there == NULL ? (PyErr_Occurred() ? -1 : 0)
                                                   : PyObject_RichCompareBool(there, sid, Py_EQ);
        found = same < 0 ? NULL : same ? table_free(f, address, site) : PyList_New(0);
        found = leave(f, found);
    }
    seam_release(site);
    return found;
}

/* ShimLink.connected: the shim reports allocations and frees itself. 1, 0, or -1 on error. */
static int shim_connected(StorageFeed *f) {
    PyObject *connected = PyObject_GetAttr(f->shim, str_connected);
    if (connected == NULL) return -1;
    int truth = PyObject_IsTrue(connected);
    seam_release(connected);
    return truth;
}

static PyObject *m_allocate(StorageFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(f) < 0) return NULL;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "allocate(address, size, key[, site])");
        return NULL;
    }
    return allocate_at(f, args[0], args[1], args[2], nargs == 4 ? args[3] : NULL);
}

static PyObject *m_free(StorageFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(f) < 0) return NULL;
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "free(address[, sid])");
        return NULL;
    }
    return free_at(f, args[0], nargs == 2 ? args[1] : NULL);
}

static PyObject *m_trace_alloc(StorageFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(f) < 0) return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "trace_alloc(address, key)");
        return NULL;
    }
    int skip = shim_connected(f);
    if (skip != 0) return skip < 0 ? NULL : Py_NewRef(Py_None);
    static PyObject *zero;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) return NULL;
    PyObject *sid = allocate_at(f, args[0], zero, args[1], NULL);
    if (sid == NULL) return NULL;
    seam_release(sid);
    Py_RETURN_NONE;
}

static PyObject *m_trace_free(StorageFeed *f, PyObject *address) {
    if (uninitialised(f) < 0) return NULL;
    int skip = shim_connected(f);
    if (skip != 0) return skip < 0 ? NULL : Py_NewRef(Py_None);
    return free_at(f, address, NULL);
}

static PyObject *m_shim_alloc(StorageFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(f) < 0) return NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "shim_alloc(ptr, size, device, stream)");
        return NULL;
    }
    PyObject *key = PyTuple_Pack(2, args[2], args[3]);
    if (key == NULL) return NULL;
    PyObject *sid = allocate_at(f, args[0], args[1], key, NULL);
    seam_release(key);
    if (sid == NULL) return NULL;
    seam_release(sid);
    Py_RETURN_NONE;
}

static PyObject *m_shim_free(StorageFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(f) < 0) return NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "shim_free(ptr, size, device, stream)");
        return NULL;
    }
    return free_at(f, args[0], NULL);
}

static PyMethodDef feed_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))m_allocate, METH_FASTCALL,
     "allocate(address, size, key[, site]): the storage id; StorageTable.allocate, by default at the op's site "
     "(or one captured now)."},
    {"free", (PyCFunction)(void (*)(void))m_free, METH_FASTCALL,
     "free(address[, sid]): the model's findings; StorageTable.free."},
    {"trace_alloc", (PyCFunction)(void (*)(void))m_trace_alloc, METH_FASTCALL,
     "trace_alloc(address, key): allocate(address, 0, key), unless the shim is connected."},
    {"shim_alloc", (PyCFunction)(void (*)(void))m_shim_alloc, METH_FASTCALL,
     "shim_alloc(ptr, size, device, stream): allocate(ptr, size, (device, stream)), returning None."},
    {"shim_free", (PyCFunction)(void (*)(void))m_shim_free, METH_FASTCALL,
     "shim_free(ptr, size, device, stream): free(ptr) (the findings)."},
    {"trace_free", (PyCFunction)m_trace_free, METH_O,
     "trace_free(address): free(address) (the findings), unless the shim is connected (None)."},
    {NULL, NULL, 0, NULL},
};

/* -- the type --------------------------------------------------------------------------------------- */

static int feed_init(StorageFeed *f, PyObject *args, PyObject *kwds) {
    PyObject *sanitizer, *lock, *shim, *live, *sizeless, *ids, *blocks_before, *allocate, *free, *has_stream,
        *stream, *on_thread, *capture;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "StorageFeed takes positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOO!O!OO!OOOOOO:StorageFeed", &sanitizer, &lock, &shim, &PyDict_Type, &live,
                          &PySet_Type, &sizeless, &ids, &PyDict_Type, &blocks_before, &allocate, &free, &has_stream,
                          &stream, &on_thread, &capture))
        return -1;
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    PyObject *release = acquire != NULL ? PyObject_GetAttrString(lock, "release") : NULL;
    if (release == NULL) {
        seam_release(acquire);
        return -1;
    }
#define SET(name) Py_XSETREF(f->name, Py_NewRef(name));
    FEED_FIELDS(SET)
#undef SET
    seam_release(acquire);
    seam_release(release);
    return 0;
}

static int feed_traverse(StorageFeed *f, visitproc visit, void *arg) {
#define VISIT(name) Py_VISIT(f->name);
    FEED_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int feed_clear(StorageFeed *f) {
#define CLEAR(name) SEAM_CLEAR(f->name);
    FEED_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void feed_dealloc(StorageFeed *f) {
    PyObject_GC_UnTrack(f);
    feed_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject StorageFeedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "npu_lifetime.sanitizer._storage_feed.StorageFeed",
    .tp_basicsize = sizeof(StorageFeed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One sanitizer's allocations and frees into its storage table and model.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)feed_init,
    .tp_traverse = (traverseproc)feed_traverse,
    .tp_clear = (inquiry)feed_clear,
    .tp_dealloc = (destructor)feed_dealloc,
    .tp_methods = feed_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_storage_feed", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__storage_feed(void) {
    str_connected = PyUnicode_InternFromString("connected");
    str_frame = PyUnicode_InternFromString("frame");
    str_site = PyUnicode_InternFromString("site");
    str_free_found = PyUnicode_InternFromString("_free_found");
    if (host_entry_init() < 0 || !str_connected || !str_frame || !str_site || !str_free_found) return NULL;
    if (PyType_Ready(&StorageFeedType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "StorageFeed", (PyObject *)&StorageFeedType) < 0) {
        seam_release(m);
        return NULL;
    }
    return m;
}
