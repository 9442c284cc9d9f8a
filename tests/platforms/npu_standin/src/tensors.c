/* The op-api objects op-plugin builds for a kernel call (nnopbase's
 * aclCreateTensor, aclCreateScalar, ...). Each function is checked against
 * the function type op-plugin calls it through (op_api_typedefs.h, generated
 * from the wheel). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"
#include "op_api_typedefs.h"

#define CHECKED(name) static const _##name checked_##name __attribute__((unused)) = name

struct aclFloatArray {
    uint64_t size;
    float values[];
};
struct aclBoolArray {
    uint64_t size;
    bool values[];
};
struct aclTensorList {
    uint64_t size;
    aclTensor *tensors[];
};
struct aclScalarList {
    uint64_t size;
    aclScalar *scalars[];
};

STANDIN_EXPORT aclTensor *aclCreateTensor(const int64_t *view_dims, uint64_t view_dims_num, aclDataType data_type,
                                          const int64_t *stride, int64_t offset, aclFormat format,
                                          const int64_t *storage_dims, uint64_t storage_dims_num, void *tensor_data)
{
    (void)format;
    (void)storage_dims;
    (void)storage_dims_num;
    STANDIN_CALLED();
    if (view_dims_num > STANDIN_MAX_DIMS) {
        standin_set_error("npu_standin: a tensor of %llu dimensions (at most %d)", (unsigned long long)view_dims_num,
                          STANDIN_MAX_DIMS);
        return NULL;
    }
    aclTensor *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->dtype = data_type;
    t->ndim = view_dims_num;
    for (uint64_t i = 0; i < view_dims_num; ++i) {
        t->dims[i] = view_dims[i];
        t->strides[i] = stride ? stride[i] : 0;
    }
    t->offset = offset;
    t->data = tensor_data;
    return t;
}
CHECKED(aclCreateTensor);

STANDIN_EXPORT int aclDestroyTensor(const aclTensor *tensor)
{
    STANDIN_CALLED();
    free((void *)tensor);
    return 0;
}
CHECKED(aclDestroyTensor);

/* The view shape of TENSOR as a new array the caller frees: op-plugin reads
 * a data-dependent output's shape this way after its kernel ran (nonzero)
 * and releases it with delete[], which for an int64_t array is free() in
 * libstdc++. Op-plugin calls it through int (*)(const aclTensor *,
 * int64_t **, uint64_t *) (NonzeroKernelNpuOpApi.cpp; no header has it). */
STANDIN_EXPORT int aclGetViewShape(const aclTensor *tensor, int64_t **view_dims, uint64_t *view_dims_num)
{
    STANDIN_CALLED();
    if (tensor == NULL || view_dims == NULL || view_dims_num == NULL)
        return 161001; /* ACLNN_ERR_PARAM_NULLPTR */
    int64_t *dims = malloc((tensor->ndim ? tensor->ndim : 1) * sizeof *dims);
    if (dims == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    standin_lock(); /* the kernel wrote it on the stream's worker */
    for (uint64_t i = 0; i < tensor->ndim; ++i)
        dims[i] = tensor->dims[i];
    *view_dims_num = tensor->ndim;
    standin_unlock();
    *view_dims = dims;
    return 0;
}

STANDIN_EXPORT aclScalar *aclCreateScalar(void *value, aclDataType data_type)
{
    STANDIN_CALLED();
    if (!standin_dtype_supported(data_type)) {
        standin_set_error("npu_standin: a scalar of aclDataType %d is not supported", (int)data_type);
        return NULL;
    }
    aclScalar *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->dtype = data_type;
    s->real = standin_load(value, data_type);
    s->integer = standin_dtype_integral(data_type) ? standin_load_int(value, data_type) : (int64_t)s->real;
    return s;
}
CHECKED(aclCreateScalar);

STANDIN_EXPORT int aclDestroyScalar(const aclScalar *scalar)
{
    STANDIN_CALLED();
    free((void *)scalar);
    return 0;
}
CHECKED(aclDestroyScalar);

STANDIN_EXPORT aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size)
{
    STANDIN_CALLED();
    aclIntArray *a = malloc(sizeof *a + size * sizeof(int64_t));
    if (a == NULL)
        return NULL;
    a->size = size;
    if (size)
        memcpy(a->values, value, size * sizeof(int64_t));
    return a;
}
CHECKED(aclCreateIntArray);

STANDIN_EXPORT int aclDestroyIntArray(const aclIntArray *array)
{
    STANDIN_CALLED();
    free((void *)array);
    return 0;
}
CHECKED(aclDestroyIntArray);

STANDIN_EXPORT aclFloatArray *aclCreateFloatArray(const float *value, uint64_t size)
{
    STANDIN_CALLED();
    aclFloatArray *a = malloc(sizeof *a + size * sizeof(float));
    if (a == NULL)
        return NULL;
    a->size = size;
    if (size)
        memcpy(a->values, value, size * sizeof(float));
    return a;
}
CHECKED(aclCreateFloatArray);

STANDIN_EXPORT int aclDestroyFloatArray(const aclFloatArray *array)
{
    STANDIN_CALLED();
    free((void *)array);
    return 0;
}
CHECKED(aclDestroyFloatArray);

STANDIN_EXPORT aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size)
{
    STANDIN_CALLED();
    aclBoolArray *a = malloc(sizeof *a + size * sizeof(bool));
    if (a == NULL)
        return NULL;
    a->size = size;
    if (size)
        memcpy(a->values, value, size * sizeof(bool));
    return a;
}
CHECKED(aclCreateBoolArray);

STANDIN_EXPORT int aclDestroyBoolArray(const aclBoolArray *array)
{
    STANDIN_CALLED();
    free((void *)array);
    return 0;
}
CHECKED(aclDestroyBoolArray);

/* A list owns its tensors: op-plugin destroys only the list. */
STANDIN_EXPORT aclTensorList *aclCreateTensorList(const aclTensor *const *value, uint64_t size)
{
    STANDIN_CALLED();
    aclTensorList *l = malloc(sizeof *l + size * sizeof(aclTensor *));
    if (l == NULL)
        return NULL;
    l->size = size;
    for (uint64_t i = 0; i < size; ++i)
        l->tensors[i] = (aclTensor *)value[i];
    return l;
}
CHECKED(aclCreateTensorList);

STANDIN_EXPORT int aclDestroyTensorList(const aclTensorList *array)
{
    STANDIN_CALLED();
    if (array == NULL)
        return 0;
    for (uint64_t i = 0; i < array->size; ++i)
        free(array->tensors[i]);
    free((void *)array);
    return 0;
}
CHECKED(aclDestroyTensorList);

STANDIN_EXPORT aclScalarList *aclCreateScalarList(const aclScalar *const *value, uint64_t size)
{
    STANDIN_CALLED();
    aclScalarList *l = malloc(sizeof *l + size * sizeof(aclScalar *));
    if (l == NULL)
        return NULL;
    l->size = size;
    for (uint64_t i = 0; i < size; ++i)
        l->scalars[i] = (aclScalar *)value[i];
    return l;
}
CHECKED(aclCreateScalarList);

STANDIN_EXPORT int aclDestroyScalarList(const aclScalarList *array)
{
    STANDIN_CALLED();
    if (array == NULL)
        return 0;
    for (uint64_t i = 0; i < array->size; ++i)
        free(array->scalars[i]);
    free((void *)array);
    return 0;
}
CHECKED(aclDestroyScalarList);

int64_t standin_tensor_numel(const aclTensor *tensor)
{
    int64_t n = 1;
    for (uint64_t i = 0; i < tensor->ndim; ++i)
        n *= tensor->dims[i];
    return n;
}

/* The element at row-major position LINEAR of TENSOR's view. */
char *standin_tensor_element(const aclTensor *tensor, int64_t linear)
{
    int64_t at = tensor->offset;
    for (uint64_t d = tensor->ndim; d-- > 0;) {
        int64_t size = tensor->dims[d];
        at += (linear % size) * tensor->strides[d];
        linear /= size;
    }
    return tensor->data + at * (int64_t)standin_dtype_size(tensor->dtype);
}

/* The element of INPUT that broadcasts to row-major position LINEAR of a
 * tensor shaped like SHAPE (dimensions aligned on the right, size 1 repeats). */
char *standin_broadcast_element(const aclTensor *input, const aclTensor *shape, int64_t linear)
{
    int64_t at = input->offset;
    uint64_t skip = shape->ndim > input->ndim ? shape->ndim - input->ndim : 0;
    for (uint64_t d = shape->ndim; d-- > 0;) {
        int64_t size = shape->dims[d];
        int64_t index = linear % size;
        linear /= size;
        if (d < skip)
            continue;
        uint64_t own = d - skip;
        if (input->dims[own] != 1)
            at += index * input->strides[own];
    }
    return input->data + at * (int64_t)standin_dtype_size(input->dtype);
}
