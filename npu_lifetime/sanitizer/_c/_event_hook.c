/* Device events' delivery, native (hub.py's Hub.event without its Python
 * frame, nor the trace lambda's): stream creation, event creation, record,
 * wait, synchronisation and deletion, stream and device synchronisation.
 *
 * Event(hub, name, held, on_thread, device, keying): a subscriber (a trace
 *   callback, or a simulated-device listener's method) for the device event
 *   `name`.  Called with the event's arguments, it reads hub.sinks; with
 *   none, it does nothing.  The arguments it delivers are, by `keying`:
 *   0: as given; 1: the last one, a stream handle, made the stream's key
 *   (device(), handle); 2: (device(),) for an event with no argument.
 *   Then, as Hub.event: when `held` and an op is in progress on this thread
 *   (on_thread.frame is not None), (hub, name, args) is appended to the
 *   frame's `held` list; else sink.<name>(*args) for each sink, in order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"
#include <stddef.h>

static PyObject *str_sinks, *str_frame, *str_held;

enum { KEEP_ARGS = 0, KEY_LAST = 1, DEVICE_ONLY = 2 };

typedef struct {
    PyObject_HEAD
    PyObject *hub, *name, *on_thread, *device;
    int held, keying;
    vectorcallfunc vectorcall;
} Event;

static PyObject *tuple_of(PyObject *const *items, Py_ssize_t n) {
    PyObject *tuple = PyTuple_New(n);
    if (tuple == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(items[i]));
    return tuple;
}

/* The arguments the sinks get, as a new tuple. */
static PyObject *delivered_args(Event *e, PyObject *const *args, Py_ssize_t nargs) {
    if (e->keying == KEEP_ARGS) return tuple_of(args, nargs);
    if (e->keying == DEVICE_ONLY && nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "this device event takes no argument");
        return NULL;
    }
    if (e->keying == KEY_LAST && nargs == 0) {
        PyErr_SetString(PyExc_TypeError, "this device event takes a stream handle last");
        return NULL;
    }
    PyObject *device = PyObject_CallNoArgs(e->device);
    if (device == NULL) return NULL;
    if (e->keying == DEVICE_ONLY) {
        PyObject *only = PyTuple_Pack(1, device);
        seam_release(device);
        return only;
    }
    PyObject *key = PyTuple_Pack(2, device, args[nargs - 1]);
    seam_release(device);
    if (key == NULL) return NULL;
    PyObject *delivered = tuple_of(args, nargs);
    if (delivered != NULL) Py_SETREF(PyTuple_GET_ITEM(delivered, nargs - 1), key);
    else seam_release(key);
    return delivered;
}

/* Held by the op in progress: 1 if it was, 0 if there is none, -1 on error. */
static int hold(Event *e, PyObject *delivered) {
    PyObject *frame = PyObject_GetAttr(e->on_thread, str_frame);
    if (frame == NULL) return -1;
    if (frame == Py_None) {
        seam_release(frame);
        return 0;
    }
    PyObject *held = PyObject_GetAttr(frame, str_held);
    seam_release(frame);
    if (held == NULL) return -1;
    PyObject *entry = PyTuple_Pack(3, e->hub, e->name, delivered);
    int failed = entry == NULL ? -1 : PyList_Check(held) ? PyList_Append(held, entry) : -2;
    if (failed == -2) PyErr_SetString(PyExc_TypeError, "an op frame's held events must be a list");
    seam_release(entry);
    seam_release(held);
    return failed < 0 ? -1 : 1;
}

static int deliver(Event *e, PyObject *sinks, PyObject *delivered) {
    Py_ssize_t nargs = PyTuple_GET_SIZE(delivered);
    PyObject *call[8];
    if (nargs + 1 > (Py_ssize_t)(sizeof call / sizeof call[0])) {
        PyErr_SetString(PyExc_TypeError, "too many arguments for a device event");
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) call[i + 1] = PyTuple_GET_ITEM(delivered, i);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sinks); i++) {
        call[0] = PyTuple_GET_ITEM(sinks, i);
        PyObject *done = PyObject_VectorcallMethod(e->name, call, (size_t)(nargs + 1), NULL);
        if (done == NULL) return -1;
        seam_release(done);
    }
    return 0;
}

static PyObject *event_call(Event *e, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "a device event takes no keyword arguments");
        return NULL;
    }
    PyObject *sinks = PyObject_GetAttr(e->hub, str_sinks);
    if (sinks == NULL) return NULL;
    if (!PyTuple_Check(sinks)) {
        seam_release(sinks);
        PyErr_SetString(PyExc_TypeError, "hub.sinks must be a tuple");
        return NULL;
    }
    int failed = 0;
    if (PyTuple_GET_SIZE(sinks) > 0) {
        PyObject *delivered = delivered_args(e, args, PyVectorcall_NARGS(nargsf));
#ifdef NPL_MUTANT_EVENT_HOOK /* tests/sanitizer/test_sanitizer_seam_mutants.py: an event issued inside an op
                              * reaches the sinks at once, before the op's accesses */
        e->held = 0;
#endif
        int held = delivered == NULL ? -1 : e->held ? hold(e, delivered) : 0;
        failed = held < 0 ? -1 : held == 0 ? deliver(e, sinks, delivered) : 0;
        seam_release(delivered);
    }
    seam_release(sinks);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static int event_init(Event *e, PyObject *args, PyObject *kwds) {
    PyObject *hub, *name, *on_thread, *device;
    int held, keying;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) > 0) ||
        !PyArg_ParseTuple(args, "OUpOOi:Event(hub, name, held, on_thread, device, keying)", &hub, &name, &held,
                          &on_thread, &device, &keying))
        return -1;
    if (keying < KEEP_ARGS || keying > DEVICE_ONLY || (keying != KEEP_ARGS && !PyCallable_Check(device))) {
        PyErr_SetString(PyExc_ValueError, "keying is 0, 1 or 2; 1 and 2 need device()");
        return -1;
    }
    Py_XSETREF(e->hub, Py_NewRef(hub));
    Py_XSETREF(e->name, Py_NewRef(name));
    PyUnicode_InternInPlace(&e->name);
    Py_XSETREF(e->on_thread, Py_NewRef(on_thread));
    Py_XSETREF(e->device, Py_NewRef(device));
    e->held = held;
    e->keying = keying;
    e->vectorcall = (vectorcallfunc)event_call;
    return 0;
}

static int event_traverse(Event *e, visitproc visit, void *arg) {
    Py_VISIT(e->hub);
    Py_VISIT(e->name);
    Py_VISIT(e->on_thread);
    Py_VISIT(e->device);
    return 0;
}

static int event_clear(Event *e) {
    SEAM_CLEAR(e->hub);
    SEAM_CLEAR(e->name);
    SEAM_CLEAR(e->on_thread);
    SEAM_CLEAR(e->device);
    return 0;
}

static void event_dealloc(Event *e) {
    PyObject_GC_UnTrack(e);
    event_clear(e);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *event_get_name(Event *e, void *closure) {
    (void)closure;
    return Py_NewRef(e->name != NULL ? e->name : Py_None);
}

static PyGetSetDef event_getset[] = {
    {"name", (getter)event_get_name, NULL, "The device event it delivers.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EventType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "npu_lifetime.sanitizer._event_hook.Event",
    .tp_basicsize = sizeof(Event),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A device event to every sink of a hub, or held by the op in progress.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)event_init,
    .tp_traverse = (traverseproc)event_traverse,
    .tp_clear = (inquiry)event_clear,
    .tp_dealloc = (destructor)event_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Event, vectorcall),
    .tp_getset = event_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_event_hook", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__event_hook(void) {
    str_sinks = PyUnicode_InternFromString("sinks");
    str_frame = PyUnicode_InternFromString("frame");
    str_held = PyUnicode_InternFromString("held");
    if (!str_sinks || !str_frame || !str_held) return NULL;
    if (PyType_Ready(&EventType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "KEEP_ARGS", KEEP_ARGS) < 0 ||
        PyModule_AddIntConstant(m, "KEY_LAST", KEY_LAST) < 0 ||
        PyModule_AddIntConstant(m, "DEVICE_ONLY", DEVICE_ONLY) < 0 ||
        PyModule_AddObjectRef(m, "Event", (PyObject *)&EventType) < 0) {
        seam_release(m);
        return NULL;
    }
    return m;
}
