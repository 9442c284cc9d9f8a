// Calls the torch bridge the way torch's pluggable allocator does, on the
// simulated runtime with a memory limit, and checks that an allocation the
// shim cannot serve throws c10::OutOfMemoryError (what torch's Python layer
// turns into torch.OutOfMemoryError) with the shim's message.
//   bridge_driver SHIM.so BRIDGE.so     prints the message; exit 0 if so
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <sys/types.h>

#include <cstdint>
#include <cstdio>

int main(int argc, char** argv) {
    if (argc < 3) return 2;
    void* shim = dlopen(argv[1], RTLD_NOW);
    void* bridge = dlopen(argv[2], RTLD_NOW);
    if (shim == nullptr || bridge == nullptr) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    auto select = reinterpret_cast<int (*)(const char*, const char*)>(dlsym(shim, "npl_select_runtime"));
    auto limit = reinterpret_cast<void (*)(uint64_t)>(dlsym(shim, "npl_sim_set_memory_limit"));
    auto connect = reinterpret_cast<void (*)(void*, void*, void*)>(dlsym(bridge, "npl_bridge_connect"));
    auto alloc = reinterpret_cast<void* (*)(size_t, int, void*)>(dlsym(bridge, "npl_bridge_alloc"));
    auto release = reinterpret_cast<void (*)(void*, size_t, int, void*)>(dlsym(bridge, "npl_bridge_free"));
    if (!select || !limit || !connect || !alloc || !release || select("sim", nullptr) != 0) return 2;
    connect(dlsym(shim, "npl_alloc"), dlsym(shim, "npl_free"), dlsym(shim, "npl_last_oom_message"));
    limit(64 << 20);
    void* stream = reinterpret_cast<void*>(0x10);
    void* ok = alloc(1 << 20, 0, stream);
    if (ok == nullptr) return 1;
    release(ok, 1 << 20, 0, stream);
    try {
        alloc(size_t(1) << 30, 0, stream);
    } catch (const c10::OutOfMemoryError& e) {
        std::printf("%s\n", e.what_without_backtrace());
        return alloc(0, 0, stream) == nullptr ? 0 : 1;  // a zero-byte request is no error
    } catch (...) {
        std::fprintf(stderr, "another exception\n");
        return 1;
    }
    std::fprintf(stderr, "no exception\n");
    return 1;
}
