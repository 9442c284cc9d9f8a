/* The sanitizer's device-event handlers, native: an event's creation,
 * deletion, record and wait, a stream waiting for another, a stream's or the
 * device's synchronisation, into one sanitizer's lifetime model in one C
 * call, without the Python frames of sanitizer.py's on_event_created,
 * on_event_deleted, on_event_record, on_event_wait, on_wait_stream,
 * on_stream_sync and on_device_sync.  Those stay the reference: the same
 * model calls with the same arguments, in the same order, under the lock,
 * with stream keys made known as self._stream(key) does; _keep is called
 * only when the model found something (it does nothing otherwise).  The
 * sanitizer sets these methods as its own attributes, so every delivery
 * (_event_hook.c, Hub.event, an op's held events) reaches them.
 *
 * EventFeed(sanitizer, lock, known, model, stream, sync_site, keep)
 *   sanitizer: its _host and _set_host() (host_entry.h)
 *   lock:      the sanitizer's RLock (acquire / release; the host check is here)
 *   known:     sanitizer._known_events (a set)
 *   model:     the lifetime model; its methods are looked up once, here
 *   stream:    sanitizer._stream(key): creates a stream the model lacks
 *   sync_site: sanitizer._sync_site for a caller with no frame, the model's lazy site
 *   keep:      sanitizer._keep(found)
 */
#include "host_entry.h"

#define MODEL_METHODS(X)                                                                                        \
    X(has_stream) X(create_event) X(delete_event) X(record_event) X(wait_event) X(wait_stream)                   \
        X(synchronize_stream) X(synchronize_device)

#define EVENT_FEED_FIELDS(X) X(sanitizer) X(acquire) X(release) X(known) X(stream) X(sync_site) X(keep) MODEL_METHODS(X)

#define DECLARE(name) PyObject *name;
typedef struct {
    PyObject_HEAD EVENT_FEED_FIELDS(DECLARE)
} EventFeed;
#undef DECLARE

static int enter(EventFeed *f) {
    if (f->known == NULL) { /* EventFeed.__new__ without __init__ */
        PyErr_SetString(PyExc_TypeError, "this EventFeed was not initialised");
        return -1;
    }
    return host_enter(f->acquire, f->release, f->sanitizer);
}

static PyObject *leave(EventFeed *f, PyObject *result) { return host_leave(f->release, result); }

static int ensure_stream(EventFeed *f, PyObject *key) { return host_ensure_stream(f->has_stream, f->stream, key); }

/* callable(*args) with its result dropped: 0, or -1. */
static int call_dropped(PyObject *callable, PyObject *const *args, size_t nargs) {
    PyObject *done = PyObject_Vectorcall(callable, args, nargs, NULL);
    if (done == NULL) return -1;
    seam_release(done);
    return 0;
}

/* sanitizer._keep(found) when found is a non-empty list (steals found). 0, or -1. */
static int keep_found(EventFeed *f, PyObject *found) {
    if (found == NULL) return -1;
    int any = PyObject_IsTrue(found);
    int failed = any < 0 || (any && call_dropped(f->keep, &found, 1) < 0);
    seam_release(found);
    return failed ? -1 : 0;
}

/* The result of a handler whose body ran with the lock held: None, or NULL with its error. */
static PyObject *done(EventFeed *f, int failed) { return leave(f, failed ? NULL : Py_NewRef(Py_None)); }

static int check_nargs(Py_ssize_t nargs, Py_ssize_t expected, const char *usage) {
    if (nargs == expected) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd argument%s (%zd given)", usage, expected, expected == 1 ? "" : "s",
                 nargs);
    return -1;
}

/* -- the handlers ----------------------------------------------------------------------------------- */

static PyObject *m_on_event_created(EventFeed *f, PyObject *event) {
    if (enter(f) < 0) return NULL;
    return done(f, PySet_Add(f->known, event) < 0 || call_dropped(f->create_event, &event, 1) < 0);
}

static PyObject *m_on_event_deleted(EventFeed *f, PyObject *event) {
    if (enter(f) < 0) return NULL;
    return done(f, PySet_Discard(f->known, event) < 0 || call_dropped(f->delete_event, &event, 1) < 0);
}

static PyObject *m_on_event_record(EventFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs(nargs, 2, "on_event_record(event, key)") < 0 || enter(f) < 0) return NULL;
    PyObject *event = args[0], *key = args[1];
    int failed = PySet_Add(f->known, event) < 0 || call_dropped(f->create_event, &event, 1) < 0 ||
                 ensure_stream(f, key) < 0;
#ifndef NPL_MUTANT_EVENT_FEED /* tests/test_sanitizer_seam_mutants.py: the record never reaches the model */
    failed = failed || call_dropped(f->record_event, args, 2) < 0;
#endif
    return done(f, failed);
}

/* A known event: the model's wait, its findings kept (a wait on an event not recorded yet is one, dropped by _keep). */
static int wait_known(EventFeed *f, PyObject *event, PyObject *key) {
    if (ensure_stream(f, key) < 0) return -1;
    PyObject *wait[2] = {key, event};
    return keep_found(f, PyObject_Vectorcall(f->wait_event, wait, 2, NULL));
}

static PyObject *m_on_event_wait(EventFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs(nargs, 2, "on_event_wait(event, key)") < 0 || enter(f) < 0) return NULL;
    int known = PySet_Contains(f->known, args[0]); /* else created and recorded before we were enabled */
    return done(f, known < 0 || (known && wait_known(f, args[0], args[1]) < 0));
}

static PyObject *m_on_wait_stream(EventFeed *f, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs(nargs, 2, "on_wait_stream(waiter, waitee)") < 0 || enter(f) < 0) return NULL;
    int failed = ensure_stream(f, args[0]) < 0 || ensure_stream(f, args[1]) < 0 ||
                 call_dropped(f->wait_stream, args, 2) < 0;
    return done(f, failed);
}

static PyObject *m_on_stream_sync(EventFeed *f, PyObject *key) {
    if (enter(f) < 0) return NULL;
    PyObject *call[2] = {key, f->sync_site};
    return done(f, ensure_stream(f, key) < 0 || call_dropped(f->synchronize_stream, call, 2) < 0);
}

static PyObject *m_on_device_sync(EventFeed *f, PyObject *device) {
    if (enter(f) < 0) return NULL;
    PyObject *call[2] = {device, f->sync_site};
    return done(f, call_dropped(f->synchronize_device, call, 2) < 0);
}

static PyMethodDef feed_methods[] = {
    {"on_event_created", (PyCFunction)m_on_event_created, METH_O, "sanitizer.on_event_created(event)"},
    {"on_event_deleted", (PyCFunction)m_on_event_deleted, METH_O, "sanitizer.on_event_deleted(event)"},
    {"on_event_record", (PyCFunction)(void (*)(void))m_on_event_record, METH_FASTCALL,
     "sanitizer.on_event_record(event, key)"},
    {"on_event_wait", (PyCFunction)(void (*)(void))m_on_event_wait, METH_FASTCALL,
     "sanitizer.on_event_wait(event, key)"},
    {"on_wait_stream", (PyCFunction)(void (*)(void))m_on_wait_stream, METH_FASTCALL,
     "sanitizer.on_wait_stream(waiter, waitee)"},
    {"on_stream_sync", (PyCFunction)m_on_stream_sync, METH_O, "sanitizer.on_stream_sync(key)"},
    {"on_device_sync", (PyCFunction)m_on_device_sync, METH_O, "sanitizer.on_device_sync(device)"},
    {NULL, NULL, 0, NULL},
};

/* -- the type --------------------------------------------------------------------------------------- */

static int feed_init(EventFeed *f, PyObject *args, PyObject *kwds) {
    PyObject *sanitizer, *lock, *known, *model, *stream, *sync_site, *keep;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "EventFeed takes positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOO!OOOO:EventFeed", &sanitizer, &lock, &PySet_Type, &known, &model, &stream,
                          &sync_site, &keep))
        return -1;
    PyObject *acquire = NULL, *release = NULL;
#define LOOKUP(name) PyObject *name = NULL;
    MODEL_METHODS(LOOKUP)
#undef LOOKUP
    int failed = (acquire = PyObject_GetAttrString(lock, "acquire")) == NULL ||
                 (release = PyObject_GetAttrString(lock, "release")) == NULL
#define LOOKUP(name) || (name = PyObject_GetAttrString(model, #name)) == NULL
                 MODEL_METHODS(LOOKUP)
#undef LOOKUP
        ;
    if (!failed) {
#define SET(name) Py_XSETREF(f->name, Py_NewRef(name));
        EVENT_FEED_FIELDS(SET)
#undef SET
    }
    seam_release(acquire);
    seam_release(release);
#define DROP(name) seam_release(name);
    MODEL_METHODS(DROP)
#undef DROP
    return failed ? -1 : 0;
}

static int feed_traverse(EventFeed *f, visitproc visit, void *arg) {
#define VISIT(name) Py_VISIT(f->name);
    EVENT_FEED_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int feed_clear(EventFeed *f) {
#define CLEAR(name) SEAM_CLEAR(f->name);
    EVENT_FEED_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void feed_dealloc(EventFeed *f) {
    PyObject_GC_UnTrack(f);
    feed_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject EventFeedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "npu_lifetime.sanitizer._event_feed.EventFeed",
    .tp_basicsize = sizeof(EventFeed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One sanitizer's device-event handlers, into its lifetime model.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)feed_init,
    .tp_traverse = (traverseproc)feed_traverse,
    .tp_clear = (inquiry)feed_clear,
    .tp_dealloc = (destructor)feed_dealloc,
    .tp_methods = feed_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_event_feed", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__event_feed(void) {
    if (host_entry_init() < 0 || PyType_Ready(&EventFeedType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "EventFeed", (PyObject *)&EventFeedType) < 0) {
        seam_release(m);
        return NULL;
    }
    return m;
}
