/* Elementwise arithmetic kernels: out = self OP alpha * other, with
 * broadcasting, strides and dtype conversion; integral outputs compute in
 * int64, the others in double. Operands: tensors self, other, out (an
 * in-place kernel's out is self), scalars other (the ...s forms) and alpha. */
#include "standin.h"

enum arith { ADD, SUB, MUL, DIV };

static double real_result(enum arith op, double a, double b)
{
    switch (op) {
    case ADD: return a + b;
    case SUB: return a - b;
    case MUL: return a * b;
    default: return a / b;
    }
}

static int64_t int_result(enum arith op, int64_t a, int64_t b)
{
    switch (op) {
    case ADD: return a + b;
    case SUB: return a - b;
    case MUL: return a * b;
    default: return b ? a / b : 0;
    }
}

/* OTHER is a tensor or, when NULL, the scalar SCALAR; ALPHA scales it. */
static void arith(enum arith op, const aclTensor *self, const aclTensor *other, const aclScalar *scalar,
                  const aclScalar *alpha, const aclTensor *out)
{
    int64_t n = standin_tensor_numel(out);
    int integral = standin_dtype_integral(out->dtype);
    for (int64_t i = 0; i < n; ++i) {
        const char *a = standin_broadcast_element(self, out, i);
        const char *b = other ? standin_broadcast_element(other, out, i) : NULL;
        char *r = standin_tensor_element(out, i);
        if (integral) {
            int64_t y = b ? standin_load_int(b, other->dtype) : scalar->integer;
            standin_store_int(r, out->dtype, int_result(op, standin_load_int(a, self->dtype),
                                                        alpha ? y * alpha->integer : y));
        } else {
            double y = b ? standin_load(b, other->dtype) : scalar->real;
            standin_store(r, out->dtype, real_result(op, standin_load(a, self->dtype), alpha ? y * alpha->real : y));
        }
    }
}

#define OUT(e) (&(e)->tensors[(e)->tensor_count - 1])

/* Kernel bodies by operand layout: tensor other (T) or scalar other (S),
 * with alpha (A) or without, out-of-place (3 tensors) or in place. */
#define UNUSED_OK __attribute__((unused))
#define KERNELS(OP, op)                                                                                      \
    UNUSED_OK static void op##_tta(aclOpExecutor *e) { arith(OP, &e->tensors[0], &e->tensors[1], NULL, &e->scalars[0], OUT(e)); } \
    UNUSED_OK static void op##_tt(aclOpExecutor *e) { arith(OP, &e->tensors[0], &e->tensors[1], NULL, NULL, OUT(e)); } \
    UNUSED_OK static void op##_tsa(aclOpExecutor *e) { arith(OP, &e->tensors[0], NULL, &e->scalars[0], &e->scalars[1], OUT(e)); } \
    UNUSED_OK static void op##_ts(aclOpExecutor *e) { arith(OP, &e->tensors[0], NULL, &e->scalars[0], NULL, OUT(e)); }

KERNELS(ADD, add)
KERNELS(SUB, sub)
KERNELS(MUL, mul)
KERNELS(DIV, div)

static int tensors_op(const char *name, standin_kernel kernel, const aclTensor *self, const aclTensor *other,
                      const aclScalar *alpha, const aclTensor *out, uint64_t *size, aclOpExecutor **executor)
{
    aclOpExecutor *op = standin_executor(name, kernel, size, executor);
    const aclTensor *tensors[] = {self, other, out ? out : self}; /* in place: out is self */
    return standin_operands(op, 3, tensors, alpha ? 1 : 0, &alpha);
}

static int scalar_op(const char *name, standin_kernel kernel, const aclTensor *self, const aclScalar *other,
                     const aclScalar *alpha, const aclTensor *out, uint64_t *size, aclOpExecutor **executor)
{
    aclOpExecutor *op = standin_executor(name, kernel, size, executor);
    const aclTensor *tensors[] = {self, out ? out : self};
    const aclScalar *scalars[] = {other, alpha};
    return standin_operands(op, 2, tensors, alpha ? 2 : 1, scalars);
}

#define WITH_ALPHA(Name, op)                                                                                 \
    STANDIN_EXPORT int aclnn##Name##GetWorkspaceSize(const aclTensor *self, const aclTensor *other,         \
                                                     const aclScalar *alpha, aclTensor *out, uint64_t *size, \
                                                     aclOpExecutor **executor)                              \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return tensors_op("aclnn" #Name, op##_tta, self, other, alpha, out, size, executor);                \
    }                                                                                                        \
    PHASE_TWO(aclnn##Name)                                                                                   \
    STANDIN_EXPORT int aclnn##Name##sGetWorkspaceSize(const aclTensor *self, const aclScalar *other,       \
                                                      const aclScalar *alpha, aclTensor *out,               \
                                                      uint64_t *size, aclOpExecutor **executor)             \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return scalar_op("aclnn" #Name "s", op##_tsa, self, other, alpha, out, size, executor);             \
    }                                                                                                        \
    PHASE_TWO(aclnn##Name##s)                                                                                \
    STANDIN_EXPORT int aclnnInplace##Name##GetWorkspaceSize(aclTensor *self, const aclTensor *other,       \
                                                            const aclScalar *alpha, uint64_t *size,         \
                                                            aclOpExecutor **executor)                       \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return tensors_op("aclnnInplace" #Name, op##_tta, self, other, alpha, NULL, size, executor);        \
    }                                                                                                        \
    PHASE_TWO(aclnnInplace##Name)                                                                            \
    STANDIN_EXPORT int aclnnInplace##Name##sGetWorkspaceSize(aclTensor *self, const aclScalar *other,      \
                                                             const aclScalar *alpha, uint64_t *size,        \
                                                             aclOpExecutor **executor)                      \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return scalar_op("aclnnInplace" #Name "s", op##_tsa, self, other, alpha, NULL, size, executor);     \
    }                                                                                                        \
    PHASE_TWO(aclnnInplace##Name##s)

#define WITHOUT_ALPHA(Name, op)                                                                              \
    STANDIN_EXPORT int aclnn##Name##GetWorkspaceSize(const aclTensor *self, const aclTensor *other,         \
                                                     aclTensor *out, uint64_t *size, aclOpExecutor **executor) \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return tensors_op("aclnn" #Name, op##_tt, self, other, NULL, out, size, executor);                  \
    }                                                                                                        \
    PHASE_TWO(aclnn##Name)                                                                                   \
    STANDIN_EXPORT int aclnn##Name##sGetWorkspaceSize(const aclTensor *self, const aclScalar *other,       \
                                                      aclTensor *out, uint64_t *size,                       \
                                                      aclOpExecutor **executor)                             \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return scalar_op("aclnn" #Name "s", op##_ts, self, other, NULL, out, size, executor);               \
    }                                                                                                        \
    PHASE_TWO(aclnn##Name##s)                                                                                \
    STANDIN_EXPORT int aclnnInplace##Name##GetWorkspaceSize(aclTensor *self, const aclTensor *other,       \
                                                            uint64_t *size, aclOpExecutor **executor)       \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return tensors_op("aclnnInplace" #Name, op##_tt, self, other, NULL, NULL, size, executor);          \
    }                                                                                                        \
    PHASE_TWO(aclnnInplace##Name)                                                                            \
    STANDIN_EXPORT int aclnnInplace##Name##sGetWorkspaceSize(aclTensor *self, const aclScalar *other,      \
                                                             uint64_t *size, aclOpExecutor **executor)      \
    {                                                                                                        \
        STANDIN_CALLED();                                                                                    \
        return scalar_op("aclnnInplace" #Name "s", op##_ts, self, other, NULL, NULL, size, executor);       \
    }                                                                                                        \
    PHASE_TWO(aclnnInplace##Name##s)

WITH_ALPHA(Add, add)
WITH_ALPHA(Sub, sub)
WITHOUT_ALPHA(Mul, mul)
WITHOUT_ALPHA(Div, div)
