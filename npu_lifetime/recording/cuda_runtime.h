// The CUDA runtime entry points the torch-allocator fallback's table calls directly
// (_holds.cpp): event create/record/query/synchronize/destroy and the
// stream capture check, resolved with dlsym from a library the process has
// already loaded (torch's libtorch_cuda.so: dlsym on its handle searches it
// and the libraries it depends on, so these are the libcudart torch calls).
// Nothing is loaded that was not there (RTLD_NOLOAD).  Every call returns
// the runtime's status; the callers check each one.
#pragma once

#include <dlfcn.h>

namespace npl_holds {

using cudaError = int;
constexpr cudaError kSuccess = 0;
constexpr cudaError kNotReady = 600;
constexpr unsigned kEventDisableTiming = 0x02;  // torch.cuda.Event()'s default
constexpr int kCaptureStatusNone = 0;
constexpr int kCaptureModeRelaxed = 2;

struct CudaCalls {
    cudaError (*EventCreateWithFlags)(void**, unsigned);
    cudaError (*EventDestroy)(void*);
    cudaError (*EventRecord)(void*, void*);
    cudaError (*EventQuery)(void*);
    cudaError (*EventSynchronize)(void*);
    cudaError (*StreamIsCapturing)(void*, int*);
    cudaError (*GetDevice)(int*);
    cudaError (*SetDevice)(int);
    cudaError (*GetLastError)();
    cudaError (*PeekAtLastError)();
    cudaError (*ThreadExchangeStreamCaptureMode)(int*);
};

// Fills `calls` from the loaded library at `path`; returns the name of the
// first symbol missing (or "dlopen" when the library is not loaded), or
// nullptr.  `*handle` keeps the library mapped while the calls are used.
inline const char* resolve(const char* path, CudaCalls* calls, void** handle) {
    *handle = dlopen(path, RTLD_NOLOAD | RTLD_LAZY | RTLD_LOCAL);
    if (*handle == nullptr) return "dlopen";
    struct Slot {
        const char* name;
        void** fn;
    };
    const Slot slots[] = {
        {"cudaEventCreateWithFlags", reinterpret_cast<void**>(&calls->EventCreateWithFlags)},
        {"cudaEventDestroy", reinterpret_cast<void**>(&calls->EventDestroy)},
        {"cudaEventRecord", reinterpret_cast<void**>(&calls->EventRecord)},
        {"cudaEventQuery", reinterpret_cast<void**>(&calls->EventQuery)},
        {"cudaEventSynchronize", reinterpret_cast<void**>(&calls->EventSynchronize)},
        {"cudaStreamIsCapturing", reinterpret_cast<void**>(&calls->StreamIsCapturing)},
        {"cudaGetDevice", reinterpret_cast<void**>(&calls->GetDevice)},
        {"cudaSetDevice", reinterpret_cast<void**>(&calls->SetDevice)},
        {"cudaGetLastError", reinterpret_cast<void**>(&calls->GetLastError)},
        {"cudaPeekAtLastError", reinterpret_cast<void**>(&calls->PeekAtLastError)},
        {"cudaThreadExchangeStreamCaptureMode", reinterpret_cast<void**>(&calls->ThreadExchangeStreamCaptureMode)},
    };
    for (const Slot& slot : slots) {
        *slot.fn = dlsym(*handle, slot.name);
        if (*slot.fn == nullptr) {
            dlclose(*handle);
            *handle = nullptr;
            return slot.name;
        }
    }
    return nullptr;
}

// A failed or not-ready call leaves its status as the thread's last error
// (cudaGetLastError): cleared when it is still the one this call left, so
// torch's next check does not report it, and an earlier error of the
// program's stays for torch to see.
inline void forget(const CudaCalls& cu, cudaError err) {
    if (err != kSuccess && cu.PeekAtLastError() == err) cu.GetLastError();
}

// Runs `call` with `device` current and the previous device restored.
template <typename Call>
cudaError on_device(const CudaCalls& cu, int device, Call call) {
    int previous = -1;
    cudaError err = cu.GetDevice(&previous);
    if (err != kSuccess) return err;
    if (previous == device) return call();
    if ((err = cu.SetDevice(device)) != kSuccess) return err;
    err = call();
    cudaError back = cu.SetDevice(previous);
    return err != kSuccess ? err : back;
}

// A new event on `device` (timing off), created in relaxed capture mode: a
// graph capture elsewhere in the process (global mode) is not invalidated.
inline cudaError create_event(const CudaCalls& cu, int device, void** event) {
    return on_device(cu, device, [&] {
        int mode = kCaptureModeRelaxed;
        cudaError err = cu.ThreadExchangeStreamCaptureMode(&mode);
        if (err != kSuccess) return err;
        err = cu.EventCreateWithFlags(event, kEventDisableTiming);
        cudaError restored = cu.ThreadExchangeStreamCaptureMode(&mode);
        return err != kSuccess ? err : restored;
    });
}

// Whether `stream` captures; an error (the legacy stream while another
// captures) counts as yes.
inline bool capturing(const CudaCalls& cu, void* stream) {
    int status = kCaptureStatusNone;
    cudaError err = cu.StreamIsCapturing(stream, &status);
    forget(cu, err);
    return err != kSuccess || status != kCaptureStatusNone;
}

}  // namespace npl_holds
