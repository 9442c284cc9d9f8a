/* Runtime options torch_npu reads back: system parameters (remembered as
 * set) and CANN attributes (what an Ascend910B reports). */
#include "standin.h"

#define OPTIONS 16

static int64_t options[OPTIONS];
static int64_t context_options[OPTIONS];

static aclError set(int64_t *table, aclSysParamOpt opt, int64_t value)
{
    if ((int)opt < 0 || (int)opt >= OPTIONS)
        return ACL_ERROR_INVALID_PARAM;
    standin_lock();
    table[opt] = value;
    standin_unlock();
    return ACL_SUCCESS;
}

static aclError get(const int64_t *table, aclSysParamOpt opt, int64_t *value)
{
    if ((int)opt < 0 || (int)opt >= OPTIONS)
        return ACL_ERROR_INVALID_PARAM;
    standin_lock();
    *value = table[opt];
    standin_unlock();
    return ACL_SUCCESS;
}

aclError aclrtSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    STANDIN_CALLED();
    return set(options, opt, value);
}

aclError aclrtGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    STANDIN_CALLED();
    return get(options, opt, value);
}

aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    STANDIN_CALLED();
    return set(context_options, opt, value);
}

aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    STANDIN_CALLED();
    return get(context_options, opt, value);
}

aclError aclGetCannAttribute(aclCannAttr cannAttr, int32_t *value)
{
    STANDIN_CALLED();
    switch (cannAttr) {
    case ACL_CANN_ATTR_INF_NAN:
    case ACL_CANN_ATTR_BF16:
        *value = 1;
        return ACL_SUCCESS;
    case ACL_CANN_ATTR_JIT_COMPILE:
        *value = 0;
        return ACL_SUCCESS;
    default:
        return ACL_ERROR_INVALID_PARAM;
    }
}
