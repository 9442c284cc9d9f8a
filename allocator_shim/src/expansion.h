// An expandable segment's address range: reserved once from the runtime's
// virtual memory, and backed by physical pages mapped one after another from
// its start.  The allocator grows a segment by mapping pages at its end and
// shrinks it by unmapping whole pages from its end; the blocks that tile the
// segment cover exactly the mapped part (segments.h).
//
// Invariants: `chunks` holds one physical chunk per mapped page, in address
// order; mapped() <= capacity; base, page and capacity are multiples of the
// runtime's granularity.  Each call either does all it was asked or nothing
// (a failure part-way is undone).  No lock of its own: CachingAllocator's
// mutex guards it.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime.h"

namespace npl {

struct Expansion {
    const VirtualMemory* vm = nullptr;
    int device = 0;
    char* base = nullptr;
    size_t capacity = 0;  // bytes reserved
    size_t page = 0;      // bytes per physical chunk
    std::vector<void*> chunks;

    size_t mapped() const { return chunks.size() * page; }
};

// A new range of `capacity` bytes (rounded up to pages of `page` bytes, each
// rounded up to the granularity) with nothing mapped; nullptr with the
// runtime's status and code when it can't be reserved.
Expansion* reserve_expansion(const VirtualMemory* vm, int device, size_t page, size_t capacity, Status* status,
                             int* code);
// Maps `pages` more pages at the end (all or none).
Status map_pages(Expansion& e, size_t pages, int* code);
// Unmaps the last `pages` pages, one by one from the end, and releases
// their chunks.  A failed unmap stops there; an unmapped page is gone even
// when its chunk's release fails (both give an error status): mapped()
// tells what is left.
Status unmap_pages(Expansion& e, size_t pages, int* code);
// Unmaps every page, gives the range back and deletes `e`: true (with an
// error status if a chunk's release or the range's return failed: the
// runtime keeps those).  False, `e` unchanged, when the unmap failed.
bool release_expansion(Expansion* e, Status* status, int* code);

}  // namespace npl
