// How the invariant checkers (invariants.cpp, and the check() of each data
// structure that states its own invariants) name an address and a block in
// their sentences.
#pragma once

#include <sstream>
#include <string>

#include "block.h"

namespace npl {

inline std::string hex(const void* p) {
    std::ostringstream out;
    out << p;
    return out.str();
}

// "block 0x... (N B, device D, stream 0x...)"
inline std::string where(const Block* b) {
    return "block " + hex(b->ptr) + " (" + std::to_string(b->size) + " B, device " + std::to_string(b->device) +
           ", stream " + hex(b->stream) + ")";
}

}  // namespace npl
