/* The sanitizer's per-op scan of tensor arguments, native: which storages an
 * op touches, by base address (accesses.op_accesses; the rules are in
 * accesses.py's docstring).  It does what accesses._note_all does for each
 * (value, mode, name), and no more: plain tensors and lists or tuples of them
 * are read here, anything else (a wrapper subclass such as DTensor) through
 * the Python generator accesses._tensors; a tensor without a storage of its
 * own (sparse, functorch-wrapped) through accesses._holders.
 * No torch headers: tensors are reached through their Python methods.
 *
 * configure(StorageAccess, tensor_types, tensors_fn, holders_fn) once, then
 *   arguments(found, plan_arguments, args, tracked)   positional arguments
 *   value(found, value, is_write, name, fresh, tracked)
 *   op(...)                                           all of op_accesses once its plan is chosen (below)
 *   written(plan_arguments, args, kwargs)             accesses.written_storages
 * found: {address: StorageAccess}, filled in argument order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"
#include <structmember.h>

/* accesses.StorageAccess's base: its slots (access_object.h), so that the
 * scan makes and updates entries here without running StorageAccess.__init__
 * or looking attributes up. */
#include "access_object.h"

static int access_traverse(AccessObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->storage);
    Py_VISIT(self->is_write);
    Py_VISIT(self->tensor);
    Py_VISIT(self->names);
    Py_VISIT(self->device_index);
    Py_VISIT(self->fresh);
    Py_VISIT(self->accessed);
    return 0;
}

static int access_clear(AccessObject *self) {
    SEAM_CLEAR(self->storage);
    SEAM_CLEAR(self->is_write);
    SEAM_CLEAR(self->tensor);
    SEAM_CLEAR(self->names);
    SEAM_CLEAR(self->device_index);
    SEAM_CLEAR(self->fresh);
    SEAM_CLEAR(self->accessed);
    return 0;
}

static void access_dealloc(AccessObject *self) {
    PyObject_GC_UnTrack(self);
    access_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef access_members[] = {
    {"storage", T_OBJECT_EX, offsetof(AccessObject, storage), 0, NULL},
    {"is_write", T_OBJECT_EX, offsetof(AccessObject, is_write), 0, NULL},
    {"tensor", T_OBJECT_EX, offsetof(AccessObject, tensor), 0, NULL},
    {"names", T_OBJECT_EX, offsetof(AccessObject, names), 0, NULL},
    {"device_index", T_OBJECT_EX, offsetof(AccessObject, device_index), 0, NULL},
    {"fresh", T_OBJECT_EX, offsetof(AccessObject, fresh), 0, NULL},
    {"accessed", T_OBJECT_EX, offsetof(AccessObject, accessed), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AccessBase = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npu_lifetime.sanitizer._scan.AccessBase",
    .tp_basicsize = sizeof(AccessObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "accesses.StorageAccess's slots.",
    .tp_traverse = (traverseproc)access_traverse,
    .tp_clear = (inquiry)access_clear,
    .tp_dealloc = (destructor)access_dealloc,
    .tp_members = access_members,
    .tp_new = PyType_GenericNew,
};

static PyObject *storage_access_class, *tensor_types, *tensors_fn, *holders_fn;
static int access_class_native; /* storage_access_class is a subclass of AccessBase */
static PyObject *str_untyped_storage, *str_data_ptr, *str_get_device, *str_fresh, *str_accessed, *str_is_write,
    *str_names, *str_out, *str_storage;

/* t.untyped_storage().data_ptr(): 0; or 1 (and 0 in *out) with no error for
 * a tensor without storage (RuntimeError, NotImplementedError: sparse,
 * functorch-wrapped...); -1 on another error. */
static int storage_address(PyObject *t, uintptr_t *out) {
    *out = 0;
    PyObject *storage = PyObject_CallMethodNoArgs(t, str_untyped_storage);
    PyObject *ptr = storage ? PyObject_CallMethodNoArgs(storage, str_data_ptr) : NULL;
    seam_release(storage);
    if (ptr == NULL) {
        if (PyErr_ExceptionMatches(PyExc_RuntimeError) || PyErr_ExceptionMatches(PyExc_NotImplementedError)) {
            PyErr_Clear();
            return 1;
        }
        return -1;
    }
    *out = (uintptr_t)PyLong_AsVoidPtr(ptr);
    seam_release(ptr);
    return PyErr_Occurred() ? -1 : 0;
}

/* The slot of an AccessBase entry that holds the attribute name, or NULL
 * (not one of ours: the attribute is looked up). */
static PyObject **slot_of(PyObject *entry, PyObject *name) {
    if (!PyObject_TypeCheck(entry, &AccessBase)) return NULL;
    AccessObject *a = (AccessObject *)entry;
    if (name == str_fresh) return &a->fresh;
    if (name == str_accessed) return &a->accessed;
    if (name == str_is_write) return &a->is_write;
    if (name == str_names) return &a->names;
    if (name == str_storage) return &a->storage;
    return NULL;
}

static int set_flag(PyObject *entry, PyObject *name, int value) {
    PyObject **slot = slot_of(entry, name);
    if (slot == NULL) return PyObject_SetAttr(entry, name, value ? Py_True : Py_False);
    Py_XSETREF(*slot, Py_NewRef(value ? Py_True : Py_False));
    return 0;
}

/* entry.<name>: a new reference, or NULL with an AttributeError. */
static PyObject *get_attr(PyObject *entry, PyObject *name) {
    PyObject **slot = slot_of(entry, name);
    if (slot == NULL) return PyObject_GetAttr(entry, name);
    if (*slot == NULL) {
        PyErr_SetObject(PyExc_AttributeError, name);
        return NULL;
    }
    return Py_NewRef(*slot);
}

static int get_flag(PyObject *entry, PyObject *name) {
    PyObject *v = get_attr(entry, name);
    if (v == NULL) return -1;
    int truth = PyObject_IsTrue(v);
    seam_release(v);
    return truth;
}

static int note(PyObject *found, PyObject *t, int is_write, PyObject *name, int fresh, PyObject *tracked);

/* A tensor without a storage of its own, or one showing no memory: each
 * tensor holding its memory (accesses._holders, which never returns t). */
static int note_holders(PyObject *found, PyObject *t, int is_write, PyObject *name, int fresh, PyObject *tracked) {
    PyObject *parts = PyObject_CallOneArg(holders_fn, t);
    if (parts == NULL) return -1;
    if (!PyTuple_Check(parts)) {
        seam_release(parts);
        PyErr_SetString(PyExc_TypeError, "accesses._holders returned no tuple");
        return -1;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; !failed && i < PyTuple_GET_SIZE(parts); i++)
        failed = note(found, PyTuple_GET_ITEM(parts, i), is_write, name, fresh, tracked) < 0;
    seam_release(parts);
    return failed ? -1 : 0;
}

/* accesses._note: one tensor. */
static int note(PyObject *found, PyObject *t, int is_write, PyObject *name, int fresh, PyObject *tracked) {
#ifdef NPL_MUTANT_SCAN /* tests/sanitizer/test_sanitizer_seam_mutants.py: every write scanned as a read */
    is_write = 0;
#endif
    PyObject *tracks = PyObject_CallOneArg(tracked, t);
    if (tracks == NULL) return -1;
    int yes = PyObject_IsTrue(tracks);
    seam_release(tracks);
    if (yes <= 0) return yes;
    uintptr_t address;
    int own = storage_address(t, &address);
    if (own < 0) return -1;
    if (own == 1 || address == 0) return note_holders(found, t, is_write, name, fresh, tracked);
    PyObject *key = PyLong_FromVoidPtr((void *)address);
    if (key == NULL) return -1;
    PyObject *entry = PyDict_GetItemWithError(found, key); /* borrowed */
    int failed = 0;
    if (entry == NULL) {
        if (PyErr_Occurred()) goto fail;
        PyObject *device = PyObject_CallMethodNoArgs(t, str_get_device);
        if (device == NULL) goto fail;
        long index = PyLong_AsLong(device);
        seam_release(device);
        if (index == -1 && PyErr_Occurred()) goto fail;
        if (access_class_native) { /* StorageAccess.__init__, here */
            PyObject *names = PyList_New(0);
            PyObject *device_index = names != NULL ? PyLong_FromLong(index > 0 ? index : 0L) : NULL;
            AccessObject *made = device_index != NULL
                                     ? (AccessObject *)((PyTypeObject *)storage_access_class)
                                           ->tp_alloc((PyTypeObject *)storage_access_class, 0)
                                     : NULL;
            if (made == NULL) {
                seam_release(names);
                seam_release(device_index);
                goto fail;
            }
            made->storage = Py_NewRef(key);
            made->is_write = Py_NewRef(Py_False);
            made->tensor = Py_NewRef(t);
            made->names = names;
            made->device_index = device_index;
            made->fresh = Py_NewRef(fresh ? Py_True : Py_False);
            made->accessed = Py_NewRef((!fresh || is_write) ? Py_True : Py_False);
            entry = (PyObject *)made;
        } else {
            entry = PyObject_CallFunction(storage_access_class, "OOlOO", key, t, index > 0 ? index : 0L,
                                          fresh ? Py_True : Py_False, (!fresh || is_write) ? Py_True : Py_False);
            if (entry == NULL) goto fail;
        }
        failed = PyDict_SetItem(found, key, entry);
        seam_release(entry); /* found holds it */
        if (failed) goto fail;
    } else {
        int entry_fresh = get_flag(entry, str_fresh);
        if (entry_fresh < 0) goto fail;
        if (fresh && !entry_fresh) { /* an undeclared alias of an input: a view, no data written */
            seam_release(key);
            return 0;
        }
        int accessed = get_flag(entry, str_accessed);
        if (accessed < 0 || set_flag(entry, str_fresh, entry_fresh || fresh) < 0 ||
            set_flag(entry, str_accessed, accessed || !fresh || is_write) < 0)
            goto fail;
    }
    if (is_write && set_flag(entry, str_is_write, 1) < 0) goto fail;
    PyObject *names = get_attr(entry, str_names);
    if (names == NULL) goto fail;
    failed = PyList_Append(names, name);
    seam_release(names);
    seam_release(key);
    return failed;
fail:
    seam_release(key);
    return -1;
}

static int is_plain_tensor(PyObject *value) {
    Py_ssize_t n = PyTuple_GET_SIZE(tensor_types);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)Py_TYPE(value) == PyTuple_GET_ITEM(tensor_types, i)) return 1;
    return 0;
}

/* Each tensor in a value, as accesses._tensors yields them: a plain tensor
 * itself, the items of lists and tuples (a foreach op's arguments) walked
 * here, anything else that is not a plain tensor (a wrapper subclass)
 * through accesses._tensors; visit(t, context) for each, stopping at -1. */
typedef int (*TensorVisit)(PyObject *t, void *context);

static int each_tensor(PyObject *value, TensorVisit visit, void *context) {
    if (is_plain_tensor(value)) return visit(value, context);
    if (value == Py_None || PyLong_Check(value) || PyFloat_Check(value)) return 0; /* bool is an int */
    if (PyList_Check(value) || PyTuple_Check(value)) {
        PyObject *items = PySequence_Fast(value, "a list or tuple"); /* the same object, referenced */
        if (items == NULL) return -1;
        int failed = 0;
        for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(items); i++)
            failed = each_tensor(PySequence_Fast_GET_ITEM(items, i), visit, context);
        seam_release(items);
        return failed;
    }
    PyObject *iterator = PyObject_CallOneArg(tensors_fn, value);
    if (iterator == NULL) return -1;
    PyObject *t;
    int failed = 0;
    while (!failed && (t = PyIter_Next(iterator)) != NULL) {
        failed = visit(t, context);
        seam_release(t);
    }
    seam_release(iterator);
    return failed || PyErr_Occurred() ? -1 : 0;
}

typedef struct {
    PyObject *found, *name, *tracked;
    int is_write, fresh;
} NoteContext;

static int note_one(PyObject *t, void *context) {
    NoteContext *c = context;
    return note(c->found, t, c->is_write, c->name, c->fresh, c->tracked);
}

/* accesses._note_all: a value that may hold tensors. */
static int note_all(PyObject *found, PyObject *value, int is_write, PyObject *name, int fresh, PyObject *tracked) {
    NoteContext context = {found, name, tracked, is_write, fresh};
    return each_tensor(value, note_one, &context);
}

static int ready(void) {
    if (storage_access_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_scan.configure() was not called");
        return 0;
    }
    return 1;
}

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "configure(StorageAccess, tensor_types: tuple, tensors_fn, holders_fn)");
        return NULL;
    }
    Py_XSETREF(storage_access_class, Py_NewRef(args[0]));
    access_class_native = PyType_Check(args[0]) && PyType_IsSubtype((PyTypeObject *)args[0], &AccessBase);
    Py_XSETREF(tensor_types, Py_NewRef(args[1]));
    Py_XSETREF(tensors_fn, Py_NewRef(args[2]));
    Py_XSETREF(holders_fn, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

/* One (position, name, mode) of a plan's arguments: 0, or -1 with a TypeError. */
static int plan_argument(PyObject *argument, Py_ssize_t *position, PyObject **name, int *mode) {
    if (!PyTuple_Check(argument) || PyTuple_GET_SIZE(argument) != 3) {
        PyErr_SetString(PyExc_TypeError, "a plan argument is (position, name, mode)");
        return -1;
    }
    *position = PyLong_AsSsize_t(PyTuple_GET_ITEM(argument, 0));
    if (*position == -1 && PyErr_Occurred()) return -1;
    *name = PyTuple_GET_ITEM(argument, 1);
    *mode = PyObject_IsTrue(PyTuple_GET_ITEM(argument, 2));
    return *mode < 0 ? -1 : 0;
}

/* arguments(found, plan_arguments, args, tracked): each (position, name, mode)
 * of the plan whose position is among args. */
static PyObject *arguments(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready()) return NULL;
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "arguments(found: dict, plan_arguments: tuple, args: tuple, tracked)");
        return NULL;
    }
    PyObject *found = args[0], *plan = args[1], *values = args[2], *tracked = args[3];
    Py_ssize_t count = PyTuple_GET_SIZE(values);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(plan); k++) {
        Py_ssize_t position;
        PyObject *name;
        int mode;
        if (plan_argument(PyTuple_GET_ITEM(plan, k), &position, &name, &mode) < 0) return NULL;
        if (position >= count) continue;
        if (note_all(found, PyTuple_GET_ITEM(values, position), mode, name, 0, tracked) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* value(found, value, is_write, name, fresh, tracked) */
static PyObject *value(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready()) return NULL;
    if (nargs != 6 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "value(found: dict, value, is_write, name, fresh, tracked)");
        return NULL;
    }
    int is_write = PyObject_IsTrue(args[2]), fresh = PyObject_IsTrue(args[4]);
    if (is_write < 0 || fresh < 0 || note_all(args[0], args[1], is_write, args[3], fresh, args[5]) < 0) return NULL;
    Py_RETURN_NONE;
}


/* The fresh outputs of an op, as accesses._outputs: (outputs,) for one
 * return, else the items of a list or tuple (none otherwise).  A new
 * reference to a tuple, or NULL. */
static PyObject *outputs_of(Py_ssize_t count, PyObject *outputs) {
    if (count == 1) return PyTuple_Pack(1, outputs);
    if (PyList_Check(outputs) || PyTuple_Check(outputs)) return PySequence_Tuple(outputs);
    return PyTuple_New(0);
}

/* op(arguments, by_name, fresh_returns, written, args, kwargs, outputs, tracked, written_before)
 * -> [StorageAccess]: accesses.op_accesses after its plan is chosen, in one
 * call (the same steps in the same order: positional arguments, keyword
 * arguments, fresh outputs, then the written arguments the op moved).
 *   arguments:      the plan's (position, name, mode) tuple
 *   by_name:        {name: mode} for keyword arguments
 *   fresh_returns:  per return, whether it is fresh
 *   written:        whether fresh outputs are written (not an empty-like factory)
 *   kwargs:         a dict (may be empty)
 *   written_before: None or [(tensor, address before the op)] */
static PyObject *op(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready()) return NULL;
    if (nargs != 9 || !PyDict_Check(args[1]) || !PyTuple_Check(args[2]) ||
        (args[5] != Py_None && !PyDict_Check(args[5]))) {
        PyErr_SetString(PyExc_TypeError, "op(arguments: tuple, by_name: dict, fresh_returns: tuple, written, args, "
                                         "kwargs: dict or None, outputs, tracked, written_before)");
        return NULL;
    }
    PyObject *by_name = args[1], *fresh_returns = args[2], *kwargs = args[5], *outputs = args[6];
    PyObject *tracked = args[7], *written_before = args[8];
    int written = PyObject_IsTrue(args[3]);
    if (written < 0) return NULL;
    PyObject *found = PyDict_New();
    if (found == NULL) return NULL;
    PyObject *positional[4] = {found, args[0], args[4], tracked};
    PyObject *done = arguments(self, positional, 4);
    if (done == NULL) goto fail;
    seam_release(done);
    if (kwargs != Py_None && PyDict_GET_SIZE(kwargs) > 0) {
        Py_ssize_t pos = 0;
        PyObject *name, *value;
        while (PyDict_Next(kwargs, &pos, &name, &value)) {
            PyObject *mode = PyDict_GetItemWithError(by_name, name); /* borrowed */
            if (mode == NULL) {
                if (PyErr_Occurred()) goto fail;
                continue;
            }
            if (mode == Py_None) continue;
            int is_write = PyObject_IsTrue(mode);
            if (is_write < 0 || note_all(found, value, is_write, name, 0, tracked) < 0) goto fail;
        }
    }
    Py_ssize_t returns = PyTuple_GET_SIZE(fresh_returns);
    if (returns > 0) {
        PyObject *values = outputs_of(returns, outputs);
        if (values == NULL) goto fail;
        int failed = 0;
        Py_ssize_t n = PyTuple_GET_SIZE(values) < returns ? PyTuple_GET_SIZE(values) : returns;
        for (Py_ssize_t i = 0; !failed && i < n; i++) {
            int fresh = PyObject_IsTrue(PyTuple_GET_ITEM(fresh_returns, i));
            failed = fresh < 0 ||
                     (fresh && note_all(found, PyTuple_GET_ITEM(values, i), written, str_out, 1, tracked) < 0);
        }
        seam_release(values);
        if (failed) goto fail;
    }
    int moved_any = written_before == Py_None ? 0 : PyObject_IsTrue(written_before);
    if (moved_any < 0) goto fail;
    if (moved_any) {
        PyObject *pairs = PySequence_Fast(written_before, "written_before is a list");
        if (pairs == NULL) goto fail;
        int failed = 0;
        for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(pairs); i++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(pairs, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "written_before holds (tensor, address) pairs");
                failed = 1;
                break;
            }
            uintptr_t address;
            failed = storage_address(PyTuple_GET_ITEM(pair, 0), &address) < 0;
            PyObject *key = failed ? NULL : PyLong_FromVoidPtr((void *)address);
            if (key == NULL) {
                failed = 1;
                break;
            }
            PyObject *entry = PyDict_GetItemWithError(found, key); /* borrowed */
            seam_release(key);
            if (entry == NULL) {
                failed = PyErr_Occurred() != NULL;
                continue;
            }
            PyObject *storage = get_attr(entry, str_storage);
            int moved = storage == NULL ? -1 : PyObject_RichCompareBool(storage, PyTuple_GET_ITEM(pair, 1), Py_NE);
            seam_release(storage);
            failed = moved < 0 || (moved && set_flag(entry, str_fresh, 1) < 0);
        }
        seam_release(pairs);
        if (failed) goto fail;
    }
    PyObject *list = PyDict_Values(found);
    seam_release(found);
    return list;
fail:
    seam_release(found);
    return NULL;
}

/* (t, storage address) appended to the list `found`, as
 * accesses.written_storages's (t, _address(t)), for each t in _tensors(value). */
static int written_pair(PyObject *t, void *found) {
    uintptr_t address;
    if (storage_address(t, &address) < 0) return -1;
    PyObject *key = PyLong_FromVoidPtr((void *)address);
    PyObject *pair = key == NULL ? NULL : PyTuple_Pack(2, t, key);
    seam_release(key);
    int failed = pair == NULL || PyList_Append(found, pair) < 0;
    seam_release(pair);
    return failed ? -1 : 0;
}

/* written(plan_arguments, args, kwargs) -> [(tensor, address)]:
 * accesses.written_storages, before an op, for each written argument. */
static PyObject *written(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready()) return NULL;
    if (nargs != 3 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
        (args[2] != Py_None && !PyDict_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "written(plan_arguments: tuple, args: tuple, kwargs: dict or None)");
        return NULL;
    }
    PyObject *plan = args[0], *values = args[1], *kwargs = args[2];
    PyObject *found = PyList_New(0);
    if (found == NULL) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(plan); k++) {
        Py_ssize_t position;
        PyObject *name;
        int mode;
        if (plan_argument(PyTuple_GET_ITEM(plan, k), &position, &name, &mode) < 0) goto fail;
        if (!mode) continue;
        PyObject *value = NULL; /* borrowed */
        if (position < PyTuple_GET_SIZE(values)) {
            value = PyTuple_GET_ITEM(values, position);
        } else if (kwargs != Py_None) {
            value = PyDict_GetItemWithError(kwargs, name);
            if (value == NULL && PyErr_Occurred()) goto fail;
        }
        if (value != NULL && value != Py_None && each_tensor(value, written_pair, found) < 0) goto fail;
    }
    return found;
fail:
    seam_release(found);
    return NULL;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, "Sets the classes the scan makes and reads."},
    {"arguments", (PyCFunction)(void (*)(void))arguments, METH_FASTCALL, "Notes an op's positional arguments."},
    {"value", (PyCFunction)(void (*)(void))value, METH_FASTCALL, "Notes one value (argument or output)."},
    {"op", (PyCFunction)(void (*)(void))op, METH_FASTCALL, "An op's accesses (op_accesses after its plan)."},
    {"written", (PyCFunction)(void (*)(void))written, METH_FASTCALL,
     "The written arguments' (tensor, storage address) before an op (written_storages)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    str_untyped_storage = PyUnicode_InternFromString("untyped_storage");
    str_data_ptr = PyUnicode_InternFromString("data_ptr");
    str_get_device = PyUnicode_InternFromString("get_device");
    str_fresh = PyUnicode_InternFromString("fresh");
    str_accessed = PyUnicode_InternFromString("accessed");
    str_is_write = PyUnicode_InternFromString("is_write");
    str_names = PyUnicode_InternFromString("names");
    str_out = PyUnicode_InternFromString("out");
    str_storage = PyUnicode_InternFromString("storage");
    if (!str_out || !str_storage) return NULL;
    if (!str_untyped_storage || !str_data_ptr || !str_get_device || !str_fresh || !str_accessed || !str_is_write ||
        !str_names)
        return NULL;
    if (PyType_Ready(&AccessBase) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "AccessBase", (PyObject *)&AccessBase) < 0) {
        seam_release(m);
        return NULL;
    }
    return m;
}
