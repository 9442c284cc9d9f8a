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
    Py_DECREF(held);
    PyObject *host = PyObject_GetAttr(sanitizer, host_entry_str_host);
    if (host == NULL) goto failed;
    unsigned long ident = PyLong_AsUnsignedLong(host);
    Py_DECREF(host);
    if (ident == (unsigned long)-1 && PyErr_Occurred()) goto failed;
    if (ident != PyThread_get_thread_ident()) {
        PyObject *done = PyObject_CallMethodNoArgs(sanitizer, host_entry_str_set_host);
        if (done == NULL) goto failed;
        Py_DECREF(done);
    }
    return 0;
failed:;
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    Py_XDECREF(PyObject_CallNoArgs(release));
    PyErr_Restore(type, value, trace);
    return -1;
}

/* release(), keeping a pending error; returns result (stolen), or NULL if the release failed. */
static inline PyObject *host_leave(PyObject *release, PyObject *result) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyObject *done = PyObject_CallNoArgs(release);
    if (done == NULL) {
        Py_XDECREF(result);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        return NULL;
    }
    Py_DECREF(done);
    PyErr_Restore(type, value, trace);
    return result;
}

/* sanitizer._stream(key) with the lock held: stream(key) only when has_stream(key) is false. 0, or -1. */
static inline int host_ensure_stream(PyObject *has_stream, PyObject *stream, PyObject *key) {
    PyObject *has = PyObject_CallOneArg(has_stream, key);
    if (has == NULL) return -1;
    int known = PyObject_IsTrue(has);
    Py_DECREF(has);
    if (known != 0) return known < 0 ? -1 : 0;
    PyObject *made = PyObject_CallOneArg(stream, key);
    if (made == NULL) return -1;
    Py_DECREF(made);
    return 0;
}

#endif
