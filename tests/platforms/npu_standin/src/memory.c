/* Device memory over host memory (with a cap), pinned host memory, and
 * synchronous copies/fills.
 * Freed device memory behaves as on a device: it returns to the cap at once
 * but stays mapped with its contents, and a later allocation of the same size
 * gets it back (the latest freed first), so work still queued on it (in
 * torch_npu's task queue or on a stream) reads or writes memory that may be
 * reused, and never faults. Beyond POOL_RESIDENT bytes the oldest freed
 * regions lose their pages (read as zeros), beyond POOL_LIMIT their mapping. Freed pinned host memory goes back to the system only after every
 * task queued before the free has run. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "standin.h"

#define DEFAULT_CAP (8ULL << 30)
#define HOST_ALIGNMENT 64
#define POOL_RESIDENT (1ULL << 30) /* freed device memory keeping its contents */
#define POOL_LIMIT (64ULL << 30)   /* freed device address space kept mapped */

struct region {
    char *base;
    size_t size;
    int32_t device;
    enum standin_memory_kind kind;
    int owned; /* allocated here (not registered user memory) */
};

struct deferred {
    struct region region;
    uint64_t after_sequence;
};

static struct region *regions;
static size_t region_count, region_capacity;
static struct deferred *graveyard;
static size_t graveyard_count, graveyard_capacity;
static struct deferred *pool; /* freed device regions, oldest first */
static size_t pool_count, pool_capacity, pool_bytes;
static size_t pool_dropped; /* pool[0 .. pool_dropped) lost their pages */
static size_t in_use[64];

static size_t cap(void)
{
    return (size_t)standin_env_u64("NPU_STANDIN_MEMORY_BYTES", DEFAULT_CAP);
}

void *standin_grow(void *array, size_t *capacity, size_t count, size_t item)
{
    if (count < *capacity)
        return array;
    *capacity = *capacity ? *capacity * 2 : 64;
    void *bigger = realloc(array, *capacity * item);
    if (bigger == NULL)
        abort();
    return bigger;
}

/* Lock held. */
static void add_region(struct region region)
{
    regions = standin_grow(regions, &region_capacity, region_count, sizeof *regions);
    regions[region_count++] = region;
}

/* Lock held: index of the region containing PTR, or -1. */
static long find_region(const void *ptr)
{
    const char *at = ptr;
    for (size_t i = 0; i < region_count; ++i)
        if (at >= regions[i].base && at < regions[i].base + (regions[i].size ? regions[i].size : 1))
            return (long)i;
    return -1;
}

static void release(struct region *region)
{
    if (!region->owned)
        return;
    if (region->kind == STANDIN_DEVICE)
        munmap(region->base, region->size);
    else
        free(region->base);
}

void standin_release_deferred(void)
{
    uint64_t oldest = standin_oldest_pending_sequence();
    size_t kept = 0;
    for (size_t i = 0; i < graveyard_count; ++i) {
        if (graveyard[i].after_sequence < oldest)
            release(&graveyard[i].region);
        else
            graveyard[kept++] = graveyard[i];
    }
    graveyard_count = kept;
}

/* Lock held: keep a freed device region mapped for reuse; beyond the pool's
 * limit, unmap the oldest ones no queued task can still touch. */
static void to_pool(struct region region)
{
    pool = standin_grow(pool, &pool_capacity, pool_count, sizeof *pool);
    pool[pool_count++] = (struct deferred){region, standin_sequence_now()};
    pool_bytes += region.size;
    size_t resident = 0;
    for (size_t i = pool_dropped; i < pool_count; ++i)
        resident += pool[i].region.size;
    for (; resident > POOL_RESIDENT && pool_dropped < pool_count; ++pool_dropped) {
        madvise(pool[pool_dropped].region.base, pool[pool_dropped].region.size, MADV_DONTNEED);
        resident -= pool[pool_dropped].region.size;
    }
    uint64_t oldest = standin_oldest_pending_sequence();
    size_t unmapped = 0;
    while (pool_bytes > POOL_LIMIT && unmapped < pool_dropped && pool[unmapped].after_sequence < oldest) {
        pool_bytes -= pool[unmapped].region.size;
        release(&pool[unmapped++].region);
    }
    memmove(pool, pool + unmapped, (pool_count - unmapped) * sizeof *pool);
    pool_count -= unmapped;
    pool_dropped -= unmapped;
}

/* Lock held: a pooled region of exactly SIZE bytes (the latest freed), or NULL. */
static void *from_pool(size_t size)
{
    for (size_t i = pool_count; i-- > 0;) {
        if (pool[i].region.size != size)
            continue;
        void *base = pool[i].region.base;
        pool_bytes -= size;
        memmove(pool + i, pool + i + 1, (pool_count - i - 1) * sizeof *pool);
        pool_count -= 1;
        if (i < pool_dropped)
            pool_dropped -= 1;
        return base;
    }
    return NULL;
}

/* Lock held: forget the region starting at PTR; free it once earlier work ran. */
static aclError forget(void *ptr, enum standin_memory_kind kind)
{
    long at = find_region(ptr);
    if (at < 0 || regions[at].base != ptr || regions[at].kind != kind)
        return ACL_ERROR_RT_PARAM_INVALID;
    if (kind == STANDIN_DEVICE && !regions[at].owned)
        return ACL_ERROR_RT_PARAM_INVALID; /* a reservation: aclrtReleaseMemAddress's */
    struct region region = regions[at];
    regions[at] = regions[--region_count];
    if (kind == STANDIN_DEVICE) {
        in_use[region.device] -= region.size;
        to_pool(region);
        return ACL_SUCCESS;
    }
    graveyard = standin_grow(graveyard, &graveyard_capacity, graveyard_count, sizeof *graveyard);
    graveyard[graveyard_count++] = (struct deferred){region, standin_sequence_now()};
    standin_release_deferred();
    return ACL_SUCCESS;
}

enum standin_memory_kind standin_memory_kind_of(const void *ptr)
{
    standin_lock();
    long at = find_region(ptr);
    enum standin_memory_kind kind = at < 0 ? STANDIN_NOT_OURS : regions[at].kind;
    standin_unlock();
    return kind;
}

aclError standin_charge_device(int32_t device, size_t bytes)
{
    if (in_use[device] + bytes > cap()) {
        standin_set_error("npu_standin: out of memory: %zu bytes asked, %zu of %zu in use", bytes, in_use[device],
                          cap());
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    in_use[device] += bytes;
    return ACL_SUCCESS;
}

void standin_refund_device(int32_t device, size_t bytes)
{
    in_use[device] -= bytes;
}

void standin_add_device_range(void *base, size_t size, int32_t device)
{
    add_region((struct region){base, size, device, STANDIN_DEVICE, 0});
}

void standin_remove_device_range(void *base)
{
    long at = find_region(base);
    if (at >= 0 && regions[at].base == base && regions[at].kind == STANDIN_DEVICE && !regions[at].owned)
        regions[at] = regions[--region_count];
}

static aclError device_malloc(void **devPtr, size_t size)
{
    int32_t device = standin_current_device();
    size_t bytes = size ? size : 1;
    standin_lock();
    if (in_use[device] + bytes > cap()) {
        standin_unlock();
        standin_set_error("npu_standin: out of memory: %zu bytes asked, %zu of %zu in use", bytes, in_use[device],
                          cap());
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    void *base = from_pool(bytes);
    if (base == NULL)
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        standin_unlock();
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    in_use[device] += bytes;
    add_region((struct region){base, bytes, device, STANDIN_DEVICE, 1});
    standin_unlock();
    *devPtr = base;
    return ACL_SUCCESS;
}

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    (void)policy;
    STANDIN_CALLED();
    return device_malloc(devPtr, size);
}

aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    (void)policy;
    STANDIN_CALLED();
    return device_malloc(devPtr, size);
}

aclError aclrtFree(void *devPtr)
{
    STANDIN_CALLED();
    if (devPtr == NULL)
        return ACL_SUCCESS;
    standin_lock();
    aclError err = forget(devPtr, STANDIN_DEVICE);
    standin_unlock();
    return err;
}

aclError aclrtMallocHost(void **hostPtr, size_t size)
{
    STANDIN_CALLED();
    size_t bytes = (size + HOST_ALIGNMENT - 1) / HOST_ALIGNMENT * HOST_ALIGNMENT;
    void *base = aligned_alloc(HOST_ALIGNMENT, bytes ? bytes : HOST_ALIGNMENT);
    if (base == NULL)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    standin_lock();
    add_region((struct region){base, size, standin_current_device(), STANDIN_PINNED_HOST, 1});
    standin_unlock();
    *hostPtr = base;
    return ACL_SUCCESS;
}

aclError aclrtFreeHost(void *hostPtr)
{
    STANDIN_CALLED();
    standin_lock();
    aclError err = forget(hostPtr, STANDIN_PINNED_HOST);
    standin_unlock();
    return err;
}

aclError aclrtHostRegister(void *ptr, uint64_t size, aclrtHostRegisterType type, void **devPtr)
{
    (void)type;
    STANDIN_CALLED();
    standin_lock();
    add_region((struct region){ptr, size, standin_current_device(), STANDIN_PINNED_HOST, 0});
    standin_unlock();
    *devPtr = ptr;
    return ACL_SUCCESS;
}

aclError aclrtHostUnregister(void *ptr)
{
    STANDIN_CALLED();
    standin_lock();
    aclError err = forget(ptr, STANDIN_PINNED_HOST);
    standin_unlock();
    return err;
}

aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes)
{
    STANDIN_CALLED();
    memset(attributes, 0, sizeof *attributes);
    standin_lock();
    long at = find_region(ptr);
    if (at >= 0 && regions[at].kind == STANDIN_DEVICE) {
        attributes->location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
        attributes->location.id = (uint32_t)regions[at].device;
    } else {
        attributes->location.type = at >= 0 ? ACL_MEM_LOCATION_TYPE_HOST : ACL_MEM_LOCATION_TYPE_UNREGISTERED;
    }
    standin_unlock();
    attributes->pageSize = 4096;
    return ACL_SUCCESS;
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total)
{
    (void)attr;
    STANDIN_CALLED();
    standin_lock();
    size_t used = in_use[standin_current_device()];
    standin_unlock();
    *total = cap();
    *free = used > *total ? 0 : *total - used;
    return ACL_SUCCESS;
}

void standin_copy(void *dst, const void *src, size_t count)
{
    if (count)
        memmove(dst, src, count);
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    (void)kind;
    STANDIN_CALLED();
    if (count > destMax)
        return ACL_ERROR_INVALID_PARAM;
    standin_copy(dst, src, count);
    return ACL_SUCCESS;
}

aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    STANDIN_CALLED();
    if (count > maxCount)
        return ACL_ERROR_INVALID_PARAM;
    memset(devPtr, value, count);
    return ACL_SUCCESS;
}

/* Test control: bytes of device memory in use on DEVICE. */
STANDIN_EXPORT uint64_t standin_memory_in_use(int32_t device)
{
    standin_lock();
    uint64_t used = device >= 0 && device < 64 ? in_use[device] : 0;
    standin_unlock();
    return used;
}
