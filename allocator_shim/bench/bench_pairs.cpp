// ns per npl_alloc + npl_free pair, called from C (no Python in the way).
//   bench_pairs SHIM.so RUNTIME [SIZE] [PAIRS] [REPEATS] [plain|pending|pending_announced]
// Prints one JSON line: the median and all repeats, in ns per pair.
// pending: a block of another size stays pending throughout (record_stream-ed
// on a stream whose work never completes: sim only), and two blocks are live at a time, so
// the allocation the cached-pair shortcut does not serve polls events;
// pending_announced: the same with captures announced, as install("cuda")
// sets them (no capture-status query per allocation: design D19).
#include <dlfcn.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

using Alloc = void* (*)(ssize_t, int, void*);
using Free = void (*)(void*, ssize_t, int, void*);
using Select = int (*)(const char*, const char*);
using LastError = const char* (*)();
using RecordStream = int (*)(void*, void*);
using SetFlag = void (*)(int);
using Launch = uint64_t (*)(void*);

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s SHIM.so RUNTIME [SIZE] [PAIRS] [REPEATS]\n", argv[0]);
        return 2;
    }
    ssize_t size = argc > 3 ? std::atol(argv[3]) : 4096;
    long pairs = argc > 4 ? std::atol(argv[4]) : 1000000;
    int repeats = argc > 5 ? std::atoi(argv[5]) : 9;
    std::string_view mode = argc > 6 ? argv[6] : "plain";
    if (mode != "plain" && mode != "pending" && mode != "pending_announced") {
        std::fprintf(stderr, "mode: plain, pending or pending_announced, not %s\n", argv[6]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (lib == nullptr) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    auto alloc = reinterpret_cast<Alloc>(dlsym(lib, "npl_alloc"));
    auto free_ = reinterpret_cast<Free>(dlsym(lib, "npl_free"));
    auto select = reinterpret_cast<Select>(dlsym(lib, "npl_select_runtime"));
    auto last_error = reinterpret_cast<LastError>(dlsym(lib, "npl_last_error"));
    if (!alloc || !free_ || !select || !last_error) {
        std::fprintf(stderr, "missing shim symbols\n");
        return 1;
    }
    if (select(argv[2], nullptr) != 0) {
        std::fprintf(stderr, "select_runtime(%s): %s\n", argv[2], last_error());
        return 1;
    }
    void* stream = reinterpret_cast<void*>(0x1);  // any handle under sim
    if (std::string_view(argv[2]) == "cuda") stream = nullptr;  // the legacy default stream
    void* warm = alloc(size, 0, stream);
    if (warm == nullptr) {
        std::fprintf(stderr, "allocation failed\n");
        return 1;
    }
    free_(warm, size, 0, stream);
    if (mode != "plain") {
        auto record_stream = reinterpret_cast<RecordStream>(dlsym(lib, "npl_record_stream"));
        auto announce = reinterpret_cast<SetFlag>(dlsym(lib, "npl_set_captures_announced"));
        auto launch = reinterpret_cast<Launch>(dlsym(lib, "npl_sim_launch"));
        if (!record_stream || !announce || !launch || std::string_view(argv[2]) != "sim") {
            std::fprintf(stderr, "%s: needs the sim runtime and npl_record_stream, npl_set_captures_announced\n",
                         argv[6]);
            return 1;
        }
        announce(mode == "pending_announced" ? 1 : 0);
        const ssize_t other = size == 4096 ? 8192 : 4096;  // another size: never the pair's block
        void* held = alloc(other, 0, stream);
        void* idle = reinterpret_cast<void*>(0x2);  // a sim stream whose one operation never completes
        launch(idle);
        if (held == nullptr || record_stream(held, idle) != 0) {
            std::fprintf(stderr, "pending block: %s\n", last_error());
            return 1;
        }
        free_(held, other, 0, stream);
    }
    std::vector<double> ns;
    for (int r = 0; r < repeats; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        if (mode == "plain") {
            for (long i = 0; i < pairs; ++i) free_(alloc(size, 0, stream), size, 0, stream);
        } else {  // two live at once: the cached-pair shortcut serves only one, the other polls
            for (long i = 0; i < pairs; i += 2) {
                void* a = alloc(size, 0, stream);
                void* b = alloc(size, 0, stream);
                free_(a, size, 0, stream);
                free_(b, size, 0, stream);
            }
        }
        auto t1 = std::chrono::steady_clock::now();
        ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs);
    }
    std::vector<double> sorted = ns;
    std::sort(sorted.begin(), sorted.end());
    std::printf("{\"runtime\": \"%s\", \"mode\": \"%.*s\", \"size\": %zd, \"median_ns\": %.2f, \"repeats_ns\": [",
                argv[2], static_cast<int>(mode.size()), mode.data(), size, sorted[sorted.size() / 2]);
    for (size_t i = 0; i < ns.size(); ++i) std::printf("%s%.2f", i ? ", " : "", ns[i]);
    std::printf("]}\n");
    return 0;
}
