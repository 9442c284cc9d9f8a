/* Entering the sanitizer's lock from C, as sanitizer.py's _HostLock.__enter__
 * does (acquire, then name the calling thread as the model's host when it is
 * not), leaving it with the pending error kept, and sanitizer._stream(key)'s
 * "create the stream the model lacks".  Shared by the native feeds
 * (_storage_feed.c, _event_feed.c); each calls host_entry_init() once from
 * its module init.
 */
#ifndef NPU_LIFETIME_HOST_ENTRY_H
#define NPU_LIFETIME_HOST_ENTRY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"
#include <pythread.h>

static PyObject *host_entry_str_host, *host_entry_str_set_host;

static inline int host_entry_init(void) {
    host_entry_str_host = PyUnicode_InternFromString("_host");
    host_entry_str_set_host = PyUnicode_InternFromString("_set_host");
    return host_entry_str_host != NULL && host_entry_str_set_host != NULL ? 0 : -1;
}

/* acquire(), then sanitizer._set_host() unless sanitizer._host is this thread;
 * 0, or -1 with an error and the lock released. */
static inline int host_enter(PyObject *acquire, PyObject *release, PyObject *sanitizer) {
    PyObject *held = PyObject_CallNoArgs(acquire);
    if (held == NULL) return -1;
    seam_release(held);
    PyObject *host = PyObject_GetAttr(sanitizer, host_entry_str_host);
    if (host == NULL) goto failed;
    unsigned long ident = PyLong_AsUnsignedLong(host);
    seam_release(host);
    if (ident == (unsigned long)-1 && PyErr_Occurred()) goto failed;
    if (ident != PyThread_get_thread_ident()) {
        PyObject *done = PyObject_CallMethodNoArgs(sanitizer, host_entry_str_set_host);
        if (done == NULL) goto failed;
        seam_release(done);
    }
    return 0;
failed:;
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    seam_release(PyObject_CallNoArgs(release));
    PyErr_Restore(type, value, trace);
    return -1;
}

/* release(), keeping a pending error; returns result (stolen), or NULL if the release failed. */
static inline PyObject *host_leave(PyObject *release, PyObject *result) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyObject *done = PyObject_CallNoArgs(release);
    if (done == NULL) {
        seam_release(result);
        seam_release(type);
        seam_release(value);
        seam_release(trace);
        return NULL;
    }
    seam_release(done);
    PyErr_Restore(type, value, trace);
    return result;
}

/* sanitizer._stream(key) with the lock held: stream(key) only when has_stream(key) is false. 0, or -1. */
static inline int host_ensure_stream(PyObject *has_stream, PyObject *stream, PyObject *key) {
    PyObject *has = PyObject_CallOneArg(has_stream, key);
    if (has == NULL) return -1;
    int known = PyObject_IsTrue(has);
    seam_release(has);
    if (known != 0) return known < 0 ? -1 : 0;
    PyObject *made = PyObject_CallOneArg(stream, key);
    if (made == NULL) return -1;
    seam_release(made);
    return 0;
}

#endif
