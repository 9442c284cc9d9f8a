/*
 * A stand-in for libascendcl.so, for testing the shim's ACL runtime table
 * without an NPU (as torch_npu's own tests use a stub ACL library).  It
 * exports the AscendCL symbols the shim resolves, with their published
 * signatures and status codes, over host memory and simulated streams:
 * an event completes when the test calls fake_acl_complete(stream).
 * Arguments are checked the way the real runtime documents them, so a
 * wrong signature or status code in the shim fails a test.
 *
 * It also plays two parts of torch_npu: its task queue (with the queue on,
 * fake_acl_launch holds a kernel on the host until fake_acl_flush submits
 * it, as torch_npu's launch thread does), and NPUStream::stream()
 * (fake_npu_stream_handle reads a 16-byte c10::Stream: device index at
 * byte 1, stream id at bytes 8-15, which here is the aclrtStream itself).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int aclError;
typedef void* aclrtStream;
typedef void* aclrtEvent;
typedef void* aclmdlRI;

#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_MEM_MALLOC_NORMAL_ONLY_P2P 5
#define ACL_EVENT_RECORDED_STATUS_NOT_READY 0
#define ACL_EVENT_RECORDED_STATUS_COMPLETE 1
#define ACL_MODEL_RI_CAPTURE_STATUS_NONE 0
#define ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE 1

#define MAX_STREAMS 64
#define MAX_EVENTS 4096

#define EXPORT __attribute__((visibility("default")))

struct stream_state { aclrtStream handle; uint64_t queued, completed, waits, on_host, last_kernel; int capturing; };
/* plain: made by aclrtCreateEvent, whose documented protocol is record ->
 * wait -> reset; re-recording one whose record may still be pending is
 * counted (n_plain_rerecord), as CANN leaves what a wait then sees undefined
 * (only aclrtCreateEventExWithFlag events keep the record a wait saw). */
struct event_state { int live; int plain; aclrtStream stream; uint64_t position; int recorded; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct stream_state streams[MAX_STREAMS];
static struct event_state events[MAX_EVENTS];
static int32_t current_device = 0;
static uint64_t in_use = 0, limit = 0;
static uint64_t n_malloc = 0, n_free = 0, n_record = 0, n_query = 0, n_wait = 0, n_capture_info = 0;
static uint64_t n_sync_event = 0, n_sync_device = 0, n_plain_rerecord = 0, n_create_ex = 0;
static int last_policy = -1;
static int task_queue = 0;

/* ACL's NULL stream is the default stream: slot 0. */
static struct stream_state* stream_of(aclrtStream s) {
    if (s == NULL) return &streams[0];
    for (int i = 1; i < MAX_STREAMS; i++) {
        if (streams[i].handle == s) return &streams[i];
    }
    for (int i = 1; i < MAX_STREAMS; i++) {
        if (streams[i].handle == NULL) {
            streams[i].handle = s;
            return &streams[i];
        }
    }
    return NULL;
}

static struct event_state* event_of(aclrtEvent e) {
    uintptr_t i = (uintptr_t)e;
    if (i == 0 || i > MAX_EVENTS || !events[i - 1].live) return NULL;
    return &events[i - 1];
}

EXPORT aclError aclrtMalloc(void** devPtr, size_t size, int policy) {
    if (devPtr == NULL || size == 0 || policy < 0 || policy > ACL_MEM_MALLOC_NORMAL_ONLY_P2P) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&mu);
    aclError rc = ACL_SUCCESS;
    n_malloc++;
    last_policy = policy;
    if (limit && in_use + size > limit) {
        rc = ACL_ERROR_RT_MEMORY_ALLOCATION;
    } else {
        size_t *p = malloc(size + 64);
        if (p == NULL) {
            rc = ACL_ERROR_RT_MEMORY_ALLOCATION;
        } else {
            p[0] = size;
            *devPtr = (char*)p + 64;
            in_use += size;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT aclError aclrtFree(void* devPtr) {
    if (devPtr == NULL) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&mu);
    size_t* p = (size_t*)((char*)devPtr - 64);
    in_use -= p[0];
    n_free++;
    free(p);
    pthread_mutex_unlock(&mu);
    return ACL_SUCCESS;
}

static aclError create_event(aclrtEvent* event, int plain) {
    if (event == NULL) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&mu);
    aclError rc = ACL_ERROR_RT_PARAM_INVALID;
    for (int i = 0; i < MAX_EVENTS; i++) {
        if (!events[i].live) {
            memset(&events[i], 0, sizeof events[i]);
            events[i].live = 1;
            events[i].plain = plain;
            *event = (aclrtEvent)(uintptr_t)(i + 1);
            rc = ACL_SUCCESS;
            break;
        }
    }
    if (!plain && rc == ACL_SUCCESS) n_create_ex++;
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT aclError aclrtCreateEvent(aclrtEvent* event) { return create_event(event, 1); }

#define ACL_EVENT_SYNC 0x1u
#define ACL_EVENT_CAPTURE_STREAM_PROGRESS 0x2u
#define ACL_EVENT_TIME_LINE 0x8u
EXPORT aclError aclrtCreateEventExWithFlag(aclrtEvent* event, uint32_t flag) {
    if (flag & ~(ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE)) return ACL_ERROR_INVALID_PARAM;
    return create_event(event, 0);
}

EXPORT aclError aclrtDestroyEvent(aclrtEvent event) {
    pthread_mutex_lock(&mu);
    struct event_state* e = event_of(event);
    if (e) e->live = 0;
    pthread_mutex_unlock(&mu);
    return e ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

EXPORT aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
    pthread_mutex_lock(&mu);
    struct event_state* e = event_of(event);
    struct stream_state* s = stream_of(stream);
    if (e && s) {
        struct stream_state* before = e->recorded ? stream_of(e->stream) : NULL;
        if (e->plain && before && before->completed < e->position) n_plain_rerecord++;
        e->stream = stream;
        e->position = ++s->queued;
        e->recorded = 1;
        n_record++;
    }
    pthread_mutex_unlock(&mu);
    return e && s ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

EXPORT aclError aclrtQueryEventStatus(aclrtEvent event, int* status) {
    if (status == NULL) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&mu);
    struct event_state* e = event_of(event);
    n_query++;
    if (e) {
        /* As documented: an event never recorded is NOT_READY (unlike CUDA). */
        struct stream_state* s = e->recorded ? stream_of(e->stream) : NULL;
        *status = s && s->completed >= e->position ? ACL_EVENT_RECORDED_STATUS_COMPLETE
                                                    : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    }
    pthread_mutex_unlock(&mu);
    return e ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

EXPORT aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
    pthread_mutex_lock(&mu);
    struct event_state* e = event_of(event);
    struct stream_state* s = stream_of(stream);
    if (e && s) {
        s->waits++;
        n_wait++;
    }
    pthread_mutex_unlock(&mu);
    return e && s ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

EXPORT aclError aclrtSynchronizeEvent(aclrtEvent event) {
    pthread_mutex_lock(&mu);
    struct event_state* e = event_of(event);
    if (e && e->recorded) {
        struct stream_state* s = stream_of(e->stream);
        if (s && s->completed < e->position) s->completed = e->position;
    }
    n_sync_event++;
    pthread_mutex_unlock(&mu);
    return e ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

EXPORT aclError aclrtSynchronizeStream(aclrtStream stream) {
    pthread_mutex_lock(&mu);
    struct stream_state* s = stream_of(stream);
    if (s) s->completed = s->queued;
    pthread_mutex_unlock(&mu);
    return s ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

EXPORT aclError aclrtSynchronizeDevice(void) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_STREAMS; i++) streams[i].completed = streams[i].queued;
    n_sync_device++;
    pthread_mutex_unlock(&mu);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream) {
    if (devPtr == NULL || count > maxCount) return ACL_ERROR_INVALID_PARAM;
    (void)stream;
    memset(devPtr, value, count);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, int kind) {
    if (dst == NULL || src == NULL || count > destMax || kind < 0 || kind > 3) return ACL_ERROR_INVALID_PARAM;
    memcpy(dst, src, count);
    return ACL_SUCCESS;
}

EXPORT aclError aclrtGetMemInfo(int attr, size_t* free_bytes, size_t* total) {
    if (free_bytes == NULL || total == NULL || attr < 0) return ACL_ERROR_INVALID_PARAM;
    *total = limit ? limit : ((size_t)32 << 30);
    *free_bytes = *total - in_use;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtGetDevice(int32_t* deviceId) {
    if (deviceId == NULL) return ACL_ERROR_INVALID_PARAM;
    *deviceId = current_device;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtGetDeviceCount(uint32_t* count) {
    if (count == NULL) return ACL_ERROR_INVALID_PARAM;
    *count = 8;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtSetDevice(int32_t deviceId) {
    if (deviceId < 0 || deviceId > 7) return ACL_ERROR_INVALID_PARAM;
    current_device = deviceId;
    return ACL_SUCCESS;
}

EXPORT aclError aclmdlRICaptureGetInfo(aclrtStream stream, int* status, aclmdlRI* modelRI) {
    if (status == NULL || modelRI == NULL) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&mu);
    struct stream_state* s = stream_of(stream);
    n_capture_info++;
    *status = s && s->capturing ? ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE : ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    *modelRI = NULL;
    pthread_mutex_unlock(&mu);
    return s ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

/* ---- test controls ---- */
EXPORT void fake_acl_complete(aclrtStream stream) {
    pthread_mutex_lock(&mu);
    struct stream_state* s = stream_of(stream);
    if (s) s->completed = s->queued;
    pthread_mutex_unlock(&mu);
}

EXPORT void fake_acl_set_capturing(aclrtStream stream, int capturing) {
    pthread_mutex_lock(&mu);
    struct stream_state* s = stream_of(stream);
    if (s) s->capturing = capturing;
    pthread_mutex_unlock(&mu);
}

EXPORT void fake_acl_set_memory_limit(uint64_t bytes) { limit = bytes; }

/* torch_npu's task queue: with it on, a launched kernel waits on the host. */
EXPORT void fake_acl_set_task_queue(int on) { task_queue = on; }

EXPORT void fake_acl_launch(aclrtStream stream) {
    pthread_mutex_lock(&mu);
    struct stream_state* s = stream_of(stream);
    if (s) {
        if (task_queue) s->on_host++;
        else s->last_kernel = ++s->queued;
    }
    pthread_mutex_unlock(&mu);
}

EXPORT void fake_acl_flush(void) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_STREAMS; i++) {
        if (streams[i].on_host == 0) continue;
        streams[i].queued += streams[i].on_host;
        streams[i].last_kernel = streams[i].queued;
        streams[i].on_host = 0;
    }
    pthread_mutex_unlock(&mu);
}

/* Kernels of `stream` that have run on the device: all submitted ones, once completed. */
EXPORT uint64_t fake_acl_kernels_pending(aclrtStream stream) {
    pthread_mutex_lock(&mu);
    struct stream_state* s = stream_of(stream);
    uint64_t n = s ? s->on_host + (s->last_kernel > s->completed ? 1 : 0) : 0;
    pthread_mutex_unlock(&mu);
    return n;
}

/* c10_npu::NPUStream::stream() const, on a 16-byte c10::Stream. */
EXPORT void* fake_npu_stream_handle(const void* npu_stream) {
    int64_t id;
    memcpy(&id, (const char*)npu_stream + 8, sizeof id);
    return (void*)(intptr_t)id;
}
EXPORT int32_t fake_acl_current_device(void) { return current_device; }
EXPORT int fake_acl_last_policy(void) { return last_policy; }
EXPORT uint64_t fake_acl_in_use(void) { return in_use; }

/* Between tests: counters to zero, no kernel pending anywhere. */
EXPORT void fake_acl_reset_counters(void) {
    pthread_mutex_lock(&mu);
    n_malloc = n_free = n_record = n_query = n_wait = n_capture_info = n_sync_event = n_sync_device = 0;
    n_plain_rerecord = n_create_ex = 0;
    for (int i = 0; i < MAX_STREAMS; i++) {
        streams[i].on_host = streams[i].last_kernel = 0;
        streams[i].completed = streams[i].queued;
    }
    pthread_mutex_unlock(&mu);
}

EXPORT uint64_t fake_acl_calls(const char* name) {
    if (!strcmp(name, "aclrtMalloc")) return n_malloc;
    if (!strcmp(name, "aclrtFree")) return n_free;
    if (!strcmp(name, "aclrtRecordEvent")) return n_record;
    if (!strcmp(name, "aclrtQueryEventStatus")) return n_query;
    if (!strcmp(name, "aclrtStreamWaitEvent")) return n_wait;
    if (!strcmp(name, "aclmdlRICaptureGetInfo")) return n_capture_info;
    if (!strcmp(name, "aclrtSynchronizeEvent")) return n_sync_event;
    if (!strcmp(name, "aclrtSynchronizeDevice")) return n_sync_device;
    if (!strcmp(name, "aclrtCreateEventExWithFlag")) return n_create_ex;
    if (!strcmp(name, "plain event re-recorded while pending")) return n_plain_rerecord;
    return UINT64_MAX;
}

/* npl_queue_ops as torch_npu's NPUEvent plays them with the queue on: a
 * record or wait enters the queue behind the kernels already there (here:
 * those are submitted first), a sync drains the queue first.  Events are
 * this library's own.  The layout is the shim header's struct npl_queue_ops. */
static int q_event_create(void** event, int device) { (void)device; return aclrtCreateEvent(event); }
static int q_event_destroy(void* event) { return aclrtDestroyEvent(event); }
static int q_event_record(void* event, void* stream) { fake_acl_flush(); return aclrtRecordEvent(event, stream); }
static int q_event_query(void* event, int* complete) {
    int status = 0;
    aclError err = aclrtQueryEventStatus(event, &status);
    *complete = status == ACL_EVENT_RECORDED_STATUS_COMPLETE;
    return err;
}
static int q_event_synchronize(void* event) { fake_acl_flush(); return aclrtSynchronizeEvent(event); }
static int q_stream_wait(void* stream, void* event) { fake_acl_flush(); return aclrtStreamWaitEvent(stream, event); }
static int q_stream_synchronize(void* stream) { fake_acl_flush(); return aclrtSynchronizeStream(stream); }
static int q_stream_drain(void* stream) { (void)stream; fake_acl_flush(); return ACL_SUCCESS; }
static int q_device_synchronize(int device) { (void)device; fake_acl_flush(); return aclrtSynchronizeDevice(); }
static const char* q_error_string(int code) { (void)code; return ""; }
static struct {
    int (*event_create)(void**, int);
    int (*event_destroy)(void*);
    int (*event_record)(void*, void*);
    int (*event_query)(void*, int*);
    int (*event_synchronize)(void*);
    int (*stream_wait_event)(void*, void*);
    int (*stream_synchronize)(void*);
    int (*stream_drain)(void*);
    int (*device_synchronize)(int);
    const char* (*error_string)(int);
} queue_ops = {q_event_create, q_event_destroy, q_event_record, q_event_query, q_event_synchronize,
               q_stream_wait, q_stream_synchronize, q_stream_drain, q_device_synchronize, q_error_string};
EXPORT const void* fake_npu_queue_ops(void) { return &queue_ops; }
