/* Devices, contexts, versions and options. */
#include <stdio.h>
#include <string.h>

#include "acl/acl_op_compiler.h"
#include "standin.h"

#define MAX_DEVICES 16
#define SOC_NAME "Ascend910B1"
#define JIT_COMPILE_DEFAULT "disable"
#define CANN_VERSION "8.5.0"
#define CUBE_CORES 24
#define VECTOR_CORES 48
#define L2_CACHE_BYTES (192LL << 20)

static _Thread_local int32_t current = -1;
static char contexts[MAX_DEVICES]; /* a context handle is the address of its device's byte */

int standin_device_count(void)
{
    uint64_t count = standin_env_u64("NPU_STANDIN_DEVICES", 1);
    return count > MAX_DEVICES ? MAX_DEVICES : (int)count;
}

int32_t standin_current_device(void)
{
    return current < 0 ? 0 : current;
}

static int valid_device(int32_t device)
{
    return device >= 0 && device < standin_device_count();
}

aclError aclInit(const char *configPath)
{
    (void)configPath;
    STANDIN_CALLED();
    return ACL_SUCCESS;
}

aclError aclFinalize(void)
{
    STANDIN_CALLED();
    return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t *count)
{
    STANDIN_CALLED();
    *count = (uint32_t)standin_device_count();
    return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId)
{
    STANDIN_CALLED();
    if (!valid_device(deviceId))
        return ACL_ERROR_RT_INVALID_DEVICEID;
    current = deviceId;
    return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t *deviceId)
{
    STANDIN_CALLED();
    if (current < 0)
        return ACL_ERROR_RT_CONTEXT_NULL;
    *deviceId = current;
    return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId)
{
    STANDIN_CALLED();
    return valid_device(deviceId) ? ACL_SUCCESS : ACL_ERROR_RT_INVALID_DEVICEID;
}

aclError aclrtGetCurrentContext(aclrtContext *context)
{
    STANDIN_CALLED();
    if (current < 0)
        return ACL_ERROR_RT_CONTEXT_NULL;
    *context = &contexts[current];
    return ACL_SUCCESS;
}

aclError aclrtSetCurrentContext(aclrtContext context)
{
    STANDIN_CALLED();
    char *at = context;
    if (at < contexts || at >= contexts + MAX_DEVICES)
        return ACL_ERROR_RT_PARAM_INVALID;
    current = (int32_t)(at - contexts);
    return ACL_SUCCESS;
}

aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId)
{
    STANDIN_CALLED();
    if (!valid_device(deviceId))
        return ACL_ERROR_RT_INVALID_DEVICEID;
    *context = &contexts[deviceId];
    current = deviceId;
    return ACL_SUCCESS;
}

aclError aclrtDestroyContext(aclrtContext context)
{
    (void)context;
    STANDIN_CALLED();
    return ACL_SUCCESS;
}

const char *aclrtGetSocName(void)
{
    STANDIN_CALLED();
    return SOC_NAME;
}

size_t aclGetCompileoptSize(aclCompileOpt opt)
{
    (void)opt;
    STANDIN_CALLED();
    return sizeof JIT_COMPILE_DEFAULT;
}

aclError aclGetCompileopt(aclCompileOpt opt, char *value, size_t length)
{
    (void)opt;
    STANDIN_CALLED();
    if (length < sizeof JIT_COMPILE_DEFAULT)
        return ACL_ERROR_INVALID_PARAM;
    memcpy(value, JIT_COMPILE_DEFAULT, sizeof JIT_COMPILE_DEFAULT);
    return ACL_SUCCESS;
}

aclError aclsysGetCANNVersion(aclCANNPackageName name, aclCANNPackageVersion *version)
{
    (void)name;
    STANDIN_CALLED();
    memset(version, 0, sizeof *version);
    snprintf(version->version, sizeof version->version, "%s", CANN_VERSION);
    snprintf(version->majorVersion, sizeof version->majorVersion, "8");
    snprintf(version->minorVersion, sizeof version->minorVersion, "5");
    snprintf(version->releaseVersion, sizeof version->releaseVersion, "0");
    return ACL_SUCCESS;
}

aclError aclsysGetVersionStr(char *pkgName, char *versionStr)
{
    (void)pkgName;
    STANDIN_CALLED();
    strcpy(versionStr, CANN_VERSION);
    return ACL_SUCCESS;
}

aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId)
{
    STANDIN_CALLED();
    *canAccessPeer = valid_device(deviceId) && valid_device(peerDeviceId);
    return ACL_SUCCESS;
}

aclError aclrtPeekAtLastError(aclrtLastErrLevel level)
{
    (void)level;
    STANDIN_CALLED();
    return ACL_SUCCESS;
}

aclError aclrtGetLastError(aclrtLastErrLevel level)
{
    (void)level;
    STANDIN_CALLED();
    return ACL_SUCCESS;
}

aclError aclGetDeviceCapability(uint32_t deviceId, aclDeviceInfo deviceInfo, int64_t *value)
{
    STANDIN_CALLED();
    if (!valid_device((int32_t)deviceId))
        return ACL_ERROR_RT_INVALID_DEVICEID;
    switch (deviceInfo) {
    case ACL_DEVICE_INFO_AI_CORE_NUM: *value = CUBE_CORES; return ACL_SUCCESS;
    case ACL_DEVICE_INFO_VECTOR_CORE_NUM: *value = VECTOR_CORES; return ACL_SUCCESS;
    case ACL_DEVICE_INFO_L2_SIZE: *value = L2_CACHE_BYTES; return ACL_SUCCESS;
    default: return ACL_ERROR_INVALID_PARAM;
    }
}

aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value)
{
    STANDIN_CALLED();
    if (!valid_device((int32_t)deviceId))
        return ACL_ERROR_RT_INVALID_DEVICEID;
    switch (attr) {
    case ACL_DEV_ATTR_AICORE_CORE_NUM:
    case ACL_DEV_ATTR_CUBE_CORE_NUM: *value = CUBE_CORES; return ACL_SUCCESS;
    case ACL_DEV_ATTR_VECTOR_CORE_NUM: *value = VECTOR_CORES; return ACL_SUCCESS;
    case ACL_DEV_ATTR_L2_CACHE_SIZE: *value = L2_CACHE_BYTES; return ACL_SUCCESS;
    case ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE:
        *value = (int64_t)standin_env_u64("NPU_STANDIN_MEMORY_BYTES", 8ULL << 30);
        return ACL_SUCCESS;
    default: *value = 0; return ACL_SUCCESS;
    }
}

aclError aclrtDeviceGetUuid(int32_t deviceId, aclrtUuid *uuid)
{
    STANDIN_CALLED();
    if (!valid_device(deviceId))
        return ACL_ERROR_RT_INVALID_DEVICEID;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    memcpy(uuid->bytes, "npu-standin", 11);
    uuid->bytes[15] = (char)deviceId;
    return ACL_SUCCESS;
}
