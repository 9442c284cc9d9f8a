/* The device allocation trace's delivery, native (backends.py,
 * _TraceBackend): torch (and torch_npu) report each allocation and free of
 * their caching allocator by looking up REGISTRY.fire_callbacks and calling
 * it with the address; registry.callback_list holds the subscribers.
 *
 * Deliver(hub, freeing, device, raw_stream): a subscriber that hands the
 *   address to every sink of the hub (hub.sinks, read at each call):
 *   sink._storage_feed.trace_alloc(address, (device(), int(raw_stream(device()))))
 *   for an allocation; found = sink._storage_feed.trace_free(address) for a
 *   free, then sink._free_found(found) when it found anything (the sink's
 *   _trace_alloc / _trace_free without their Python frame).  Hub.direct
 *   does the same in Python.
 * Fire(callback_list, only, fire_callbacks): set as the registry's own
 *   fire_callbacks (an instance attribute, found before the class's method):
 *   calls `only` straight away while it is the one subscriber, else the
 *   registry's fire_callbacks (every subscriber, in order: CSAN's too).  An
 *   error of `only` is reported as unraisable, as fire_callbacks logs it
 *   (torch's caller must not see it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"
#include <stddef.h>

static PyObject *str_sinks, *str_storage_feed, *str_trace_alloc, *str_trace_free, *str_free_found;

typedef struct {
    PyObject_HEAD
    PyObject *hub, *device, *raw_stream;
    int freeing;
    vectorcallfunc vectorcall;
} Deliver;

/* (device(), int(raw_stream(device()))): the current stream's key. */
static PyObject *current_key(Deliver *d) {
    PyObject *device = PyObject_CallNoArgs(d->device);
    if (device == NULL) return NULL;
    PyObject *raw = PyObject_CallOneArg(d->raw_stream, device);
    PyObject *handle = raw != NULL ? PyNumber_Long(raw) : NULL;
    seam_release(raw);
    PyObject *key = handle != NULL ? PyTuple_Pack(2, device, handle) : NULL;
    seam_release(device);
    seam_release(handle);
    return key;
}

static int deliver_alloc(Deliver *d, PyObject *sinks, PyObject *address) {
    PyObject *key = current_key(d);
    if (key == NULL) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sinks); i++) {
        PyObject *feed = PyObject_GetAttr(PyTuple_GET_ITEM(sinks, i), str_storage_feed);
        PyObject *args[3] = {feed, address, key};
        PyObject *done = feed != NULL ? PyObject_VectorcallMethod(str_trace_alloc, args, 3, NULL) : NULL;
        seam_release(feed);
        if (done == NULL) {
            seam_release(key);
            return -1;
        }
        seam_release(done);
    }
    seam_release(key);
    return 0;
}

static int deliver_free(PyObject *sinks, PyObject *address) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sinks); i++) {
        PyObject *feed = PyObject_GetAttr(PyTuple_GET_ITEM(sinks, i), str_storage_feed);
        PyObject *args[2] = {feed, address};
        PyObject *found = feed != NULL ? PyObject_VectorcallMethod(str_trace_free, args, 2, NULL) : NULL;
        seam_release(feed);
        if (found == NULL) return -1;
        int any = found != Py_None ? PyObject_IsTrue(found) : 0;
#ifdef NPL_MUTANT_TRACE_HOOK /* tests/sanitizer/test_sanitizer_seam_mutants.py: what a free found is dropped */
        if (any > 0) any = 0;
#endif
        if (any > 0) {
            PyObject *report[2] = {PyTuple_GET_ITEM(sinks, i), found};
            PyObject *done = PyObject_VectorcallMethod(str_free_found, report, 2, NULL);
            any = done == NULL ? -1 : 0;
            seam_release(done);
        }
        seam_release(found);
        if (any < 0) return -1;
    }
    return 0;
}

static PyObject *deliver_call(Deliver *d, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a trace's delivery takes the address");
        return NULL;
    }
    PyObject *sinks = PyObject_GetAttr(d->hub, str_sinks);
    if (sinks == NULL) return NULL;
    int failed = 0;
    if (!PyTuple_Check(sinks)) {
        PyErr_SetString(PyExc_TypeError, "hub.sinks must be a tuple");
        failed = -1;
    } else if (PyTuple_GET_SIZE(sinks) > 0) {
        failed = d->freeing ? deliver_free(sinks, args[0]) : deliver_alloc(d, sinks, args[0]);
    }
    seam_release(sinks);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static int deliver_init(Deliver *d, PyObject *args, PyObject *kwds) {
    PyObject *hub, *device, *raw_stream;
    int freeing;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) > 0) ||
        !PyArg_ParseTuple(args, "OpOO:Deliver(hub, freeing, device, raw_stream)", &hub, &freeing, &device,
                          &raw_stream))
        return -1;
    Py_XSETREF(d->hub, Py_NewRef(hub));
    Py_XSETREF(d->device, Py_NewRef(device));
    Py_XSETREF(d->raw_stream, Py_NewRef(raw_stream));
    d->freeing = freeing;
    d->vectorcall = (vectorcallfunc)deliver_call;
    return 0;
}

static int deliver_traverse(Deliver *d, visitproc visit, void *arg) {
    Py_VISIT(d->hub);
    Py_VISIT(d->device);
    Py_VISIT(d->raw_stream);
    return 0;
}

static int deliver_clear(Deliver *d) {
    SEAM_CLEAR(d->hub);
    SEAM_CLEAR(d->device);
    SEAM_CLEAR(d->raw_stream);
    return 0;
}

static void deliver_dealloc(Deliver *d) {
    PyObject_GC_UnTrack(d);
    deliver_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyTypeObject DeliverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "npu_lifetime.sanitizer._trace_hook.Deliver",
    .tp_basicsize = sizeof(Deliver),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A trace subscriber: an allocation or free to every sink of a hub.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)deliver_init,
    .tp_traverse = (traverseproc)deliver_traverse,
    .tp_clear = (inquiry)deliver_clear,
    .tp_dealloc = (destructor)deliver_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Deliver, vectorcall),
};

/* -- Fire ---------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *callbacks, *only, *fire;
    vectorcallfunc vectorcall;
} Fire;

static PyObject *fire_call(Fire *f, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyList_GET_SIZE(f->callbacks) != 1 || PyList_GET_ITEM(f->callbacks, 0) != f->only)
        return PyObject_Vectorcall(f->fire, args, nargsf, kwnames);
    PyObject *only = Py_NewRef(f->only);
    PyObject *done = PyObject_Vectorcall(only, args, nargsf, kwnames);
    if (done == NULL) PyErr_WriteUnraisable(only);
    seam_release(only);
    seam_release(done);
    Py_RETURN_NONE;
}

static int fire_init(Fire *f, PyObject *args, PyObject *kwds) {
    PyObject *callbacks, *only, *fire;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) > 0) ||
        !PyArg_ParseTuple(args, "O!OO:Fire(callback_list, only, fire_callbacks)", &PyList_Type, &callbacks, &only,
                          &fire))
        return -1;
    Py_XSETREF(f->callbacks, Py_NewRef(callbacks));
    Py_XSETREF(f->only, Py_NewRef(only));
    Py_XSETREF(f->fire, Py_NewRef(fire));
    f->vectorcall = (vectorcallfunc)fire_call;
    return 0;
}

static int fire_traverse(Fire *f, visitproc visit, void *arg) {
    Py_VISIT(f->callbacks);
    Py_VISIT(f->only);
    Py_VISIT(f->fire);
    return 0;
}

static int fire_clear(Fire *f) {
    SEAM_CLEAR(f->callbacks);
    SEAM_CLEAR(f->only);
    SEAM_CLEAR(f->fire);
    return 0;
}

static void fire_dealloc(Fire *f) {
    PyObject_GC_UnTrack(f);
    fire_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *fire_original(Fire *f, void *closure) {
    (void)closure;
    return Py_NewRef(f->fire != NULL ? f->fire : Py_None);
}

static PyGetSetDef fire_getset[] = {
    {"original", (getter)fire_original, NULL, "The registry's fire_callbacks it stands in for.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FireType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "npu_lifetime.sanitizer._trace_hook.Fire",
    .tp_basicsize = sizeof(Fire),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A trace registry's fire_callbacks: its one subscriber called straight away.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fire_init,
    .tp_traverse = (traverseproc)fire_traverse,
    .tp_clear = (inquiry)fire_clear,
    .tp_dealloc = (destructor)fire_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Fire, vectorcall),
    .tp_getset = fire_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_trace_hook", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__trace_hook(void) {
    str_sinks = PyUnicode_InternFromString("sinks");
    str_storage_feed = PyUnicode_InternFromString("_storage_feed");
    str_trace_alloc = PyUnicode_InternFromString("trace_alloc");
    str_trace_free = PyUnicode_InternFromString("trace_free");
    str_free_found = PyUnicode_InternFromString("_free_found");
    if (!str_sinks || !str_storage_feed || !str_trace_alloc || !str_trace_free || !str_free_found) return NULL;
    if (PyType_Ready(&DeliverType) < 0 || PyType_Ready(&FireType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Deliver", (PyObject *)&DeliverType) < 0 ||
        PyModule_AddObjectRef(m, "Fire", (PyObject *)&FireType) < 0) {
        seam_release(m);
        return NULL;
    }
    return m;
}
