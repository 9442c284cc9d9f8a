/* An in-process CPU sampler for machines with no perf (the GPU host has none):
 *
 *     SAMPLER_OUT=stacks.txt LD_PRELOAD=./sampler.so python3 ...
 *
 * Every SAMPLER_US (default 1000) microseconds of the process's CPU time,
 * SIGPROF interrupts a running thread; on the main thread it records the
 * native stack with backtrace() into a preallocated table (no allocation in
 * the handler; other threads, such as BLAS servers spinning, are skipped).
 * Sampling runs from start-up to exit, or with SAMPLER_MANUAL=1 only between
 * the program's calls of npl_sampler_start() and npl_sampler_stop() (the
 * benchmarks' children make them around their timed runs, so imports and
 * warm-up stay out). A process that took no samples writes nothing, so a
 * wrapper that the preload also reaches (timeout, a shell) leaves the file to
 * the sampled process. The kernel rounds the interval up to its timer tick
 * (about 4 ms was seen on the GPU host). At exit each stack is written as one
 * line, root first:
 * "LIB@0xOFFSET[:SYMBOL];... COUNT". Offsets are relative to each library's
 * load base, so `symbolize.py` can name static functions with addr2line on the
 * machine that ran it. Python frames show as the interpreter's C functions:
 * the point is where native time goes (torch's dispatcher, the allocator,
 * our extensions), which py-spy --native was too slow to sample there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

enum { MAX_DEPTH = 96, MAX_SAMPLES = 40000 };

static void *stacks[MAX_SAMPLES][MAX_DEPTH];
static int depths[MAX_SAMPLES];
static void *leaves[MAX_SAMPLES]; /* the interrupted instruction, from the signal context */
static atomic_int taken;
static atomic_int dropped;
static const char *out_path;
static long interval_us = 1000;
static pid_t main_thread;
static char executable[4096];

static void on_tick(int sig, siginfo_t *info, void *context) {
    (void)sig, (void)info;
    if ((pid_t)syscall(SYS_gettid) != main_thread) return;
    int slot = atomic_fetch_add(&taken, 1);
    if (slot >= MAX_SAMPLES) {
        atomic_fetch_add(&dropped, 1);
        return;
    }
#if defined(__x86_64__)
    leaves[slot] = (void *)((ucontext_t *)context)->uc_mcontext.gregs[REG_RIP];
#else
    (void)context; /* the leaf is kept only where the context's layout is known */
#endif
    depths[slot] = backtrace(stacks[slot], MAX_DEPTH);
}

static void arm(long us) {
    struct itimerval every = {{0, us}, {0, us}};
    if (setitimer(ITIMER_PROF, &every, NULL) != 0) perror("sampler: setitimer");
}

void npl_sampler_start(void) {
    if (out_path != NULL) arm(interval_us);
}

void npl_sampler_stop(void) {
    if (out_path != NULL) arm(0);
}

__attribute__((constructor)) static void start(void) {
    out_path = getenv("SAMPLER_OUT");
    if (out_path == NULL) return;
    main_thread = getpid();
    ssize_t length = readlink("/proc/self/exe", executable, sizeof executable - 1);
    executable[length > 0 ? length : 0] = '\0';
    void *warm[4];
    backtrace(warm, 4); /* loads libgcc's unwinder now, not inside the handler */
    const char *us_text = getenv("SAMPLER_US");
    if (us_text != NULL && atol(us_text) > 0) interval_us = atol(us_text);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_tick;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGPROF, &action, NULL) != 0) return;
    const char *manual = getenv("SAMPLER_MANUAL");
    if (manual == NULL || manual[0] != '1') arm(interval_us);
}

static void write_frame(FILE *out, void *address) {
    Dl_info info;
    if (dladdr(address, &info) == 0 || info.dli_fname == NULL) {
        fprintf(out, "?@%p", address);
        return;
    }
    /* the return address minus one lies inside the calling instruction; the
     * main program's name comes as given on the command line, so use its path */
    unsigned long offset = (unsigned long)((char *)address - (char *)info.dli_fbase) - 1;
    const char *name = strchr(info.dli_fname, '/') == NULL && executable[0] ? executable : info.dli_fname;
    fprintf(out, "%s@0x%lx", name, offset);
    if (info.dli_sname != NULL) fprintf(out, ":%s", info.dli_sname);
}

__attribute__((destructor)) static void stop(void) {
    if (out_path == NULL) return;
    arm(0);
    int count = atomic_load(&taken);
    if (count > MAX_SAMPLES) count = MAX_SAMPLES;
    /* a process that took no samples (a wrapper such as timeout, a subprocess
     * that never started sampling) must not truncate the sampled one's file */
    if (count == 0) return;
    FILE *out = fopen(out_path, "w");
    if (out == NULL) return;
    for (int s = 0; s < count; s++) {
        /* frame 0 is on_tick itself, 1 the signal trampoline: the interrupted code starts at 2 */
        /* unwinding through the signal frame can fail: then the stack is the leaf alone */
        if (depths[s] <= 2) {
            fputs("[unwound no further]", out);
            if (leaves[s] != NULL) {
                fputc(';', out);
                write_frame(out, (char *)leaves[s] + 1);
            }
        }
        for (int f = depths[s] - 1; f >= 2; f--) {
            write_frame(out, stacks[s][f]);
            if (f > 2) fputc(';', out);
        }
        fputs(" 1\n", out);
    }
    fprintf(stderr, "sampler: %d samples to %s (%d dropped)\n", count, out_path, atomic_load(&dropped));
    fclose(out);
}
