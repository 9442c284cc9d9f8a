// A boxed fallback on a dispatch key of its own, switched on per thread: the
// floor a native (C++) sanitizer front end would stand on, for
// bench_dispatch_floor.py. Not part of the sanitizer.
//
// The key is DeferredInit (torchdistx's, out of tree; nothing in torch
// registers on it). It sits above Autograd: no key between BackendSelect and
// Autograd is free to borrow (see design/sanitizer.md, "A native front end?").
//
// Per op the fallback counts the op, does the work asked for (nothing; a call
// into Python with the op's name; a walk of the tensor arguments and returns
// reading each storage's data pointer and the schema's is_write; a call into
// Python with the name and the tensor arguments as Python tensors; a call
// site captured by a given Python capture, kept until the next op's), then runs
// the op below its key with the key excluded, so ops the op itself calls are
// not seen (as a Python dispatch mode does not see them).
#include <Python.h>

#include <ATen/ThreadLocalState.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace {

constexpr c10::DispatchKey kFloorKey = c10::DispatchKey::DeferredInit;

enum Work : int { kRedispatch = 0, kCallPython = 1, kWalkTensors = 2, kPassTensors = 3, kCaptureSite = 4 };

std::atomic<int> work_per_op{kRedispatch};
std::atomic<uint64_t> ops_seen{0};
PyObject* on_op = nullptr;  // owned reference, changed under the GIL
PyObject* site_capture = nullptr;  // owned: (callable, args tuple), changed under the GIL
thread_local PyObject* last_site = nullptr;  // the last op's site (owned), as a front end keeps it on its record
std::atomic<uint64_t> sites_captured{0};
thread_local uintptr_t walk_sink = 0;  // what the walk read, so it is not optimised away
thread_local uint64_t writes_seen = 0;
std::unique_ptr<torch::Library> registration;

void touch(const at::Tensor& tensor, bool is_write) {
  if (!tensor.defined() || !tensor.has_storage()) {
    return;
  }
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  walk_sink += reinterpret_cast<uintptr_t>(storage->data_ptr().get()) ^
      reinterpret_cast<uintptr_t>(storage);
  writes_seen += is_write ? 1 : 0;
}

// Calls visit(tensor) for a tensor value and for each tensor of a list (Tensor[] and Tensor?[]).
template <typename Visit>
void each_tensor(const c10::IValue& value, Visit visit) {
  if (value.isTensor()) {
    visit(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) {
      if (item.isTensor()) {
        visit(item.toTensor());
      }
    }
  }
}

// The top `arguments.size()` values of the stack, each with its alias info
// (returns too; a written return aliases a written argument, counted there).
void walk(const std::vector<c10::Argument>& arguments, const torch::jit::Stack& stack, bool are_returns) {
  const size_t count = arguments.size();
  const auto values = torch::jit::last(stack, count);
  for (size_t i = 0; i < count; ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    const bool is_write = !are_returns && alias != nullptr && alias->isWrite();
    each_tensor(values[i], [is_write](const at::Tensor& tensor) { touch(tensor, is_write); });
  }
}

// The op's tensor arguments (lists flattened) as a tuple of Python tensors, leaving out a Python
// number wrapped for the op (`x + 1`'s 1), which a Python dispatch mode is handed back as the
// number; NULL with a Python error set.
PyObject* tensor_arguments(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& value : torch::jit::last(stack, schema.arguments().size())) {
    each_tensor(value, [&tensors](const at::Tensor& tensor) {
      if (!tensor.unsafeGetTensorImpl()->is_wrapped_number()) {
        tensors.push_back(tensor);
      }
    });
  }
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(tensors.size()));
  for (size_t i = 0; tuple != nullptr && i < tensors.size(); ++i) {
    PyObject* wrapped = THPVariable_Wrap(tensors[i]);
    if (wrapped == nullptr) {
      Py_CLEAR(tuple);
    } else {
      PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), wrapped);
    }
  }
  return tuple;
}

// Takes the GIL and calls on_op(name), or on_op(name, tensors) with the op's tensor arguments
// when a stack is given; a Python error becomes a c10::Error.
void call_python(const c10::OperatorHandle& op, const torch::jit::Stack* with_tensors) {
  const std::string& name = op.operator_name().name;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* text = PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
  PyObject* tensors = (text != nullptr && with_tensors != nullptr) ? tensor_arguments(op.schema(), *with_tensors)
                                                                   : nullptr;
  PyObject* result = nullptr;
  if (text != nullptr && on_op != nullptr && (with_tensors == nullptr || tensors != nullptr)) {
    result = with_tensors == nullptr ? PyObject_CallOneArg(on_op, text)
                                     : PyObject_CallFunctionObjArgs(on_op, text, tensors, nullptr);
  }
  const bool failed = result == nullptr;
  Py_XDECREF(text);
  Py_XDECREF(tensors);
  Py_XDECREF(result);
  if (failed) {
    PyErr_Print();  // on_op unset or raising: say why on stderr
  }
  PyGILState_Release(gil);
  TORCH_CHECK(!failed, "dispatch_floor: calling on_op for ", name, " failed (see stderr)");
}

// Takes the GIL and keeps callable(*args) as this thread's last site; a Python error becomes a c10::Error.
void capture_site(const c10::OperatorHandle& op) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* site = site_capture != nullptr
      ? PyObject_Call(PyTuple_GET_ITEM(site_capture, 0), PyTuple_GET_ITEM(site_capture, 1), nullptr)
      : nullptr;
  const bool failed = site == nullptr;
  if (failed) {
    PyErr_Print();  // no capture set, or it raised
  } else {
    Py_XSETREF(last_site, site);
    sites_captured.fetch_add(1, std::memory_order_relaxed);
  }
  PyGILState_Release(gil);
  TORCH_CHECK(!failed, "dispatch_floor: capturing ", op.operator_name().name, "'s site failed (see stderr)");
}

void floor_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  ops_seen.fetch_add(1, std::memory_order_relaxed);
  const int work = work_per_op.load(std::memory_order_relaxed);
  if (work == kCallPython) {
    call_python(op, nullptr);
  } else if (work == kWalkTensors) {
    walk(op.schema().arguments(), *stack, false);
  } else if (work == kPassTensors) {
    call_python(op, stack);
  } else if (work == kCaptureSite) {
    capture_site(op);
  }
  {
    c10::impl::ExcludeDispatchKeyGuard not_nested(kFloorKey);
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kFloorKey), stack);
  }
  if (work == kWalkTensors) {
    walk(op.schema().returns(), *stack, true);
  }
}

PyObject* py_enable(PyObject* /*module*/, PyObject* arg) {
  const long work = PyLong_AsLong(arg);
  if (work == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  if (work < kRedispatch || work > kCaptureSite) {
    PyErr_Format(PyExc_ValueError, "work must be 0 to 4, not %ld", work);
    return nullptr;
  }
  work_per_op.store(static_cast<int>(work));
  c10::impl::tls_set_dispatch_key_included(kFloorKey, true);
  Py_RETURN_NONE;
}

PyObject* py_disable(PyObject* /*module*/, PyObject* /*unused*/) {
  c10::impl::tls_set_dispatch_key_included(kFloorKey, false);
  Py_RETURN_NONE;
}

PyObject* py_set_on_op(PyObject* /*module*/, PyObject* callable) {
  if (callable != Py_None && !PyCallable_Check(callable)) {
    PyErr_SetString(PyExc_TypeError, "on_op must be callable or None");
    return nullptr;
  }
  PyObject* previous = on_op;
  if (callable != Py_None) {
    Py_INCREF(callable);
  }
  on_op = callable == Py_None ? nullptr : callable;
  Py_XDECREF(previous);
  Py_RETURN_NONE;
}

PyObject* py_set_site_capture(PyObject* /*module*/, PyObject* args) {
  PyObject* callable = nullptr;
  PyObject* call_args = nullptr;
  if (!PyArg_ParseTuple(args, "OO!", &callable, &PyTuple_Type, &call_args)) {
    return nullptr;
  }
  if (callable != Py_None && !PyCallable_Check(callable)) {
    PyErr_SetString(PyExc_TypeError, "the site capture must be callable or None");
    return nullptr;
  }
  PyObject* pair = callable == Py_None ? nullptr : PyTuple_Pack(2, callable, call_args);
  if (callable != Py_None && pair == nullptr) {
    return nullptr;
  }
  Py_XSETREF(site_capture, pair);
  Py_RETURN_NONE;
}

// This thread's last captured site (None before any), dropped from the thread.
PyObject* py_take_last_site(PyObject* /*module*/, PyObject* /*unused*/) {
  PyObject* site = last_site != nullptr ? last_site : Py_NewRef(Py_None);
  last_site = nullptr;
  return site;
}

PyObject* py_sites_captured(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromUnsignedLongLong(sites_captured.load());
}

PyObject* py_ops_seen(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromUnsignedLongLong(ops_seen.load());
}

PyObject* py_reset(PyObject* /*module*/, PyObject* /*unused*/) {
  ops_seen.store(0);
  sites_captured.store(0);
  writes_seen = 0;
  walk_sink = 0;
  Py_RETURN_NONE;
}

PyObject* py_writes_seen(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromUnsignedLongLong(writes_seen);
}

// Whether a new thread sees the key included: with this thread's
// at::ThreadLocalState installed (what autograd's engine does before each
// node, at::launch before each task), and bare.
PyObject* py_key_in_new_thread(PyObject* /*module*/, PyObject* /*unused*/) {
  bool with_state = false;
  bool bare = false;
  const at::ThreadLocalState state;
  Py_BEGIN_ALLOW_THREADS
  std::thread([&] {
    at::ThreadLocalStateGuard installed(state);
    with_state = c10::impl::tls_is_dispatch_key_included(kFloorKey);
  }).join();
  std::thread([&] { bare = c10::impl::tls_is_dispatch_key_included(kFloorKey); }).join();
  Py_END_ALLOW_THREADS
  return Py_BuildValue("(OO)", with_state ? Py_True : Py_False, bare ? Py_True : Py_False);
}

PyObject* py_key(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyUnicode_FromString(c10::toString(kFloorKey));
}

PyMethodDef methods[] = {
    {"enable", py_enable, METH_O,
     "enable(work): include the key in this thread's dispatch (0 redispatch, 1 call on_op(name), 2 walk, "
     "3 call on_op(name, tensors), 4 capture a site)"},
    {"disable", py_disable, METH_NOARGS, "disable(): leave the key out of this thread's dispatch"},
    {"set_on_op", py_set_on_op, METH_O, "set_on_op(callable or None): what works 1 and 3 call with each op"},
    {"set_site_capture", py_set_site_capture, METH_VARARGS,
     "set_site_capture(callable or None, args): what work 4 calls, callable(*args), for each op's site"},
    {"take_last_site", py_take_last_site, METH_NOARGS, "this thread's last captured site, or None"},
    {"sites_captured", py_sites_captured, METH_NOARGS, "sites captured since reset()"},
    {"ops_seen", py_ops_seen, METH_NOARGS, "ops the fallback was entered for since reset()"},
    {"writes_seen", py_writes_seen, METH_NOARGS, "this thread's written tensor arguments seen by the walk since reset()"},
    {"reset", py_reset, METH_NOARGS, "reset(): zero the counters"},
    {"key", py_key, METH_NOARGS, "the dispatch key's name"},
    {"key_in_new_thread", py_key_in_new_thread, METH_NOARGS,
     "(with this thread's ThreadLocalState, bare): whether a new thread has the key included"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "dispatch_floor", nullptr, -1, methods,
                          nullptr, nullptr, nullptr, nullptr};

}  // namespace

// Registers the fallback here, not in a static initialiser, so a key already
// taken (torchdistx loaded) is an ImportError rather than a terminate.
PyMODINIT_FUNC PyInit_dispatch_floor() {
  try {
    registration = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kFloorKey, __FILE__, __LINE__);
    registration->fallback(torch::CppFunction::makeFromBoxedFunction<&floor_fallback>());
  } catch (const std::exception& error) {
    registration.reset();
    PyErr_Format(PyExc_ImportError, "dispatch_floor: cannot register a fallback on %s: %s",
                 c10::toString(kFloorKey), error.what());
    return nullptr;
  }
  return PyModule_Create(&module_def);
}
