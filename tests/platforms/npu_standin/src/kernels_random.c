/* Random fills, deterministic in (seed, offset, element): not torch's or
 * CANN's generator, only reproducible and well spread. */
#include <math.h>

#include "standin.h"

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A uniform double in (0, 1) for draw K of element I. */
static double uniform(const aclOpExecutor *e, int64_t i, int k)
{
    uint64_t bits = mix(mix(mix((uint64_t)e->ints[0]) ^ (uint64_t)e->ints[1]) ^ (uint64_t)(2 * i + k));
    return ((double)(bits >> 11) + 0.5) / 9007199254740992.0;
}

static void normal_kernel(aclOpExecutor *e)
{
    const aclTensor *self = &e->tensors[0];
    const double two_pi = 6.283185307179586;
    int64_t n = standin_tensor_numel(self);
    for (int64_t i = 0; i < n; ++i) {
        double z = sqrt(-2.0 * log(uniform(e, i, 0))) * cos(two_pi * uniform(e, i, 1));
        standin_store(standin_tensor_element(self, i), self->dtype, e->reals[0] + e->reals[1] * z);
    }
}

static void uniform_kernel(aclOpExecutor *e)
{
    const aclTensor *self = &e->tensors[0];
    int64_t n = standin_tensor_numel(self);
    for (int64_t i = 0; i < n; ++i)
        standin_store(standin_tensor_element(self, i), self->dtype,
                      e->reals[0] + (e->reals[1] - e->reals[0]) * uniform(e, i, 0));
}

static int random_op(const char *name, standin_kernel kernel, aclTensor *self, double a, double b, int64_t seed,
                     int64_t offset, uint64_t *size, aclOpExecutor **executor)
{
    aclOpExecutor *op = standin_executor(name, kernel, size, executor);
    int err = standin_operands(op, 1, (const aclTensor *[]){self}, 0, NULL);
    if (err == 0) {
        op->reals[0] = a;
        op->reals[1] = b;
        op->ints[0] = seed;
        op->ints[1] = offset;
    }
    return err;
}

STANDIN_EXPORT int aclnnInplaceNormalGetWorkspaceSize(aclTensor *self, float mean, float std, int64_t seed,
                                                      int64_t offset, uint64_t *size, aclOpExecutor **executor)
{
    STANDIN_CALLED();
    return random_op("aclnnInplaceNormal", normal_kernel, self, mean, std, seed, offset, size, executor);
}
PHASE_TWO(aclnnInplaceNormal)

STANDIN_EXPORT int aclnnInplaceUniformGetWorkspaceSize(aclTensor *self, double from, double to, int64_t seed,
                                                       int64_t offset, uint64_t *size, aclOpExecutor **executor)
{
    STANDIN_CALLED();
    return random_op("aclnnInplaceUniform", uniform_kernel, self, from, to, seed, offset, size, executor);
}
PHASE_TWO(aclnnInplaceUniform)
