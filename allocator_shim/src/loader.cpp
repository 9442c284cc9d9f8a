#include "loader.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>

#include "runtime.h"

namespace npl {

namespace {

struct Search {
    const char* fragment;
    std::string found;
};

int visit(struct dl_phdr_info* info, size_t, void* data) {
    auto* search = static_cast<Search*>(data);
    if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, search->fragment) != nullptr) {
        search->found = info->dlpi_name;
        return 1;
    }
    return 0;
}

}  // namespace

bool library_loaded(const char* name_fragment, std::string* path) {
    Search search{name_fragment, {}};
    dl_iterate_phdr(visit, &search);
    if (search.found.empty()) return false;
    if (path != nullptr) *path = search.found;
    return true;
}

void* resolve_symbol(void* handle, const char* name) { return dlsym(handle, name); }

void* open_runtime_library(const std::string& preferred, const char* fragment,
                           std::initializer_list<const char*> sonames, std::string* why) {
    if (!preferred.empty()) {
        void* h = dlopen(preferred.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h != nullptr) return h;
        const char* err = dlerror();
        *why = "cannot open " + preferred + ": " + (err ? err : "unknown error");
        return nullptr;
    }
    std::string loaded;
    if (library_loaded(fragment, &loaded)) {
        // The process's own copy: same runtime state as the framework's.
        void* h = dlopen(loaded.c_str(), RTLD_NOW | RTLD_NOLOAD);
        if (h != nullptr) return h;
    }
    for (const char* soname : sonames) {
        void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
        if (h != nullptr) return h;
    }
    *why = std::string("no ") + fragment + " library is loaded or loadable";
    return nullptr;
}

}  // namespace npl
