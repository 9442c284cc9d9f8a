// Expandable segments' address ranges: the runtime's virtual-memory calls
// in the order they must run, each status checked, a failure undone.
#include "expansion.h"

namespace npl {

namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// One page at the end: a chunk, mapped, made accessible; undone on failure.
Status map_one(Expansion& e, int* code) {
    void* chunk = nullptr;
    char* at = e.base + e.mapped();
    Status s = e.vm->create(&chunk, e.page, e.device, code);
    if (s != Status::ok) return s;
    if (chunk == nullptr) return Status::unsupported;  // "success" with nothing: a stub
    int undo = 0;
    if ((s = e.vm->map(at, e.page, chunk, e.device, code)) != Status::ok) {
        e.vm->release(chunk, e.device, &undo);
        return s;
    }
    if ((s = e.vm->set_access(at, e.page, e.device, code)) != Status::ok) {
        e.vm->unmap(at, e.page, e.device, &undo);
        e.vm->release(chunk, e.device, &undo);
        return s;
    }
    e.chunks.push_back(chunk);
    return Status::ok;
}

}  // namespace

Expansion* reserve_expansion(const VirtualMemory* vm, int device, size_t page, size_t capacity, Status* status,
                             int* code) {
    size_t granularity = 0;
    *status = vm->granularity(device, &granularity, code);
    if (*status != Status::ok) return nullptr;
    auto* e = new Expansion();
    e->vm = vm;
    e->device = device;
    e->page = round_up(page, granularity);
    e->capacity = round_up(capacity, e->page);
    void* base = nullptr;
    *status = vm->reserve(&base, e->capacity, device, code);
    if (*status == Status::ok && base == nullptr) *status = Status::unsupported;  // "success" with nothing: a stub
    if (*status != Status::ok) {
        delete e;
        return nullptr;
    }
    e->base = static_cast<char*>(base);
    return e;
}

Status map_pages(Expansion& e, size_t pages, int* code) {
    if (e.mapped() + pages * e.page > e.capacity) {
        *code = 0;
        return Status::out_of_memory;
    }
    size_t before = e.chunks.size();
    for (size_t i = 0; i < pages; ++i) {
        Status s = map_one(e, code);
        if (s == Status::ok) continue;
        int undo = 0;
        unmap_pages(e, e.chunks.size() - before, &undo);
        return s;
    }
    return Status::ok;
}

// Page by page from the end (ACL unmaps one mapping per call): a failure
// stops there, with the pages after it unmapped and released.
Status unmap_pages(Expansion& e, size_t pages, int* code) {
    if (pages > e.chunks.size()) return Status::error;
    Status released = Status::ok;
    for (size_t i = 0; i < pages; ++i) {
        char* at = e.base + e.mapped() - e.page;
        Status s = e.vm->unmap(at, e.page, e.device, code);
        if (s != Status::ok) return s;
        // Unmapped, the page is gone whatever the chunk's release says (a
        // failure is told; the memory is the runtime's to reclaim).
        int c = 0;
        if (e.vm->release(e.chunks.back(), e.device, &c) != Status::ok && released == Status::ok) {
            released = Status::error;
            *code = c;
        }
        e.chunks.pop_back();
    }
    return released;
}

bool release_expansion(Expansion* e, Status* status, int* code) {
    *status = unmap_pages(*e, e->chunks.size(), code);
    if (!e->chunks.empty()) return false;
    int c = 0;
    Status freed = e->vm->unreserve(e->base, e->capacity, e->device, &c);
    if (freed != Status::ok && *status == Status::ok) {
        *status = freed;
        *code = c;
    }
    delete e;
    return true;
}

}  // namespace npl
