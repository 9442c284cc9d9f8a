// The GPU trace bridge: torch's GPU trace delivered to the same Python
// registries, without torch's per-event module import (the sanitizer's;
// npu_lifetime/sanitizer/trace_bridge.py).
//
// With the trace active (torch._C._activate_gpu_trace()), torch's caching
// allocator, streams and events call the trace's interpreter at every
// allocation, free, event and synchronisation.  torch's own interpreter
// (torch/csrc/PyInterpreter.cpp) then builds the string "torch.cuda",
// imports it, looks up _gpu_trace.<Registry>.fire_callbacks and calls it.
// On a chain of small CUDA ops that layer, outside any subscriber, was
// about a tenth of the whole sanitized run (design/sanitizer.md, Cost).
//
// This interpreter does the same for CUDA (and HIP, which torch delivers to
// torch.cuda too): it takes the GIL, looks up the same attributes from the
// torch.cuda module object it was given at install, and calls the same
// fire_callbacks with the same arguments; an error is reported, never
// raised into the allocator, as torch's does.  Every other device type,
// and every method that is not a trace, is torch's own interpreter's.
//
// Invariants:
// - installed only over torch's interpreter (the trace must be active, and
//   its interpreter torch's main one), by storing it as GPUTrace's current
//   interpreter: GPUTrace keeps the first interpreter set and has no second
//   set_trace;
// - never removed: with no subscriber it does what torch's does, so a
//   later enable (CSAN's included) is served as before;
// - no C++ exception leaves the extern "C" functions.
#include <Python.h>

#include <ATen/core/PythonFallbackKernel.h>
#include <ATen/core/PythonOpRegistrationTrampoline.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/core/impl/PyInterpreter.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace {

using c10::DeviceType;
using c10::impl::PyInterpreter;
using c10::impl::PyInterpreterVTable;

// The registries of torch.cuda._gpu_trace, in the order of the test entry's kinds.
enum Kind {
    EVENT_CREATION, EVENT_DELETION, EVENT_RECORD, EVENT_WAIT, MEMORY_ALLOCATION, MEMORY_DEALLOCATION,
    STREAM_CREATION, DEVICE_SYNCHRONIZATION, STREAM_SYNCHRONIZATION, EVENT_SYNCHRONIZATION, KINDS
};
const char* const REGISTRY_NAMES[KINDS] = {
    "EventCreationCallbacks", "EventDeletionCallbacks", "EventRecordCallbacks", "EventWaitCallbacks",
    "MemoryAllocationCallbacks", "MemoryDeallocationCallbacks", "StreamCreationCallbacks",
    "DeviceSynchronizationCallbacks", "StreamSynchronizationCallbacks", "EventSynchronizationCallbacks",
};

// Set once by install(), under the GIL, before the interpreter is published.
struct Delivery {
    const PyInterpreter* torch = nullptr;  // torch's interpreter: its vtable is read at each call, so that
                                           // the no-op vtable torch swaps in at exit (disarm) is the one used
    PyObject* module = nullptr;            // torch.cuda, held for the process
    PyObject* gpu_trace = nullptr;         // "_gpu_trace"
    PyObject* fire_callbacks = nullptr;    // "fire_callbacks"
    PyObject* registries[KINDS] = {};      // each registry's name
};
Delivery delivery;

bool delivered_here(DeviceType type) { return type == DeviceType::CUDA || type == DeviceType::HIP; }

// module._gpu_trace.<registry>.fire_callbacks(*args): torch's lookups, from the held module.
void fire(Kind kind, int nargs, uintptr_t first, uintptr_t second) {
    at::impl::MaybeSetTLSOnEntryGuard tls;  // as torch's: Python entered from C++ sees the TLS of entry
    if (!Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    // a free can come from a release made while an exception is set: the delivery starts with none
    // and puts the caller's back (npu_lifetime/seam.h, rule 2)
    PyObject *saved_type, *saved_value, *saved_traceback;
    PyErr_Fetch(&saved_type, &saved_value, &saved_traceback);
    PyObject* args[2] = {nargs > 0 ? PyLong_FromSize_t(first) : nullptr, nargs > 1 ? PyLong_FromSize_t(second) : nullptr};
    PyObject* callable = nullptr;
    PyObject* done = nullptr;
    if ((nargs < 1 || args[0] != nullptr) && (nargs < 2 || args[1] != nullptr)) {
        PyObject* trace = PyObject_GetAttr(delivery.module, delivery.gpu_trace);
        PyObject* registry = trace != nullptr ? PyObject_GetAttr(trace, delivery.registries[kind]) : nullptr;
        callable = registry != nullptr ? PyObject_GetAttr(registry, delivery.fire_callbacks) : nullptr;
        done = callable != nullptr ? PyObject_Vectorcall(callable, args, static_cast<size_t>(nargs), nullptr) : nullptr;
        Py_XDECREF(registry);
        Py_XDECREF(trace);
    }
    if (done == nullptr) PyErr_WriteUnraisable(callable);  // torch logs it; the allocator never sees it
    Py_XDECREF(done);
    Py_XDECREF(callable);
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    PyErr_Restore(saved_type, saved_value, saved_traceback);
    PyGILState_Release(gil);
}

const PyInterpreterVTable& torch_vtable() { return **delivery.torch; }

struct BridgeVTable final : PyInterpreterVTable {
    // -- the trace: delivered here for CUDA, torch's for any other device type --
    void trace_gpu_event_creation(DeviceType type, uintptr_t event) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_event_creation(type, event);
        fire(EVENT_CREATION, 1, event, 0);
    }
    void trace_gpu_event_deletion(DeviceType type, uintptr_t event) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_event_deletion(type, event);
        fire(EVENT_DELETION, 1, event, 0);
    }
    void trace_gpu_event_record(DeviceType type, uintptr_t event, uintptr_t stream) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_event_record(type, event, stream);
        fire(EVENT_RECORD, 2, event, stream);
    }
    void trace_gpu_event_wait(DeviceType type, uintptr_t event, uintptr_t stream) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_event_wait(type, event, stream);
        fire(EVENT_WAIT, 2, event, stream);
    }
    void trace_gpu_memory_allocation(DeviceType type, uintptr_t ptr) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_memory_allocation(type, ptr);
        fire(MEMORY_ALLOCATION, 1, ptr, 0);
    }
    void trace_gpu_memory_deallocation(DeviceType type, uintptr_t ptr) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_memory_deallocation(type, ptr);
        fire(MEMORY_DEALLOCATION, 1, ptr, 0);
    }
    void trace_gpu_stream_creation(DeviceType type, uintptr_t stream) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_stream_creation(type, stream);
        fire(STREAM_CREATION, 1, stream, 0);
    }
    void trace_gpu_device_synchronization(DeviceType type) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_device_synchronization(type);
        fire(DEVICE_SYNCHRONIZATION, 0, 0, 0);
    }
    void trace_gpu_stream_synchronization(DeviceType type, uintptr_t stream) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_stream_synchronization(type, stream);
        fire(STREAM_SYNCHRONIZATION, 1, stream, 0);
    }
    void trace_gpu_event_synchronization(DeviceType type, uintptr_t event) const override {
        if (!delivered_here(type)) return torch_vtable().trace_gpu_event_synchronization(type, event);
        fire(EVENT_SYNCHRONIZATION, 1, event, 0);
    }

    // -- everything else: torch's (GPUTrace calls none of these; they are here for completeness) --
    std::string name() const override { return torch_vtable().name(); }
    void incref(PyObject* o) const override { torch_vtable().incref(o); }
    void decref(PyObject* o) const override { torch_vtable().decref(o); }
    bool try_incref(const c10::impl::PyObjectSlot& slot) const override { return torch_vtable().try_incref(slot); }
    size_t refcnt(PyObject* o) const override { return torch_vtable().refcnt(o); }
    c10::intrusive_ptr<c10::TensorImpl> detach(const c10::TensorImpl* self) const override {
        return torch_vtable().detach(self);
    }
    void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const override {
        torch_vtable().dispatch(op, stack);
    }
    void reportErrorCallback(PyObject* callback, c10::DispatchKey key) const override {
        torch_vtable().reportErrorCallback(callback, key);
    }
    void python_op_registration_trampoline(const c10::OperatorHandle& op, c10::DispatchKey key,
                                           c10::DispatchKeySet keyset, torch::jit::Stack* stack, bool with_keyset,
                                           bool with_op) const override {
        torch_vtable().python_op_registration_trampoline(op, key, keyset, stack, with_keyset, with_op);
    }
    void throw_abstract_impl_not_imported_error(std::string opname, const char* pymodule,
                                                const char* context) const override {
        torch_vtable().throw_abstract_impl_not_imported_error(std::move(opname), pymodule, context);
    }
    void python_dispatcher(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) const override {
        torch_vtable().python_dispatcher(op, keys, stack);
    }
    bool is_contiguous(const c10::TensorImpl* self, at::MemoryFormat format) const override {
        return torch_vtable().is_contiguous(self, format);
    }
    c10::SymBool sym_is_contiguous(const c10::TensorImpl* self, at::MemoryFormat format) const override {
        return torch_vtable().sym_is_contiguous(self, format);
    }
    bool is_strides_like(const c10::TensorImpl* self, at::MemoryFormat format) const override {
        return torch_vtable().is_strides_like(self, format);
    }
    bool is_non_overlapping_and_dense(const c10::TensorImpl* self) const override {
        return torch_vtable().is_non_overlapping_and_dense(self);
    }
    c10::Device device(const c10::TensorImpl* self) const override { return torch_vtable().device(self); }
    int64_t dim(const c10::TensorImpl* self) const override { return torch_vtable().dim(self); }
    c10::IntArrayRef strides(const c10::TensorImpl* self) const override { return torch_vtable().strides(self); }
    c10::IntArrayRef sizes(const c10::TensorImpl* self) const override { return torch_vtable().sizes(self); }
    c10::SymIntArrayRef sym_sizes(const c10::TensorImpl* self) const override { return torch_vtable().sym_sizes(self); }
    c10::Layout layout(const c10::TensorImpl* self) const override { return torch_vtable().layout(self); }
    int64_t numel(const c10::TensorImpl* self) const override { return torch_vtable().numel(self); }
    c10::SymInt sym_numel(const c10::TensorImpl* self) const override { return torch_vtable().sym_numel(self); }
    c10::SymIntArrayRef sym_strides(const c10::TensorImpl* self) const override {
        return torch_vtable().sym_strides(self);
    }
    c10::SymInt sym_storage_offset(const c10::TensorImpl* self) const override {
        return torch_vtable().sym_storage_offset(self);
    }
    void reset_backward_hooks(const c10::TensorImpl* self) const override { torch_vtable().reset_backward_hooks(self); }
};

// Static storage, never destroyed before the process ends (torch's own interpreter is leaked for the same reason).
BridgeVTable* bridge_vtable() {
    static auto* vtable = new BridgeVTable();
    return vtable;
}
PyInterpreter* bridge_interpreter() {
    static auto* interpreter = new PyInterpreter(bridge_vtable());
    return interpreter;
}

int intern_names() {
    delivery.gpu_trace = PyUnicode_InternFromString("_gpu_trace");
    delivery.fire_callbacks = PyUnicode_InternFromString("fire_callbacks");
    if (delivery.gpu_trace == nullptr || delivery.fire_callbacks == nullptr) return -1;
    for (int kind = 0; kind < KINDS; kind++) {
        delivery.registries[kind] = PyUnicode_InternFromString(REGISTRY_NAMES[kind]);
        if (delivery.registries[kind] == nullptr) return -1;
    }
    return 0;
}

}  // namespace

#define NPL_EXPORT extern "C" __attribute__((visibility("default")))

// Called with the GIL held (ctypes.PyDLL), the trace active, and torch.cuda:
// 0 installed now, 1 already installed, 2 left out because the trace's
// interpreter is neither torch's nor this one (another copy of this library,
// or someone else's), -1 with a Python exception set.
NPL_EXPORT int npl_trace_bridge_install(PyObject* cuda_module) {
    try {
        const PyInterpreter* current = c10::impl::GPUTrace::get_trace();
        if (current == bridge_interpreter()) return 1;
        if (current == nullptr) {
            PyErr_SetString(PyExc_RuntimeError,
                            "the GPU trace bridge needs torch's GPU trace active first "
                            "(torch._C._activate_gpu_trace())");
            return -1;
        }
        if (current != at::impl::PythonOpRegistrationTrampoline::getInterpreter()) return 2;
        if (!PyModule_Check(cuda_module)) {
            PyErr_SetString(PyExc_TypeError, "the GPU trace bridge takes the torch.cuda module");
            return -1;
        }
        if (intern_names() < 0) return -1;
        Py_INCREF(cuda_module);
        delivery.module = cuda_module;
        delivery.torch = current;
        c10::impl::GPUTrace::gpuTraceState.store(bridge_interpreter(), std::memory_order_release);
        return 0;
    } catch (...) {
        PyErr_SetString(PyExc_RuntimeError, "the GPU trace bridge could not be installed");
        return -1;
    }
}

// 1 while the trace's interpreter is the bridge's.
NPL_EXPORT int npl_trace_bridge_installed(void) { return c10::impl::GPUTrace::get_trace() == bridge_interpreter(); }

// What torch's C++ does at a traced event, for the tests: the trace's
// current interpreter (through_torch 0) or torch's own (1) called for
// registry `kind` (REGISTRY_NAMES' order) and `device_type` (c10's
// numbering).  Called without the GIL (ctypes.CDLL), as torch calls it.
// 0, or -1 for a bad kind or no trace (or no torch interpreter recorded).
NPL_EXPORT int npl_trace_bridge_fire(int through_torch, int kind, int device_type, uintptr_t first, uintptr_t second) {
    const PyInterpreter* interpreter = through_torch ? delivery.torch : c10::impl::GPUTrace::get_trace();
    if (interpreter == nullptr || kind < 0 || kind >= KINDS) return -1;
    try {
        const PyInterpreterVTable& v = **interpreter;
        auto type = static_cast<DeviceType>(device_type);
        switch (kind) {
            case EVENT_CREATION: v.trace_gpu_event_creation(type, first); break;
            case EVENT_DELETION: v.trace_gpu_event_deletion(type, first); break;
            case EVENT_RECORD: v.trace_gpu_event_record(type, first, second); break;
            case EVENT_WAIT: v.trace_gpu_event_wait(type, first, second); break;
            case MEMORY_ALLOCATION: v.trace_gpu_memory_allocation(type, first); break;
            case MEMORY_DEALLOCATION: v.trace_gpu_memory_deallocation(type, first); break;
            case STREAM_CREATION: v.trace_gpu_stream_creation(type, first); break;
            case DEVICE_SYNCHRONIZATION: v.trace_gpu_device_synchronization(type); break;
            case STREAM_SYNCHRONIZATION: v.trace_gpu_stream_synchronization(type, first); break;
            default: v.trace_gpu_event_synchronization(type, first); break;
        }
        return 0;
    } catch (...) {
        return -1;
    }
}
