/* The sanitizer's per-op feed, native: an op's storage accesses (from the
 * scan, accesses.op_accesses) into the lifetime model, one model.access per
 * accessed storage.  LifetimeSanitizer._accesses does the same in Python
 * (the fallback, and what this file follows line by line); storages not in
 * the table yet, and sizes learnt at first sight, are handed back to it.
 *
 * feed(found, live, sizeless, first_sight, set_size, access, stream, fresh_stream, op_name, site)
 *   found:       [StorageAccess]             (accesses.py)
 *   live:        {address: storage id}       (StorageTable.live)
 *   sizeless:    {storage id}                (StorageTable.sizeless)
 *   first_sight: callable(entry, fresh_stream, site) -> storage id, for an address not in live
 *                (its arguments passed here: no closure to build per op)
 *   set_size:    the model's bound set_size(storage id, nbytes): for an id in sizeless, with the size of
 *                the entry's storage when it has one (it is then taken out of sizeless; StorageTable.sized)
 *   access:      the model's bound access(sid, stream, is_write, op, site, names)
 * Returns the races the accesses made, as one list.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"

static PyObject *str_storage, *str_accessed, *str_is_write, *str_names, *str_tensor, *str_untyped_storage,
    *str_nbytes;

/* _scan.c's AccessBase (accesses.StorageAccess's base), whose slots
 * (access_object.h) are read directly once configure_access(AccessBase) was
 * called (it checks the type's size). */
#include "access_object.h"

static PyTypeObject *access_type;

static PyObject *configure_access(PyObject *self, PyObject *type) {
    (void)self;
    if (!PyType_Check(type) || ((PyTypeObject *)type)->tp_basicsize != (Py_ssize_t)sizeof(AccessObject)) {
        PyErr_SetString(PyExc_TypeError, "configure_access(_scan.AccessBase)");
        return NULL;
    }
    Py_XSETREF(access_type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

/* entry.<name>: a new reference, or NULL with an error; an AccessBase
 * entry's slot is read directly. */
static PyObject *attribute(PyObject *entry, PyObject *name) {
    if (access_type != NULL && PyObject_TypeCheck(entry, access_type)) {
        AccessObject *a = (AccessObject *)entry;
        PyObject *value = name == str_storage    ? a->storage
                          : name == str_accessed ? a->accessed
                          : name == str_is_write ? a->is_write
                          : name == str_names    ? a->names
                          : name == str_tensor   ? a->tensor
                                                 : NULL;
        if (value != NULL) return Py_NewRef(value);
    }
    return PyObject_GetAttr(entry, name);
}

/* entry.<name> as a truth value; -1 on error. */
static int flag(PyObject *entry, PyObject *name) {
    PyObject *value = attribute(entry, name);
    if (value == NULL) return -1;
    int truth = PyObject_IsTrue(value);
    seam_release(value);
    return truth;
}

/* StorageTable.sized: sid's size from entry.tensor's storage, if it has one. 0, or -1 on error. */
static int size_from(PyObject *entry, PyObject *sid, PyObject *sizeless, PyObject *set_size) {
    PyObject *tensor = attribute(entry, str_tensor);
    PyObject *storage = tensor != NULL ? PyObject_CallMethodNoArgs(tensor, str_untyped_storage) : NULL;
    seam_release(tensor);
    PyObject *nbytes = storage != NULL ? PyObject_CallMethodNoArgs(storage, str_nbytes) : NULL;
    seam_release(storage);
    if (nbytes == NULL) return -1;
    int known = PyObject_IsTrue(nbytes);
    PyObject *done = NULL;
    if (known > 0 && PySet_Discard(sizeless, sid) >= 0) {
        PyObject *args[2] = {sid, nbytes};
        done = PyObject_Vectorcall(set_size, args, 2, NULL);
    }
    seam_release(nbytes);
    seam_release(done);
    return known < 0 || (known > 0 && done == NULL) ? -1 : 0;
}

/* The storage id of entry: from live, else first_sight(entry, fresh_stream,
 * site); its size set when it has none yet.  A new reference, or NULL. */
static PyObject *storage_id(PyObject *entry, PyObject *live, PyObject *sizeless, PyObject *first_sight,
                            PyObject *set_size, PyObject *fresh_stream, PyObject *site) {
    PyObject *address = attribute(entry, str_storage);
    if (address == NULL) return NULL;
    PyObject *sid = PyDict_GetItemWithError(live, address);
    seam_release(address);
    if (sid == NULL) {
        if (PyErr_Occurred()) return NULL;
        PyObject *call[3] = {entry, fresh_stream, site};
        return PyObject_Vectorcall(first_sight, call, 3, NULL);
    }
    Py_INCREF(sid);
    if (PySet_GET_SIZE(sizeless) > 0) {
        int unsized = PySet_Contains(sizeless, sid);
        if (unsized < 0 || (unsized > 0 && size_from(entry, sid, sizeless, set_size) < 0)) {
            seam_release(sid);
            return NULL;
        }
    }
    return sid;
}

/* model.access(sid, stream, entry.is_write, op_name, site, tuple(entry.names)), its races appended. */
static int access_one(PyObject *entry, PyObject *sid, PyObject *access, PyObject *stream, PyObject *op_name,
                      PyObject *site, PyObject *races) {
    int is_write = flag(entry, str_is_write);
    if (is_write < 0) return -1;
    PyObject *names = attribute(entry, str_names);
    if (names == NULL) return -1;
    PyObject *names_tuple = PySequence_Tuple(names);
    seam_release(names);
    if (names_tuple == NULL) return -1;
#ifdef NPL_MUTANT_OP_FEED /* tests/test_sanitizer_seam_mutants.py: every write fed as a read */
    is_write = 0;
#endif
    PyObject *args[6] = {sid, stream, is_write ? Py_True : Py_False, op_name, site, names_tuple};
    PyObject *found = PyObject_Vectorcall(access, args, 6, NULL);
    seam_release(names_tuple);
    if (found == NULL) return -1;
    int failed = 0;
    if (PyList_Check(found) && PyList_GET_SIZE(found) > 0)
        failed = PyList_SetSlice(races, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, found);
    seam_release(found);
    return failed;
}

static PyObject *feed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PySet_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "feed(found: list, live: dict, sizeless: set, first_sight, set_size, access, stream, fresh_stream, "
                        "op_name, site)");
        return NULL;
    }
    PyObject *found = args[0], *live = args[1], *sizeless = args[2], *first_sight = args[3], *set_size = args[4];
    PyObject *access = args[5], *stream = args[6], *fresh_stream = args[7], *op_name = args[8], *site = args[9];
    PyObject *races = PyList_New(0);
    if (races == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(found); i++) {
        PyObject *entry = PyList_GET_ITEM(found, i);
        PyObject *sid = storage_id(entry, live, sizeless, first_sight, set_size, fresh_stream, site);
        int accessed = sid != NULL ? flag(entry, str_accessed) : -1;
        int failed = accessed < 0 || (accessed && access_one(entry, sid, access, stream, op_name, site, races) < 0);
        seam_release(sid);
        if (failed) {
            seam_release(races);
            return NULL;
        }
    }
    return races;
}


static PyMethodDef methods[] = {
    {"feed", (PyCFunction)(void (*)(void))feed, METH_FASTCALL, "An op's accesses into the model; returns the races."},
    {"configure_access", configure_access, METH_O, "Sets _scan.AccessBase, whose slots feed reads directly."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_op_feed", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__op_feed(void) {
    str_storage = PyUnicode_InternFromString("storage");
    str_accessed = PyUnicode_InternFromString("accessed");
    str_is_write = PyUnicode_InternFromString("is_write");
    str_names = PyUnicode_InternFromString("names");
    str_tensor = PyUnicode_InternFromString("tensor");
    str_untyped_storage = PyUnicode_InternFromString("untyped_storage");
    str_nbytes = PyUnicode_InternFromString("nbytes");
    if (!str_storage || !str_accessed || !str_is_write || !str_names || !str_tensor || !str_untyped_storage || !str_nbytes)
        return NULL;
    return PyModule_Create(&module);
}
