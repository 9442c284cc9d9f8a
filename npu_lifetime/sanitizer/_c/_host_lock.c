/* The sanitizer's lock, native: sanitizer.py's _HostLock without its
 * Python __enter__ frame (it is entered a few times per op).
 *
 * HostLock(rlock, sanitizer): a reentrant lock (rlock: a threading.RLock)
 * whose entering also names the calling thread as the model's host: when
 * sanitizer._host is not the calling thread, sanitizer._set_host() is called
 * with the lock held (if it fails, the lock is released and the error
 * raised).  acquire / release are rlock's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"
#include <pythread.h>

typedef struct {
    PyObject_HEAD
    PyObject *acquire, *release, *sanitizer;
} HostLock;

static PyObject *str_host, *str_set_host;

/* Names the calling thread as the host if it is not; 0, or -1 with an error. */
static int set_host(HostLock *l) {
#ifdef NPL_MUTANT_HOST_LOCK /* tests/test_sanitizer_seam_mutants.py: every thread is taken for the host */
    return 0;
#endif
    PyObject *host = PyObject_GetAttr(l->sanitizer, str_host);
    if (host == NULL) return -1;
    unsigned long ident = PyLong_AsUnsignedLong(host);
    seam_release(host);
    if (ident == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (ident == PyThread_get_thread_ident()) return 0;
    PyObject *done = PyObject_CallMethodNoArgs(l->sanitizer, str_set_host);
    if (done == NULL) return -1;
    seam_release(done);
    return 0;
}

static PyObject *lock_enter(HostLock *l, PyObject *unused) {
    (void)unused;
    PyObject *held = PyObject_CallNoArgs(l->acquire);
    if (held == NULL) return NULL;
    seam_release(held);
    if (set_host(l) < 0) {
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        seam_release(PyObject_CallNoArgs(l->release));
        PyErr_Restore(type, value, trace);
        return NULL;
    }
    return Py_NewRef((PyObject *)l);
}

static PyObject *lock_exit(HostLock *l, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    (void)nargs;
    PyObject *done = PyObject_CallNoArgs(l->release);
    if (done == NULL) return NULL;
    seam_release(done);
    Py_RETURN_FALSE;
}

static PyObject *lock_acquire(HostLock *l, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(l->acquire, args, nargsf, kwnames);
}

static PyObject *lock_release(HostLock *l, PyObject *unused) {
    (void)unused;
    return PyObject_CallNoArgs(l->release);
}

static PyMethodDef lock_methods[] = {
    {"__enter__", (PyCFunction)lock_enter, METH_NOARGS, "Acquires the lock; the calling thread becomes the host."},
    {"__exit__", (PyCFunction)(void (*)(void))lock_exit, METH_FASTCALL, "Releases the lock."},
    {"acquire", (PyCFunction)(void (*)(void))lock_acquire, METH_FASTCALL | METH_KEYWORDS, "The RLock's acquire."},
    {"release", (PyCFunction)lock_release, METH_NOARGS, "The RLock's release."},
    {NULL, NULL, 0, NULL},
};

static int lock_init(HostLock *l, PyObject *args, PyObject *kwds) {
    PyObject *rlock, *sanitizer;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) > 0) ||
        !PyArg_ParseTuple(args, "OO:HostLock(rlock, sanitizer)", &rlock, &sanitizer))
        return -1;
    PyObject *acquire = PyObject_GetAttrString(rlock, "acquire");
    PyObject *release = acquire != NULL ? PyObject_GetAttrString(rlock, "release") : NULL;
    if (release == NULL) {
        seam_release(acquire);
        return -1;
    }
    Py_XSETREF(l->acquire, acquire);
    Py_XSETREF(l->release, release);
    Py_XSETREF(l->sanitizer, Py_NewRef(sanitizer));
    return 0;
}

static int lock_traverse(HostLock *l, visitproc visit, void *arg) {
    Py_VISIT(l->acquire);
    Py_VISIT(l->release);
    Py_VISIT(l->sanitizer);
    return 0;
}

static int lock_clear(HostLock *l) {
    SEAM_CLEAR(l->acquire);
    SEAM_CLEAR(l->release);
    SEAM_CLEAR(l->sanitizer);
    return 0;
}

static void lock_dealloc(HostLock *l) {
    PyObject_GC_UnTrack(l);
    lock_clear(l);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

static PyTypeObject HostLockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "npu_lifetime.sanitizer._host_lock.HostLock",
    .tp_basicsize = sizeof(HostLock),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The sanitizer's reentrant lock; entering it names the calling thread as the model's host.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lock_init,
    .tp_traverse = (traverseproc)lock_traverse,
    .tp_clear = (inquiry)lock_clear,
    .tp_dealloc = (destructor)lock_dealloc,
    .tp_methods = lock_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_host_lock", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__host_lock(void) {
    str_host = PyUnicode_InternFromString("_host");
    str_set_host = PyUnicode_InternFromString("_set_host");
    if (!str_host || !str_set_host) return NULL;
    if (PyType_Ready(&HostLockType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "HostLock", (PyObject *)&HostLockType) < 0) {
        seam_release(m);
        return NULL;
    }
    return m;
}
