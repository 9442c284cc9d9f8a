/* Internal interface of the stand-in CANN runtime (test support, not CANN).
 * Everything here is hidden (built with -fvisibility=hidden); the ACL entry
 * points get default visibility from the wheel's headers (FUNC_VISIBILITY)
 * and the test controls from STANDIN_EXPORT. */
#ifndef NPU_STANDIN_H
#define NPU_STANDIN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "acl/acl.h"

#define STANDIN_EXPORT __attribute__((visibility("default")))
#define STANDIN_CALLED() standin_count(__func__)

/* calls.c: call counts, trace, the recent error message, configuration */
void standin_count(const char *name);
int64_t standin_stub_called(const char *name);
int64_t standin_unimplemented(const char *name);
void standin_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t standin_env_u64(const char *name, uint64_t fallback);
/* `array` with room for at least count + 1 items of `item` bytes (doubling; aborts when out of memory) */
void *standin_grow(void *array, size_t *capacity, size_t count, size_t item);

/* devices.c */
int standin_device_count(void);
int32_t standin_current_device(void); /* the calling thread's, 0 if none set */

/* streams.c: every stream runs its FIFO of tasks on a worker thread */
typedef struct standin_task standin_task;
struct standin_task {
    void (*run)(standin_task *task);     /* on the worker, outside the lock */
    void (*release)(standin_task *task); /* after run, frees the task */
    standin_task *next;
    uint64_t index;    /* 1-based position in its stream */
    uint64_t sequence; /* 1-based position among all tasks */
};
typedef struct standin_stream standin_stream;
standin_stream *standin_stream_of(aclrtStream stream); /* NULL: the current device's default */
uint64_t standin_enqueue(standin_stream *stream, standin_task *task);
void standin_wait_index(standin_stream *stream, uint64_t index); /* host waits for a task */
uint64_t standin_oldest_pending_sequence(void);
uint64_t standin_sequence_now(void);

/* The one lock of the runtime's shared state, and its change signal. */
void standin_lock(void);
void standin_unlock(void);
void standin_wait_change(void);
void standin_signal_change(void);

/* memory.c */
enum standin_memory_kind { STANDIN_NOT_OURS, STANDIN_DEVICE, STANDIN_PINNED_HOST };
enum standin_memory_kind standin_memory_kind_of(const void *ptr);
void standin_release_deferred(void); /* with the lock held */
void standin_copy(void *dst, const void *src, size_t count);
/* With the lock held, for virtual_memory.c: device memory charged against a
 * device's cap (ACL_ERROR_RT_MEMORY_ALLOCATION past it) and given back; a
 * reservation's address space registered as device memory, not owned here. */
aclError standin_charge_device(int32_t device, size_t bytes);
void standin_refund_device(int32_t device, size_t bytes);
void standin_add_device_range(void *base, size_t size, int32_t device);
void standin_remove_device_range(void *base);


/* tensors.c: the op-api objects kernels read */
typedef struct aclTensor aclTensor;
typedef struct aclScalar aclScalar;
typedef struct aclIntArray aclIntArray;
typedef struct aclOpExecutor aclOpExecutor;

#define STANDIN_MAX_DIMS 8
struct aclTensor {
    aclDataType dtype;
    uint64_t ndim;
    int64_t dims[STANDIN_MAX_DIMS];
    int64_t strides[STANDIN_MAX_DIMS];
    int64_t offset; /* in elements, from data */
    char *data;
};
struct aclScalar {
    aclDataType dtype;
    double real;
    int64_t integer;
};
struct aclIntArray {
    uint64_t size;
    int64_t values[];
};
int64_t standin_tensor_numel(const aclTensor *tensor);
char *standin_tensor_element(const aclTensor *tensor, int64_t linear);
char *standin_broadcast_element(const aclTensor *input, const aclTensor *shape, int64_t linear);

/* dtypes.c: elements as double, or as int64 for integral types */
size_t standin_dtype_size(aclDataType dtype);
int standin_dtype_supported(aclDataType dtype);
int standin_dtype_integral(aclDataType dtype);
double standin_load(const char *at, aclDataType dtype);
void standin_store(char *at, aclDataType dtype, double value);
int64_t standin_load_int(const char *at, aclDataType dtype);
void standin_store_int(char *at, aclDataType dtype, int64_t value);

/* executor.c: the two-phase op-api protocol */
#define STANDIN_MAX_OPERANDS 6
typedef void (*standin_kernel)(aclOpExecutor *op);
struct aclOpExecutor {
    const char *name;
    standin_kernel kernel;
    aclTensor tensors[STANDIN_MAX_OPERANDS];
    int tensor_count;
    aclScalar scalars[STANDIN_MAX_OPERANDS];
    int scalar_count;
    int64_t ints[STANDIN_MAX_OPERANDS];
    double reals[STANDIN_MAX_OPERANDS];
    /* The caller's aclTensor whose view shape the kernel writes back, for a
     * data-dependent output (nonzero: the caller synchronizes the stream,
     * then reads it with aclGetViewShape); NULL for the others. */
    aclTensor *shape_out;
};
/* Phase one: a new executor for NAME (NULL when out of memory) ... */
aclOpExecutor *standin_executor(const char *name, standin_kernel kernel, uint64_t *workspace_size,
                                aclOpExecutor **out);
/* ... holding copies of its operands: 0, or an aclnn error (executor freed). */
int standin_operands(aclOpExecutor *op, int tensor_count, const aclTensor *const *tensors, int scalar_count,
                     const aclScalar *const *scalars);
int standin_operand_error(aclOpExecutor *op, const char *what);
/* Phase two: queue the executor's kernel on STREAM. */
int standin_launch(void *workspace, uint64_t workspace_size, aclOpExecutor *op, aclrtStream stream);
/* A kernel's second phase: queue what its first phase prepared. */
#define PHASE_TWO(name)                                                                                       \
    STANDIN_EXPORT int name(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,               \
                            aclrtStream stream)                                                               \
    {                                                                                                         \
        STANDIN_CALLED();                                                                                     \
        return standin_launch(workspace, workspace_size, executor, stream);                                  \
    }

#endif
