/* Streams: a FIFO of tasks per stream, run by a worker thread of its own,
 * asynchronously to the host. Each task runs after the configured delay
 * (NPU_STANDIN_DELAY_US, standin_set_delay_us); a paused stream holds its
 * queue until resumed. Stream structures live until the process ends. */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "standin.h"

#define MAX_DEVICES 16

struct standin_stream {
    int32_t device;
    int32_t id;
    int paused;
    int destroyed;
    standin_task *head, *tail;
    uint64_t submitted, completed;
    pthread_cond_t wake; /* the worker's: work queued, resumed or destroyed */
    standin_stream *next_stream;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static standin_stream *streams;
static standin_stream *default_streams[MAX_DEVICES];
static int32_t next_id;
static uint64_t next_sequence = 1;
static uint64_t delay_us;
static int delay_read;

void standin_lock(void) { pthread_mutex_lock(&lock); }
void standin_unlock(void) { pthread_mutex_unlock(&lock); }
void standin_wait_change(void) { pthread_cond_wait(&changed, &lock); }
void standin_signal_change(void) { pthread_cond_broadcast(&changed); }

/* Lock held: wait for a change until DEADLINE; 0 once it passed. */
static int wait_change_until(const struct timespec *deadline)
{
    if (deadline == NULL) {
        pthread_cond_wait(&changed, &lock);
        return 1;
    }
    return pthread_cond_timedwait(&changed, &lock, deadline) != ETIMEDOUT;
}

static struct timespec *deadline_after(int32_t timeout_ms, struct timespec *at)
{
    if (timeout_ms < 0)
        return NULL;
    clock_gettime(CLOCK_REALTIME, at);
    at->tv_sec += timeout_ms / 1000;
    at->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (at->tv_nsec >= 1000000000L) {
        at->tv_sec += 1;
        at->tv_nsec -= 1000000000L;
    }
    return at;
}

static void sleep_delay(void)
{
    standin_lock();
    if (!delay_read) {
        delay_us = standin_env_u64("NPU_STANDIN_DELAY_US", 0);
        delay_read = 1;
    }
    uint64_t us = delay_us;
    standin_unlock();
    if (us == 0)
        return;
    struct timespec pause = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
    nanosleep(&pause, NULL);
}

/* Lock held on entry and exit. */
static void run_head(standin_stream *s)
{
    standin_task *task = s->head;
    standin_unlock();
    sleep_delay();
    task->run(task);
    standin_lock();
    s->head = task->next;
    if (s->head == NULL)
        s->tail = NULL;
    s->completed = task->index;
    standin_release_deferred();
    standin_signal_change();
    standin_unlock();
    task->release(task);
    standin_lock();
}

static void *worker(void *arg)
{
    standin_stream *s = arg;
    standin_lock();
    for (;;) {
        while (s->head == NULL || s->paused) {
            if (s->destroyed && s->head == NULL) {
                standin_unlock();
                return NULL;
            }
            pthread_cond_wait(&s->wake, &lock);
        }
        run_head(s);
    }
}

static standin_stream *new_stream(int32_t device)
{
    standin_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->device = device;
    pthread_cond_init(&s->wake, NULL);
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, s) != 0) {
        pthread_cond_destroy(&s->wake);
        free(s);
        return NULL;
    }
    pthread_detach(thread);
    standin_lock();
    s->id = next_id++;
    s->next_stream = streams;
    streams = s;
    standin_unlock();
    return s;
}

standin_stream *standin_stream_of(aclrtStream stream)
{
    if (stream != NULL)
        return stream;
    int32_t device = standin_current_device();
    standin_lock();
    standin_stream *s = default_streams[device];
    standin_unlock();
    if (s != NULL)
        return s;
    s = new_stream(device);
    standin_lock();
    if (default_streams[device] == NULL)
        default_streams[device] = s;
    else
        s->destroyed = 1; /* another thread won; this one's worker exits */
    pthread_cond_signal(&s->wake);
    s = default_streams[device];
    standin_unlock();
    return s;
}

/* standin_hold_launches: while on, work submitted by any thread but the
 * one that turned it on waits at the door, as if that thread (torch_npu's
 * launch thread, with its task queue on) were slow to launch. */
static int launches_held;
static pthread_t launch_holder;

uint64_t standin_enqueue(standin_stream *s, standin_task *task)
{
    standin_lock();
    while (launches_held && !pthread_equal(pthread_self(), launch_holder))
        standin_wait_change();
    task->next = NULL;
    task->index = ++s->submitted;
    task->sequence = next_sequence++;
    if (s->tail)
        s->tail->next = task;
    else
        s->head = task;
    s->tail = task;
    pthread_cond_signal(&s->wake);
    standin_unlock();
    return task->index;
}

void standin_wait_index(standin_stream *s, uint64_t index)
{
    standin_lock();
    while (s->completed < index)
        standin_wait_change();
    standin_unlock();
}

uint64_t standin_sequence_now(void)
{
    return next_sequence - 1;
}

uint64_t standin_oldest_pending_sequence(void)
{
    uint64_t oldest = UINT64_MAX;
    for (standin_stream *s = streams; s; s = s->next_stream)
        if (s->head && s->head->sequence < oldest)
            oldest = s->head->sequence;
    return oldest;
}

/* Lock held: wait until S ran what was queued on it before; 0 on timeout. */
static int drain_stream(standin_stream *s, const struct timespec *deadline)
{
    uint64_t target = s->submitted;
    while (s->completed < target)
        if (!wait_change_until(deadline))
            return 0;
    return 1;
}

static aclError synchronize_stream(aclrtStream stream, int32_t timeout_ms)
{
    struct timespec at;
    struct timespec *deadline = deadline_after(timeout_ms, &at);
    standin_stream *s = standin_stream_of(stream);
    standin_lock();
    int done = drain_stream(s, deadline);
    standin_unlock();
    return done ? ACL_SUCCESS : ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
}

static aclError synchronize_device(int32_t timeout_ms)
{
    struct timespec at;
    struct timespec *deadline = deadline_after(timeout_ms, &at);
    int32_t device = standin_current_device();
    int done = 1;
    standin_lock();
    for (standin_stream *s = streams; s && done; s = s->next_stream)
        if (s->device == device)
            done = drain_stream(s, deadline);
    standin_unlock();
    return done ? ACL_SUCCESS : ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
}

aclError aclrtCreateStream(aclrtStream *stream)
{
    STANDIN_CALLED();
    standin_stream *s = new_stream(standin_current_device());
    if (s == NULL)
        return ACL_ERROR_RT_INTERNAL_ERROR;
    *stream = s;
    return ACL_SUCCESS;
}

aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag)
{
    (void)priority;
    (void)flag;
    STANDIN_CALLED();
    standin_stream *s = new_stream(standin_current_device());
    if (s == NULL)
        return ACL_ERROR_RT_INTERNAL_ERROR;
    *stream = s;
    return ACL_SUCCESS;
}

static aclError destroy_stream(aclrtStream stream)
{
    if (stream == NULL)
        return ACL_ERROR_RT_PARAM_INVALID;
    standin_stream *s = stream;
    standin_lock();
    s->destroyed = 1;
    pthread_cond_signal(&s->wake);
    standin_unlock();
    return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream stream)
{
    STANDIN_CALLED();
    return destroy_stream(stream);
}

aclError aclrtDestroyStreamForce(aclrtStream stream)
{
    STANDIN_CALLED();
    return destroy_stream(stream);
}

aclError aclrtSynchronizeStream(aclrtStream stream)
{
    STANDIN_CALLED();
    return synchronize_stream(stream, -1);
}

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout)
{
    STANDIN_CALLED();
    return synchronize_stream(stream, timeout);
}

aclError aclrtSynchronizeDevice(void)
{
    STANDIN_CALLED();
    return synchronize_device(-1);
}

aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout)
{
    STANDIN_CALLED();
    return synchronize_device(timeout);
}

aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status)
{
    STANDIN_CALLED();
    standin_stream *s = standin_stream_of(stream);
    standin_lock();
    *status = s->completed == s->submitted ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
    standin_unlock();
    return ACL_SUCCESS;
}

aclError aclrtStreamGetId(aclrtStream stream, int32_t *streamId)
{
    STANDIN_CALLED();
    *streamId = standin_stream_of(stream)->id;
    return ACL_SUCCESS;
}

/* Test control: the delay before each task, in microseconds. */
STANDIN_EXPORT void standin_set_delay_us(uint64_t us)
{
    standin_lock();
    delay_us = us;
    delay_read = 1;
    standin_unlock();
}

static void set_paused(aclrtStream stream, int paused)
{
    standin_stream *s = standin_stream_of(stream);
    standin_lock();
    s->paused = paused;
    pthread_cond_signal(&s->wake);
    standin_signal_change();
    standin_unlock();
}

/* Test control: hold (ON) / release work submitted by threads other than
 * the caller (see launches_held). */
STANDIN_EXPORT void standin_hold_launches(int on)
{
    standin_lock();
    launches_held = on;
    launch_holder = pthread_self();
    standin_signal_change();
    standin_unlock();
}

/* Test controls: hold / release a stream's queue (NULL: the default stream). */
STANDIN_EXPORT void standin_pause_stream(aclrtStream stream) { set_paused(stream, 1); }
STANDIN_EXPORT void standin_resume_stream(aclrtStream stream) { set_paused(stream, 0); }

/* Test control: resume every stream and wait until all their work ran. */
STANDIN_EXPORT void standin_drain(void)
{
    standin_lock();
    for (standin_stream *s = streams; s; s = s->next_stream) {
        s->paused = 0;
        pthread_cond_signal(&s->wake);
    }
    for (standin_stream *s = streams; s; s = s->next_stream)
        drain_stream(s, NULL);
    standin_unlock();
}

/* Test controls: tasks a stream has run / holds (NULL: the default stream). */
STANDIN_EXPORT uint64_t standin_tasks_executed(aclrtStream stream)
{
    standin_stream *s = standin_stream_of(stream);
    standin_lock();
    uint64_t executed = s->completed;
    standin_unlock();
    return executed;
}

STANDIN_EXPORT uint64_t standin_tasks_pending(aclrtStream stream)
{
    standin_stream *s = standin_stream_of(stream);
    standin_lock();
    uint64_t pending = s->submitted - s->completed;
    standin_unlock();
    return pending;
}
