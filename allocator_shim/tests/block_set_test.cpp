// BlockSet against a reference: random inserts, erases and replacements
// (in place or not), checking after every step that best-fit lookups and
// in-order walks see exactly what a sorted vector of the same blocks sees.
//   block_set_test [STEPS] [SEED]   -> prints {"steps": N, "in_place": K, "moved": M}
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../src/block.h"

using npl::Block;
using npl::BlockSet;

namespace {

bool before(const Block* a, const Block* b) { return a->size != b->size ? a->size < b->size : a->ptr < b->ptr; }

[[noreturn]] void fail(const char* what, long step) {
    std::fprintf(stderr, "step %ld: %s\n", step, what);
    std::exit(1);
}

void check(const BlockSet& set, std::vector<Block*> ref, std::mt19937_64& rng, long step) {
    std::sort(ref.begin(), ref.end(), before);
    if (set.size() != ref.size()) fail("size differs", step);
    // a walk from the smallest block sees every block in order
    size_t i = 0;
    for (Block* b = set.at_least(0); b != nullptr; b = set.after(b), ++i) {
        if (i >= ref.size() || ref[i] != b) fail("in-order walk differs", step);
    }
    if (i != ref.size()) fail("walk ended early", step);
    for (int probe = 0; probe < 4; ++probe) {  // best fit for random sizes
        size_t size = rng() % 80 + 1;
        auto it = std::find_if(ref.begin(), ref.end(), [&](Block* b) { return b->size >= size; });
        if (set.at_least(size) != (it == ref.end() ? nullptr : *it)) fail("best fit differs", step);
    }
}

}  // namespace

int main(int argc, char** argv) {
    long steps = argc > 1 ? std::atol(argv[1]) : 200000;
    std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
    std::vector<Block> storage(512);
    std::vector<Block*> free_blocks, in_set;
    for (size_t i = 0; i < storage.size(); ++i) {
        storage[i].ptr = reinterpret_cast<char*>(0x100000 + i * 0x1000);
        free_blocks.push_back(&storage[i]);
    }
    BlockSet set;
    long in_place = 0, moved = 0;
    auto fresh = [&]() {
        size_t k = rng() % free_blocks.size();
        Block* b = free_blocks[k];
        free_blocks[k] = free_blocks.back();
        free_blocks.pop_back();
        b->size = rng() % 64 + 1;  // few sizes: many ties broken by address
        return b;
    };
    for (long step = 0; step < steps; ++step) {
        unsigned op = rng() % 3;
        if (op == 0 && !free_blocks.empty() && in_set.size() < 200) {
            Block* b = fresh();
            set.insert(b);
            in_set.push_back(b);
        } else if (op == 1 && !in_set.empty()) {
            size_t k = rng() % in_set.size();
            set.erase(in_set[k]);
            free_blocks.push_back(in_set[k]);
            in_set[k] = in_set.back();
            in_set.pop_back();
        } else if (!in_set.empty() && !free_blocks.empty()) {
            size_t k = rng() % in_set.size();
            Block* old = in_set[k];
            Block* b = fresh();
            if (rng() % 2) b->size = old->size + (rng() % 3) - 1;  // near: often sorts in old's place
            if (b->size == 0) b->size = 1;
            // does b sort where old is?  (then replace reuses old's node)
            std::vector<Block*> sorted = in_set;
            std::sort(sorted.begin(), sorted.end(), before);
            size_t at = std::find(sorted.begin(), sorted.end(), old) - sorted.begin();
            bool here = (at == 0 || before(sorted[at - 1], b)) && (at + 1 == sorted.size() || before(b, sorted[at + 1]));
            set.replace(old, b, before(b, old) ? BlockSet::Order::smaller : BlockSet::Order::larger);
            (here ? in_place : moved)++;
            free_blocks.push_back(old);
            in_set[k] = b;
        }
        check(set, in_set, rng, step);
    }
    std::printf("{\"steps\": %ld, \"in_place\": %ld, \"moved\": %ld}\n", steps, in_place, moved);
    return 0;
}
