/* The shim's allocation and free hooks, native: the C functions the shim
 * calls on every allocation and free (npl_set_hooks), relaying each to the
 * Python subscribers of hooks.py without a ctypes callback (which converts
 * its arguments through ctypes' type machinery and enters a Python frame of
 * its own on every call).  hooks.py's _on_alloc / _on_free do the same
 * through ctypes where this was not built, and are what it follows.
 *
 * set_subscribers(((on_alloc, on_free, on_findings), ...))
 *   on_alloc(ptr, size, device, stream), on_free(ptr, size, device, stream):
 *     either may be None.  on_findings(ptr, found): when not None, called
 *     after on_free with what on_free returned, if that is a non-empty list
 *     (the sanitizer's storage feed returns the free's findings; the Python
 *     handling of a finding then runs only for a free that has one).
 * alloc_hook(), free_hook(): the hooks' addresses, for npl_set_hooks.
 *
 * A hook may run on any thread, with or without the GIL: it takes the GIL
 * (PyGILState_Ensure) and reads the subscribers under it, as set_subscribers
 * writes them.  After the interpreter began finalising it does nothing
 * (hooks.py clears the hooks at exit; this covers a free racing that).  An
 * exception in a subscriber is reported as unraisable and the relay goes on,
 * as a ctypes callback does: the allocator never sees it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../seam.h"
#include <stdint.h>

static PyObject *subscribers; /* a tuple of (on_alloc, on_free, on_findings); NULL: none */

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* Calls fn(ptr, size, device, stream); returns its result (new reference) or NULL, the error reported. */
static PyObject *call_subscriber(PyObject *fn, PyObject *const *args) {
    PyObject *result = PyObject_Vectorcall(fn, args, 4, NULL);
    if (result == NULL) PyErr_WriteUnraisable(fn);
    return result;
}

/* The findings' handler, for a non-empty list returned by on_free. */
static void hand_findings(PyObject *on_findings, PyObject *ptr, PyObject *found) {
#ifdef NPL_MUTANT_HOOK_RELAY /* tests/test_seam_mutants.py: what a free found never reaches on_findings */
    on_findings = Py_None;
#endif
    if (on_findings == Py_None || !PyList_Check(found) || PyList_GET_SIZE(found) == 0) return;
    PyObject *args[2] = {ptr, found};
    PyObject *done = PyObject_Vectorcall(on_findings, args, 2, NULL);
    if (done == NULL) PyErr_WriteUnraisable(on_findings);
    seam_release(done);
}

/* slot: 0 for on_alloc, 1 for on_free. */
static void relay(int slot, void *ptr, size_t size, int device, void *stream) {
    if (!Py_IsInitialized() || finalizing()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    SeamSaved saved = seam_enter(); /* a free from a release while an exception is set (seam.h) */
    PyObject *subs = subscribers != NULL ? Py_NewRef(subscribers) : NULL; /* a set_subscribers in a call */
    if (subs != NULL && PyTuple_GET_SIZE(subs) > 0) {
        PyObject *args[4] = {PyLong_FromUnsignedLongLong((uintptr_t)ptr), PyLong_FromSize_t(size),
                             PyLong_FromLong(device), PyLong_FromUnsignedLongLong((uintptr_t)stream)};
        if (args[0] && args[1] && args[2] && args[3]) {
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(subs); i++) {
                PyObject *sub = PyTuple_GET_ITEM(subs, i);
                PyObject *fn = PyTuple_GET_ITEM(sub, slot);
                if (fn == Py_None) continue;
                PyObject *result = call_subscriber(fn, args);
                if (result != NULL && slot == 1) hand_findings(PyTuple_GET_ITEM(sub, 2), args[0], result);
                seam_release(result);
            }
        } else {
            PyErr_WriteUnraisable(NULL);
        }
        for (int i = 0; i < 4; i++) seam_release(args[i]);
    }
    seam_release(subs);
    seam_leave(saved, NULL);
    PyGILState_Release(gil);
}

static void relay_alloc(void *ptr, size_t size, int device, void *stream, void *ctx) {
    (void)ctx;
    relay(0, ptr, size, device, stream);
}

static void relay_free(void *ptr, size_t size, int device, void *stream, void *ctx) {
    (void)ctx;
    relay(1, ptr, size, device, stream);
}

static PyObject *set_subscribers(PyObject *self, PyObject *subs) {
    (void)self;
    if (!PyTuple_Check(subs)) {
        PyErr_SetString(PyExc_TypeError, "set_subscribers(((on_alloc, on_free, on_findings), ...))");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(subs); i++) {
        PyObject *sub = PyTuple_GET_ITEM(subs, i);
        if (!PyTuple_Check(sub) || PyTuple_GET_SIZE(sub) != 3) {
            PyErr_SetString(PyExc_TypeError, "each subscriber is a tuple (on_alloc, on_free, on_findings)");
            return NULL;
        }
    }
    Py_XSETREF(subscribers, Py_NewRef(subs));
    Py_RETURN_NONE;
}

static PyObject *alloc_hook(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromVoidPtr((void *)(uintptr_t)&relay_alloc);
}

static PyObject *free_hook(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromVoidPtr((void *)(uintptr_t)&relay_free);
}

static PyMethodDef methods[] = {
    {"set_subscribers", set_subscribers, METH_O, "Sets the subscribers: a tuple of (on_alloc, on_free, on_findings)."},
    {"alloc_hook", alloc_hook, METH_NOARGS, "The address of the allocation hook (an npl_alloc_hook)."},
    {"free_hook", free_hook, METH_NOARGS, "The address of the free hook (an npl_free_hook)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hook_relay", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hook_relay(void) { return PyModule_Create(&module); }
