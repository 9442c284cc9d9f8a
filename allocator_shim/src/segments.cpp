// The segments and the blocks that tile them: linking blocks into a
// segment, and the checker of the invariants stated in segments.h.
#include "segments.h"

#include "describe.h"
#include "expansion.h"

namespace npl {

Segment* Segments::add(char* base, size_t size, int device, Stream stream, bool small, PoolId pool_id, Block* first) {
    auto* seg = new Segment{base, size, device, stream, small, pool_id, nullptr, {}, nullptr};
    first->ptr = seg->base;
    first->size = size;
    first->device = device;
    first->stream = stream;
    first->small = small;
    first->segment = seg;
    seg->first = first;
    seg->last = first;
    map_[seg->base] = seg;
    return seg;
}

Block* Segments::block_at(const char* p) const {
    const Segment* seg = containing(p);
    for (Block* b = seg != nullptr ? seg->first : nullptr; b != nullptr; b = b->next) {
        if (p >= b->ptr && p < b->ptr + b->size) return b;
    }
    return nullptr;
}

void Segments::cut_front(Block* b, char* at, Block* front) {
    front->ptr = b->ptr;
    front->size = static_cast<size_t>(at - b->ptr);
    front->prev = b->prev;
    front->next = b;
    if (b->prev != nullptr) b->prev->next = front;
    if (b->segment->first == b) b->segment->first = front;
    b->prev = front;
    b->ptr = at;
    b->size -= front->size;
}

Block* Segments::last(const Segment* seg) { return seg->last; }

void Segments::append(Segment* seg, size_t bytes, Block* added) {
    Block* tail = last(seg);
    added->ptr = seg->base + seg->size;
    added->size = bytes;
    added->device = seg->device;
    added->stream = seg->stream;
    added->small = seg->small;
    added->segment = seg;
    added->pool = tail->pool;
    added->prev = tail;
    added->next = nullptr;
    tail->next = added;
    seg->last = added;
    seg->size += bytes;
}

Block* Segments::truncate(Segment* seg, char* at) {
    Block* tail = last(seg);
    seg->size = static_cast<size_t>(at - seg->base);
    if (at > tail->ptr) {
        tail->size = static_cast<size_t>(at - tail->ptr);
        return nullptr;
    }
    tail->prev->next = nullptr;
    seg->last = tail->prev;
    tail->prev = nullptr;
    return tail;
}

void Segments::check(const std::function<void(const std::string&)>& fail) const {
    for (const auto& entry : map_) {
        const Segment* seg = entry.second;
        std::string segment = "segment " + hex(seg->base);
        if (entry.first != seg->base) fail(segment + " is filed under " + hex(entry.first));
        if (seg->first == nullptr || seg->first->prev != nullptr) fail(segment + ": its first block has a predecessor");
        const char* expect = seg->base;
        const Block* prev = nullptr;
        for (const Block* b = seg->first; b != nullptr; prev = b, b = b->next) {
            std::string at = where(b);
            if (b->ptr != expect) fail(at + " does not start where its predecessor ends (" + hex(expect) + ")");
            if (b->prev != prev) fail(at + ": its prev link is broken");
            if (b->segment != seg) fail(at + " points to another segment");
            if (b->size == 0 || b->size % 512 != 0) fail(at + ": size is not a positive multiple of 512");
            if (b->device != seg->device || b->stream != seg->stream || b->small != seg->small) {
                fail(at + " disagrees with its segment on device, stream or size class");
            }
            expect = b->ptr + b->size;
        }
        if (expect != seg->base + seg->size) fail(segment + ": its blocks do not cover it exactly");
        if (seg->last != prev) fail(segment + ": its last block is not the one it names");
        if (const Expansion* e = seg->expansion) {
            if (e->base != seg->base || e->mapped() != seg->size || e->mapped() > e->capacity || seg->size == 0) {
                fail(segment + " (expandable) disagrees with its range: mapped " + std::to_string(e->mapped()) +
                     " of " + std::to_string(e->capacity) + " bytes, segment size " + std::to_string(seg->size));
            }
            if (!seg->pool_id.eager()) fail(segment + " is expandable in a graph pool");
        }
    }
}

}  // namespace npl
