/* A stand-in for the CUDA runtime calls of npu_lifetime/recording/cuda_runtime.h,
 * for the torch-allocator fallback's tests on CPU (tests/helpers/fake_cudart/__init__.py builds it).
 * Streams are handles 0..63 whose queued work runs when a test says so
 * (fake_run); events record a stream's queue position.  It also checks the
 * rules the table must keep: no query while a capture is underway or of an
 * event recorded during capture, event creation in relaxed capture mode,
 * records on the stream's device; each breach counts as a violation. */
#define _DEFAULT_SOURCE /* usleep */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_STREAMS 64
enum { SUCCESS = 0, INVALID_VALUE = 1, INVALID_HANDLE = 400, NOT_READY = 600, CAPTURE_UNSUPPORTED = 900,
       CAPTURE_IMPLICIT = 906, CAPTURED_EVENT = 907 };
enum { CREATED, DESTROYED, RECORDS, QUERIES, VIOLATIONS, SET_DEVICE, SYNCS, N_COUNTS };
enum { FAIL_CREATE, FAIL_RECORD, FAIL_QUERY, N_FAILS };

struct stream { long queued, done; int capturing, device; };
struct event { int device, recorded, in_capture; long stream, mark; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct stream streams[MAX_STREAMS];
static long counts[N_COUNTS];
static int fails[N_FAILS];
static int capture_underway;
static unsigned query_sleep_us;  /* a slow query: the tests see whether the GIL was released */
static _Thread_local int current_device, last_error, capture_mode;  /* mode 0: global */

static int fail(int err) { last_error = err; return err; }
static int valid(long h) { return h >= 0 && h < MAX_STREAMS; }

int cudaGetDevice(int* device) { *device = current_device; return SUCCESS; }
int cudaSetDevice(int device) {
    __atomic_add_fetch(&counts[SET_DEVICE], 1, __ATOMIC_RELAXED);
    current_device = device;
    return SUCCESS;
}
int cudaGetLastError(void) { int e = last_error; last_error = SUCCESS; return e; }
int cudaPeekAtLastError(void) { return last_error; }
int cudaThreadExchangeStreamCaptureMode(int* mode) { int m = capture_mode; capture_mode = *mode; *mode = m; return SUCCESS; }

int cudaEventCreateWithFlags(void** out, unsigned flags) {
    pthread_mutex_lock(&mu);
    int err = fails[FAIL_CREATE] ? fails[FAIL_CREATE] : flags != 2 ? INVALID_VALUE : SUCCESS;
    if (capture_underway && capture_mode != 2) counts[VIOLATIONS]++;  /* would invalidate a global capture */
    struct event* e = err ? NULL : calloc(1, sizeof *e);
    if (e) { e->device = current_device; counts[CREATED]++; }
    pthread_mutex_unlock(&mu);
    if (err) return fail(err);
    *out = e;
    return SUCCESS;
}

int cudaEventDestroy(void* event) {
    pthread_mutex_lock(&mu);
    counts[DESTROYED]++;
    pthread_mutex_unlock(&mu);
    free(event);
    return SUCCESS;
}

int cudaEventRecord(void* event, void* stream) {
    struct event* e = event;
    long h = (long)stream;
    pthread_mutex_lock(&mu);
    int err = fails[FAIL_RECORD];
    if (!err && (!valid(h) || streams[h].device != current_device || e->device != streams[h].device)) {
        err = INVALID_HANDLE;
        counts[VIOLATIONS]++;
    }
    if (!err) {
        counts[RECORDS]++;
        e->stream = h;
        e->recorded = 1;
        e->in_capture = streams[h].capturing;
        if (!e->in_capture) e->mark = ++streams[h].queued;  /* the event is itself a queued item */
    }
    pthread_mutex_unlock(&mu);
    return err ? fail(err) : SUCCESS;
}

int cudaEventQuery(void* event) {
    struct event* e = event;
    if (query_sleep_us) usleep(query_sleep_us);
    pthread_mutex_lock(&mu);
    counts[QUERIES]++;
    int err = fails[FAIL_QUERY];
    if (!err && (capture_underway || e->in_capture || (e->recorded && streams[e->stream].capturing))) {
        counts[VIOLATIONS]++;
        err = e->in_capture ? CAPTURED_EVENT : CAPTURE_UNSUPPORTED;
    }
    if (!err && e->recorded && streams[e->stream].done < e->mark) err = NOT_READY;
    pthread_mutex_unlock(&mu);
    return err ? fail(err) : SUCCESS;
}

int cudaEventSynchronize(void* event) {
    struct event* e = event;
    pthread_mutex_lock(&mu);
    counts[SYNCS]++;
    if (e->recorded && !e->in_capture && streams[e->stream].done < e->mark) streams[e->stream].done = e->mark;
    pthread_mutex_unlock(&mu);
    return SUCCESS;
}

int cudaStreamIsCapturing(void* stream, int* status) {
    long h = (long)stream;
    if (!valid(h)) return fail(INVALID_HANDLE);
    pthread_mutex_lock(&mu);
    int any = 0;
    for (int i = 1; i < MAX_STREAMS; i++) any |= streams[i].capturing;
    int err = h == 0 && any ? CAPTURE_IMPLICIT : SUCCESS;  /* the legacy stream while another captures */
    *status = streams[h].capturing;
    pthread_mutex_unlock(&mu);
    return err ? fail(err) : SUCCESS;
}

/* -- the tests' controls ------------------------------------------------------------------ */
void fake_reset(void) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_STREAMS; i++) streams[i] = (struct stream){0, 0, 0, 0};
    for (int i = 0; i < N_COUNTS; i++) counts[i] = 0;
    for (int i = 0; i < N_FAILS; i++) fails[i] = 0;
    capture_underway = 0;
    query_sleep_us = 0;
    pthread_mutex_unlock(&mu);
    current_device = last_error = capture_mode = 0;
}
void fake_stream_device(long h, int device) { pthread_mutex_lock(&mu); streams[h].device = device; pthread_mutex_unlock(&mu); }
void fake_run(long h, long n) {  /* n < 0: everything queued */
    pthread_mutex_lock(&mu);
    struct stream* s = &streams[h];
    s->done = n < 0 || s->done + n > s->queued ? s->queued : s->done + n;
    pthread_mutex_unlock(&mu);
}
long fake_queued(long h) { return streams[h].queued; }
long fake_done(long h) { return streams[h].done; }
void fake_capture(long h, int on) { pthread_mutex_lock(&mu); streams[h].capturing = on; pthread_mutex_unlock(&mu); }
void fake_capture_underway(int on) { pthread_mutex_lock(&mu); capture_underway = on; pthread_mutex_unlock(&mu); }
void fake_fail(int which, int err) { pthread_mutex_lock(&mu); fails[which] = err; pthread_mutex_unlock(&mu); }
long fake_count(int which) { pthread_mutex_lock(&mu); long c = counts[which]; pthread_mutex_unlock(&mu); return c; }
int fake_last_error(void) { return last_error; }
void fake_set_last_error(int err) { last_error = err; }
int fake_current_device(void) { return current_device; }
void fake_query_sleep_us(unsigned us) { query_sleep_us = us; }
