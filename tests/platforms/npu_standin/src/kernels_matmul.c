/* Matrix products of 2-D tensors (aclnnMm, aclnnMatmul), over double. */
#include "standin.h"

static double at2(const aclTensor *t, int64_t i, int64_t j)
{
    int64_t element = t->offset + i * t->strides[0] + j * t->strides[1];
    return standin_load(t->data + element * (int64_t)standin_dtype_size(t->dtype), t->dtype);
}

static void mm_kernel(aclOpExecutor *e)
{
    const aclTensor *a = &e->tensors[0], *b = &e->tensors[1], *out = &e->tensors[2];
    int64_t rows = a->dims[0], inner = a->dims[1], cols = b->dims[1];
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            double sum = 0.0;
            for (int64_t k = 0; k < inner; ++k)
                sum += at2(a, i, k) * at2(b, k, j);
            standin_store(standin_tensor_element(out, i * cols + j), out->dtype, sum);
        }
}

static int mm_op(const char *name, const aclTensor *self, const aclTensor *mat2, aclTensor *out, uint64_t *size,
                 aclOpExecutor **executor)
{
    aclOpExecutor *op = standin_executor(name, mm_kernel, size, executor);
    int err = standin_operands(op, 3, (const aclTensor *[]){self, mat2, out}, 0, NULL);
    if (err)
        return err;
    if (self->ndim != 2 || mat2->ndim != 2 || out->ndim != 2 || self->dims[1] != mat2->dims[0])
        return standin_operand_error(op, "only products of 2-D matrices are implemented");
    return 0;
}

STANDIN_EXPORT int aclnnMmGetWorkspaceSize(const aclTensor *self, const aclTensor *mat2, aclTensor *out,
                                           int8_t cubeMathType, uint64_t *size, aclOpExecutor **executor)
{
    (void)cubeMathType;
    STANDIN_CALLED();
    return mm_op("aclnnMm", self, mat2, out, size, executor);
}
PHASE_TWO(aclnnMm)

STANDIN_EXPORT int aclnnMatmulGetWorkspaceSize(const aclTensor *self, const aclTensor *mat2, aclTensor *out,
                                               int8_t cubeMathType, uint64_t *size, aclOpExecutor **executor)
{
    (void)cubeMathType;
    STANDIN_CALLED();
    return mm_op("aclnnMatmul", self, mat2, out, size, executor);
}
PHASE_TWO(aclnnMatmul)
