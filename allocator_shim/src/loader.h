// Finding and opening runtime libraries with dlopen, and resolving symbols.
#pragma once

#include <initializer_list>
#include <string>

namespace npl {

// Opens the first library that loads: `preferred` (if non-empty), then a
// copy already loaded in the process whose path contains `fragment`, then
// each name in `sonames`.  Returns the handle, or nullptr with `why`.
void* open_runtime_library(const std::string& preferred, const char* fragment,
                           std::initializer_list<const char*> sonames, std::string* why);

// Resolves `name` in `handle` into `*slot`; on failure appends to `why`.
template <typename Fn>
bool resolve(void* handle, const char* name, Fn* slot, std::string* why);

void* resolve_symbol(void* handle, const char* name);

template <typename Fn>
bool resolve(void* handle, const char* name, Fn* slot, std::string* why) {
    void* sym = resolve_symbol(handle, name);
    if (sym == nullptr) {
        *why += std::string(why->empty() ? "" : "; ") + "missing symbol " + name;
        return false;
    }
    *slot = reinterpret_cast<Fn>(sym);
    return true;
}

}  // namespace npl
