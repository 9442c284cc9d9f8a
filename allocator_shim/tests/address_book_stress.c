/*
 * The address book under more live blocks than it keeps freed addresses
 * for (2^20): each free must stay cheap, and a double free of an address
 * just freed must still be recognised as one.
 *   address_book_stress SHIM.so [LIVE] [FREES]
 * Prints one JSON line: the median and slowest free (ns), and the kinds
 * of the findings a double free and an interior pointer produce; then,
 * with every block freed (more addresses than the book keeps), the mean
 * free and what a double free of the oldest and of the newest address is.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

typedef void* (*alloc_fn)(ssize_t, int, void*);
typedef void (*free_fn)(void*, ssize_t, int, void*);
typedef int (*select_fn)(const char*, const char*);
typedef char* (*string_fn)(void);
typedef void (*free_string_fn)(char*);

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int by_value(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* The "kind" of the first finding in the JSON the shim returns ("" if none). */
static void first_kind(string_fn drain, free_string_fn release, char* out, size_t n) {
    char* json = drain();
    out[0] = 0;
    const char* at = json ? strstr(json, "\"kind\":\"") : NULL;
    if (at != NULL) {
        at += strlen("\"kind\":\"");
        size_t len = strcspn(at, "\"");
        if (len >= n) len = n - 1;
        memcpy(out, at, len);
        out[len] = 0;
    }
    release(json);
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    long live = argc > 2 ? atol(argv[2]) : (1L << 20) + 4096;
    long frees = argc > 3 ? atol(argv[3]) : 64;
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    alloc_fn shim_alloc = (alloc_fn)dlsym(lib, "npl_alloc");
    free_fn shim_free = (free_fn)dlsym(lib, "npl_free");
    select_fn select_runtime = (select_fn)dlsym(lib, "npl_select_runtime");
    string_fn drain = (string_fn)dlsym(lib, "npl_drain_findings_json");
    free_string_fn release = (free_string_fn)dlsym(lib, "npl_free_string");
    if (!shim_alloc || !shim_free || !select_runtime || !drain || !release || select_runtime("sim", NULL) != 0) {
        return 2;
    }
    void* stream = (void*)0x10;
    void** blocks = malloc((size_t)live * sizeof *blocks);
    for (long i = 0; i < live; i++) {
        blocks[i] = shim_alloc(512, 0, stream);
        if (blocks[i] == NULL) {
            fprintf(stderr, "allocation %ld failed\n", i);
            return 1;
        }
    }
    double* ns = malloc((size_t)frees * sizeof *ns);
    for (long i = 0; i < frees; i++) {
        double t0 = now_ns();
        shim_free(blocks[i], 512, 0, stream);
        ns[i] = now_ns() - t0;
    }
    char again[64], unknown[64];
    shim_free(blocks[frees - 1], 512, 0, stream); /* freed just now: a double free */
    first_kind(drain, release, again, sizeof again);
    shim_free((char*)blocks[frees] + 64, 512, 0, stream); /* inside a live block, not its start */
    first_kind(drain, release, unknown, sizeof unknown);
    qsort(ns, (size_t)frees, sizeof *ns, by_value);
    double t0 = now_ns();
    for (long i = frees; i < live; i++) shim_free(blocks[i], 512, 0, stream);
    double mean = (now_ns() - t0) / (double)(live - frees);
    char oldest[64], newest[64];
    shim_free(blocks[0], 512, 0, stream);
    first_kind(drain, release, oldest, sizeof oldest);
    shim_free(blocks[live - 1], 512, 0, stream);
    first_kind(drain, release, newest, sizeof newest);
    printf("{\"live\": %ld, \"frees\": %ld, \"median_free_ns\": %.0f, \"slowest_free_ns\": %.0f, "
           "\"double_free\": \"%s\", \"bad_pointer\": \"%s\", \"mean_free_ns_all\": %.0f, "
           "\"oldest_again\": \"%s\", \"newest_again\": \"%s\"}\n",
           live, frees, ns[frees / 2], ns[frees - 1], again, unknown, mean, oldest, newest);
    return 0;
}
