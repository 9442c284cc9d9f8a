/* Host threads that were already running when a sanitizer was enabled
 * (threads.py): torch keeps the dispatch-mode stack per thread, so such a
 * thread must push the mode itself.  This sets a one-shot profile function
 * on every other thread of the interpreter; at the thread's next Python
 * event it puts back the profile function the thread had (a profiler keeps
 * running), calls `callback()` there (threads.py pushes the mode), and
 * passes the event on to the profile function it put back.
 *
 * follow(callback): arms every other thread that is not armed yet.
 * cancel(): disarms the threads that have not fired (their profile
 *   functions back as they were).
 * armed(): how many threads are armed.
 *
 * CPython 3.11 and 3.12 (_PyEval_SetProfile on another thread's state, as
 * threading.setprofile_all_threads does); elsewhere follow() raises
 * NotImplementedError and threads.py uses threading.setprofile_all_threads.
 * Every entry point runs with the GIL held, which guards the table.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define NPL_PER_THREAD_PROFILE 1
#include <frameobject.h>
#endif

#ifdef NPL_PER_THREAD_PROFILE
typedef struct Armed {
    PyThreadState *thread;
    Py_tracefunc before; /* the thread's profile function when it was armed */
    PyObject *before_arg;
    struct Armed *next;
} Armed;

static Armed *armed_list;
static PyObject *callback; /* threads.py's: pushes the dispatch mode on the calling thread */

/* thread is one of the interpreter's live thread states (an armed thread may have ended). */
static int alive(PyThreadState *thread) {
    for (PyThreadState *t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t != NULL;
         t = PyThreadState_Next(t))
        if (t == thread) return 1;
    return 0;
}

/* Unlinks thread's entry; NULL if it has none. */
static Armed *take(PyThreadState *thread) {
    for (Armed **link = &armed_list; *link != NULL; link = &(*link)->next) {
        if ((*link)->thread == thread) {
            Armed *found = *link;
            *link = found->next;
            return found;
        }
    }
    return NULL;
}

/* Puts the thread's profile function back; the entry is freed. */
static int restore(Armed *entry) {
    int failed = _PyEval_SetProfile(entry->thread, entry->before, entry->before_arg);
    seam_release(entry->before_arg);
    PyMem_Free(entry);
    return failed;
}

static int one_shot(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
    (void)obj;
    Armed *entry = take(PyThreadState_Get());
    if (entry == NULL) return 0;
    Py_tracefunc before = entry->before;
    PyObject *before_arg = Py_XNewRef(entry->before_arg);
    int failed = restore(entry);
    if (!failed && callback != NULL) {
        SeamSaved saved = seam_enter();
        PyObject *done = PyObject_CallNoArgs(callback);
        seam_release(done);
        seam_leave(saved, callback);
    }
    if (!failed && before != NULL) failed = before(before_arg, frame, what, arg);
    seam_release(before_arg);
    return failed;
}

static PyObject *follow(PyObject *self, PyObject *fn) {
    (void)self;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "follow(callback): callback must be callable");
        return NULL;
    }
    Py_XSETREF(callback, Py_NewRef(fn));
    PyThreadState *me = PyThreadState_Get();
    for (PyThreadState *t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t != NULL;
         t = PyThreadState_Next(t)) {
        if (t == me) continue;
        int already = 0;
        for (Armed *a = armed_list; a != NULL && !already; a = a->next) already = a->thread == t;
#ifdef NPL_MUTANT_THREADS /* tests/sanitizer/test_sanitizer_seam_mutants.py: no running thread is armed */
        already = 1;
#endif
        if (already || t->c_profilefunc == one_shot) continue;
        Armed *entry = PyMem_Malloc(sizeof(Armed));
        if (entry == NULL) return PyErr_NoMemory();
        entry->thread = t;
        entry->before = t->c_profilefunc;
        entry->before_arg = Py_XNewRef(t->c_profileobj);
        if (_PyEval_SetProfile(t, one_shot, NULL) < 0) {
            seam_release(entry->before_arg);
            PyMem_Free(entry);
            return NULL;
        }
        entry->next = armed_list;
        armed_list = entry;
    }
    Py_RETURN_NONE;
}

static PyObject *cancel(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    int failed = 0;
    while (armed_list != NULL) {
        Armed *entry = armed_list;
        armed_list = entry->next;
        if (alive(entry->thread) && entry->thread->c_profilefunc == one_shot) {
            failed |= restore(entry) < 0;
        } else { /* ended, or its profile function was replaced since: nothing of ours is left there */
            seam_release(entry->before_arg);
            PyMem_Free(entry);
        }
    }
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyObject *armed(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    long n = 0;
    for (Armed *a = armed_list; a != NULL; a = a->next) n += alive(a->thread);
    return PyLong_FromLong(n);
}
#else
static PyObject *follow(PyObject *self, PyObject *fn) {
    (void)self, (void)fn;
    PyErr_SetString(PyExc_NotImplementedError, "per-thread profile functions need CPython 3.11 or 3.12");
    return NULL;
}

static PyObject *cancel(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    Py_RETURN_NONE;
}

static PyObject *armed(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(0);
}
#endif

static PyMethodDef methods[] = {
    {"follow", follow, METH_O, "Arms every other running thread to call callback() at its next Python event."},
    {"cancel", cancel, METH_NOARGS, "Disarms the threads that have not fired."},
    {"armed", armed, METH_NOARGS, "How many live threads are armed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_threads", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__threads(void) { return PyModule_Create(&module); }
