/* Elementwise unary kernels over double: out = f(self), out-of-place
 * (aclnnXxx(self, out)) and in place (aclnnInplaceXxx(self)). */
#include <math.h>

#include "standin.h"

static void unary(double (*f)(double), const aclTensor *self, const aclTensor *out)
{
    int64_t n = standin_tensor_numel(out);
    for (int64_t i = 0; i < n; ++i)
        standin_store(standin_tensor_element(out, i), out->dtype,
                      f(standin_load(standin_broadcast_element(self, out, i), self->dtype)));
}

static double negate(double x) { return -x; }
static double relu(double x) { return x > 0 ? x : 0; }

#define UNARY(Name, f)                                                                                        \
    static void Name##_kernel(aclOpExecutor *e) { unary(f, &e->tensors[0], &e->tensors[e->tensor_count - 1]); } \
    STANDIN_EXPORT int aclnn##Name##GetWorkspaceSize(const aclTensor *self, aclTensor *out, uint64_t *size,  \
                                                     aclOpExecutor **executor)                               \
    {                                                                                                         \
        STANDIN_CALLED();                                                                                     \
        aclOpExecutor *op = standin_executor("aclnn" #Name, Name##_kernel, size, executor);                  \
        return standin_operands(op, 2, (const aclTensor *[]){self, out}, 0, NULL);                           \
    }                                                                                                         \
    PHASE_TWO(aclnn##Name)                                                                                    \
    STANDIN_EXPORT int aclnnInplace##Name##GetWorkspaceSize(aclTensor *self, uint64_t *size,                 \
                                                            aclOpExecutor **executor)                        \
    {                                                                                                         \
        STANDIN_CALLED();                                                                                     \
        aclOpExecutor *op = standin_executor("aclnnInplace" #Name, Name##_kernel, size, executor);           \
        return standin_operands(op, 1, (const aclTensor *[]){self}, 0, NULL);                                \
    }                                                                                                         \
    PHASE_TWO(aclnnInplace##Name)

UNARY(Neg, negate)
UNARY(Abs, fabs)
UNARY(Exp, exp)
UNARY(Sqrt, sqrt)
UNARY(Tanh, tanh)
UNARY(Relu, relu)
UNARY(Log, log)
