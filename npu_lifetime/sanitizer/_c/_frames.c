/* The sanitizer's stack capture, native: one walk of the calling thread's
 * frames per op, keeping (code object, instruction offset) pairs, and the
 * site object (sites.Site) made here.  Line numbers are worked out only when
 * a finding is reported (lineno below); reading a frame's f_lineno from
 * Python costs about as much as the op.
 *
 * Mirrors sites.capture's Python walk (the fallback when this module is not
 * built) exactly: the same kinds, the same stopping rules.  No torch.
 *
 * Each code object's kind (sites._classify of its file) is worked out once
 * and kept on the code object itself, in a co_extra slot of this module's
 * (no dict lookup, no key object per frame).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"
#include <frameobject.h>
#include <structmember.h>

#if PY_VERSION_HEX >= 0x030C0000
#define REQUEST_CODE_EXTRA_INDEX PyUnstable_Eval_RequestCodeExtraIndex
#define CODE_GET_EXTRA PyUnstable_Code_GetExtra
#define CODE_SET_EXTRA PyUnstable_Code_SetExtra
#else
#define REQUEST_CODE_EXTRA_INDEX _PyEval_RequestCodeExtraIndex
#define CODE_GET_EXTRA _PyCode_GetExtra
#define CODE_SET_EXTRA _PyCode_SetExtra
#endif

enum { KIND_USER = 0, KIND_PASS = 1, KIND_RUNNER = 2, KIND_LIBRARY = 3 };
enum { WALK_LIMIT = 256 }; /* the most frames configure accepts as max_walk */

/* sites.Site's base: its five slots, so that a capture makes the site here
 * without running Site.__init__. */
typedef struct {
    PyObject_HEAD
    PyObject *raw_frames, *raw_library, *context, *frames, *library;
} SiteObject;

static int site_traverse(SiteObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->raw_frames);
    Py_VISIT(self->raw_library);
    Py_VISIT(self->context);
    Py_VISIT(self->frames);
    Py_VISIT(self->library);
    return 0;
}

static int site_clear(SiteObject *self) {
    SEAM_CLEAR(self->raw_frames);
    SEAM_CLEAR(self->raw_library);
    SEAM_CLEAR(self->context);
    SEAM_CLEAR(self->frames);
    SEAM_CLEAR(self->library);
    return 0;
}

static void site_dealloc(SiteObject *self) {
    PyObject_GC_UnTrack(self);
    site_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef site_members[] = {
    {"raw_frames", T_OBJECT_EX, offsetof(SiteObject, raw_frames), 0, NULL},
    {"raw_library", T_OBJECT_EX, offsetof(SiteObject, raw_library), 0, NULL},
    {"context", T_OBJECT_EX, offsetof(SiteObject, context), 0, NULL},
    {"_frames", T_OBJECT_EX, offsetof(SiteObject, frames), 0, NULL},
    {"_library", T_OBJECT_EX, offsetof(SiteObject, library), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SiteBase = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npu_lifetime.sanitizer._frames.SiteBase",
    .tp_basicsize = sizeof(SiteObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "sites.Site's slots.",
    .tp_traverse = (traverseproc)site_traverse,
    .tp_clear = (inquiry)site_clear,
    .tp_dealloc = (destructor)site_dealloc,
    .tp_members = site_members,
    .tp_new = PyType_GenericNew,
};

/* configure(site_class, classify, frameless, phase, max_walk, library_max):
 *   site_class: sites.Site (a subclass of SiteBase)
 *   classify:   sites._classify(filename) -> kind
 *   frameless:  sites._frameless_site(library pairs) -> Site, for a capture with no user frame
 *   phase:      sites._phase (its .text, when set, is the site's context and no walk is made) */
static PyTypeObject *site_class;
static PyObject *classify_fn, *frameless_fn, *phase_obj, *str_text, *str_empty_context, *empty_tuple;
static Py_ssize_t code_extra_index = -1;
static long max_walk_cfg, library_max_cfg;

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &SiteBase)) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(site_class: a SiteBase subclass, classify, frameless, phase, max_walk, library_max)");
        return NULL;
    }
    long max_walk = PyLong_AsLong(args[4]), library_max = PyLong_AsLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (max_walk < 0 || max_walk > WALK_LIMIT || library_max < 0 || library_max > WALK_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "max_walk and library_max must be within 0..256");
        return NULL;
    }
    Py_XSETREF(site_class, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(classify_fn, Py_NewRef(args[1]));
    Py_XSETREF(frameless_fn, Py_NewRef(args[2]));
    Py_XSETREF(phase_obj, Py_NewRef(args[3]));
    max_walk_cfg = max_walk;
    library_max_cfg = library_max;
    Py_RETURN_NONE;
}

/* The frame's last instruction as a byte offset into its code. */
static int frame_lasti(PyFrameObject *frame) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(frame);
#else
    return frame->f_lasti * (int)sizeof(_Py_CODEUNIT);
#endif
}

/* The kind of a code object: kept in its co_extra slot (kind + 1) once
 * classify(filename) said it. */
static int code_kind(PyCodeObject *code) {
    void *extra = NULL;
    if (CODE_GET_EXTRA((PyObject *)code, code_extra_index, &extra) < 0) return -1;
    if (extra != NULL) return (int)((uintptr_t)extra - 1);
    PyObject *kind = PyObject_CallOneArg(classify_fn, code->co_filename);
    if (kind == NULL) return -1;
    long value = PyLong_AsLong(kind);
    seam_release(kind);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (value < KIND_USER || value > KIND_LIBRARY) {
        PyErr_Format(PyExc_ValueError, "classify returned %ld, not a kind", value);
        return -1;
    }
    if (CODE_SET_EXTRA((PyObject *)code, code_extra_index, (void *)(uintptr_t)(value + 1)) < 0) return -1;
    return (int)value;
}

/* ((code, lasti), ...) from n codes (references stolen, also on failure) and offsets. */
static PyObject *pairs(PyCodeObject **codes, int *lasti, Py_ssize_t n) {
    PyObject *tuple = PyTuple_New(n);
    Py_ssize_t i = 0;
    for (; tuple != NULL && i < n; i++) {
        PyObject *offset = PyLong_FromLong(lasti[i]);
        PyObject *pair = offset != NULL ? PyTuple_New(2) : NULL;
        if (pair == NULL) {
            seam_release(offset);
            SEAM_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(pair, 0, (PyObject *)codes[i]); /* stolen */
        PyTuple_SET_ITEM(pair, 1, offset);
        PyTuple_SET_ITEM(tuple, i, pair);
    }
    for (; i < n; i++) seam_release(codes[i]); /* not handed to the tuple */
    return tuple;
}

/* capture(depth, skip) -> sites.Site: the innermost depth user frames above
 * the caller's skip-th frame (skip counts frames above the caller of
 * capture), and the library frames below them; sites.capture's rules. */
static PyObject *capture(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (site_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_frames.configure() was not called");
        return NULL;
    }
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "capture(depth, skip)");
        return NULL;
    }
    long depth = PyLong_AsLong(args[0]), skip = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (depth <= 0) Py_RETURN_NONE;
    PyObject *text = PyObject_GetAttr(phase_obj, str_text);
    if (text == NULL) return NULL;
    int in_phase = PyObject_IsTrue(text);
    if (in_phase != 0) { /* a runner's own step (its garbage collection): the frames above are not the program's */
        PyObject *site = in_phase > 0 ? PyObject_CallFunctionObjArgs((PyObject *)site_class, empty_tuple,
                                                                     empty_tuple, text, NULL)
                                      : NULL;
        seam_release(text);
        return site;
    }
    seam_release(text);
    PyCodeObject *user[WALK_LIMIT], *library[WALK_LIMIT];
    int user_lasti[WALK_LIMIT], library_lasti[WALK_LIMIT];
    Py_ssize_t n_user = 0, n_library = 0;
    int failed = 0;
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed: capture's caller */
    Py_XINCREF(frame);
    for (long i = 0; i < skip && frame != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        seam_release(frame);
        frame = back;
    }
    for (long walked = 0; frame != NULL && walked < max_walk_cfg; walked++) {
        PyCodeObject *code = PyFrame_GetCode(frame); /* a new reference */
        int kind = code_kind(code);
        int stop = 0, kept = 0;
        failed = kind < 0;
        if (!failed && kind == KIND_USER) {
            user[n_user] = code;
            user_lasti[n_user++] = frame_lasti(frame);
            kept = 1;
            stop = n_user == depth;
        } else if (!failed && kind == KIND_LIBRARY) {
            if (n_user == 0 && n_library < library_max_cfg) {
                library[n_library] = code;
                library_lasti[n_library++] = frame_lasti(frame);
                kept = 1;
            }
        } else if (!failed && kind == KIND_RUNNER && n_user > 0) {
            stop = 1;
        }
        if (!kept) seam_release(code);
        if (failed || stop) break;
        PyFrameObject *back = PyFrame_GetBack(frame);
        seam_release(frame);
        frame = back;
    }
    seam_release(frame);
    if (failed) {
        for (Py_ssize_t i = 0; i < n_user; i++) seam_release(user[i]);
        for (Py_ssize_t i = 0; i < n_library; i++) seam_release(library[i]);
        return NULL;
    }
    PyObject *frames_tuple = pairs(user, user_lasti, n_user);
    PyObject *library_tuple = pairs(library, library_lasti, n_library);
    if (frames_tuple == NULL || library_tuple == NULL) goto fail;
    if (n_user == 0) {
        seam_release(frames_tuple);
        PyObject *site = PyObject_CallOneArg(frameless_fn, library_tuple);
        seam_release(library_tuple);
        return site;
    }
    SiteObject *site = (SiteObject *)site_class->tp_alloc(site_class, 0);
    if (site == NULL) goto fail;
    site->raw_frames = frames_tuple; /* the references move to the site */
    site->raw_library = library_tuple;
    site->context = Py_NewRef(str_empty_context);
    site->frames = Py_NewRef(Py_None);
    site->library = Py_NewRef(Py_None);
    return (PyObject *)site;
fail:
    seam_release(frames_tuple);
    seam_release(library_tuple);
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
#ifdef NPL_MUTANT_FRAMES /* tests/sanitizer/test_sanitizer_seam_mutants.py: every site one line off */
    return PyLong_FromLong(PyCode_Addr2Line((PyCodeObject *)args[0], lasti) + 1);
#else
    return PyLong_FromLong(PyCode_Addr2Line((PyCodeObject *)args[0], lasti));
#endif
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, "Sets what a capture makes and calls."},
    {"capture", (PyCFunction)(void (*)(void))capture, METH_FASTCALL, "Walks the stack: a sites.Site."},
    {"lineno", (PyCFunction)(void (*)(void))lineno, METH_FASTCALL, "The line of (code, byte offset)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__frames(void) {
    str_text = PyUnicode_InternFromString("text");
    str_empty_context = PyUnicode_FromString("");
    empty_tuple = PyTuple_New(0);
    if (str_text == NULL || str_empty_context == NULL || empty_tuple == NULL) return NULL;
    code_extra_index = REQUEST_CODE_EXTRA_INDEX(NULL);
    if (code_extra_index < 0) {
        PyErr_SetString(PyExc_RuntimeError, "no co_extra index left for the site capture");
        return NULL;
    }
    if (PyType_Ready(&SiteBase) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "SiteBase", (PyObject *)&SiteBase) < 0) {
        seam_release(m);
        return NULL;
    }
    return m;
}
