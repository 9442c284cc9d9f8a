/* Events fire when their stream's worker reaches the record. A stream that
 * waits on an event holds its queue until the event's latest record (at the
 * time of the wait call) fired; waiting on a never-recorded event is a no-op,
 * as in CUDA. Queued records and waits hold a reference, so an event may be
 * destroyed while they are pending. */
#include <stdlib.h>
#include <time.h>

#include "standin.h"

struct standin_event {
    uint64_t recorded; /* records asked */
    uint64_t fired;    /* latest record the stream reached */
    uint64_t waits_queued, waits_done;
    struct timespec fired_at;
    uint32_t flags;
    int references;
};

struct event_task {
    standin_task task;
    struct standin_event *event;
    uint64_t record;
};

/* Lock held. */
static void unreference(struct standin_event *event)
{
    if (--event->references == 0)
        free(event);
}

static aclError create(aclrtEvent *event, uint32_t flags)
{
    struct standin_event *e = calloc(1, sizeof *e);
    if (e == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    e->flags = flags;
    e->references = 1;
    *event = e;
    return ACL_SUCCESS;
}

aclError aclrtCreateEvent(aclrtEvent *event)
{
    STANDIN_CALLED();
    return create(event, ACL_EVENT_SYNC);
}

aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    STANDIN_CALLED();
    return create(event, flag);
}

aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag)
{
    STANDIN_CALLED();
    return create(event, flag);
}

aclError aclrtDestroyEvent(aclrtEvent event)
{
    STANDIN_CALLED();
    if (event == NULL)
        return ACL_ERROR_RT_PARAM_INVALID;
    standin_lock();
    unreference(event);
    standin_unlock();
    return ACL_SUCCESS;
}

static void release_event_task(standin_task *task)
{
    struct event_task *t = (struct event_task *)task;
    standin_lock();
    unreference(t->event);
    standin_unlock();
    free(t);
}

static void run_record(standin_task *task)
{
    struct event_task *t = (struct event_task *)task;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    standin_lock();
    if (t->record > t->event->fired) {
        t->event->fired = t->record;
        t->event->fired_at = now;
    }
    standin_signal_change();
    standin_unlock();
}

static void run_wait(standin_task *task)
{
    struct event_task *t = (struct event_task *)task;
    standin_lock();
    while (t->event->fired < t->record)
        standin_wait_change();
    t->event->waits_done++;
    standin_signal_change();
    standin_unlock();
}

/* Queue RUN for EVENT's record RECORD on STREAM (reference taken). */
static aclError queue(struct standin_event *event, uint64_t record, void (*run)(standin_task *),
                      aclrtStream stream)
{
    struct event_task *t = malloc(sizeof *t);
    if (t == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    *t = (struct event_task){{run, release_event_task, NULL, 0, 0}, event, record};
    standin_enqueue(standin_stream_of(stream), &t->task);
    return ACL_SUCCESS;
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    STANDIN_CALLED();
    struct standin_event *e = event;
    standin_lock();
    uint64_t record = ++e->recorded;
    e->references++;
    standin_unlock();
    return queue(e, record, run_record, stream);
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event)
{
    STANDIN_CALLED();
    struct standin_event *e = event;
    standin_lock();
    uint64_t record = e->recorded;
    if (record == 0) {
        standin_unlock();
        return ACL_SUCCESS;
    }
    e->waits_queued++;
    e->references++;
    standin_unlock();
    return queue(e, record, run_wait, stream);
}

static void run_nothing(standin_task *task)
{
    (void)task;
}

aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream)
{
    STANDIN_CALLED();
    struct standin_event *e = event;
    standin_lock();
    e->references++;
    standin_unlock();
    return queue(e, 0, run_nothing, stream);
}

static int complete(struct standin_event *e)
{
    standin_lock();
    int done = e->fired >= e->recorded;
    standin_unlock();
    return done;
}

aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status)
{
    STANDIN_CALLED();
    *status = complete(event) ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
    return ACL_SUCCESS;
}

aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    STANDIN_CALLED();
    *status = complete(event) ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return ACL_SUCCESS;
}

aclError aclrtQueryEventWaitStatus(aclrtEvent event, aclrtEventWaitStatus *status)
{
    STANDIN_CALLED();
    struct standin_event *e = event;
    standin_lock();
    *status = e->waits_done == e->waits_queued ? ACL_EVENT_WAIT_STATUS_COMPLETE : ACL_EVENT_WAIT_STATUS_NOT_READY;
    standin_unlock();
    return ACL_SUCCESS;
}

aclError aclrtSynchronizeEvent(aclrtEvent event)
{
    STANDIN_CALLED();
    struct standin_event *e = event;
    standin_lock();
    uint64_t record = e->recorded;
    while (e->fired < record)
        standin_wait_change();
    standin_unlock();
    return ACL_SUCCESS;
}

static double milliseconds(struct timespec at)
{
    return (double)at.tv_sec * 1e3 + (double)at.tv_nsec / 1e6;
}

aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent)
{
    STANDIN_CALLED();
    struct standin_event *start = startEvent, *end = endEvent;
    standin_lock();
    int ready = start->fired && end->fired && start->fired >= start->recorded && end->fired >= end->recorded;
    if (ready)
        *ms = (float)(milliseconds(end->fired_at) - milliseconds(start->fired_at));
    standin_unlock();
    return ready ? ACL_SUCCESS : ACL_ERROR_RT_EVENT_NOT_COMPLETE;
}

aclError aclrtEventGetTimestamp(aclrtEvent event, uint64_t *timestamp)
{
    STANDIN_CALLED();
    struct standin_event *e = event;
    standin_lock();
    int ready = e->fired && e->fired >= e->recorded;
    if (ready)
        *timestamp = (uint64_t)e->fired_at.tv_sec * 1000000ULL + (uint64_t)e->fired_at.tv_nsec / 1000ULL;
    standin_unlock();
    return ready ? ACL_SUCCESS : ACL_ERROR_RT_EVENT_NOT_COMPLETE;
}
