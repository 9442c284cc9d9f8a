/* The seam between this package's C and Python: the two rules every C part
 * keeps (the sanitizer's extensions, the shim's hook relay, the native
 * fallback's holds).
 *
 * 1. Nothing that can run code when released is released while an
 *    exception is set.  Releasing a tensor, a storage, an event or a stream
 *    (or anything holding one: an op's outputs, an access, a held frame)
 *    frees device memory, and torch's device trace then calls into Python
 *    (torch_npu's hook does it through pybind11): that call fails with the
 *    exception still set, or clears it, and the caller is left returning
 *    NULL with no exception (SystemError).  seam_release() keeps the
 *    pending exception aside around a release that may run code.
 * 2. A call into Python from C that Python did not make (an allocator hook,
 *    a device trace delivery) starts with no exception set and leaves the
 *    caller's as it found it: seam_enter() / seam_leave().  An error of the
 *    call itself is reported as unraisable in between.
 */
#ifndef NPU_LIFETIME_SEAM_H
#define NPU_LIFETIME_SEAM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Py_XDECREF, with a pending exception kept across a release that frees
 * the object (only then can code run: a shared reference costs a compare).
 * seam_release(obj) takes any object pointer, as Py_XDECREF does. */
static inline void seam_release_object(PyObject *obj) {
    if (obj == NULL) return;
    if (Py_REFCNT(obj) > 1 || !PyErr_Occurred()) {
        Py_DECREF(obj);
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    Py_DECREF(obj);
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL); /* raised while releasing: the pending one wins */
    PyErr_Restore(type, value, traceback);
}

#define seam_release(obj) seam_release_object((PyObject *)(obj))

/* Py_CLEAR through seam_release. */
#define SEAM_CLEAR(op)                     \
    do {                                   \
        PyObject *seam_tmp_ = (PyObject *)(op); \
        (op) = NULL;                       \
        seam_release(seam_tmp_);           \
    } while (0)

typedef struct {
    PyObject *type, *value, *traceback;
} SeamSaved;

/* Before a call into Python from C code Python did not call: the caller's
 * pending exception, set aside. */
static inline SeamSaved seam_enter(void) {
    SeamSaved saved;
    PyErr_Fetch(&saved.type, &saved.value, &saved.traceback);
    return saved;
}

/* After it: an error the call left is reported as unraisable (context:
 * what was called), then the caller's exception is put back. */
static inline void seam_leave(SeamSaved saved, PyObject *context) {
    if (PyErr_Occurred()) PyErr_WriteUnraisable(context);
    PyErr_Restore(saved.type, saved.value, saved.traceback);
}

#endif
