// The simulated runtime's virtual memory, on the host's: a reservation is an
// anonymous mapping with no access (touching it faults, as on a device); a
// physical chunk is a memfd of its size, charged against the simulated
// device's memory; mapping one places the memfd at an offset of a
// reservation, and setting access makes it readable and writable.  Unmapping
// puts the no-access mapping back.  The model keeps its own table of what is
// reserved, mapped and accessible, so the runtime's fills and reads check an
// address before touching it (an illegal access is refused and counted, not
// a crash), and misuse (a map outside a reservation, over a mapping, a
// release of a reservation still mapped) is an error as on a device.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "runtime_sim.h"

namespace npl {

namespace {

constexpr size_t kGranularity = size_t(2) << 20;

struct Chunk {
    int fd;
    size_t size;
    int mappings = 0;
    bool released = false;
};

struct Mapping {
    size_t size;
    Chunk* chunk;
    bool access = false;
};

struct VmState {
    std::mutex mu;
    std::map<char*, size_t> reservations;  // base -> size
    std::map<char*, Mapping> mappings;     // address -> mapping
    uint64_t mapped = 0, reserved = 0, illegal = 0;
};

VmState& vm() {
    static VmState* s = new VmState();  // never destroyed: safe during exit
    return *s;
}

// The reservation holding [p, p + size), if any (under mu).
const std::pair<char* const, size_t>* reservation_of(VmState& s, const char* p, size_t size) {
    auto it = s.reservations.upper_bound(const_cast<char*>(p));
    if (it == s.reservations.begin()) return nullptr;
    --it;
    return p + size <= it->first + it->second ? &*it : nullptr;
}

// Whether any mapping overlaps [p, p + size) (under mu).
bool overlaps_mapping(VmState& s, const char* p, size_t size) {
    auto it = s.mappings.lower_bound(const_cast<char*>(p));
    if (it != s.mappings.end() && it->first < p + size) return true;
    if (it == s.mappings.begin()) return false;
    --it;
    return it->first + it->second.size > p;
}

// Whether a kernel may touch [p, p + size): memory outside every
// reservation (malloc'd), or a run of mappings with access (under mu).
bool covered(VmState& s, const char* p, size_t size) {
    if (s.reservations.empty() || reservation_of(s, p, 1) == nullptr) return true;
    auto it = s.mappings.upper_bound(const_cast<char*>(p));
    if (it == s.mappings.begin()) return false;
    --it;
    for (const char* q = p; q < p + size; ++it) {
        if (it == s.mappings.end() || it->first > q || q >= it->first + it->second.size || !it->second.access) {
            return false;
        }
        q = it->first + it->second.size;
    }
    return true;
}

// Frees a chunk neither kept nor mapped; returns the bytes the caller
// refunds once it no longer holds mu (the runtime's lock comes first).
size_t drop_chunk_if_unused(Chunk* c) {
    if (!c->released || c->mappings != 0) return 0;
    size_t size = c->size;
    close(c->fd);
    delete c;
    return size;
}

bool aligned(const void* p, size_t size) {
    return reinterpret_cast<uintptr_t>(p) % kGranularity == 0 && size % kGranularity == 0 && size != 0;
}

Status vm_granularity(int, size_t* bytes, int* code) {
    *bytes = kGranularity;
    *code = 0;
    return Status::ok;
}

// An aligned range of address space with no access.
Status vm_reserve(void** base, size_t size, int, int* code) {
    if (sim::detail::call_status("vm_reserve", code) != Status::ok) return Status::error;
    if (size == 0 || size % kGranularity != 0) return sim::detail::invalid(code);
    size_t span = size + kGranularity;
    void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return sim::detail::invalid(code);
    auto* start = static_cast<char*>(p);
    auto* at = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + kGranularity - 1) / kGranularity *
                                       kGranularity);
    if (at > start) munmap(start, static_cast<size_t>(at - start));
    size_t tail = static_cast<size_t>(start + span - (at + size));
    if (tail != 0) munmap(at + size, tail);
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    s.reservations[at] = size;
    s.reserved += size;
    *base = at;
    return Status::ok;
}

Status vm_unreserve(void* base, size_t size, int, int* code) {
    if (sim::detail::call_status("vm_unreserve", code) != Status::ok) return Status::error;
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.reservations.find(static_cast<char*>(base));
    if (it == s.reservations.end() || it->second != size || overlaps_mapping(s, it->first, size)) {
        return sim::detail::invalid(code);
    }
    munmap(base, size);
    s.reserved -= size;
    s.reservations.erase(it);
    return Status::ok;
}

Status vm_create(void** chunk, size_t size, int, int* code) {
    if (sim::detail::call_status("vm_create", code) != Status::ok) return Status::error;
    if (size == 0 || size % kGranularity != 0) return sim::detail::invalid(code);
    Status charged = sim::detail::charge(size, code);
    if (charged != Status::ok) return charged;
    int fd = memfd_create("npl-sim-chunk", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
        if (fd >= 0) close(fd);
        sim::detail::refund(size);
        return sim::detail::invalid(code);
    }
    *chunk = new Chunk{fd, size};
    return Status::ok;
}

Status vm_release(void* chunk, int, int* code) {
    if (sim::detail::call_status("vm_release", code) != Status::ok) return Status::error;
    auto* c = static_cast<Chunk*>(chunk);
    VmState& s = vm();
    size_t freed = 0;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        if (c == nullptr || c->released) return sim::detail::invalid(code);
        c->released = true;
        freed = drop_chunk_if_unused(c);
    }
    if (freed != 0) sim::detail::refund(freed);
    return Status::ok;
}

Status vm_map(void* at, size_t size, void* chunk, int, int* code) {
    if (sim::detail::call_status("vm_map", code) != Status::ok) return Status::error;
    auto* c = static_cast<Chunk*>(chunk);
    auto* p = static_cast<char*>(at);
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    if (c == nullptr || c->released || size != c->size || !aligned(p, size) || reservation_of(s, p, size) == nullptr ||
        overlaps_mapping(s, p, size)) {
        return sim::detail::invalid(code);
    }
    if (mmap(p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, c->fd, 0) == MAP_FAILED) return sim::detail::invalid(code);
    s.mappings[p] = Mapping{size, c};
    c->mappings++;
    s.mapped += size;
    return Status::ok;
}

Status vm_set_access(void* at, size_t size, int, int* code) {
    if (sim::detail::call_status("vm_set_access", code) != Status::ok) return Status::error;
    auto* p = static_cast<char*>(at);
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    // [p, p + size) must be exactly a run of whole mappings
    char* q = p;
    for (auto it = s.mappings.find(p); it != s.mappings.end() && it->first == q && q < p + size; ++it) {
        q += it->second.size;
    }
    if (q != p + size || size == 0) return sim::detail::invalid(code);
    if (mprotect(p, size, PROT_READ | PROT_WRITE) != 0) return sim::detail::invalid(code);
    for (auto it = s.mappings.find(p); it != s.mappings.end() && it->first < p + size; ++it) it->second.access = true;
    return Status::ok;
}

// Unmaps whole mappings covering exactly [at, at + size).
Status vm_unmap(void* at, size_t size, int, int* code) {
    if (sim::detail::call_status("vm_unmap", code) != Status::ok) return Status::error;
    auto* p = static_cast<char*>(at);
    VmState& s = vm();
    size_t freed = 0;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        char* q = p;
        auto first = s.mappings.find(p), it = first;
        for (; it != s.mappings.end() && it->first == q && q < p + size; ++it) q += it->second.size;
        if (q != p + size || size == 0) return sim::detail::invalid(code);
        if (mmap(p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
            return sim::detail::invalid(code);
        }
        for (auto m = first; m != it; ++m) {
            m->second.chunk->mappings--;
            s.mapped -= m->second.size;
            freed += drop_chunk_if_unused(m->second.chunk);
        }
        s.mappings.erase(first, it);
    }
    if (freed != 0) sim::detail::refund(freed);
    return Status::ok;
}

const VirtualMemory kSimVm = {vm_granularity, vm_reserve, vm_unreserve, vm_create,
                              vm_release,     vm_map,     vm_set_access, vm_unmap};

}  // namespace

namespace sim {

namespace detail {

const VirtualMemory* virtual_memory(std::string*) { return &kSimVm; }

void lock_virtual_memory() { vm().mu.lock(); }
void unlock_virtual_memory() { vm().mu.unlock(); }

bool accessible(const void* ptr, size_t size) {
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    bool ok = covered(s, static_cast<const char*>(ptr), size);
    if (!ok) s.illegal++;
    return ok;
}

void count_illegal(uint64_t n) {
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    s.illegal += n;
}

}  // namespace detail

uint64_t mapped_bytes() {
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.mapped;
}

uint64_t reserved_bytes() {
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.reserved;
}

bool accessible(const void* ptr, size_t size) {
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    return covered(s, static_cast<const char*>(ptr), size);
}

uint64_t illegal_accesses() {
    VmState& s = vm();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.illegal;
}

}  // namespace sim

}  // namespace npl
