// The torch bridge: the allocation entry point torch's pluggable allocator
// calls, raising torch's out-of-memory error when the shim has none left.
//
// torch's CUDAPluggableAllocator (and torch_npu's) passes a NULL from the
// alloc function on as a tensor at address 0.  The framework's own
// convention is to throw c10::OutOfMemoryError, which its Python layer turns
// into torch.OutOfMemoryError; only code built against torch's headers can
// throw it, so this one small file is built at install() time, against the
// torch in use (npu_lifetime/shim/bridge.py).  The shim itself stays
// header-free; the bridge forwards to it through the pointers it is given.
#include <c10/util/Exception.h>
#include <sys/types.h>

#include <cstddef>

namespace {
void* (*shim_alloc)(ssize_t, int, void*) = nullptr;
void (*shim_free)(void*, ssize_t, int, void*) = nullptr;
const char* (*shim_oom_message)() = nullptr;
}  // namespace

extern "C" __attribute__((visibility("default"))) void npl_bridge_connect(void* alloc, void* free, void* oom_message) {
    shim_alloc = reinterpret_cast<void* (*)(ssize_t, int, void*)>(alloc);
    shim_free = reinterpret_cast<void (*)(void*, ssize_t, int, void*)>(free);
    shim_oom_message = reinterpret_cast<const char* (*)()>(oom_message);
}

extern "C" __attribute__((visibility("default"))) void* npl_bridge_alloc(size_t size, int device, void* stream) {
    TORCH_CHECK(shim_alloc != nullptr, "npu_lifetime: the torch bridge was not connected to the shim");
    void* p = shim_alloc(static_cast<ssize_t>(size), device, stream);
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr || size == 0, shim_oom_message());
    return p;
}

extern "C" __attribute__((visibility("default"))) void npl_bridge_free(void* ptr, size_t size, int device, void* stream) {
    if (shim_free != nullptr) shim_free(ptr, static_cast<ssize_t>(size), device, stream);
}
