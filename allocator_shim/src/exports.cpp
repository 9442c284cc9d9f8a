// The C ABI: one process-wide allocator; no exception crosses this boundary.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

#include "caching_allocator.h"
#include "npu_lifetime_shim.h"
#include "runtime_sim.h"

#define NPL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Shim {
    npl::FindingQueue findings;
    npl::CachingAllocator allocator{findings};
    std::mutex error_mu;
    std::string last_error;
    std::atomic<npl_alloc_hook> on_alloc{nullptr};
    std::atomic<npl_free_hook> on_free{nullptr};
    std::atomic<void*> hook_ctx{nullptr};
};

// Never destroyed: torch may free tensors during interpreter exit, after
// static destructors would have run.
Shim& shim() {
    static Shim* s = new Shim();
    return *s;
}

void internal_error(const char* op, const char* what) {
    npl::Finding f;
    f.kind = "internal_error";
    f.op = op;
    f.detail = what;
    try {
        shim().findings.push(std::move(f));
    } catch (...) {
    }
}

// Runs `body`, turning any exception into an internal_error finding.
template <typename T, typename Body>
T guarded(const char* op, T fallback, Body body) noexcept {
    try {
        return body();
    } catch (const std::exception& e) {
        internal_error(op, e.what());
    } catch (...) {
        internal_error(op, "unknown exception");
    }
    return fallback;
}

char* copy_string(const std::string& s) {
    char* out = static_cast<char*>(std::malloc(s.size() + 1));
    if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
    return out;
}

void set_error(const std::string& why) {
    std::lock_guard<std::mutex> lock(shim().error_mu);
    shim().last_error = why;
}

}  // namespace

NPL_EXPORT void* npl_alloc(ssize_t size, int device, void* stream) {
    void* p = guarded("alloc", static_cast<void*>(nullptr),
                      [&] { return shim().allocator.allocate(size, device, stream); });
    npl_alloc_hook hook = shim().on_alloc.load();
    if (hook != nullptr && p != nullptr) hook(p, static_cast<size_t>(size), device, stream, shim().hook_ctx.load());
    return p;
}

NPL_EXPORT void npl_free(void* ptr, ssize_t size, int device, void* stream) {
    npl_free_hook hook = shim().on_free.load();
    if (hook != nullptr && ptr != nullptr) hook(ptr, static_cast<size_t>(size), device, stream, shim().hook_ctx.load());
    guarded("free", 0, [&] {
        shim().allocator.free(ptr, size);
        return 0;
    });
}

NPL_EXPORT int npl_record_stream(void* ptr, void* stream) {
    return guarded("record_stream", -1, [&] { return shim().allocator.record_stream(ptr, stream); });
}

NPL_EXPORT int npl_erase_stream(void* ptr, void* stream) {
    return guarded("erase_stream", -1, [&] { return shim().allocator.erase_stream(ptr, stream); });
}

NPL_EXPORT int npl_record_use(void* ptr, void* stream) {
    return guarded("record_use", -1, [&] { return shim().allocator.record_use(ptr, stream, false); });
}

NPL_EXPORT int npl_note_use(void* ptr, void* stream) {
    return guarded("note_use", -1, [&] { return shim().allocator.record_use(ptr, stream, true); });
}

NPL_EXPORT int npl_set_policy(int policy) {
    if (policy != NPL_POLICY_POLL && policy != NPL_POLICY_STREAM_WAIT) return -1;
    return guarded("set_policy", -1, [&] {
        shim().allocator.set_policy(static_cast<npl::Policy>(policy));
        return 0;
    });
}

NPL_EXPORT int npl_get_policy(void) {
    return guarded("get_policy", -1, [] { return static_cast<int>(shim().allocator.policy()); });
}

NPL_EXPORT void npl_process_events(void) {
    guarded("process_events", 0, [] {
        shim().allocator.process_events();
        return 0;
    });
}

NPL_EXPORT void npl_empty_cache(void) {
    guarded("empty_cache", 0, [] {
        shim().allocator.empty_cache();
        return 0;
    });
}

NPL_EXPORT size_t npl_stats_size(void) { return sizeof(npl_stats); }

NPL_EXPORT void npl_get_stats(npl_stats* out) {
    if (out == nullptr) return;
    guarded("get_stats", 0, [&] {
        shim().allocator.stats(out);
        return 0;
    });
}

NPL_EXPORT void npl_reset_peak(void) {
    guarded("reset_peak", 0, [] {
        shim().allocator.reset_peak();
        return 0;
    });
}

NPL_EXPORT char* npl_snapshot_json(void) {
    return guarded("snapshot", static_cast<char*>(nullptr),
                   [] { return copy_string(shim().allocator.snapshot_json()); });
}

NPL_EXPORT char* npl_drain_findings_json(void) {
    return guarded("drain_findings", static_cast<char*>(nullptr),
                   [] { return copy_string(shim().findings.drain_json()); });
}

NPL_EXPORT void npl_free_string(char* s) { std::free(s); }

NPL_EXPORT int npl_select_runtime(const char* name, const char* library_path) {
    return guarded("select_runtime", -1, [&] {
        std::string which = name ? name : "auto";
        std::string why;
        const npl::Runtime* rt = nullptr;
        if (which == "cuda") {
            rt = npl::cuda_runtime(&why);
        } else if (which == "acl") {
            rt = npl::acl_runtime(library_path, &why);
        } else if (which == "sim") {
            rt = npl::sim_runtime();
        } else if (which == "auto") {
            std::string ignored;
            if (npl::library_loaded("libcudart", nullptr)) rt = npl::cuda_runtime(&ignored);
            if (rt == nullptr && npl::library_loaded("libascendcl", nullptr)) rt = npl::acl_runtime(nullptr, &ignored);
            if (rt == nullptr) rt = npl::sim_runtime();
        } else {
            why = "unknown runtime '" + which + "' (expected cuda, acl, sim or auto)";
        }
        if (rt == nullptr || !shim().allocator.set_runtime(rt, &why)) {
            set_error(why);
            return -1;
        }
        return 0;
    });
}

NPL_EXPORT const char* npl_runtime_name(void) {
    const npl::Runtime* rt = shim().allocator.runtime();
    return rt ? rt->name : "none";
}

NPL_EXPORT const char* npl_last_error(void) {
    static thread_local std::string copy;
    std::lock_guard<std::mutex> lock(shim().error_mu);
    copy = shim().last_error;
    return copy.c_str();
}

NPL_EXPORT void npl_reset(void) {
    guarded("reset", 0, [] {
        shim().allocator.reset();
        shim().findings.clear();
        npl::sim::reset_streams();
        return 0;
    });
}

NPL_EXPORT void npl_set_hooks(npl_alloc_hook on_alloc, npl_free_hook on_free, void* ctx) {
    shim().hook_ctx.store(ctx);
    shim().on_alloc.store(on_alloc);
    shim().on_free.store(on_free);
}

NPL_EXPORT void npl_sim_complete(void* stream) { npl::sim::complete(stream); }
NPL_EXPORT void npl_sim_complete_all(void) { npl::sim::complete_all(); }
NPL_EXPORT void npl_sim_set_capturing(void* stream, int capturing) { npl::sim::set_capturing(stream, capturing != 0); }
NPL_EXPORT void npl_sim_set_memory_limit(uint64_t bytes) { npl::sim::set_memory_limit(bytes); }
NPL_EXPORT uint64_t npl_sim_stream_waits(void* stream) { return npl::sim::stream_waits(stream); }
NPL_EXPORT uint64_t npl_sim_incomplete_events(void) { return npl::sim::incomplete_events(); }
