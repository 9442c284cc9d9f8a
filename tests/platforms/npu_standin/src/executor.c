/* The two-phase op-api protocol: aclnnXxxGetWorkspaceSize checks the
 * operands and returns an executor holding copies of them (op-plugin
 * destroys its aclTensors right after the launch); aclnnXxx queues the
 * executor's kernel on the stream, whose worker runs it over host memory
 * and frees the executor. */
#include <stdlib.h>
#include <string.h>

#include "standin.h"
#include "op_api_typedefs.h"

#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002

struct kernel_task {
    standin_task task;
    aclOpExecutor *op;
};

aclOpExecutor *standin_executor(const char *name, standin_kernel kernel, uint64_t *workspace_size,
                                aclOpExecutor **out)
{
    aclOpExecutor *op = calloc(1, sizeof *op);
    if (op == NULL)
        return NULL;
    op->name = name;
    op->kernel = kernel;
    *workspace_size = 0;
    *out = op;
    return op;
}

int standin_operand_error(aclOpExecutor *op, const char *what)
{
    standin_set_error("npu_standin: %s: %s", op->name, what);
    free(op);
    return ACLNN_ERR_PARAM_INVALID;
}

static int add_tensor(aclOpExecutor *op, const aclTensor *tensor)
{
    if (tensor == NULL)
        return standin_operand_error(op, "a tensor operand is missing");
    if (!standin_dtype_supported(tensor->dtype))
        return standin_operand_error(op, "a tensor's aclDataType is not supported by the stand-in");
    if (op->tensor_count == STANDIN_MAX_OPERANDS)
        return standin_operand_error(op, "too many tensor operands");
    op->tensors[op->tensor_count++] = *tensor;
    return 0;
}

static int add_scalar(aclOpExecutor *op, const aclScalar *scalar)
{
    if (scalar == NULL)
        return standin_operand_error(op, "a scalar operand is missing");
    if (op->scalar_count == STANDIN_MAX_OPERANDS)
        return standin_operand_error(op, "too many scalar operands");
    op->scalars[op->scalar_count++] = *scalar;
    return 0;
}

int standin_operands(aclOpExecutor *op, int tensor_count, const aclTensor *const *tensors, int scalar_count,
                     const aclScalar *const *scalars)
{
    if (op == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    int err = 0;
    for (int i = 0; i < tensor_count && err == 0; ++i)
        err = add_tensor(op, tensors[i]);
    for (int i = 0; i < scalar_count && err == 0; ++i)
        err = add_scalar(op, scalars[i]);
    return err;
}

static void run_kernel(standin_task *task)
{
    aclOpExecutor *op = ((struct kernel_task *)task)->op;
    op->kernel(op);
}

static void release_kernel(standin_task *task)
{
    free(((struct kernel_task *)task)->op);
    free(task);
}

int standin_launch(void *workspace, uint64_t workspace_size, aclOpExecutor *op, aclrtStream stream)
{
    (void)workspace;
    (void)workspace_size;
    if (op == NULL)
        return ACLNN_ERR_PARAM_NULLPTR;
    struct kernel_task *task = malloc(sizeof *task);
    if (task == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    *task = (struct kernel_task){{run_kernel, release_kernel, NULL, 0, 0}, op};
    standin_enqueue(standin_stream_of(stream), &task->task);
    return 0;
}
static const standin_OpApiFunc checked_launch __attribute__((unused)) = standin_launch;

STANDIN_EXPORT int aclDestroyAclOpExecutor(aclOpExecutor *executor)
{
    (void)executor; /* the launch owns it */
    STANDIN_CALLED();
    return 0;
}
