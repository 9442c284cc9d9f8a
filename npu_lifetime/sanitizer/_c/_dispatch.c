/* The dispatch mode's __torch_dispatch__, native (dispatch.py's _Mode).
 *
 * Torch calls a mode's __torch_dispatch__ once per op.  The Python body
 * (_Mode.__torch_dispatch__) handles every op; this file runs the common op
 * itself, the same steps in the same order, with the same Python objects,
 * so that an op costs a few calls into the sanitizer instead of the body's
 * interpretation:
 *
 *   the common op: one enabled sanitizer; not record_stream / record_use;
 *   its plan (accesses.plan) neither a collective, a resize nor a batch norm
 *   with a training flag; the native site walk and scan in use.
 *
 * Everything else, and any op while a guard fails (a test replaced
 * accesses.op_accesses, plan, written_storages or _native_scan,
 * sites._native_frames or native.feed), goes
 * to the Python body, decided before the op has any effect.
 *
 *   configure(body, wrapped, set_eval_frame)   once (dispatch.py)
 *   common(state or None)                      whenever the enabled sanitizers change
 *   dispatcher(mode) -> the bound __torch_dispatch__
 *
 * state: an OpFeed (this module's type, made by dispatch._native_state with one
 * keyword argument per field, named as below in lower case: sanitizer, backend, ...):
 *   0 sanitizer, 1 backend, 2 tracked (backend.tracks), 3 op_device(backend, found),
 *   4 before_op hooks, 5 inside_op hooks (tuples of callables), 6 depth (int),
 *   7 capture (_frames.capture), 8 OpFrame, 9 on_thread, 10 replay_held(frame),
 *   11 feed_held(func, plan, args, kwargs, outputs, frame, written_before) -> error or None,
 *   12 written (_scan.written: written_storages(plan, ...) from the plan's arguments), 13 scan_op (_scan.op),
 *   14 plan(func),
 *   15 (record_stream, record_use) ops, 16 guards: ((module dict, name, expected), ...),
 *   17 stream_handle(device) -> handle or None (backend.current_stream(d) is then (d, handle)),
 *   the sanitizer's apply_accesses, inlined: 18 its lock, 19 model.has_stream, 20 the op feed (sanitizer._op_feed),
 *   21 storages.live, 22 storages.sizeless, 23 _first_sight, 24 model.set_size, 25 model.access,
 *   26 _findings.add, 27 _announce_races,
 *   28 binding(func) -> what runs the op (dispatch._op_binding: the op's C++ binding where
 *      OpOverload.__call__ only forwards to it, which saves its Python frame per op),
 *   29 forwarder: that __call__ (or None); an op is run by its binding only while its class's
 *      __call__ is still this one (a __call__ patched after the op's first sight is run)
 *
 * Dynamo: torch wraps a mode's __torch_dispatch__ so that Dynamo never
 * compiles it (torch._disable_dynamo sets the thread's eval-frame callback
 * to None around the call).  With no callback set (no torch.compile running
 * on this thread) that changes nothing and this runs directly; otherwise
 * torch's wrapper of the Python body runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../seam.h"
#include <structmember.h>

enum {
    S_SANITIZER, S_BACKEND, S_TRACKED, S_OP_DEVICE, S_BEFORE, S_INSIDE, S_DEPTH, S_CAPTURE, S_OP_FRAME,
    S_ON_THREAD, S_REPLAY_HELD, S_FEED_HELD, S_WRITTEN_STORAGES, S_SCAN_OP, S_PLAN, S_LIFETIME_OPS, S_GUARDS,
    S_STREAM_HANDLE, S_LOCK, S_HAS_STREAM, S_FEED, S_LIVE, S_SIZELESS, S_FIRST_SIGHT, S_SET_SIZE, S_ACCESS,
    S_FINDINGS_ADD, S_ANNOUNCE, S_BINDING, S_FORWARDER, S_SIZE
};

/* A plan entry, per op (cached by the op's address, the op kept alive):
 * (func, kind, plan, arguments, by_name, fresh_returns, written, writes, name, call) */
enum { P_FUNC, P_KIND, P_PLAN, P_ARGUMENTS, P_BY_NAME, P_FRESH_RETURNS, P_WRITTEN, P_WRITES, P_NAME, P_CALL, P_SIZE };
enum { KIND_BODY, KIND_NO_DATA, KIND_COMMON };

static PyObject *dispatch_body, *dispatch_wrapped, *set_eval_frame;
/* OpFeed(**fields): what the common op's path reads, one field per S_ index, each given by name. */
#define OP_FEED_FIELDS(X)                                                                                     \
    X(sanitizer) X(backend) X(tracked) X(op_device) X(before_op) X(inside_op) X(depth) X(capture) X(op_frame)   \
        X(on_thread) X(replay_held) X(feed_held) X(written_storages) X(scan_op) X(plan) X(lifetime_ops) X(guards) \
            X(stream_handle) X(lock) X(has_stream) X(feed) X(live) X(sizeless) X(first_sight) X(set_size)        \
                X(access) X(findings_add) X(announce) X(binding) X(forwarder)
#define FIELD_NAME(name) #name,
static const char *const op_feed_names[] = {OP_FEED_FIELDS(FIELD_NAME) NULL};
#undef FIELD_NAME
_Static_assert(sizeof(op_feed_names) / sizeof(*op_feed_names) == S_SIZE + 1, "one OpFeed field per S_ index");

typedef struct {
    PyObject_HEAD
    PyObject *items[S_SIZE];
} OpFeed;

#define ST(state, index) (((OpFeed *)(state))->items[index])

static int op_feed_init(OpFeed *f, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || kwds == NULL || PyDict_GET_SIZE(kwds) != S_SIZE) {
        PyErr_Format(PyExc_TypeError, "OpFeed takes its %d fields as keyword arguments (dispatch._native_state)",
                     (int)S_SIZE);
        return -1;
    }
    for (int i = 0; i < S_SIZE; i++) {
        PyObject *value = PyDict_GetItemString(kwds, op_feed_names[i]);
        if (value == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "OpFeed: missing field %s", op_feed_names[i]);
            return -1;
        }
        Py_XSETREF(f->items[i], Py_NewRef(value));
    }
    return 0;
}

static int op_feed_traverse(OpFeed *f, visitproc visit, void *arg) {
    for (int i = 0; i < S_SIZE; i++) Py_VISIT(f->items[i]);
    return 0;
}

static int op_feed_clear(OpFeed *f) {
    for (int i = 0; i < S_SIZE; i++) Py_CLEAR(f->items[i]);
    return 0;
}

static void op_feed_dealloc(OpFeed *f) {
    PyObject_GC_UnTrack(f);
    op_feed_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject OpFeedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "npu_lifetime.sanitizer._dispatch.OpFeed",
    .tp_basicsize = sizeof(OpFeed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "OpFeed(**fields): what the common op's path reads (dispatch._native_state names each field).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)op_feed_init,
    .tp_traverse = (traverseproc)op_feed_traverse,
    .tp_clear = (inquiry)op_feed_clear,
    .tp_dealloc = (destructor)op_feed_dealloc,
};

static PyObject *common_state; /* an OpFeed, or NULL: every op to the body */
static PyObject *plan_entries; /* {id(func): entry} */
static PyObject *str_frame, *str_held, *str_site, *str_device_index, *str_current_stream, *str_apply_accesses,
    *str_touches_data, *str_resizes, *str_collective, *str_training, *str_arguments, *str_by_name,
    *str_fresh_returns, *str_allocates_only, *str_writes, *str_name, *str_enter, *str_exit, *str_call;

/* hub.OpFrame, native: the op being dispatched on a thread, its site and
 * the device events it issued (held until its accesses are known). */
typedef struct {
    PyObject_HEAD
    PyObject *site, *held;
} OpFrameObject;

static int frame_traverse(OpFrameObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->site);
    Py_VISIT(self->held);
    return 0;
}

static int frame_clear(OpFrameObject *self) {
    SEAM_CLEAR(self->site);
    SEAM_CLEAR(self->held);
    return 0;
}

static void frame_dealloc(OpFrameObject *self) {
    PyObject_GC_UnTrack(self);
    frame_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *frame_make(PyTypeObject *type, PyObject *site) {
    PyObject *held = PyList_New(0);
    OpFrameObject *self = held == NULL ? NULL : (OpFrameObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        seam_release(held);
        return NULL;
    }
    self->site = Py_NewRef(site);
    self->held = held;
    return (PyObject *)self;
}

static PyObject *frame_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *site;
    static char *names[] = {"site", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:OpFrame", names, &site)) return NULL;
    return frame_make(type, site);
}

static PyMemberDef frame_members[] = {
    {"site", T_OBJECT_EX, offsetof(OpFrameObject, site), 0, "where the op was called"},
    {"held", T_OBJECT_EX, offsetof(OpFrameObject, held), 0, "[(hub, name, args)]: device events the op issued"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject OpFrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npu_lifetime.sanitizer._dispatch.OpFrame",
    .tp_basicsize = sizeof(OpFrameObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "OpFrame(site): the op being dispatched on this thread (hub.OpFrame).",
    .tp_traverse = (traverseproc)frame_traverse,
    .tp_clear = (inquiry)frame_clear,
    .tp_dealloc = (destructor)frame_dealloc,
    .tp_members = frame_members,
    .tp_new = frame_new,
};

/* Marks "not handled here: run the body" (never returned to Python). */
static PyObject not_mine_object;
#define NOT_MINE (&not_mine_object)

static int guards_hold(PyObject *guards) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guards); i++) {
        PyObject *guard = PyTuple_GET_ITEM(guards, i);
        PyObject *now = PyDict_GetItemWithError(PyTuple_GET_ITEM(guard, 0), PyTuple_GET_ITEM(guard, 1));
        if (now != PyTuple_GET_ITEM(guard, 2)) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

static int flag(PyObject *plan, PyObject *name) {
    PyObject *value = PyObject_GetAttr(plan, name);
    if (value == NULL) return -1;
    int truth = PyObject_IsTrue(value);
    seam_release(value);
    return truth;
}

/* The op's plan entry (a borrowed reference), made on first sight from
 * accesses.plan(func); NULL with an error set if the plan failed. */
static PyObject *plan_entry(PyObject *state, PyObject *func) {
    PyObject *key = PyLong_FromVoidPtr(func);
    if (key == NULL) return NULL;
    PyObject *entry = PyDict_GetItemWithError(plan_entries, key);
    if (entry != NULL && PyTuple_GET_ITEM(entry, P_FUNC) == func) {
        seam_release(key);
        return entry;
    }
    if (PyErr_Occurred()) goto fail;
    PyObject *plan = PyObject_CallOneArg(ST(state, S_PLAN), func);
    if (plan == NULL) goto fail;
    int touches = flag(plan, str_touches_data), resizes = flag(plan, str_resizes),
        collective = flag(plan, str_collective), allocates_only = flag(plan, str_allocates_only),
        writes = flag(plan, str_writes);
    PyObject *training = PyObject_GetAttr(plan, str_training);
    PyObject *arguments = PyObject_GetAttr(plan, str_arguments), *by_name = PyObject_GetAttr(plan, str_by_name),
             *fresh = PyObject_GetAttr(plan, str_fresh_returns), *name = PyObject_GetAttr(plan, str_name);
    PyObject *call = NULL;
    entry = NULL;
    if (touches >= 0 && resizes >= 0 && collective >= 0 && allocates_only >= 0 && writes >= 0 && training &&
        arguments && by_name && fresh && name &&
        (call = PyObject_CallOneArg(ST(state, S_BINDING), func)) != NULL) {
        long kind = (resizes || collective || training != Py_None) ? KIND_BODY : touches ? KIND_COMMON : KIND_NO_DATA;
        entry = Py_BuildValue("(OlOOOOOOOO)", func, kind, plan, arguments, by_name, fresh,
                              allocates_only ? Py_False : Py_True, writes ? Py_True : Py_False, name, call);
    }
    seam_release(call);
    seam_release(plan);
    seam_release(training);
    seam_release(arguments);
    seam_release(by_name);
    seam_release(fresh);
    seam_release(name);
    if (entry == NULL || PyDict_SetItem(plan_entries, key, entry) < 0) {
        seam_release(entry);
        goto fail;
    }
    seam_release(entry); /* the dict holds it */
    seam_release(key);
    return entry;
fail:
    seam_release(key);
    return NULL;
}

/* What runs the op: its entry's binding while its class's __call__ is still
 * the forwarder that binding was chosen for, else func itself (borrowed). */
static PyObject *op_call(PyObject *state, PyObject *entry, PyObject *func) {
    PyObject *call = PyTuple_GET_ITEM(entry, P_CALL);
    if (call == func) return func;
    PyObject *now = PyObject_GetAttr((PyObject *)Py_TYPE(func), str_call);
    int same = now != NULL && now == ST(state, S_FORWARDER);
    seam_release(now);
    PyErr_Clear();
    return same ? call : func;
}

static int call_each(PyObject *hooks, PyObject *const *args, size_t nargs) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hooks); i++) {
        PyObject *done = PyObject_Vectorcall(PyTuple_GET_ITEM(hooks, i), args, nargs, NULL);
        if (done == NULL) return -1;
        seam_release(done);
    }
    return 0;
}

/* The op, its hooks around it, with on_thread.frame set to its frame (the
 * device events it issues are held there); on a failure the held events
 * are replayed (what the op did issue still happened) and the error stays. */
static PyObject *run_op(PyObject *state, PyObject *frame, PyObject *func, PyObject *call, PyObject *args,
                        PyObject *kwargs) {
    PyObject *on_thread = ST(state, S_ON_THREAD);
    PyObject *outer = PyObject_GetAttr(on_thread, str_frame);
    if (outer == NULL) return NULL;
    if (PyObject_SetAttr(on_thread, str_frame, frame) < 0) {
        seam_release(outer);
        return NULL;
    }
    PyObject *outputs = PyObject_Call(call, args, kwargs);
    PyObject *hook_args[2] = {func, args};
    if (outputs != NULL && call_each(ST(state, S_INSIDE), hook_args, 2) < 0) SEAM_CLEAR(outputs);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    int restored = PyObject_SetAttr(on_thread, str_frame, outer);
    seam_release(outer);
    if (restored < 0) {
        seam_release(type);
        seam_release(value);
        seam_release(traceback);
        seam_release(outputs);
        return NULL;
    }
    if (outputs == NULL) {
        PyObject *replayed = PyObject_CallOneArg(ST(state, S_REPLAY_HELD), frame);
        if (replayed == NULL) { /* raised while handling the op's error: that one becomes its context */
            PyObject *t2, *v2, *tb2;
            PyErr_Fetch(&t2, &v2, &tb2); /* first: normalizing with an error set would lose both */
            PyErr_NormalizeException(&type, &value, &traceback);
            if (value != NULL && traceback != NULL) PyException_SetTraceback(value, traceback);
            PyErr_NormalizeException(&t2, &v2, &tb2);
            if (value != NULL && v2 != NULL) PyException_SetContext(v2, Py_NewRef(value));
            seam_release(type);
            seam_release(value);
            seam_release(traceback);
            PyErr_Restore(t2, v2, tb2);
            return NULL;
        }
        seam_release(replayed);
        PyErr_Restore(type, value, traceback);
    }
    return outputs;
}

/* Raises error (an exception instance) unless it is None; 0 or -1. */
static int raise_unless_none(PyObject *error) {
    if (error == Py_None) return 0;
    PyErr_SetObject((PyObject *)Py_TYPE(error), error);
    return -1;
}

/* The device the op ran on: its accesses' device, or op_device's choice
 * when they differ (a copy between devices runs on the source's stream). */
static PyObject *op_device(PyObject *state, PyObject *found) {
    PyObject *device = PyObject_GetAttr(PyList_GET_ITEM(found, 0), str_device_index);
    for (Py_ssize_t i = 1; device != NULL && i < PyList_GET_SIZE(found); i++) {
        PyObject *other = PyObject_GetAttr(PyList_GET_ITEM(found, i), str_device_index);
        int same = other == NULL ? -1 : PyObject_RichCompareBool(other, device, Py_EQ);
        seam_release(other);
        if (same == 0) {
            seam_release(device);
            PyObject *call[2] = {ST(state, S_BACKEND), found};
            return PyObject_Vectorcall(ST(state, S_OP_DEVICE), call, 2, NULL);
        }
        if (same < 0) SEAM_CLEAR(device);
    }
    return device;
}

/* backend.current_stream(device), as (device, handle) where the backend
 * has a stream_handle, else by calling it. */
static PyObject *current_stream(PyObject *state, PyObject *device) {
    PyObject *handle_of = ST(state, S_STREAM_HANDLE);
    if (handle_of == Py_None) {
        PyObject *call[2] = {ST(state, S_BACKEND), device};
        return PyObject_VectorcallMethod(str_current_stream, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    PyObject *handle = PyObject_CallOneArg(handle_of, device);
    if (handle == NULL) return NULL;
    PyObject *key = PyTuple_Pack(2, device, handle);
    seam_release(handle);
    return key;
}

/* LifetimeSanitizer.apply_accesses, the same steps: under its lock, the
 * accesses into the model (_feed.feed) and the races into its findings;
 * then the error to raise for new races, or None.  A stream the model does
 * not know yet goes through the method itself (it registers the stream). */
static PyObject *apply_accesses(PyObject *state, PyObject *stream, PyObject *found, PyObject *site, PyObject *name) {
    PyObject *lock = ST(state, S_LOCK);
    PyObject *entered = PyObject_CallMethodNoArgs(lock, str_enter);
    if (entered == NULL) return NULL;
    seam_release(entered);
    PyObject *known = PyObject_CallOneArg(ST(state, S_HAS_STREAM), stream);
    int has = known == NULL ? -1 : PyObject_IsTrue(known);
    seam_release(known);
    PyObject *races = NULL, *added = NULL;
    if (has > 0) {
        PyObject *call[10] = {found, ST(state, S_LIVE), ST(state, S_SIZELESS),
                              ST(state, S_FIRST_SIGHT), ST(state, S_SET_SIZE),
                              ST(state, S_ACCESS), stream, stream, name, site};
        races = PyObject_Vectorcall(ST(state, S_FEED), call, 10, NULL);
        int any = races == NULL ? -1 : PyObject_IsTrue(races);
        if (any > 0) added = PyObject_CallOneArg(ST(state, S_FINDINGS_ADD), races);
        else if (any == 0) added = PyTuple_New(0);
    }
    /* the with statement's exit: the error in flight, if any, passed on */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != NULL && traceback != NULL) PyException_SetTraceback(value, traceback);
    PyObject *exit_args[4] = {lock, type ? type : Py_None, value ? value : Py_None, traceback ? traceback : Py_None};
    PyObject *exited = PyObject_VectorcallMethod(str_exit, exit_args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    seam_release(races);
    if (exited == NULL) { /* raised by the exit itself: that error wins */
        seam_release(type);
        seam_release(value);
        seam_release(traceback);
        seam_release(added);
        return NULL;
    }
    seam_release(exited);
    PyErr_Restore(type, value, traceback);
    if (has < 0 || (has > 0 && added == NULL)) {
        seam_release(added);
        return NULL;
    }
    if (has == 0) { /* a new stream */
        PyObject *call[5] = {ST(state, S_SANITIZER), stream, found, site, name};
        return PyObject_VectorcallMethod(str_apply_accesses, call, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    int any_new = PyObject_IsTrue(added);
    PyObject *error = any_new > 0 ? PyObject_CallOneArg(ST(state, S_ANNOUNCE), added)
                                  : any_new == 0 ? Py_NewRef(Py_None) : NULL;
    seam_release(added);
    return error;
}

/* The op's accesses, found after it ran, into the sanitizer on the current stream. */
static int feed_accesses(PyObject *state, PyObject *entry, PyObject *frame, PyObject *args, PyObject *kwargs,
                         PyObject *outputs, PyObject *written_before) {
    PyObject *scan[9] = {PyTuple_GET_ITEM(entry, P_ARGUMENTS), PyTuple_GET_ITEM(entry, P_BY_NAME),
                         PyTuple_GET_ITEM(entry, P_FRESH_RETURNS), PyTuple_GET_ITEM(entry, P_WRITTEN), args,
                         kwargs, outputs, ST(state, S_TRACKED), written_before};
    PyObject *found = PyObject_Vectorcall(ST(state, S_SCAN_OP), scan, 9, NULL);
    if (found == NULL) return -1;
    int failed = !PyList_Check(found);
    if (failed) PyErr_SetString(PyExc_TypeError, "_scan.op returned no list");
#ifdef NPL_MUTANT_DISPATCH /* tests/test_sanitizer_seam_mutants.py: the common op's accesses are dropped */
    if (!failed) PyList_SetSlice(found, 0, PyList_GET_SIZE(found), NULL);
#endif
    if (failed || PyList_GET_SIZE(found) == 0) {
        seam_release(found);
        return failed ? -1 : 0;
    }
    PyObject *device = op_device(state, found), *current = NULL, *site = NULL, *error = NULL;
    if (device != NULL) current = current_stream(state, device);
    if (current != NULL) site = PyObject_GetAttr(frame, str_site);
    if (site != NULL) error = apply_accesses(state, current, found, site, PyTuple_GET_ITEM(entry, P_NAME));
    failed = error == NULL || raise_unless_none(error) < 0;
    seam_release(error);
    seam_release(site);
    seam_release(current);
    seam_release(device);
    seam_release(found);
    return failed ? -1 : 0;
}

/* A data-touching op: site, run, then its accesses (or, when it issued
 * device events, the Python feed that puts them in device order). */
static PyObject *common_op(PyObject *state, PyObject *entry, PyObject *func, PyObject *args, PyObject *kwargs) {
    PyObject *capture_args[2] = {ST(state, S_DEPTH), NULL};
    capture_args[1] = PyLong_FromLong(0);
    if (capture_args[1] == NULL) return NULL;
    PyObject *site = PyObject_Vectorcall(ST(state, S_CAPTURE), capture_args, 2, NULL);
    seam_release(capture_args[1]);
    PyObject *frame_class = ST(state, S_OP_FRAME); /* this file's OpFrame: made with no argument parsing */
    PyObject *frame = site == NULL                                  ? NULL
                      : frame_class == (PyObject *)&OpFrameType ? frame_make(&OpFrameType, site)
                                                                  : PyObject_CallOneArg(frame_class, site);
    seam_release(site);
    if (frame == NULL) return NULL;
    PyObject *written_before = Py_NewRef(Py_None), *outputs = NULL, *held = NULL;
    if (PyTuple_GET_ITEM(entry, P_WRITES) == Py_True) {
        PyObject *call[3] = {PyTuple_GET_ITEM(entry, P_ARGUMENTS), args, kwargs};
        Py_SETREF(written_before, PyObject_Vectorcall(ST(state, S_WRITTEN_STORAGES), call, 3, NULL));
        if (written_before == NULL) goto done;
    }
    outputs = run_op(state, frame, func, op_call(state, entry, func), args, kwargs);
    if (outputs == NULL) goto done;
    held = PyObject_GetAttr(frame, str_held);
    int any_held = held == NULL ? -1 : PyObject_IsTrue(held);
    int failed;
    if (any_held > 0) {
        PyObject *call[7] = {func, PyTuple_GET_ITEM(entry, P_PLAN), args, kwargs, outputs, frame, written_before};
        PyObject *error = PyObject_Vectorcall(ST(state, S_FEED_HELD), call, 7, NULL);
        failed = error == NULL || raise_unless_none(error) < 0;
        seam_release(error);
    } else {
        failed = any_held < 0 || feed_accesses(state, entry, frame, args, kwargs, outputs, written_before) < 0;
    }
    if (failed) SEAM_CLEAR(outputs);
done:
    seam_release(held);
    seam_release(written_before);
    seam_release(frame);
    return outputs;
}

/* The op handled here, or NOT_MINE (decided before the op has any effect). */
static PyObject *try_op(PyObject *state, PyObject *func, PyObject *args, PyObject *kwargs) {
    PyObject *lifetime_ops = ST(state, S_LIFETIME_OPS);
    if (!PyTuple_Check(args) || !PyDict_Check(kwargs) || !guards_hold(ST(state, S_GUARDS)) ||
        func == PyTuple_GET_ITEM(lifetime_ops, 0) || func == PyTuple_GET_ITEM(lifetime_ops, 1))
        return NOT_MINE;
    PyObject *entry = plan_entry(state, func);
    if (entry == NULL) { /* the body makes the plan again and raises its error where the Python path does */
        PyErr_Clear();
        return NOT_MINE;
    }
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(entry, P_KIND));
    if (kind == KIND_BODY) return NOT_MINE;
    Py_INCREF(entry); /* a plan cache change during the op must not free it */
    PyObject *result = NULL;
    if (call_each(ST(state, S_BEFORE), NULL, 0) == 0)
        result = kind == KIND_NO_DATA ? PyObject_Call(op_call(state, entry, func), args, kwargs)
                                      : common_op(state, entry, func, args, kwargs);
    seam_release(entry);
    return result;
}

static PyObject *call_body(PyObject *target, PyObject *mode, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8];
    PyObject **call = total < 8 ? small : PyMem_New(PyObject *, total + 1);
    if (call == NULL) return PyErr_NoMemory();
    call[0] = mode;
    for (Py_ssize_t i = 0; i < total; i++) call[i + 1] = args[i];
    Py_INCREF(target); /* a configure() during the call must not free it under us */
    PyObject *result = PyObject_Vectorcall(target, call, nargs + 1, kwnames);
    seam_release(target);
    if (call != small) PyMem_Free(call);
    return result;
}

/* __torch_dispatch__(func, types, args=(), kwargs=None), bound to the mode. */
static PyObject *dispatch(PyObject *mode, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *prior = PyObject_CallOneArg(set_eval_frame, Py_None);
    if (prior == NULL) return NULL;
    if (prior != Py_None) { /* Dynamo is active: its callback back, and torch's own wrapper */
        PyObject *back = PyObject_CallOneArg(set_eval_frame, prior);
        seam_release(prior);
        if (back == NULL) return NULL;
        seam_release(back);
        return call_body(dispatch_wrapped, mode, args, nargs, kwnames);
    }
    seam_release(prior);
    PyObject *state = common_state;
    if (state != NULL && kwnames == NULL && nargs >= 3) {
        Py_INCREF(state); /* a common() during the op must not free it under us */
        PyObject *kwargs = nargs > 3 && args[3] != Py_None ? Py_NewRef(args[3]) : PyDict_New();
        PyObject *result = kwargs == NULL ? NULL : try_op(state, args[0], args[2], kwargs);
        seam_release(kwargs);
        seam_release(state);
        if (result != NOT_MINE) return result;
    }
    return call_body(dispatch_body, mode, args, nargs, kwnames);
}

static PyMethodDef dispatch_def = {"__torch_dispatch__", (PyCFunction)(void (*)(void))dispatch,
                                   METH_FASTCALL | METH_KEYWORDS, "The dispatch mode's __torch_dispatch__."};

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "configure(body, wrapped, set_eval_frame)");
        return NULL;
    }
    Py_XSETREF(dispatch_body, Py_NewRef(args[0]));
    Py_XSETREF(dispatch_wrapped, Py_NewRef(args[1]));
    Py_XSETREF(set_eval_frame, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static int valid_state(PyObject *state) {
    if (!Py_IS_TYPE(state, &OpFeedType) || ST(state, 0) == NULL) return 0; /* made, and initialised */
    PyObject *ops = ST(state, S_LIFETIME_OPS), *guards = ST(state, S_GUARDS);
    if (!PyTuple_Check(ST(state, S_BEFORE)) || !PyTuple_Check(ST(state, S_INSIDE)) ||
        !PyLong_Check(ST(state, S_DEPTH)) || !PyTuple_Check(ops) || PyTuple_GET_SIZE(ops) != 2 ||
        !PyTuple_Check(guards))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guards); i++) {
        PyObject *guard = PyTuple_GET_ITEM(guards, i);
        if (!PyTuple_Check(guard) || PyTuple_GET_SIZE(guard) != 3 || !PyDict_Check(PyTuple_GET_ITEM(guard, 0)))
            return 0;
    }
    return 1;
}

static PyObject *common(PyObject *self, PyObject *state) {
    (void)self;
    if (state != Py_None && !valid_state(state)) {
        PyErr_SetString(PyExc_TypeError, "common(state): None or the OpFeed dispatch._native_state makes");
        return NULL;
    }
    Py_XSETREF(common_state, state == Py_None ? NULL : Py_NewRef(state));
    Py_RETURN_NONE;
}

static PyObject *dispatcher(PyObject *self, PyObject *mode) {
    (void)self;
    if (dispatch_body == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_dispatch.configure() was not called");
        return NULL;
    }
    return PyCFunction_New(&dispatch_def, mode);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "Sets the dispatch mode's body, its Dynamo-disabled wrapper and torch's set_eval_frame."},
    {"common", common, METH_O, "Sets (or, with None, clears) the state the common op's path reads."},
    {"dispatcher", dispatcher, METH_O, "The mode's __torch_dispatch__, bound to it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dispatch", NULL, -1, methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text) ((var = PyUnicode_InternFromString(text)) != NULL)

PyMODINIT_FUNC PyInit__dispatch(void) {
    plan_entries = PyDict_New();
    if (plan_entries == NULL || !INTERN(str_frame, "frame") || !INTERN(str_held, "held") || !INTERN(str_site, "site") ||
        !INTERN(str_device_index, "device_index") || !INTERN(str_current_stream, "current_stream") ||
        !INTERN(str_apply_accesses, "apply_accesses") || !INTERN(str_touches_data, "touches_data") ||
        !INTERN(str_resizes, "resizes") || !INTERN(str_collective, "collective") ||
        !INTERN(str_training, "training") || !INTERN(str_arguments, "arguments") ||
        !INTERN(str_by_name, "by_name") || !INTERN(str_fresh_returns, "fresh_returns") ||
        !INTERN(str_allocates_only, "allocates_only") || !INTERN(str_writes, "writes") || !INTERN(str_name, "name") ||
        !INTERN(str_enter, "__enter__") || !INTERN(str_exit, "__exit__") || !INTERN(str_call, "__call__"))
        return NULL;
    if (PyType_Ready(&OpFrameType) < 0 || PyType_Ready(&OpFeedType) < 0) return NULL;
    PyObject *made = PyModule_Create(&module);
    if (made != NULL && (PyModule_AddObjectRef(made, "OpFrame", (PyObject *)&OpFrameType) < 0 ||
                         PyModule_AddObjectRef(made, "OpFeed", (PyObject *)&OpFeedType) < 0))
        SEAM_CLEAR(made);
    return made;
}
