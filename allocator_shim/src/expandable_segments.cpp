// Expandable segments (torch's expandable_segments:True): with the setting
// on, new memory of the eager pool comes from one segment per (device,
// stream, size class) that grows by mapping pages at its end, instead of a
// segment per runtime allocation.
//
// - Growth: an allocation nothing cached fits maps just enough pages (2 MiB
//   small, 20 MiB large, as torch's) after the segment's end; when the
//   segment's last block is free (cached, no events) the new pages extend
//   it, so blocks at the mapped end merge.  The range reserved is the
//   device's memory plus an eighth (torch's); a request beyond what is left
//   of it is out of memory.  A runtime without virtual-memory calls, or
//   whose first reservation or mapping fails other than for lack of memory,
//   is told once (a finding, a line on stderr) and gets plain segments.
// - Shrink: empty_cache and the out-of-memory path unmap the whole pages of
//   a free last block (cutting it at a page edge), after synchronising the
//   segment's stream (torch's rule: an unmap does not wait for queued work);
//   a block that is live, pending or carries use events is never unmapped.  A segment left with
//   nothing mapped gives its range back and is forgotten.
// - Graph pools and MemPools keep plain segments (their checkpoints and own
//   allocators need them), as torch's.
// - Statistics as torch counts them: reserved_bytes follows the mapped
//   bytes, each map / unmap is a num_device_alloc / num_device_free, the
//   segment count and inactive_split leave expandable segments out.
// - With the setting off again, blocks of expandable segments are neither
//   handed out nor grown (torch's rule); empty_cache still unmaps them.
#include <cstdio>

#include "caching_allocator.h"
#include "expansion.h"

namespace npl {

namespace {

constexpr size_t kSmallPage = size_t(2) << 20;
constexpr size_t kLargePage = size_t(20) << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void CachingAllocator::set_expandable_segments(bool on) {
    Locked lock(this);
    expandable_ = on;
}

bool CachingAllocator::expandable_segments() const {
    Locked lock(this);
    return expandable_;
}

// The runtime's virtual memory; a runtime without it is told once (a
// finding and a line on stderr) and gets plain segments.
const VirtualMemory* CachingAllocator::virtual_memory() {
    std::string why;
    const VirtualMemory* vm = rt_->virtual_memory(&why);
    if (vm == nullptr) refuse_virtual_memory(why);
    return vm;
}

// Expandable segments are off for good on this runtime: said once.
void CachingAllocator::refuse_virtual_memory(const std::string& why) {
    vm_refused_ = true;
    if (expandable_warned_) return;
    expandable_warned_ = true;
    std::string text = std::string("expandable_segments is not supported on the ") + rt_->name + " runtime (" + why +
                       "); plain segments are used";
    std::fprintf(stderr, "npu_lifetime shim: %s\n", text.c_str());
    Finding f;
    f.kind = "unsupported_setting";
    f.op = "expandable_segments";
    f.detail = text;
    report(std::move(f));
}

// The runtime has the calls but its first use failed (a device without
// virtual-memory support, a stub): plain segments from now on, this
// allocation's included (status unsupported).
void CachingAllocator::refused(Status* status, int code, const char* step) {
    const char* words = code != 0 ? rt_->error_string(code) : nullptr;
    refuse_virtual_memory(code == 0 ? std::string(step) + " reported success but gave nothing back (a stub?)"
                                    : std::string(step) + " failed: error " + std::to_string(code) +
                                          (words != nullptr && *words ? std::string(", ") + words : std::string()));
    *status = Status::unsupported;
}

bool CachingAllocator::grows(const Pool* p) {
    return expandable_ && p->id.eager() && !vm_refused_ && virtual_memory() != nullptr;
}

// A block of `size` bytes from the pool's expandable segment, made or
// grown for it (the rest of the new pages cached).
Block* CachingAllocator::try_grow(Pool* p, size_t size, Status* status, int* code) {
    Segment* seg = p->expandable;
    if (seg == nullptr) {
        seg = first_pages(p, size, status, code);
        if (seg == nullptr) return nullptr;
        split(seg->first, size);
        return seg->first;
    }
    Block* tail = Segments::last(seg);
    bool tail_free = tail->state == BlockState::cached && tail->held.empty() && !hidden_expandable(tail);
    size_t have = tail_free ? tail->size : 0;
    if (have >= size) {  // it fits already (a search that skipped it)
        take(tail, size);
        return tail;
    }
    Block* added = more_pages(seg, round_up(size - have, seg->expansion->page), status, code);
    if (added == nullptr) return nullptr;
    Block* b = added;
    if (tail_free) {  // the free end grows: one block
        pool_erase(tail);
        Segments::merge(tail, added);
        recycle_block(added);
        b = tail;
    }
    split(b, size);
    return b;
}

// The pool's expandable segment, reserved and mapped with the pages `size` needs.
Segment* CachingAllocator::first_pages(Pool* p, size_t size, Status* status, int* code) {
    size_t total = 0;
    if (rt_->memory_total(p->device, &total, code) != Status::ok) total = 0;
    size_t page = p->small ? kSmallPage : kLargePage;
    size_t capacity = total != 0 ? total + total / 8 : round_up(size, page);
    Expansion* e = reserve_expansion(virtual_memory(), p->device, page, capacity, status, code);
    if (e == nullptr) {
        if (*status != Status::out_of_memory) refused(status, *code, "reserving an address range");
        return nullptr;
    }
    size_t bytes = round_up(size, e->page);
    if (bytes > e->capacity || over_fraction(p->device, bytes, code)) {
        *status = Status::out_of_memory;
    } else {
        *status = map_pages(*e, bytes / e->page, code);
    }
    if (*status != Status::ok) {
        Status undo = Status::ok;
        int c = 0;
        release_expansion(e, &undo, &c);
        if (*status != Status::out_of_memory) refused(status, *code, "mapping the first pages");
        return nullptr;
    }
    Block* b = new_block();
    b->pool = p;
    Segment* seg = segments_.add(e->base, bytes, p->device, p->stream, p->small, p->id, b);
    seg->expansion = e;
    p->expandable = seg;
    expansions_++;
    count_mapped(seg, static_cast<int64_t>(bytes));
    trace(TraceKind::segment_alloc, b, nullptr);
    history_segment(NPL_HISTORY_SEGMENT_MAP, seg, seg->base, bytes);  // torch: every mapping is a map
    return seg;
}

// `bytes` more mapped at the segment's end: a new block there (in no pool).
Block* CachingAllocator::more_pages(Segment* seg, size_t bytes, Status* status, int* code) {
    if (over_fraction(seg->device, bytes, code)) {
        *status = Status::out_of_memory;
        return nullptr;
    }
    *status = map_pages(*seg->expansion, bytes / seg->expansion->page, code);
    if (*status != Status::ok) return nullptr;
    Block* added = new_block();
    Segments::append(seg, bytes, added);
    count_mapped(seg, static_cast<int64_t>(bytes));
    history_segment(NPL_HISTORY_SEGMENT_MAP, seg, added->ptr, bytes);
    return added;
}

void CachingAllocator::count_mapped(const Segment* seg, int64_t bytes) {
    DeviceStats& st = dstats(seg->device);
    st.add(StatId::reserved_bytes, seg->small, bytes);
    st.count(bytes > 0 ? CounterId::num_device_alloc : CounterId::num_device_free);
}

// Unlike a runtime free, an unmap need not wait for work queued on the
// memory: the segment's stream (every other stream's use was waited for
// through events before its block became free) is synchronised first; not
// while it captures (that would invalidate the capture): the pages stay.
bool CachingAllocator::stream_idle(const Segment* seg) {
    if (capturing(seg->stream)) return false;
    int code = 0;
    if (rt_->stream_synchronize(seg->stream, &code) == Status::ok) return true;
    runtime_error("stream_synchronize(unmap)", code, seg->first, seg->stream);
    return false;
}

// Unmaps the whole pages of the segment's free last block; true when
// nothing is left mapped and its range went back (the caller forgets it).
bool CachingAllocator::shrink_expandable(Segment* seg) {
    Expansion* e = seg->expansion;
    Block* tail = Segments::last(seg);
    if (tail->state != BlockState::cached || !tail->held.empty()) return false;
    size_t keep = round_up(static_cast<size_t>(tail->ptr - seg->base), e->page);
    if (keep == seg->size || !stream_idle(seg)) return false;  // no whole page free at the end
    int code = 0;
    if (unmap_pages(*e, (seg->size - keep) / e->page, &code) != Status::ok) {
        runtime_error("unmap", code, tail, nullptr);
    }
    size_t bytes = seg->size - e->mapped();
    if (bytes == 0) return false;
    count_mapped(seg, -static_cast<int64_t>(bytes));
    history_segment(NPL_HISTORY_SEGMENT_UNMAP, seg, seg->base + e->mapped(), bytes);
    if (e->mapped() == 0) return forget_expansion(seg);
    pool_erase(tail);
    if (Block* gone = Segments::truncate(seg, seg->base + e->mapped())) {
        recycle_block(gone);
    } else {
        pool_insert(tail);
    }
    return false;
}

// Nothing is mapped any more: the range goes back, the segment's one block
// is recycled, and the segment is forgotten (true: the caller removes it).
bool CachingAllocator::forget_expansion(Segment* seg) {
    Block* b = seg->first;
    Status s = Status::ok;
    int code = 0;
    release_expansion(seg->expansion, &s, &code);  // nothing mapped: it goes
    if (s != Status::ok) runtime_error("release(expandable segment)", code, b, nullptr);
    seg->expansion = nullptr;
    expansions_--;
    if (b->pool->expandable == seg) b->pool->expandable = nullptr;
    trace(TraceKind::segment_free, b, nullptr);
    pool_erase(b);
    recycle_block(b);
    return true;
}

}  // namespace npl
