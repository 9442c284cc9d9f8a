// The one process-wide allocator behind the C ABI and torch's hooks.
#pragma once

#include <exception>
#include <mutex>
#include <string>

#include "caching_allocator.h"
#include "findings.h"
#include "hook_slot.h"

namespace npl {

struct Shim {
    FindingQueue findings;
    CachingAllocator allocator{findings};
    HookSlot hooks;
    std::mutex error_mu;
    std::string last_error;
};

// Never destroyed: torch may free tensors during interpreter exit, after
// static destructors would have run.
Shim& shim();

void internal_error(const char* op, const char* what) noexcept;

// Runs `body`, turning any exception into an internal_error finding.  A
// build with -DNPL_CHECK_INVARIANTS checks the allocator's invariants after
// every entry point (invariants.cpp).
template <typename T, typename Body>
T guarded(const char* op, T fallback, Body body) noexcept {
    try {
#ifdef NPL_CHECK_INVARIANTS
        T out = body();
        shim().allocator.check_invariants(op);
        return out;
#else
        return body();
#endif
    } catch (const std::exception& e) {
        internal_error(op, e.what());
    } catch (...) {
        internal_error(op, "unknown exception");
    }
    return fallback;
}

}  // namespace npl
