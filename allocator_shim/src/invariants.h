// What the invariant checkers (invariants.cpp, and the check() of each data
// structure that states its own invariants) share: how a sentence names an
// address and a block.
#pragma once

#include <string>

#include "block.h"

namespace npl {

std::string hex(const void* p);
std::string where(const Block* b);  // "block 0x... (N B, device D, stream 0x...)"

}  // namespace npl
