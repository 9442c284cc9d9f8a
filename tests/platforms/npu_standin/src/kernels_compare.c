/* Comparisons and what reads their results: equal (one bool for whole
 * tensors), eq/ne/gt/ge/lt/le against a tensor or a scalar, out of place
 * and in place, isfinite, and nonzero (whose output shape depends on the
 * data: the kernel writes it back into op-plugin's aclTensor, which reads it
 * with aclGetViewShape after synchronizing the stream). */
#include <math.h>
#include <stdbool.h>

#include "standin.h"

enum compare { EQ, NE, GT, GE, LT, LE };

static int holds_real(enum compare c, double a, double b)
{
    switch (c) {
    case EQ: return a == b;
    case NE: return a != b;
    case GT: return a > b;
    case GE: return a >= b;
    case LT: return a < b;
    default: return a <= b;
    }
}

static int holds_int(enum compare c, int64_t a, int64_t b)
{
    switch (c) {
    case EQ: return a == b;
    case NE: return a != b;
    case GT: return a > b;
    case GE: return a >= b;
    case LT: return a < b;
    default: return a <= b;
    }
}

/* Integral against integral compares in int64, anything else in double. */
static int holds(enum compare c, const char *x, aclDataType xt, const char *y, aclDataType yt)
{
    if (standin_dtype_integral(xt) && standin_dtype_integral(yt))
        return holds_int(c, standin_load_int(x, xt), standin_load_int(y, yt));
    return holds_real(c, standin_load(x, xt), standin_load(y, yt));
}

static int holds_scalar(enum compare c, const char *x, aclDataType xt, const aclScalar *y)
{
    if (standin_dtype_integral(xt) && standin_dtype_integral(y->dtype))
        return holds_int(c, standin_load_int(x, xt), y->integer);
    return holds_real(c, standin_load(x, xt), y->real);
}

/* out = self CMP other (a tensor, or scalars[0] when there is none), with
 * broadcasting; in place, out is self. The comparison is ints[0]. */
static void compare_kernel(aclOpExecutor *e)
{
    enum compare c = (enum compare)e->ints[0];
    const aclTensor *self = &e->tensors[0], *out = &e->tensors[e->tensor_count - 1];
    const aclTensor *other = e->scalar_count ? NULL : &e->tensors[1];
    int64_t n = standin_tensor_numel(out);
    for (int64_t i = 0; i < n; ++i) {
        const char *x = standin_broadcast_element(self, out, i);
        int r = other ? holds(c, x, self->dtype, standin_broadcast_element(other, out, i), other->dtype)
                      : holds_scalar(c, x, self->dtype, &e->scalars[0]);
        standin_store_int(standin_tensor_element(out, i), out->dtype, r);
    }
}

static int compare_op(const char *name, enum compare c, const aclTensor *self, const aclTensor *other,
                      const aclScalar *scalar, const aclTensor *out, uint64_t *size, aclOpExecutor **executor)
{
    aclOpExecutor *op = standin_executor(name, compare_kernel, size, executor);
    const aclTensor *tensors[3] = {self};
    int count = 1;
    if (other)
        tensors[count++] = other;
    if (out)
        tensors[count++] = out;
    int err = standin_operands(op, count, tensors, scalar ? 1 : 0, &scalar);
    if (err == 0)
        op->ints[0] = c;
    return err;
}

#define COMPARE(Name, c)                                                                                      \
    STANDIN_EXPORT int aclnn##Name##TensorGetWorkspaceSize(const aclTensor *self, const aclTensor *other,   \
                                                           aclTensor *out, uint64_t *size,                    \
                                                           aclOpExecutor **executor)                          \
    {                                                                                                         \
        STANDIN_CALLED();                                                                                     \
        return compare_op("aclnn" #Name "Tensor", c, self, other, NULL, out, size, executor);               \
    }                                                                                                         \
    PHASE_TWO(aclnn##Name##Tensor)                                                                            \
    STANDIN_EXPORT int aclnn##Name##ScalarGetWorkspaceSize(const aclTensor *self, const aclScalar *other,   \
                                                           aclTensor *out, uint64_t *size,                    \
                                                           aclOpExecutor **executor)                          \
    {                                                                                                         \
        STANDIN_CALLED();                                                                                     \
        return compare_op("aclnn" #Name "Scalar", c, self, NULL, other, out, size, executor);               \
    }                                                                                                         \
    PHASE_TWO(aclnn##Name##Scalar)                                                                            \
    STANDIN_EXPORT int aclnnInplace##Name##TensorGetWorkspaceSize(aclTensor *self, const aclTensor *other,  \
                                                                  uint64_t *size, aclOpExecutor **executor)  \
    {                                                                                                         \
        STANDIN_CALLED();                                                                                     \
        return compare_op("aclnnInplace" #Name "Tensor", c, self, other, NULL, self, size, executor);       \
    }                                                                                                         \
    PHASE_TWO(aclnnInplace##Name##Tensor)                                                                     \
    STANDIN_EXPORT int aclnnInplace##Name##ScalarGetWorkspaceSize(aclTensor *self, const aclScalar *other,  \
                                                                  uint64_t *size, aclOpExecutor **executor)  \
    {                                                                                                         \
        STANDIN_CALLED();                                                                                     \
        return compare_op("aclnnInplace" #Name "Scalar", c, self, NULL, other, self, size, executor);       \
    }                                                                                                         \
    PHASE_TWO(aclnnInplace##Name##Scalar)

COMPARE(Eq, EQ)
COMPARE(Ne, NE)
COMPARE(Gt, GT)
COMPARE(Ge, GE)
COMPARE(Lt, LT)
COMPARE(Le, LE)

static int same_shape(const aclTensor *a, const aclTensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (uint64_t d = 0; d < a->ndim; ++d)
        if (a->dims[d] != b->dims[d])
            return 0;
    return 1;
}

/* out (one element) = self and other have the same shape and values. */
static void equal_kernel(aclOpExecutor *e)
{
    const aclTensor *self = &e->tensors[0], *other = &e->tensors[1], *out = &e->tensors[2];
    int equal = same_shape(self, other);
    int64_t n = standin_tensor_numel(self);
    for (int64_t i = 0; i < n && equal; ++i)
        equal = holds(EQ, standin_tensor_element(self, i), self->dtype, standin_tensor_element(other, i),
                      other->dtype);
    standin_store_int(standin_tensor_element(out, 0), out->dtype, equal);
}

STANDIN_EXPORT int aclnnEqualGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                              uint64_t *size, aclOpExecutor **executor)
{
    STANDIN_CALLED();
    aclOpExecutor *op = standin_executor("aclnnEqual", equal_kernel, size, executor);
    return standin_operands(op, 3, (const aclTensor *[]){self, other, out}, 0, NULL);
}
PHASE_TWO(aclnnEqual)

static void is_finite_kernel(aclOpExecutor *e)
{
    const aclTensor *self = &e->tensors[0], *out = &e->tensors[1];
    int integral = standin_dtype_integral(self->dtype);
    int64_t n = standin_tensor_numel(out);
    for (int64_t i = 0; i < n; ++i) {
        const char *x = standin_broadcast_element(self, out, i);
        standin_store_int(standin_tensor_element(out, i), out->dtype,
                          integral || isfinite(standin_load(x, self->dtype)));
    }
}

STANDIN_EXPORT int aclnnIsFiniteGetWorkspaceSize(const aclTensor *self, aclTensor *out, uint64_t *size,
                                                 aclOpExecutor **executor)
{
    STANDIN_CALLED();
    aclOpExecutor *op = standin_executor("aclnnIsFinite", is_finite_kernel, size, executor);
    return standin_operands(op, 2, (const aclTensor *[]){self, out}, 0, NULL);
}
PHASE_TWO(aclnnIsFinite)

/* out (allocated for every element: numel(self) x ndim(self), contiguous)
 * gets the coordinates of self's non-zero elements in row-major order, one
 * row each; the original out's view shape becomes (count, ndim). */
static void nonzero_kernel(aclOpExecutor *e)
{
    const aclTensor *self = &e->tensors[0], *out = &e->tensors[1];
    int64_t n = standin_tensor_numel(self), rows = 0, ndim = (int64_t)self->ndim;
    int integral = standin_dtype_integral(self->dtype);
    for (int64_t i = 0; i < n; ++i) {
        const char *x = standin_tensor_element(self, i);
        if (integral ? standin_load_int(x, self->dtype) == 0 : standin_load(x, self->dtype) == 0.0)
            continue;
        for (int64_t d = ndim, rest = i; d-- > 0;) {
            standin_store_int(standin_tensor_element(out, rows * ndim + d), out->dtype, rest % self->dims[d]);
            rest /= self->dims[d];
        }
        ++rows;
    }
    if (e->shape_out != NULL) {
        standin_lock(); /* read on the host by aclGetViewShape */
        e->shape_out->dims[0] = rows;
        standin_unlock();
    }
}

STANDIN_EXPORT int aclnnNonzeroGetWorkspaceSize(const aclTensor *self, aclTensor *out, uint64_t *size,
                                                aclOpExecutor **executor)
{
    STANDIN_CALLED();
    aclOpExecutor *op = standin_executor("aclnnNonzero", nonzero_kernel, size, executor);
    int err = standin_operands(op, 2, (const aclTensor *[]){self, out}, 0, NULL);
    if (err)
        return err;
    if (out->ndim != 2 || out->dims[0] < standin_tensor_numel(self) || out->dims[1] != (int64_t)self->ndim)
        return standin_operand_error(op, "out must be numel(self) x ndim(self)");
    op->shape_out = out;
    return 0;
}
PHASE_TWO(aclnnNonzero)
