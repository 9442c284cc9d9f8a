/* npu_lifetime.recording._entry: record_use's Python entry in C, for the
 * shim's route.  calls.py keeps the pure-Python entry (record_use_reference)
 * and the route's Python fast path (_ShimRoute's make_fast_reference); this
 * does what they do, without a Python frame or a ctypes call per call.
 *
 * ShimFast(npl_record_use, stream_type, handle, current_handle, device_flag,
 *          device_index, refused, dispatch_modes)
 *   The shim route's fast path: fast(tensor, stream) -> True when recorded,
 *   False when a check failed (nothing done: the checked path says what was
 *   wrong); raises refused(tensor, ptr) when the shim refuses the storage.
 *   npl_record_use: the shim function's address; handle: a typed stream's
 *   raw handle, an attribute name (str, "cuda_stream") or a callable;
 *   current_handle(tensor), device_index(tensor): callables; device_flag:
 *   the tensor attribute True on the route's device ("is_cuda");
 *   dispatch_modes(): how many dispatch modes this thread has (the call
 *   steps aside under any: a sanitizer or a tracer must see the op).
 *   Keyword-only, for a device whose flag and handle are Python (torch_npu's
 *   is_npu property, the NPU bridge's handle through ctypes): device_type,
 *   checked as tensor.device.type instead of the flag; stream_handle, the
 *   address of a C function (stream_id, device_index, device_type) ->
 *   handle called instead of `handle` (a null handle: the checked path).
 *
 * FallbackFast(table_fast, device_flag, current_stream, dispatch_modes, shim_state)
 *   The fast path to the native fallback's table (calls.fallback_fast_path
 *   is its reference): no dispatch mode, no shim installed since
 *   (shim_state._installed is None), the current stream
 *   current_stream(tensor.device) for None; then table_fast(tensor, stream),
 *   whose truth is the answer.  Its class attribute ``fallback`` is True.
 *
 * configure(namespace, reference)
 *   namespace: calls.py's globals, where "_fast" is the active fast path;
 *   reference: the pure-Python record_use every other call goes to.
 * record_use(tensor, stream=None)
 *   With a ShimFast or FallbackFast active, its checks and its call inline,
 *   and when a check fails the reference's checked path
 *   (_record_use_checked, looked up in the namespace at the call); anything
 *   else (another fast path, keywords, other arities) is the reference's.
 *
 * A Python exception from any callable propagates (NULL); every reference
 * taken is released on every path, through seam_release (a storage's
 * release may run Python code).  Nothing of it outlives the call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../seam.h"
#include <stdint.h>

typedef int (*npl_record_use_fn)(void *ptr, void *stream);
typedef void *(*stream_handle_fn)(int64_t stream_id, int device_index, int device_type);

typedef struct {
    PyObject_HEAD
    npl_record_use_fn npl_record_use;
    PyObject *stream_type;
    PyObject *handle;  /* str: an attribute; else a callable */
    PyObject *current_handle;
    PyObject *device_flag;
    PyObject *device_index;
    PyObject *refused;
    PyObject *dispatch_modes;
    PyObject *device_type;          /* str or NULL: tensor.device.type must be it (instead of device_flag) */
    stream_handle_fn stream_handle; /* or NULL: handle(stream_id, device_index, device_type) instead of `handle` */
} ShimFast;

typedef struct {
    PyObject_HEAD
    PyObject *table_fast;
    PyObject *device_flag;
    PyObject *current_stream;
    PyObject *dispatch_modes;
    PyObject *shim_state;
} FallbackFast;

static PyTypeObject ShimFastType, FallbackFastType;
static PyObject *namespace_dict; /* calls.py's globals (owned), or NULL before configure */
static PyObject *reference;      /* the pure-Python record_use (owned) */
static PyObject *s_fast, *s_checked, *s_untyped_storage, *s_data_ptr, *s_device_index, *s_installed, *s_device,
    *s_type, *s_stream_id, *s_device_type;

/* A Python int -> pointer-sized handle; the int is released.  -1 with an exception. */
static int take_handle(PyObject *value, void **out) {
    if (value == NULL) return -1;
    if (!PyLong_Check(value)) {
        seam_release(value);
        return 0; /* not a handle: the checked path */
    }
    unsigned long long h = PyLong_AsUnsignedLongLongMask(value);
    seam_release(value);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (void *)(uintptr_t)h;
    return 1;
}

/* A Python int -> long, released; 1 done, 0 not an int, -1 exception. */
static int take_long(PyObject *value, long *out) {
    if (value == NULL) return -1;
    if (!PyLong_Check(value)) {
        seam_release(value);
        return 0;
    }
    *out = PyLong_AsLong(value);
    seam_release(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 1;
}

/* An AttributeError or TypeError (not a tensor, not a stream) sends the call
 * to the checked path as the Python fast path's except clause does: 0. */
static int checks_failed(void) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* The stream's raw handle: 1 found, 0 not this route's stream (checked
 * path), -1 exception. */
static int stream_handle(ShimFast *self, PyObject *tensor, PyObject *stream, void **handle) {
#ifdef NPL_MUTANT_ENTRY /* tests/test_seam_mutants.py: every use recorded on the current stream */
    stream = Py_None;
#endif
    if (stream == Py_None) return take_handle(PyObject_CallOneArg(self->current_handle, tensor), handle);
    if ((PyObject *)Py_TYPE(stream) != self->stream_type) return 0;
    long stream_device, tensor_device;
    int got = take_long(PyObject_GetAttr(stream, s_device_index), &stream_device);
    if (got <= 0) return got;
    got = take_long(PyObject_CallOneArg(self->device_index, tensor), &tensor_device);
    if (got <= 0) return got;
    if (stream_device != tensor_device) return 0;
    if (self->stream_handle != NULL) {
        long stream_id, device_type;
        if ((got = take_long(PyObject_GetAttr(stream, s_stream_id), &stream_id)) <= 0) return got;
        if ((got = take_long(PyObject_GetAttr(stream, s_device_type), &device_type)) <= 0) return got;
        *handle = self->stream_handle((int64_t)stream_id, (int)stream_device, (int)device_type);
        return *handle != NULL;
    }
    PyObject *raw = PyUnicode_Check(self->handle) ? PyObject_GetAttr(stream, self->handle)
                                                  : PyObject_CallOneArg(self->handle, stream);
    return take_handle(raw, handle);
}

/* The storage's address: 1 (0 for a freed storage: the checked path), -1 exception. */
static int storage_address(PyObject *tensor, void **ptr) {
    PyObject *storage = PyObject_CallMethodNoArgs(tensor, s_untyped_storage);
    if (storage == NULL) return -1;
    PyObject *address = PyObject_CallMethodNoArgs(storage, s_data_ptr);
    seam_release(storage);
    int got = take_handle(address, ptr);
    return got <= 0 ? got : (*ptr != NULL);
}

/* Whether the tensor is on the route's device type: 1, 0, -1 exception. */
static int on_route_device(ShimFast *self, PyObject *tensor) {
    if (self->device_type == NULL) {
        PyObject *on_device = PyObject_GetAttr(tensor, self->device_flag);
        if (on_device == NULL) return checks_failed();
        seam_release(on_device); /* True/False: never the last reference */
        return on_device == Py_True;
    }
    PyObject *device = PyObject_GetAttr(tensor, s_device);
    PyObject *type = device == NULL ? NULL : PyObject_GetAttr(device, s_type);
    seam_release(device);
    if (type == NULL) return checks_failed();
    int same = PyUnicode_Check(type) ? PyUnicode_Compare(type, self->device_type) == 0 : 0;
    seam_release(type);
    return same;
}

/* The fast path: 1 recorded, 0 a check failed (nothing done), -1 exception. */
static int shim_fast(ShimFast *self, PyObject *tensor, PyObject *stream) {
    long modes;
    int got = take_long(PyObject_CallNoArgs(self->dispatch_modes), &modes);
    if (got < 0) return checks_failed();
    if (got == 0 || modes != 0) return 0;
    if ((got = on_route_device(self, tensor)) <= 0) return got;
    void *handle = NULL, *ptr = NULL;
    got = stream_handle(self, tensor, stream, &handle);
    if (got == 0) return 0;
    if (got < 0 || (got = storage_address(tensor, &ptr)) < 0) return checks_failed();
    if (got == 0) return 0;
    int status;
    /* without the GIL, as ctypes and torch's event record call: the shim's lock is never held
     * while waiting for the GIL here (a thread inside the shim may need it) */
    Py_BEGIN_ALLOW_THREADS status = self->npl_record_use(ptr, handle);
    Py_END_ALLOW_THREADS
    if (status == 0) return 1;
    PyObject *address = PyLong_FromVoidPtr(ptr);
    if (address == NULL) return -1;
    PyObject *error = PyObject_CallFunctionObjArgs(self->refused, tensor, address, NULL);
    seam_release(address);
    if (error == NULL) return -1;
    PyErr_SetObject((PyObject *)Py_TYPE(error), error);
    seam_release(error);
    return -1;
}

static PyObject *ShimFast_call(ShimFast *self, PyObject *args, PyObject *kwargs) {
    PyObject *tensor, *stream;
    static char *names[] = {"tensor", "stream", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:fast", names, &tensor, &stream)) return NULL;
    int done = shim_fast(self, tensor, stream);
    if (done < 0) return NULL;
    return PyBool_FromLong(done);
}

static int ShimFast_init(ShimFast *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"npl_record_use", "stream_type", "handle", "current_handle", "device_flag",
                            "device_index", "refused", "dispatch_modes", "device_type", "stream_handle", NULL};
    PyObject *address, *stream_type, *handle, *current_handle, *device_flag, *device_index, *refused, *modes;
    PyObject *device_type = Py_None, *stream_handle_address = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOUOOO|$OO:ShimFast", names, &address, &stream_type, &handle,
                                     &current_handle, &device_flag, &device_index, &refused, &modes, &device_type,
                                     &stream_handle_address))
        return -1;
    if (device_type != Py_None && !PyUnicode_Check(device_type)) {
        PyErr_SetString(PyExc_TypeError, "ShimFast: device_type must be a str or None");
        return -1;
    }
    void *handle_fn = NULL;
    if (stream_handle_address != Py_None) {
        handle_fn = PyLong_AsVoidPtr(stream_handle_address);
        if (handle_fn == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "ShimFast: stream_handle's address is 0");
            return -1;
        }
    }
    void *fn = PyLong_AsVoidPtr(address);
    if (fn == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "ShimFast: npl_record_use's address is 0");
        return -1;
    }
    if (!PyType_Check(stream_type)) {
        PyErr_SetString(PyExc_TypeError, "ShimFast: stream_type must be a type");
        return -1;
    }
    if (!PyUnicode_Check(handle) && !PyCallable_Check(handle)) {
        PyErr_SetString(PyExc_TypeError, "ShimFast: handle must be an attribute name or a callable");
        return -1;
    }
    PyObject *callables[] = {current_handle, device_index, refused, modes};
    for (size_t i = 0; i < sizeof callables / sizeof callables[0]; i++) {
        if (!PyCallable_Check(callables[i])) {
            PyErr_SetString(PyExc_TypeError, "ShimFast: current_handle, device_index, refused and "
                                             "dispatch_modes must be callables");
            return -1;
        }
    }
    self->npl_record_use = (npl_record_use_fn)(uintptr_t)fn;
    self->stream_handle = (stream_handle_fn)(uintptr_t)handle_fn;
    if (device_type == Py_None) {
        Py_CLEAR(self->device_type);
    } else {
        Py_INCREF(device_type);
        Py_XSETREF(self->device_type, device_type);
    }
    PyObject **slots[] = {&self->stream_type, &self->handle, &self->current_handle, &self->device_flag,
                          &self->device_index, &self->refused, &self->dispatch_modes};
    PyObject *values[] = {stream_type, handle, current_handle, device_flag, device_index, refused, modes};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    return 0;
}

static int ShimFast_traverse(ShimFast *self, visitproc visit, void *arg) {
    Py_VISIT(self->stream_type);
    Py_VISIT(self->handle);
    Py_VISIT(self->current_handle);
    Py_VISIT(self->device_flag);
    Py_VISIT(self->device_index);
    Py_VISIT(self->refused);
    Py_VISIT(self->dispatch_modes);
    Py_VISIT(self->device_type);
    return 0;
}

static int ShimFast_clear(ShimFast *self) {
    Py_CLEAR(self->stream_type);
    Py_CLEAR(self->handle);
    Py_CLEAR(self->current_handle);
    Py_CLEAR(self->device_flag);
    Py_CLEAR(self->device_index);
    Py_CLEAR(self->refused);
    Py_CLEAR(self->dispatch_modes);
    Py_CLEAR(self->device_type);
    return 0;
}

static void ShimFast_dealloc(ShimFast *self) {
    PyObject_GC_UnTrack(self);
    ShimFast_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* -- FallbackFast ------------------------------------------------------------ */
/* The current stream of the tensor's device: a new reference, NULL with no
 * exception when the tensor is not this device's (the checked path), NULL
 * with one on error. */
static PyObject *current_stream(FallbackFast *self, PyObject *tensor) {
    PyObject *on_device = PyObject_GetAttr(tensor, self->device_flag);
    if (on_device == NULL) {
        checks_failed(); /* the exception stays only if it is not the checked path's */
        return NULL;
    }
    seam_release(on_device);
    if (on_device != Py_True) return NULL;
    PyObject *device = PyObject_GetAttr(tensor, s_device);
    PyObject *stream = device == NULL ? NULL : PyObject_CallOneArg(self->current_stream, device);
    seam_release(device);
    if (stream == NULL) checks_failed();
    return stream;
}

/* 1 recorded, 0 the checked path, -1 exception (as calls.fallback_fast_path). */
static int fallback_fast(FallbackFast *self, PyObject *tensor, PyObject *stream) {
    long modes;
    int got = take_long(PyObject_CallNoArgs(self->dispatch_modes), &modes);
    if (got <= 0 || modes != 0) return got < 0 ? -1 : 0;
    PyObject *installed = PyObject_GetAttr(self->shim_state, s_installed);
    if (installed == NULL) return -1;
    seam_release(installed); /* the module keeps it */
    if (installed != Py_None) return 0;
    PyObject *current = NULL;
    if (stream == Py_None) {
        current = current_stream(self, tensor);
        if (current == NULL) return PyErr_Occurred() ? -1 : 0;
        stream = current;
    }
    PyObject *argv[2] = {tensor, stream};
    PyObject *result = PyObject_Vectorcall(self->table_fast, argv, 2, NULL);
    seam_release(current);
    if (result == NULL) return -1;
    int done = PyObject_IsTrue(result);
    seam_release(result);
    return done;
}

static PyObject *FallbackFast_call(FallbackFast *self, PyObject *args, PyObject *kwargs) {
    PyObject *tensor, *stream;
    static char *names[] = {"tensor", "stream", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:fast", names, &tensor, &stream)) return NULL;
    int done = fallback_fast(self, tensor, stream);
    if (done < 0) return NULL;
    return PyBool_FromLong(done);
}

static int FallbackFast_init(FallbackFast *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"table_fast", "device_flag", "current_stream", "dispatch_modes", "shim_state", NULL};
    PyObject *table_fast, *device_flag, *current, *modes, *shim_state;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OUOOO:FallbackFast", names, &table_fast, &device_flag,
                                     &current, &modes, &shim_state))
        return -1;
    if (!PyCallable_Check(table_fast) || !PyCallable_Check(current) || !PyCallable_Check(modes)) {
        PyErr_SetString(PyExc_TypeError, "FallbackFast: table_fast, current_stream and dispatch_modes must be callables");
        return -1;
    }
    PyObject **slots[] = {&self->table_fast, &self->device_flag, &self->current_stream, &self->dispatch_modes,
                          &self->shim_state};
    PyObject *values[] = {table_fast, device_flag, current, modes, shim_state};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    return 0;
}

static int FallbackFast_traverse(FallbackFast *self, visitproc visit, void *arg) {
    Py_VISIT(self->table_fast);
    Py_VISIT(self->device_flag);
    Py_VISIT(self->current_stream);
    Py_VISIT(self->dispatch_modes);
    Py_VISIT(self->shim_state);
    return 0;
}

static int FallbackFast_clear(FallbackFast *self) {
    Py_CLEAR(self->table_fast);
    Py_CLEAR(self->device_flag);
    Py_CLEAR(self->current_stream);
    Py_CLEAR(self->dispatch_modes);
    Py_CLEAR(self->shim_state);
    return 0;
}

static void FallbackFast_dealloc(FallbackFast *self) {
    PyObject_GC_UnTrack(self);
    FallbackFast_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* -- the entry ----------------------------------------------------------------- */
/* record_use(tensor, stream=None) after the arguments were split. */
static PyObject *entry(PyObject *tensor, PyObject *stream, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (reference == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "npu_lifetime.recording._entry: configure() was not called");
        return NULL;
    }
    if (tensor != NULL) {
        PyObject *fast = PyDict_GetItemWithError(namespace_dict, s_fast); /* borrowed */
        if (fast == NULL && PyErr_Occurred()) return NULL;
        if (fast != NULL && (Py_TYPE(fast) == &ShimFastType || Py_TYPE(fast) == &FallbackFastType)) {
            Py_INCREF(fast); /* kept across the call: a callable it runs may replace _fast */
            int done = Py_TYPE(fast) == &ShimFastType ? shim_fast((ShimFast *)fast, tensor, stream)
                                                       : fallback_fast((FallbackFast *)fast, tensor, stream);
            Py_DECREF(fast);
            if (done < 0) return NULL;
            if (done) Py_RETURN_NONE;
            /* a check failed: the checked path, as the reference goes on (not the fast path again) */
            PyObject *checked = PyDict_GetItemWithError(namespace_dict, s_checked); /* borrowed */
            if (checked == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "record_use: no _record_use_checked");
                return NULL;
            }
            PyObject *argv[2] = {tensor, stream};
            PyObject *result = PyObject_Vectorcall(checked, argv, 2, NULL);
            if (result == NULL) return NULL;
            seam_release(result);
            Py_RETURN_NONE;
        }
    }
    return PyObject_Vectorcall(reference, args, nargsf, kwnames);
}

static PyObject *record_use(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    (void)module;
    int plain = kwnames == NULL && (nargs == 1 || nargs == 2);
    return entry(plain ? args[0] : NULL, plain && nargs == 2 ? args[1] : Py_None, args, (size_t)nargs, kwnames);
}

static PyObject *configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "configure(namespace: dict, reference: callable)");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(namespace_dict, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(reference, args[1]);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"record_use", (PyCFunction)(void (*)(void))record_use, METH_FASTCALL | METH_KEYWORDS,
     "record_use(tensor, stream=None)\n--\n\nKeeps tensor's memory from being reused until the work queued on "
     "stream (default: the current stream) so far has finished."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, "configure(namespace, reference)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_entry", NULL, -1, module_methods,
                                        NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__entry(void) {
    ShimFastType.tp_name = "npu_lifetime.recording._entry.ShimFast";
    ShimFastType.tp_basicsize = sizeof(ShimFast);
    ShimFastType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    ShimFastType.tp_new = PyType_GenericNew;
    ShimFastType.tp_init = (initproc)ShimFast_init;
    ShimFastType.tp_call = (ternaryfunc)ShimFast_call;
    ShimFastType.tp_traverse = (traverseproc)ShimFast_traverse;
    ShimFastType.tp_clear = (inquiry)ShimFast_clear;
    ShimFastType.tp_dealloc = (destructor)ShimFast_dealloc;
    ShimFastType.tp_doc = "ShimFast(...): the shim route's fast path, fast(tensor, stream) -> bool";
    if (PyType_Ready(&ShimFastType) < 0) return NULL;
    FallbackFastType.tp_name = "npu_lifetime.recording._entry.FallbackFast";
    FallbackFastType.tp_basicsize = sizeof(FallbackFast);
    FallbackFastType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    FallbackFastType.tp_new = PyType_GenericNew;
    FallbackFastType.tp_init = (initproc)FallbackFast_init;
    FallbackFastType.tp_call = (ternaryfunc)FallbackFast_call;
    FallbackFastType.tp_traverse = (traverseproc)FallbackFast_traverse;
    FallbackFastType.tp_clear = (inquiry)FallbackFast_clear;
    FallbackFastType.tp_dealloc = (destructor)FallbackFast_dealloc;
    FallbackFastType.tp_doc = "FallbackFast(...): the native fallback's fast path, fast(tensor, stream) -> bool";
    if (PyType_Ready(&FallbackFastType) < 0) return NULL;
    /* calls.py tells a fallback's fast path by it */
    if (PyDict_SetItemString(FallbackFastType.tp_dict, "fallback", Py_True) < 0) return NULL;
    PyType_Modified(&FallbackFastType);
    s_fast = PyUnicode_InternFromString("_fast");
    s_checked = PyUnicode_InternFromString("_record_use_checked");
    s_untyped_storage = PyUnicode_InternFromString("untyped_storage");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_device_index = PyUnicode_InternFromString("device_index");
    s_installed = PyUnicode_InternFromString("_installed");
    s_device = PyUnicode_InternFromString("device");
    s_type = PyUnicode_InternFromString("type");
    s_stream_id = PyUnicode_InternFromString("stream_id");
    s_device_type = PyUnicode_InternFromString("device_type");
    if (!s_fast || !s_checked || !s_untyped_storage || !s_data_ptr || !s_device_index || !s_installed || !s_device || !s_type ||
        !s_stream_id || !s_device_type)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    Py_INCREF(&ShimFastType);
    if (PyModule_AddObject(module, "ShimFast", (PyObject *)&ShimFastType) < 0) {
        Py_DECREF(&ShimFastType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&FallbackFastType);
    if (PyModule_AddObject(module, "FallbackFast", (PyObject *)&FallbackFastType) < 0) {
        Py_DECREF(&FallbackFastType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
