/* The sanitizer's stack capture, native: one walk of the calling thread's
 * frames per op, keeping (code object, instruction offset) pairs.  Line
 * numbers are worked out only when a finding is reported (lineno below);
 * reading a frame's f_lineno from Python costs about as much as the op.
 *
 * Mirrors sites.capture's Python walk (the fallback when this module is not
 * built) exactly: the same kinds, the same stopping rules.  No torch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

enum { KIND_USER = 0, KIND_PASS = 1, KIND_RUNNER = 2, KIND_LIBRARY = 3 };

/* The frame's last instruction as a byte offset into its code. */
static int frame_lasti(PyFrameObject *frame) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(frame);
#else
    return frame->f_lasti * (int)sizeof(_Py_CODEUNIT);
#endif
}

/* The kind of a code object, from kind_of: {id(code): (kind, code)} (keyed by
 * address: hashing a code object hashes its bytecode and constants; the
 * value holds the code, so its address is not reused), classifying the code's
 * file with classify(filename) the first time. */
static int code_kind(PyObject *kind_of, PyObject *classify, PyCodeObject *code) {
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL) return -1;
    PyObject *entry = PyDict_GetItemWithError(kind_of, key);
    long value = -1;
    if (entry != NULL && PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2) {
        value = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    } else if (!PyErr_Occurred()) {
        PyObject *kind = PyObject_CallOneArg(classify, code->co_filename);
        if (kind != NULL) {
            entry = PyTuple_Pack(2, kind, (PyObject *)code);
            if (entry != NULL && PyDict_SetItem(kind_of, key, entry) == 0) value = PyLong_AsLong(kind);
            Py_XDECREF(entry);
            Py_DECREF(kind);
        }
    }
    Py_DECREF(key);
    return PyErr_Occurred() ? -1 : (int)value;
}

static int append_pair(PyObject *list, PyCodeObject *code, int lasti) {
    PyObject *pair = Py_BuildValue("(Oi)", (PyObject *)code, lasti);
    if (pair == NULL) return -1;
    int failed = PyList_Append(list, pair);
    Py_DECREF(pair);
    return failed;
}

/* capture(kind_of, classify, depth, skip, max_walk, library_max)
 *   -> (user frames, library frames), each a tuple of (code, lasti),
 * innermost first; skip counts frames above the caller of capture. */
static PyObject *capture(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "capture(kind_of: dict, classify, depth, skip, max_walk, library_max)");
        return NULL;
    }
    PyObject *kind_of = args[0], *classify = args[1];
    long depth = PyLong_AsLong(args[2]), skip = PyLong_AsLong(args[3]);
    long max_walk = PyLong_AsLong(args[4]), library_max = PyLong_AsLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    PyObject *frames = PyList_New(0), *library = PyList_New(0);
    if (frames == NULL || library == NULL) goto fail;
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed: capture's caller */
    Py_XINCREF(frame);
    for (long i = 0; i < skip && frame != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    for (long walked = 0; frame != NULL && walked < max_walk; walked++) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int kind = code_kind(kind_of, classify, code);
        int stop = 0, failed = kind < 0;
        if (!failed && kind == KIND_USER) {
            failed = append_pair(frames, code, frame_lasti(frame));
            stop = PyList_GET_SIZE(frames) == depth;
        } else if (!failed && kind == KIND_LIBRARY) {
            if (PyList_GET_SIZE(frames) == 0 && PyList_GET_SIZE(library) < library_max)
                failed = append_pair(library, code, frame_lasti(frame));
        } else if (!failed && kind == KIND_RUNNER && PyList_GET_SIZE(frames) > 0) {
            stop = 1;
        }
        Py_DECREF(code);
        if (failed || stop) {
            Py_DECREF(frame);
            frame = NULL;
            if (failed) goto fail;
            break;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    PyObject *result = Py_BuildValue("(NN)", PyList_AsTuple(frames), PyList_AsTuple(library));
    Py_DECREF(frames);
    Py_DECREF(library);
    return result;
fail:
    Py_XDECREF(frames);
    Py_XDECREF(library);
    return NULL;
}

/* lineno(code, lasti): the source line of the instruction at byte offset lasti. */
static PyObject *lineno(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyCode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "lineno(code, lasti)");
        return NULL;
    }
    int lasti = (int)PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(PyCode_Addr2Line((PyCodeObject *)args[0], lasti));
}

static PyMethodDef methods[] = {
    {"capture", (PyCFunction)(void (*)(void))capture, METH_FASTCALL, "Walks the stack: (user, library) frames."},
    {"lineno", (PyCFunction)(void (*)(void))lineno, METH_FASTCALL, "The line of (code, byte offset)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
