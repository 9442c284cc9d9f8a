/*
 * Stress test of the shim's sanitizer hooks: 8 threads allocate and free
 * through the shim while the main thread keeps replacing and clearing the
 * hooks, releasing each hook set's context as soon as npl_set_hooks returns.
 * A hook called after its set was replaced, or with another set's context,
 * is caught by the context's magic number (poisoned on release).  Each
 * worker runs the allocator's invariant checker (npl_check_invariants)
 * every 256 of its pairs, under the other threads' traffic (every pair
 * would starve the workers on the allocator's lock); a debug build
 * (NPL_CHECK_INVARIANTS) checks after every entry point of every thread,
 * and what it finds arrives as invariant_violation findings.
 *   hook_stress SHIM.so [ITERATIONS]      exit 0: no fault and no violation seen
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef void (*hook_fn)(void*, size_t, int, void*, void*);
typedef void* (*alloc_fn)(ssize_t, int, void*);
typedef void (*free_fn)(void*, ssize_t, int, void*);
typedef void (*set_hooks_fn)(hook_fn, hook_fn, void*);
typedef int (*select_fn)(const char*, const char*);
typedef char* (*string_fn)(void);
typedef void (*free_string_fn)(char*);

#define THREADS 8
#define ALIVE 0x5AFE5AFEu
#define DEAD 0xDEADDEADu

struct ctx {
    uint32_t magic;
    int which; /* 0 or 1: which hook functions it belongs to */
    atomic_long calls;
};

static alloc_fn shim_alloc;
static free_fn shim_free;
static atomic_int stop;
static atomic_long faults;
static atomic_long violations;
static string_fn check_invariants;
static free_string_fn free_string;

/* Counts what the checker reports (a JSON array: "[]" when every invariant
 * holds), or, with a `marker`, its occurrences in the JSON (the findings). */
static void count(char* json, const char* marker) {
    if (json == NULL) {
        atomic_fetch_add(&violations, 1);
        return;
    }
    if (marker == NULL && strcmp(json, "[]") != 0) {
        atomic_fetch_add(&violations, 1);
        fprintf(stderr, "invariants: %s\n", json);
    }
    for (const char* at = json; marker != NULL && (at = strstr(at, marker)) != NULL; at += strlen(marker)) {
        atomic_fetch_add(&violations, 1);
    }
    free_string(json);
}

static void check(void* c, int which) {
    struct ctx* x = c;
    if (x == NULL || x->magic != ALIVE || x->which != which) atomic_fetch_add(&faults, 1);
    else atomic_fetch_add(&x->calls, 1);
}
static void alloc0(void* p, size_t s, int d, void* st, void* c) { (void)p, (void)s, (void)d, (void)st; check(c, 0); }
static void free0(void* p, size_t s, int d, void* st, void* c) { (void)p, (void)s, (void)d, (void)st; check(c, 0); }
static void alloc1(void* p, size_t s, int d, void* st, void* c) { (void)p, (void)s, (void)d, (void)st; check(c, 1); }
static void free1(void* p, size_t s, int d, void* st, void* c) { (void)p, (void)s, (void)d, (void)st; check(c, 1); }

static void* worker(void* arg) {
    uintptr_t stream = 0x1000 * ((uintptr_t)arg + 1);
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (long pairs = 1; !atomic_load(&stop); pairs++) {
        ssize_t size = 64 + (rand_r(&seed) % 8) * 4096;
        void* p = shim_alloc(size, 0, (void*)stream);
        if (p != NULL) shim_free(p, size, 0, (void*)stream);
        if (pairs % 256 == 0) count(check_invariants(), NULL);
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    long iterations = argc > 2 ? atol(argv[2]) : 20000;
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    shim_alloc = (alloc_fn)dlsym(lib, "npl_alloc");
    shim_free = (free_fn)dlsym(lib, "npl_free");
    set_hooks_fn set_hooks = (set_hooks_fn)dlsym(lib, "npl_set_hooks");
    select_fn select_runtime = (select_fn)dlsym(lib, "npl_select_runtime");
    check_invariants = (string_fn)dlsym(lib, "npl_check_invariants");
    string_fn drain_findings = (string_fn)dlsym(lib, "npl_drain_findings_json");
    free_string = (free_string_fn)dlsym(lib, "npl_free_string");
    if (!shim_alloc || !shim_free || !set_hooks || !select_runtime || !check_invariants || !drain_findings ||
        !free_string || select_runtime("sim", NULL) != 0)
        return 2;
    pthread_t threads[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, worker, (void*)i);
    long calls = 0;
    for (long i = 0; i < iterations; i++) {
        struct ctx* c = malloc(sizeof *c);
        c->magic = ALIVE;
        c->which = (int)(i % 2);
        atomic_init(&c->calls, 0);
        if (i % 3 == 2) set_hooks(NULL, NULL, NULL);
        else set_hooks(c->which ? alloc1 : alloc0, c->which ? free1 : free0, c);
        if (i % 3 == 2) { free(c); continue; }
        /* give the workers a moment inside this hook set */
        for (int spin = 0; spin < 2000 && atomic_load(&c->calls) == 0; spin++) sched_yield();
        /* replace it: once set_hooks returns no thread is inside c's hooks */
        set_hooks(NULL, NULL, NULL);
        calls += atomic_load(&c->calls);
        c->magic = DEAD;
        free(c);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    count(check_invariants(), NULL);
    count(drain_findings(), "invariant_violation");
    printf("{\"iterations\": %ld, \"hook_calls\": %ld, \"faults\": %ld, \"invariant_violations\": %ld}\n",
           iterations, calls, atomic_load(&faults), atomic_load(&violations));
    return atomic_load(&faults) == 0 && atomic_load(&violations) == 0 && calls > 0 ? 0 : 1;
}
