/* Virtual memory (aclrtReserveMemAddress, aclrtMallocPhysical, aclrtMapMem,
 * aclrtUnmapMem, aclrtFreePhysical, aclrtReleaseMemAddress) over the host's,
 * as torch_npu's expandable segments and the shim's use it.  A reservation
 * is address space with no access, registered as device memory (so copies
 * and kernels treat it as such); a physical allocation is a memfd charged
 * against the device's cap; mapping places it read/write at an offset of a
 * reservation, unmapping puts the no-access mapping back, so touching an
 * unmapped page faults, as on a device.  Misuse (a map outside a
 * reservation or over a mapping, a release of a reservation still mapped)
 * is ACL_ERROR_RT_PARAM_INVALID. */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "standin.h"

#define GRANULARITY (2ULL << 20)

struct physical {
    int fd;
    size_t size;
    int32_t device;
    int mappings;
    int freed;
};

struct mapping {
    char *at;
    size_t size;
    struct physical *chunk;
};

struct reservation {
    char *base;
    size_t size;
};

static struct mapping *mappings;
static size_t mapping_count, mapping_capacity;
static struct reservation *reservations;
static size_t reservation_count, reservation_capacity;

/* Lock held: the reservation holding [at, at + size), or -1. */
static long reservation_of(const char *at, size_t size)
{
    for (size_t i = 0; i < reservation_count; ++i)
        if (at >= reservations[i].base && at + size <= reservations[i].base + reservations[i].size)
            return (long)i;
    return -1;
}

/* Lock held: whether a mapping overlaps [at, at + size). */
static int overlaps(const char *at, size_t size)
{
    for (size_t i = 0; i < mapping_count; ++i)
        if (mappings[i].at < at + size && at < mappings[i].at + mappings[i].size)
            return 1;
    return 0;
}

/* Lock held: a physical allocation neither kept nor mapped goes. */
static void drop_if_unused(struct physical *chunk)
{
    if (!chunk->freed || chunk->mappings != 0)
        return;
    close(chunk->fd);
    standin_refund_device(chunk->device, chunk->size);
    free(chunk);
}

aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags)
{
    (void)expectPtr;
    (void)flags;
    STANDIN_CALLED();
    size_t align = alignment ? alignment : GRANULARITY;
    if (virPtr == NULL || size == 0 || size % GRANULARITY != 0 || align % GRANULARITY != 0)
        return ACL_ERROR_RT_PARAM_INVALID;
    size_t span = size + align;
    char *start = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (start == MAP_FAILED)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    char *at = (char *)(((uintptr_t)start + align - 1) / align * align);
    if (at > start)
        munmap(start, (size_t)(at - start));
    if (start + span > at + size)
        munmap(at + size, (size_t)(start + span - (at + size)));
    standin_lock();
    reservations = standin_grow(reservations, &reservation_capacity, reservation_count, sizeof *reservations);
    reservations[reservation_count++] = (struct reservation){at, size};
    standin_add_device_range(at, size, standin_current_device());
    standin_unlock();
    *virPtr = at;
    return ACL_SUCCESS;
}

aclError aclrtReleaseMemAddress(void *virPtr)
{
    STANDIN_CALLED();
    standin_lock();
    long i = reservation_of(virPtr, 1);
    if (i < 0 || reservations[i].base != virPtr || overlaps(reservations[i].base, reservations[i].size)) {
        standin_unlock();
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    struct reservation r = reservations[i];
    reservations[i] = reservations[--reservation_count];
    standin_remove_device_range(r.base);
    standin_unlock();
    munmap(r.base, r.size);
    return ACL_SUCCESS;
}

aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                             uint64_t flags)
{
    (void)flags;
    STANDIN_CALLED();
    if (handle == NULL || size == 0 || size % GRANULARITY != 0)
        return ACL_ERROR_RT_PARAM_INVALID;
    int32_t device = prop != NULL ? (int32_t)prop->location.id : standin_current_device();
    standin_lock();
    aclError charged = standin_charge_device(device, size);
    standin_unlock();
    if (charged != ACL_SUCCESS)
        return charged;
    int fd = memfd_create("npu-standin-physical", MFD_CLOEXEC);
    struct physical *chunk = fd >= 0 && ftruncate(fd, (off_t)size) == 0 ? calloc(1, sizeof *chunk) : NULL;
    if (chunk == NULL) {
        if (fd >= 0)
            close(fd);
        standin_lock();
        standin_refund_device(device, size);
        standin_unlock();
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    *chunk = (struct physical){fd, size, device, 0, 0};
    *handle = chunk;
    return ACL_SUCCESS;
}

aclError aclrtFreePhysical(aclrtDrvMemHandle handle)
{
    STANDIN_CALLED();
    struct physical *chunk = handle;
    if (chunk == NULL || chunk->freed)
        return ACL_ERROR_RT_PARAM_INVALID;
    standin_lock();
    chunk->freed = 1;
    drop_if_unused(chunk);
    standin_unlock();
    return ACL_SUCCESS;
}

aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)
{
    (void)flags;
    STANDIN_CALLED();
    struct physical *chunk = handle;
    char *at = virPtr;
    standin_lock();
    if (chunk == NULL || chunk->freed || size == 0 || offset + size > chunk->size || reservation_of(at, size) < 0 ||
        overlaps(at, size) || (uintptr_t)at % GRANULARITY != 0 || size % GRANULARITY != 0) {
        standin_unlock();
        return ACL_ERROR_RT_PARAM_INVALID;
    }
    if (mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, chunk->fd, (off_t)offset) == MAP_FAILED) {
        standin_unlock();
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    mappings = standin_grow(mappings, &mapping_capacity, mapping_count, sizeof *mappings);
    mappings[mapping_count++] = (struct mapping){at, size, chunk};
    chunk->mappings++;
    standin_unlock();
    return ACL_SUCCESS;
}

aclError aclrtUnmapMem(void *virPtr)
{
    STANDIN_CALLED();
    standin_lock();
    for (size_t i = 0; i < mapping_count; ++i) {
        if (mappings[i].at != virPtr)
            continue;
        struct mapping m = mappings[i];
        mmap(m.at, m.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        mappings[i] = mappings[--mapping_count];
        m.chunk->mappings--;
        drop_if_unused(m.chunk);
        standin_unlock();
        return ACL_SUCCESS;
    }
    standin_unlock();
    return ACL_ERROR_RT_PARAM_INVALID;
}
