/* Reductions: sum and mean over dimensions. */
#include <stdbool.h>
#include <stdlib.h>

#include "standin.h"

/* Position in OUT's row-major order of SELF's element LINEAR, dimensions
 * whose bit is set in REDUCED dropped. */
static int64_t reduced_position(const aclTensor *self, uint64_t reduced, int64_t linear)
{
    int64_t position = 0, scale = 1;
    for (uint64_t d = self->ndim; d-- > 0;) {
        int64_t size = self->dims[d], index = linear % size;
        linear /= size;
        if (!(reduced >> d & 1)) {
            position += index * scale;
            scale *= size;
        }
    }
    return position;
}

/* Bit set of the dimensions DIMS names (every one when empty). */
static uint64_t reduced_dims(const aclTensor *self, const aclOpExecutor *e)
{
    if (e->ints[0] == 0)
        return ~0ULL;
    uint64_t bits = 0;
    for (int64_t i = 0; i < e->ints[0]; ++i) {
        int64_t d = e->ints[1 + i];
        bits |= 1ULL << (d < 0 ? d + (int64_t)self->ndim : d);
    }
    return bits;
}

static void reduce(aclOpExecutor *e, bool mean)
{
    const aclTensor *self = &e->tensors[0], *out = &e->tensors[1];
    uint64_t reduced = reduced_dims(self, e);
    int64_t n = standin_tensor_numel(self), m = standin_tensor_numel(out);
    double *sums = calloc((size_t)(m ? m : 1), sizeof *sums);
    if (sums == NULL)
        return;
    for (int64_t i = 0; i < n; ++i)
        sums[reduced_position(self, reduced, i)] += standin_load(standin_tensor_element(self, i), self->dtype);
    double count = m ? (double)n / (double)m : 1.0;
    for (int64_t j = 0; j < m; ++j)
        standin_store(standin_tensor_element(out, j), out->dtype, mean ? sums[j] / count : sums[j]);
    free(sums);
}

static void sum_kernel(aclOpExecutor *e) { reduce(e, false); }
static void mean_kernel(aclOpExecutor *e) { reduce(e, true); }

static int reduce_op(const char *name, standin_kernel kernel, const aclTensor *self, const aclIntArray *dim,
                     aclTensor *out, uint64_t *size, aclOpExecutor **executor)
{
    aclOpExecutor *op = standin_executor(name, kernel, size, executor);
    int err = standin_operands(op, 2, (const aclTensor *[]){self, out}, 0, NULL);
    if (err)
        return err;
    uint64_t count = dim ? dim->size : 0;
    if (count + 1 > STANDIN_MAX_OPERANDS)
        return standin_operand_error(op, "too many dimensions to reduce");
    op->ints[0] = (int64_t)count;
    for (uint64_t i = 0; i < count; ++i)
        op->ints[1 + i] = dim->values[i];
    return 0;
}

STANDIN_EXPORT int aclnnReduceSumGetWorkspaceSize(const aclTensor *self, const aclIntArray *dim, bool keepdim,
                                                  aclDataType dtype, aclTensor *out, uint64_t *size,
                                                  aclOpExecutor **executor)
{
    (void)keepdim; /* out's shape has it */
    (void)dtype;
    STANDIN_CALLED();
    return reduce_op("aclnnReduceSum", sum_kernel, self, dim, out, size, executor);
}
PHASE_TWO(aclnnReduceSum)

STANDIN_EXPORT int aclnnMeanGetWorkspaceSize(const aclTensor *self, const aclIntArray *dim, bool keepdim,
                                             aclDataType dtype, aclTensor *out, uint64_t *size,
                                             aclOpExecutor **executor)
{
    (void)keepdim;
    (void)dtype;
    STANDIN_CALLED();
    return reduce_op("aclnnMean", mean_kernel, self, dim, out, size, executor);
}
PHASE_TWO(aclnnMean)
