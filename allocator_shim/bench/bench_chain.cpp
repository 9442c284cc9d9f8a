// ns per allocation + free in benchmarks/bench_sanitizer.py's 3-stream
// chain's pattern (its sizes, streams and free order), called from C
// against a shim build on the simulated runtime: the shim's own share of that
// benchmark, for A/B-ing two builds (bench_pairs.cpp times the same-size pair).
//   bench_chain SHIM.so
#include <dlfcn.h>
#include <sys/types.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
using Alloc = void* (*)(ssize_t, int, void*);
using Free = void (*)(void*, ssize_t, int, void*);
using Select = int (*)(const char*, const char*);
int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s SHIM.so\n", argv[0]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (lib == nullptr) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    auto alloc = (Alloc)dlsym(lib, "npl_alloc"); auto fr = (Free)dlsym(lib, "npl_free");
    auto sel = (Select)dlsym(lib, "npl_select_runtime");
    if (!alloc || !fr || !sel) {
        std::fprintf(stderr, "missing shim symbols\n");
        return 1;
    }
    if (sel("sim", nullptr) != 0) return 1;
    void* streams[3] = {(void*)0, (void*)0x10, (void*)0x20};
    const ssize_t M = 64 * 64 * 4;
    std::vector<double> reps;
    for (int rep = 0; rep < 9; rep++) {
        auto t0 = std::chrono::steady_clock::now();
        void* a = alloc(M, 0, streams[0]); void* a_s = streams[0];
        long ops = 0;
        for (int i = 0; i < 100000; i++) {
            void* p = streams[i % 3]; void* c2 = streams[(i + 1) % 3];
            void* b = alloc(M, 0, p); void* c = alloc(M, 0, p); fr(b, M, 0, p);
            void* d = alloc(M, 0, p); fr(c, M, 0, p); void* e = alloc(M, 0, p); fr(d, M, 0, p);
            void* s = alloc(4, 0, p); fr(s, 4, 0, p);
            void* t = alloc(M, 0, c2); void* a2 = alloc(M, 0, c2); fr(t, M, 0, c2);
            fr(a, M, 0, a_s); a = a2; a_s = c2; fr(e, M, 0, p);
            ops += 7;
        }
        fr(a, M, 0, a_s);
        reps.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / ops);
    }
    std::sort(reps.begin(), reps.end());
    std::printf("%s median %.1f ns per alloc+free\n", argv[1], reps[4]);
}
