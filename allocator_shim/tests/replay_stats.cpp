// A refactor's equivalence check: a seeded random workload over the shim's C
// ABI (12 seeds x 4000 steps on the simulated runtime: allocations in and out
// of a graph pool, frees with record_use, event completion, empty_cache; each
// policy, with and without a memory limit) printing, after every allocation,
// whether it succeeded and every statistic.  The simulated runtime's memory
// comes from the host heap, whose addresses steer best-fit ties and segment
// order, so both builds run from the same path with ASLR off:
//   c++ -std=c++17 -O1 allocator_shim/tests/replay_stats.cpp -o /tmp/replay -ldl
//   cp OLD.so /tmp/same/libnpl.so && setarch $(uname -m) -R /tmp/replay /tmp/same/libnpl.so > old.txt
//   cp NEW.so /tmp/same/libnpl.so && setarch $(uname -m) -R /tmp/replay /tmp/same/libnpl.so > new.txt
//   cmp old.txt new.txt
#include <dlfcn.h>
#include <sys/types.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
using Alloc = void* (*)(ssize_t, int, void*);
using Free = void (*)(void*, ssize_t, int, void*);
using Select = int (*)(const char*, const char*);
using RecordUse = int (*)(void*, void*);
using Void = void (*)();
using Limit = void (*)(size_t);
using Complete = void (*)(void*);
using StatsValues = size_t (*)(int, uint64_t*, size_t);
using SetPolicy = int (*)(int);
using Pool = void (*)(int, uint64_t, uint64_t, void*);
using PoolEnd = void (*)(int, uint64_t, uint64_t);
template <typename T> T sym(void* lib, const char* n) {
    void* p = dlsym(lib, n);
    if (!p) { std::fprintf(stderr, "missing %s\n", n); std::exit(2); }
    return reinterpret_cast<T>(p);
}
int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s SHIM.so\n", argv[0]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { std::fprintf(stderr, "%s\n", dlerror()); return 1; }
    auto alloc = sym<Alloc>(lib, "npl_alloc"); auto fr = sym<Free>(lib, "npl_free");
    auto sel = sym<Select>(lib, "npl_select_runtime"); auto ru = sym<RecordUse>(lib, "npl_record_use");
    auto reset = sym<Void>(lib, "npl_reset"); auto pe = sym<Void>(lib, "npl_process_events");
    auto ec = sym<Void>(lib, "npl_empty_cache"); auto lim = sym<Limit>(lib, "npl_sim_set_memory_limit");
    auto comp = sym<Complete>(lib, "npl_sim_complete"); auto sv = sym<StatsValues>(lib, "npl_stats_values");
    auto pol = sym<SetPolicy>(lib, "npl_set_policy");
    auto pb = sym<Pool>(lib, "npl_begin_allocate_to_pool"); auto pend = sym<PoolEnd>(lib, "npl_end_allocate_to_pool");
    void* S[3] = {(void*)0x1000, (void*)0x2000, (void*)0x3000};
    std::vector<uint64_t> st(512);
    for (int seed = 0; seed < 12; ++seed) {
        std::mt19937_64 r(seed);
        reset(); sel("sim", nullptr); pol(static_cast<int>(r() % 3)); lim((r() % 2) ? (64u << 20) : 0);
        struct L { void* p; ssize_t n; void* s; };
        std::vector<L> live;
        const ssize_t sizes[] = {512, 4096, 100000, 1 << 20, 3 << 20, 12 << 20};
        for (int step = 0; step < 4000; ++step) {
            unsigned k = r() % 100;
            if (k < 45 || live.empty()) {
                ssize_t n = sizes[r() % 6]; void* s = S[r() % 3]; bool pool = r() % 10 == 0;
                if (pool) pb(0, 5, 0, nullptr);
                void* p = alloc(n, 0, s);
                if (pool) pend(0, 5, 0);
                size_t m = sv(0, st.data(), st.size());
                std::printf("%d %d %d", seed, step, p != nullptr);
                for (size_t i = 0; i < m && i < st.size(); ++i) std::printf(" %llu", (unsigned long long)st[i]);
                std::printf("\n");
                if (p) live.push_back({p, n, s});
            } else if (k < 85) {
                size_t i = r() % live.size(); L l = live[i]; live.erase(live.begin() + (long)i);
                if (r() % 10 < 3) ru(l.p, S[r() % 3]);
                fr(l.p, l.n, 0, l.s);
            } else if (k < 95) {
                for (void* s : S) comp(s);
                pe();
            } else {
                ec();
            }
        }
    }
    return 0;
}
