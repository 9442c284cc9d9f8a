/* Device memory over host memory (with a cap), pinned host memory, and
 * synchronous copies/fills. Freed memory returns to the cap at once but to
 * the system only after every task queued before the free has run, so a
 * kernel still queued on a paused stream never touches unmapped memory. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "standin.h"

#define DEFAULT_CAP (8ULL << 30)
#define HOST_ALIGNMENT 64

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
static size_t in_use[64];

static size_t cap(void)
{
    return (size_t)standin_env_u64("NPU_STANDIN_MEMORY_BYTES", DEFAULT_CAP);
}

static void *grow(void *array, size_t *capacity, size_t count, size_t item)
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
    regions = grow(regions, &region_capacity, region_count, sizeof *regions);
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

/* Lock held: forget the region starting at PTR; free it once earlier work ran. */
static aclError forget(void *ptr, enum standin_memory_kind kind)
{
    long at = find_region(ptr);
    if (at < 0 || regions[at].base != ptr || regions[at].kind != kind)
        return ACL_ERROR_RT_PARAM_INVALID;
    struct region region = regions[at];
    regions[at] = regions[--region_count];
    if (kind == STANDIN_DEVICE)
        in_use[region.device] -= region.size;
    graveyard = grow(graveyard, &graveyard_capacity, graveyard_count, sizeof *graveyard);
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
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
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
