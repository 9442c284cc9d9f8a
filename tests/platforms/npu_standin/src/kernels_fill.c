/* Kernels that fill or copy: ones, zeros, fill, copy (with broadcasting and
 * dtype conversion), cast, arange; and sleep (torch.npu._sleep). */
#include <time.h>

#include "standin.h"

static void fill(const aclTensor *self, const aclScalar *value)
{
    int64_t n = standin_tensor_numel(self);
    int integral = standin_dtype_integral(self->dtype);
    for (int64_t i = 0; i < n; ++i) {
        char *at = standin_tensor_element(self, i);
        if (integral)
            standin_store_int(at, self->dtype, value->integer);
        else
            standin_store(at, self->dtype, value->real);
    }
}

/* out = src, SRC broadcast to OUT's shape. */
static void copy(const aclTensor *src, const aclTensor *out)
{
    int64_t n = standin_tensor_numel(out);
    int integral = standin_dtype_integral(out->dtype) && standin_dtype_integral(src->dtype);
    for (int64_t i = 0; i < n; ++i) {
        const char *from = standin_broadcast_element(src, out, i);
        char *to = standin_tensor_element(out, i);
        if (integral)
            standin_store_int(to, out->dtype, standin_load_int(from, src->dtype));
        else
            standin_store(to, out->dtype, standin_load(from, src->dtype));
    }
}

static void one_kernel(aclOpExecutor *e) { fill(&e->tensors[0], &(aclScalar){ACL_INT64, 1.0, 1}); }
static void zero_kernel(aclOpExecutor *e) { fill(&e->tensors[0], &(aclScalar){ACL_INT64, 0.0, 0}); }
static void fill_kernel(aclOpExecutor *e) { fill(&e->tensors[0], &e->scalars[0]); }
static void copy_kernel(aclOpExecutor *e) { copy(&e->tensors[1], &e->tensors[0]); }
static void cast_kernel(aclOpExecutor *e) { copy(&e->tensors[0], &e->tensors[1]); }

static int tensors_only(const char *name, standin_kernel kernel, int count, const aclTensor *const *tensors,
                        uint64_t *size, aclOpExecutor **executor)
{
    return standin_operands(standin_executor(name, kernel, size, executor), count, tensors, 0, NULL);
}

STANDIN_EXPORT int aclnnInplaceOneGetWorkspaceSize(aclTensor *self, uint64_t *size, aclOpExecutor **executor)
{
    STANDIN_CALLED();
    return tensors_only("aclnnInplaceOne", one_kernel, 1, (const aclTensor *[]){self}, size, executor);
}
PHASE_TWO(aclnnInplaceOne)

STANDIN_EXPORT int aclnnInplaceZeroGetWorkspaceSize(aclTensor *self, uint64_t *size, aclOpExecutor **executor)
{
    STANDIN_CALLED();
    return tensors_only("aclnnInplaceZero", zero_kernel, 1, (const aclTensor *[]){self}, size, executor);
}
PHASE_TWO(aclnnInplaceZero)

STANDIN_EXPORT int aclnnInplaceFillScalarGetWorkspaceSize(aclTensor *self, const aclScalar *value, uint64_t *size,
                                                          aclOpExecutor **executor)
{
    STANDIN_CALLED();
    aclOpExecutor *op = standin_executor("aclnnInplaceFillScalar", fill_kernel, size, executor);
    return standin_operands(op, 1, (const aclTensor *[]){self}, 1, &value);
}
PHASE_TWO(aclnnInplaceFillScalar)

/* self = value, a one-element tensor. */
STANDIN_EXPORT int aclnnInplaceFillTensorGetWorkspaceSize(aclTensor *self, const aclTensor *value, uint64_t *size,
                                                          aclOpExecutor **executor)
{
    STANDIN_CALLED();
    return tensors_only("aclnnInplaceFillTensor", copy_kernel, 2, (const aclTensor *[]){self, value}, size,
                        executor);
}
PHASE_TWO(aclnnInplaceFillTensor)

STANDIN_EXPORT int aclnnInplaceCopyGetWorkspaceSize(aclTensor *selfRef, const aclTensor *src, uint64_t *size,
                                                    aclOpExecutor **executor)
{
    STANDIN_CALLED();
    return tensors_only("aclnnInplaceCopy", copy_kernel, 2, (const aclTensor *[]){selfRef, src}, size, executor);
}
PHASE_TWO(aclnnInplaceCopy)

STANDIN_EXPORT int aclnnCastGetWorkspaceSize(const aclTensor *self, aclDataType dtype, aclTensor *out,
                                             uint64_t *size, aclOpExecutor **executor)
{
    (void)dtype; /* out has it */
    STANDIN_CALLED();
    return tensors_only("aclnnCast", cast_kernel, 2, (const aclTensor *[]){self, out}, size, executor);
}
PHASE_TWO(aclnnCast)

static void arange_kernel(aclOpExecutor *e)
{
    const aclTensor *out = &e->tensors[0];
    const aclScalar *start = &e->scalars[0], *step = &e->scalars[2];
    int64_t n = standin_tensor_numel(out);
    for (int64_t i = 0; i < n; ++i) {
        char *at = standin_tensor_element(out, i);
        if (standin_dtype_integral(out->dtype))
            standin_store_int(at, out->dtype, start->integer + i * step->integer);
        else
            standin_store(at, out->dtype, start->real + (double)i * step->real);
    }
}

STANDIN_EXPORT int aclnnArangeGetWorkspaceSize(const aclScalar *start, const aclScalar *end, const aclScalar *step,
                                               aclTensor *out, uint64_t *size, aclOpExecutor **executor)
{
    STANDIN_CALLED();
    aclOpExecutor *op = standin_executor("aclnnArange", arange_kernel, size, executor);
    return standin_operands(op, 1, (const aclTensor *[]){out}, 3, (const aclScalar *[]){start, end, step});
}
PHASE_TWO(aclnnArange)

/* torch.npu._sleep(cycles): a kernel that takes CYCLES nanoseconds. */
static void sleep_kernel(aclOpExecutor *e)
{
    int64_t ns = e->ints[0] > 0 ? e->ints[0] : 0;
    struct timespec pause = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&pause, NULL);
}

STANDIN_EXPORT int aclnnSleepGetWorkspaceSize(const aclIntArray *cycles, uint64_t *size, aclOpExecutor **executor)
{
    STANDIN_CALLED();
    aclOpExecutor *op = standin_executor("aclnnSleep", sleep_kernel, size, executor);
    if (op == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    op->ints[0] = cycles && cycles->size ? cycles->values[0] : 0;
    return 0;
}
PHASE_TWO(aclnnSleep)
