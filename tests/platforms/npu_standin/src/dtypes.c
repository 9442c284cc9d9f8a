/* Reading and writing tensor elements of the supported aclDataTypes. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "standin.h"

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    if (exponent == 0)
        return (sign ? -1.0f : 1.0f) * ldexpf((float)mantissa, -24);
    uint32_t bits = exponent == 0x1f ? sign | 0x7f800000u | (mantissa << 13)
                                     : sign | ((exponent + 112) << 23) | (mantissa << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    if (isnan(f))
        return sign | 0x7e00;
    float magnitude = fabsf(f);
    if (magnitude >= 65520.0f)
        return sign | 0x7c00;
    if (magnitude < ldexpf(1.0f, -14)) /* subnormal: a multiple of 2^-24 */
        return sign | (uint16_t)lrintf(magnitude * ldexpf(1.0f, 24));
    int exponent;
    float fraction = frexpf(magnitude, &exponent); /* magnitude = fraction * 2^exponent, fraction in [0.5, 1) */
    uint32_t mantissa = (uint32_t)lrintf((fraction * 2.0f - 1.0f) * 1024.0f);
    if (mantissa == 1024) {
        mantissa = 0;
        exponent += 1;
    }
    return sign | (uint16_t)((exponent + 14) << 10) | (uint16_t)mantissa;
}

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (isnan(f))
        return 0x7fc0;
    bits += 0x7fff + ((bits >> 16) & 1); /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

size_t standin_dtype_size(aclDataType dtype)
{
    switch (dtype) {
    case ACL_BOOL: case ACL_INT8: case ACL_UINT8: return 1;
    case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 2;
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 4;
    case ACL_DOUBLE: case ACL_INT64: case ACL_UINT64: case ACL_COMPLEX64: return 8;
    case ACL_COMPLEX128: return 16;
    default: return 1;
    }
}

int standin_dtype_supported(aclDataType dtype)
{
    switch (dtype) {
    case ACL_BOOL: case ACL_INT8: case ACL_UINT8: case ACL_INT16: case ACL_INT32: case ACL_INT64:
    case ACL_FLOAT16: case ACL_BF16: case ACL_FLOAT: case ACL_DOUBLE:
        return 1;
    default:
        return 0;
    }
}

int standin_dtype_integral(aclDataType dtype)
{
    switch (dtype) {
    case ACL_BOOL: case ACL_INT8: case ACL_UINT8: case ACL_INT16: case ACL_INT32: case ACL_INT64:
        return 1;
    default:
        return 0;
    }
}

#define LOAD(type) do { type v; memcpy(&v, at, sizeof v); return v; } while (0)
#define STORE(type, value) do { type v = (type)(value); memcpy(at, &v, sizeof v); return; } while (0)

double standin_load(const char *at, aclDataType dtype)
{
    switch (dtype) {
    case ACL_BOOL: return *(const unsigned char *)at != 0;
    case ACL_INT8: LOAD(int8_t);
    case ACL_UINT8: LOAD(uint8_t);
    case ACL_INT16: LOAD(int16_t);
    case ACL_INT32: LOAD(int32_t);
    case ACL_INT64: LOAD(int64_t);
    case ACL_FLOAT: LOAD(float);
    case ACL_DOUBLE: LOAD(double);
    case ACL_FLOAT16: { uint16_t h; memcpy(&h, at, 2); return half_to_float(h); }
    case ACL_BF16: { uint16_t b; memcpy(&b, at, 2); return bf16_to_float(b); }
    default: return 0.0;
    }
}

void standin_store(char *at, aclDataType dtype, double value)
{
    switch (dtype) {
    case ACL_BOOL: STORE(unsigned char, value != 0.0);
    case ACL_INT8: STORE(int8_t, value);
    case ACL_UINT8: STORE(uint8_t, value);
    case ACL_INT16: STORE(int16_t, value);
    case ACL_INT32: STORE(int32_t, value);
    case ACL_INT64: STORE(int64_t, value);
    case ACL_FLOAT: STORE(float, value);
    case ACL_DOUBLE: STORE(double, value);
    case ACL_FLOAT16: STORE(uint16_t, float_to_half((float)value));
    case ACL_BF16: STORE(uint16_t, float_to_bf16((float)value));
    default: return;
    }
}

int64_t standin_load_int(const char *at, aclDataType dtype)
{
    switch (dtype) {
    case ACL_INT64: LOAD(int64_t);
    case ACL_BOOL: return *(const unsigned char *)at != 0;
    default: return (int64_t)standin_load(at, dtype);
    }
}

void standin_store_int(char *at, aclDataType dtype, int64_t value)
{
    switch (dtype) {
    case ACL_INT64: STORE(int64_t, value);
    case ACL_BOOL: STORE(unsigned char, value != 0);
    default: standin_store(at, dtype, (double)value); return;
    }
}
