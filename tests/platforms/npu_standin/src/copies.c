/* Work queued on a stream besides kernels: asynchronous copies and fills,
 * host functions. As on a GPU, a copy from pageable host memory reads the
 * source when it is queued, and a copy to pageable host memory returns once
 * it ran; copies between device and pinned memory are fully asynchronous. */
#include <stdlib.h>
#include <string.h>

#include "standin.h"

struct copy_task {
    standin_task task;
    void *dst;
    const void *src;
    size_t count;
    void *staging; /* the pageable source, copied when queued */
};

struct fill_task {
    standin_task task;
    void *dst;
    int32_t value;
    size_t count;
};

struct host_task {
    standin_task task;
    void (*fn)(void *);
    void *arg;
};

static void run_copy(standin_task *task)
{
    struct copy_task *copy = (struct copy_task *)task;
    standin_copy(copy->dst, copy->staging ? copy->staging : copy->src, copy->count);
}

static void release_copy(standin_task *task)
{
    struct copy_task *copy = (struct copy_task *)task;
    free(copy->staging);
    free(copy);
}

static aclError queue_copy(void *dst, const void *src, size_t count, aclrtStream stream)
{
    struct copy_task *copy = calloc(1, sizeof *copy);
    if (copy == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    *copy = (struct copy_task){{run_copy, release_copy, NULL, 0, 0}, dst, src, count, NULL};
    if (count && standin_memory_kind_of(src) == STANDIN_NOT_OURS) {
        copy->staging = malloc(count);
        if (copy->staging == NULL) {
            free(copy);
            return ACL_ERROR_RT_MEMORY_ALLOCATION;
        }
        memcpy(copy->staging, src, count);
    }
    int pageable_target = count && standin_memory_kind_of(dst) == STANDIN_NOT_OURS;
    standin_stream *s = standin_stream_of(stream);
    uint64_t index = standin_enqueue(s, &copy->task);
    if (pageable_target)
        standin_wait_index(s, index);
    return ACL_SUCCESS;
}

aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream)
{
    (void)kind;
    STANDIN_CALLED();
    if (count > destMax)
        return ACL_ERROR_INVALID_PARAM;
    return queue_copy(dst, src, count, stream);
}

static void run_fill(standin_task *task)
{
    struct fill_task *fill = (struct fill_task *)task;
    memset(fill->dst, fill->value, fill->count);
}

static void release_task(standin_task *task)
{
    free(task);
}

aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream)
{
    STANDIN_CALLED();
    if (count > maxCount)
        return ACL_ERROR_INVALID_PARAM;
    struct fill_task *fill = malloc(sizeof *fill);
    if (fill == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    *fill = (struct fill_task){{run_fill, release_task, NULL, 0, 0}, devPtr, value, count};
    standin_enqueue(standin_stream_of(stream), &fill->task);
    return ACL_SUCCESS;
}

static void run_host(standin_task *task)
{
    struct host_task *host = (struct host_task *)task;
    host->fn(host->arg);
}

static aclError queue_host_function(void (*fn)(void *), void *arg, aclrtStream stream)
{
    struct host_task *host = malloc(sizeof *host);
    if (host == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    *host = (struct host_task){{run_host, release_task, NULL, 0, 0}, fn, arg};
    standin_enqueue(standin_stream_of(stream), &host->task);
    return ACL_SUCCESS;
}

aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args)
{
    STANDIN_CALLED();
    return queue_host_function(fn, args, stream);
}

aclError aclrtLaunchCallback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType, aclrtStream stream)
{
    (void)blockType;
    STANDIN_CALLED();
    return queue_host_function(fn, userData, stream);
}
