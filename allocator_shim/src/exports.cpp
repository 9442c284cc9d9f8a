// The C ABI: one process-wide allocator; no exception crosses this boundary.
#include <pthread.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "json.h"
#include "npu_lifetime_shim.h"
#include "runtime_sim.h"
#include "shim.h"

#define NPL_EXPORT extern "C" __attribute__((visibility("default")))

namespace npl {

thread_local long HookSlot::depth_ = 0;

namespace {

void lock_for_fork() {
    Shim& s = shim();
    s.allocator.lock_for_fork();
    s.findings.lock_for_fork();
    sim::lock_for_fork();
}

void unlock_in_parent() {
    Shim& s = shim();
    sim::unlock_after_fork();
    s.findings.unlock_after_fork();
    s.allocator.unlock_after_fork();
}

void unlock_in_child() {
    unlock_in_parent();
    shim().hooks.after_fork_in_child();
}

}  // namespace

Shim& shim() {
    static Shim* s = [] {
        auto* created = new Shim();
        // fork(): no lock of the shim may be held by a thread the child lacks.
        pthread_atfork(lock_for_fork, unlock_in_parent, unlock_in_child);
        return created;
    }();
    return *s;
}

void internal_error(const char* op, const char* what) noexcept {
    try {
        if (std::strcmp(op, "alloc") == 0) set_last_failure(std::string("npu_lifetime shim: the allocation failed: ") + what);
        Finding f;
        f.kind = "internal_error";
        f.op = op;
        f.detail = what;
        shim().findings.push(std::move(f));
    } catch (...) {
    }
}

}  // namespace npl

namespace {

using npl::guarded;
using npl::shim;

char* copy_string(const std::string& s) {
    char* out = static_cast<char*>(std::malloc(s.size() + 1));
    if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
    return out;
}

void set_error(const std::string& why) {
    std::lock_guard<std::mutex> lock(shim().error_mu);
    shim().last_error = why;
}

template <typename Body>
void guarded_void(const char* op, Body body) noexcept {
    guarded(op, 0, [&] {
        body();
        return 0;
    });
}

npl::PoolId pool_id(uint64_t id0, uint64_t id1) { return npl::PoolId{id0, id1}; }

}  // namespace

NPL_EXPORT void* npl_alloc(ssize_t size, int device, void* stream) {
    npl::Shim& s = shim();
    void* p = guarded("alloc", static_cast<void*>(nullptr), [&] { return s.allocator.allocate(size, device, stream); });
    if (p != nullptr) {
        s.hooks.call([&](const npl::HookSlot::Hooks& h) {
            if (h.on_alloc != nullptr) h.on_alloc(p, static_cast<size_t>(size), device, stream, h.ctx);
        });
    }
    return p;
}

NPL_EXPORT void npl_free(void* ptr, ssize_t size, int device, void* stream) {
    if (ptr == nullptr) return;
    npl::Shim& s = shim();
    // the hook (the sanitizer, which notes uncovered uses before the block goes) hears of a free only
    // when it will free a block: a refused one (unknown, double, stale) is a finding, not a free
    s.hooks.call([&](const npl::HookSlot::Hooks& h) {
        if (h.on_free == nullptr) return;
        bool valid = false;
        guarded_void("free", [&] { valid = s.allocator.would_free(ptr, size, device, stream); });
        if (valid) h.on_free(ptr, static_cast<size_t>(size), device, stream, h.ctx);
    });
    guarded_void("free", [&] { s.allocator.free(ptr, size, device, stream); });
}

NPL_EXPORT int npl_record_stream(void* ptr, void* stream) { return npl_record_stream_device(ptr, stream, -1); }

NPL_EXPORT int npl_record_stream_device(void* ptr, void* stream, int stream_device) {
    return guarded("record_stream", -1, [&] { return shim().allocator.record_stream(ptr, stream, stream_device); });
}

NPL_EXPORT int npl_erase_stream(void* ptr, void* stream) {
    return guarded("erase_stream", -1, [&] { return shim().allocator.erase_stream(ptr, stream); });
}

NPL_EXPORT int npl_record_use(void* ptr, void* stream) { return npl_record_use_device(ptr, stream, -1); }

NPL_EXPORT int npl_record_use_device(void* ptr, void* stream, int stream_device) {
    return guarded("record_use", -1, [&] { return shim().allocator.record_use(ptr, stream, stream_device, false); });
}

NPL_EXPORT int npl_note_use(void* ptr, void* stream) {
    return guarded("note_use", -1, [&] { return shim().allocator.record_use(ptr, stream, -1, true); });
}

NPL_EXPORT int npl_set_policy(int policy) {
    if (policy != NPL_POLICY_POLL && policy != NPL_POLICY_STREAM_WAIT && policy != NPL_POLICY_LAZY_WAIT) return -1;
    return guarded("set_policy", -1, [&] {
        shim().allocator.set_policy(static_cast<npl::Policy>(policy));
        return 0;
    });
}

NPL_EXPORT int npl_get_policy(void) {
    return guarded("get_policy", -1, [] { return static_cast<int>(shim().allocator.policy()); });
}

NPL_EXPORT void npl_set_expandable_segments(int enabled) {
    guarded_void("set_expandable_segments", [&] { shim().allocator.set_expandable_segments(enabled != 0); });
}

NPL_EXPORT int npl_get_expandable_segments(void) {
    return guarded("get_expandable_segments", 0, [] { return shim().allocator.expandable_segments() ? 1 : 0; });
}

NPL_EXPORT void npl_set_debug(int enabled, uint64_t quarantine_bytes) {
    guarded_void("set_debug", [&] { shim().allocator.set_debug(enabled != 0, quarantine_bytes); });
}

NPL_EXPORT int npl_get_debug(void) {
    return guarded("get_debug", 0, [] { return shim().allocator.debug() ? 1 : 0; });
}

NPL_EXPORT int npl_set_graph_capture_record_stream_reuse(int enabled) {
    return guarded("set_graph_capture_record_stream_reuse", 1,
                   [&] { return shim().allocator.set_capture_reuse(enabled != 0) ? 0 : 1; });
}

NPL_EXPORT int npl_get_graph_capture_record_stream_reuse(void) {
    return guarded("get_graph_capture_record_stream_reuse", 0,
                   [] { return shim().allocator.capture_reuse() ? 1 : 0; });
}

NPL_EXPORT int npl_set_stream_ordered(int enabled) {
    return guarded("set_stream_ordered", 1, [&] {
        std::string why;
        if (shim().allocator.set_stream_ordered(enabled != 0, &why)) return 0;
        npl::set_last_failure("npu_lifetime shim: the oracle mode: " + why);
        return 1;
    });
}

NPL_EXPORT int npl_get_stream_ordered(void) {
    return guarded("get_stream_ordered", 0, [] { return shim().allocator.stream_ordered() ? 1 : 0; });
}

NPL_EXPORT int npl_set_cross_stream_reuse(int mode) {
    if (mode != NPL_CROSS_STREAM_OFF && mode != NPL_CROSS_STREAM_ALWAYS && mode != NPL_CROSS_STREAM_IDLE) return -1;
    return guarded("set_cross_stream_reuse", -1, [&] {
        shim().allocator.set_cross_stream_reuse(static_cast<npl::CrossStream>(mode));
        return 0;
    });
}

NPL_EXPORT int npl_get_cross_stream_reuse(void) {
    return guarded("get_cross_stream_reuse", 0, [] { return static_cast<int>(shim().allocator.cross_stream_reuse()); });
}

NPL_EXPORT void npl_set_captures_announced(int announced) {
    guarded_void("set_captures_announced", [&] { shim().allocator.set_captures_announced(announced != 0); });
}

NPL_EXPORT int npl_get_captures_announced(void) {
    return guarded("get_captures_announced", 0, [] { return shim().allocator.captures_announced() ? 1 : 0; });
}

NPL_EXPORT void npl_process_events(void) {
    guarded_void("process_events", [] { shim().allocator.process_events(); });
}

NPL_EXPORT void npl_empty_cache(void) {
    guarded_void("empty_cache", [] { shim().allocator.empty_cache(); });
}

NPL_EXPORT void npl_init(int device_count) {
    guarded_void("init", [&] { shim().allocator.init(device_count); });
}

NPL_EXPORT void npl_set_memory_fraction(double fraction, int device) {
    guarded_void("set_memory_fraction", [&] { shim().allocator.set_memory_fraction(fraction, device); });
}

NPL_EXPORT double npl_get_memory_fraction(int device) {
    return guarded("get_memory_fraction", 0.0, [&] { return shim().allocator.memory_fraction(device); });
}

NPL_EXPORT void* npl_base_allocation(void* ptr, size_t* size) {
    return guarded("base_allocation", ptr, [&] { return shim().allocator.base_allocation(ptr, size); });
}

NPL_EXPORT void npl_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1, void* stream) {
    guarded_void("begin_allocate_to_pool", [&] {
        npl::StreamFilter filter;
        if (stream != nullptr) filter = [stream](npl::Stream s) { return s == stream; };
        shim().allocator.begin_allocate_to_pool(device, pool_id(id0, id1), std::move(filter), stream);
    });
}

NPL_EXPORT void npl_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1) {
    guarded_void("end_allocate_to_pool", [&] { shim().allocator.end_allocate_to_pool(device, pool_id(id0, id1)); });
}

NPL_EXPORT void npl_set_pool_allocator(int device, uint64_t id0, uint64_t id1, npl_segment_alloc_fn alloc,
                                       npl_segment_free_fn free, void* ctx) {
    guarded_void("set_pool_allocator", [&] {
        shim().allocator.set_pool_allocator(device, pool_id(id0, id1), npl::SegmentSource{alloc, free, ctx});
    });
}

NPL_EXPORT void npl_empty_pool_cache(int device, uint64_t id0, uint64_t id1) {
    guarded_void("empty_pool_cache", [&] { shim().allocator.empty_cache(pool_id(id0, id1), device); });
}

NPL_EXPORT void npl_release_pool(int device, uint64_t id0, uint64_t id1) {
    guarded_void("release_pool", [&] { shim().allocator.release_pool(device, pool_id(id0, id1)); });
}

NPL_EXPORT size_t npl_pool_live_allocations(int device, uint64_t id0, uint64_t id1, uint64_t* out, size_t capacity) {
    return guarded("pool_live_allocations", static_cast<size_t>(0), [&] {
        std::vector<void*> live = shim().allocator.pool_live_allocations(device, pool_id(id0, id1));
        for (size_t i = 0; i < live.size() && i < capacity && out != nullptr; ++i) {
            out[i] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(live[i]));
        }
        return live.size();
    });
}

NPL_EXPORT void npl_create_or_incref_pool(int device, uint64_t id0, uint64_t id1) {
    guarded_void("create_or_incref_pool", [&] { shim().allocator.create_or_incref_pool(device, pool_id(id0, id1)); });
}

NPL_EXPORT void npl_set_pool_use_on_oom(int device, uint64_t id0, uint64_t id1, int use_on_oom) {
    guarded_void("set_pool_use_on_oom",
                 [&] { shim().allocator.set_pool_use_on_oom(device, pool_id(id0, id1), use_on_oom != 0); });
}

NPL_EXPORT void npl_set_pool_no_split(int device, uint64_t id0, uint64_t id1) {
    guarded_void("set_pool_no_split", [&] { shim().allocator.set_pool_no_split(device, pool_id(id0, id1)); });
}

NPL_EXPORT int npl_pool_use_count(int device, uint64_t id0, uint64_t id1) {
    return guarded("pool_use_count", 0, [&] { return shim().allocator.pool_use_count(device, pool_id(id0, id1)); });
}

NPL_EXPORT int npl_prepare_pool_checkpoint(int device, uint64_t id0, uint64_t id1) {
    return guarded("prepare_pool_checkpoint", static_cast<int>(npl::PoolCheckpointable::unknown), [&] {
        return static_cast<int>(shim().allocator.prepare_pool_checkpoint(device, pool_id(id0, id1)));
    });
}

NPL_EXPORT size_t npl_block_records(npl_block_record* out, size_t capacity) {
    return guarded("block_records", static_cast<size_t>(0), [&] {
        std::vector<npl_block_record> records = shim().allocator.block_records();
        for (size_t i = 0; i < records.size() && i < capacity && out != nullptr; ++i) out[i] = records[i];
        return records.size();
    });
}

NPL_EXPORT void npl_claim_next(void* ptr) {
    guarded_void("claim_next", [&] { shim().allocator.claim_next(ptr); });
}

NPL_EXPORT size_t npl_stats_count(void) { return npl::stat_names().size(); }

NPL_EXPORT char* npl_stats_names_json(void) {
    return guarded("stats_names", static_cast<char*>(nullptr), [] {
        npl::Json j;
        j.open_array();
        for (const std::string& name : npl::stat_names()) j.value(name);
        j.close_array();
        return copy_string(j.str());
    });
}

NPL_EXPORT char* npl_stats_meanings_json(void) {
    return guarded("stats_meanings", static_cast<char*>(nullptr), [] { return copy_string(npl::stat_meanings_json()); });
}

NPL_EXPORT size_t npl_stats_values(int device, uint64_t* out, size_t capacity) {
    return guarded("stats_values", static_cast<size_t>(0), [&]() -> size_t {
        size_t n = npl::stat_names().size();
        if (out == nullptr || capacity < n) return 0;
        shim().allocator.stats(device, out);
        return n;
    });
}

NPL_EXPORT void npl_reset_peak(int device) {
    guarded_void("reset_peak", [&] { shim().allocator.reset_peak(device); });
}

NPL_EXPORT void npl_reset_accumulated(int device) {
    guarded_void("reset_accumulated", [&] { shim().allocator.reset_accumulated(device); });
}

NPL_EXPORT char* npl_snapshot_json(void) {
    return guarded("snapshot", static_cast<char*>(nullptr),
                   [] { return copy_string(shim().allocator.snapshot_json()); });
}

NPL_EXPORT char* npl_drain_findings_json(void) {
    return guarded("drain_findings", static_cast<char*>(nullptr),
                   [] { return copy_string(shim().findings.drain_json()); });
}

NPL_EXPORT char* npl_drain_trace_json(void) {
    return guarded("drain_trace", static_cast<char*>(nullptr),
                   [] { return copy_string(shim().allocator.drain_trace_json()); });
}

NPL_EXPORT void npl_set_trace(int enabled, size_t capacity) {
    guarded_void("set_trace", [&] { shim().allocator.configure_trace(enabled != 0, capacity); });
}

NPL_EXPORT void npl_free_string(char* s) { std::free(s); }

NPL_EXPORT char* npl_check_invariants(void) {
    return guarded("check_invariants", static_cast<char*>(nullptr), [] {
        npl::Json j;
        j.open_array();
        for (const std::string& what : shim().allocator.invariant_violations()) j.value(what);
        j.close_array();
        return copy_string(j.str());
    });
}

NPL_EXPORT int npl_invariant_checks_built_in(void) {
#ifdef NPL_CHECK_INVARIANTS
    return 1;
#else
    return 0;
#endif
}

namespace {

// The runtime `name` names (loading it), or nullptr with `why`.
const npl::Runtime* find_runtime(const char* name, const char* library_path, std::string* why) {
    std::string which = name ? name : "auto";
    const npl::Runtime* rt = nullptr;
    if (which == "cuda") {
        rt = npl::cuda_runtime(why);
    } else if (which == "acl") {
        rt = npl::acl_runtime(library_path, why);
    } else if (which == "sim") {
        rt = npl::sim_runtime();
    } else if (which == "auto") {
        std::string ignored;
        if (npl::library_loaded("libcudart", nullptr)) rt = npl::cuda_runtime(&ignored);
        if (rt == nullptr && npl::library_loaded("libascendcl", nullptr)) rt = npl::acl_runtime(nullptr, &ignored);
        if (rt == nullptr) rt = npl::sim_runtime();
    } else {
        *why = "unknown runtime '" + which + "' (expected cuda, acl, sim or auto)";
    }
    return rt;
}

}  // namespace

NPL_EXPORT int npl_probe_runtime(const char* name, const char* library_path) {
    return guarded("probe_runtime", -1, [&] {
        std::string why;
        const npl::Runtime* rt = find_runtime(name, library_path, &why);
        int devices = 0, code = 0;
        if (rt != nullptr && (rt->device_count(&devices, &code) != npl::Status::ok || devices < 1)) {
            const char* words = rt->error_string(code);
            why = std::string("the ") + rt->name + " runtime loads but sees no device" +
                  (code != 0 && words != nullptr && *words ? std::string(" (") + words + ")" : std::string());
            rt = nullptr;
        }
        const npl::Runtime* current = shim().allocator.runtime();
        if (rt != nullptr && current != nullptr && current != rt && shim().allocator.holds_memory()) {
            rt = nullptr;
            why = std::string("the shim holds memory of the ") + current->name + " runtime";
        }
        if (rt == nullptr) set_error(why);
        return rt == nullptr ? -1 : 0;
    });
}

NPL_EXPORT int npl_select_runtime(const char* name, const char* library_path) {
    return guarded("select_runtime", -1, [&] {
        std::string why;
        const npl::Runtime* rt = find_runtime(name, library_path, &why);
        if (rt == nullptr || !shim().allocator.set_runtime(rt, &why)) {
            set_error(why);
            return -1;
        }
        return 0;
    });
}

NPL_EXPORT int npl_set_acl_queue_ops(const npl_queue_ops* ops) {
    return guarded("set_acl_queue_ops", -1, [&] {
        std::string why;
        if (!npl::set_acl_queue_ops(ops, shim().allocator.runtime(), &why)) {
            set_error(why);
            return -1;
        }
        return 0;
    });
}

NPL_EXPORT int npl_device_count(void) {
    return guarded("device_count", -1, [] {
        const npl::Runtime* rt = shim().allocator.runtime();
        int devices = 0, code = 0;
        if (rt == nullptr || rt->device_count(&devices, &code) != npl::Status::ok) return -1;
        return devices;
    });
}

NPL_EXPORT const char* npl_runtime_name(void) {
    return guarded("runtime_name", static_cast<const char*>("none"), [] {
        const npl::Runtime* rt = shim().allocator.runtime();
        return rt ? rt->name : "none";
    });
}

NPL_EXPORT const char* npl_last_error(void) {
    static thread_local std::string copy;
    std::lock_guard<std::mutex> lock(shim().error_mu);
    copy = shim().last_error;
    return copy.c_str();
}

NPL_EXPORT const char* npl_last_oom_message(void) { return npl::last_oom_message().c_str(); }

NPL_EXPORT void npl_reset(void) {
    guarded_void("reset", [] {
        shim().allocator.reset();
        shim().findings.clear();
        npl::sim::reset_streams();
    });
}

NPL_EXPORT void npl_set_history_hook(npl_history_hook hook, void* ctx) {
    guarded_void("set_history_hook", [&] { shim().allocator.set_history_hook(hook, ctx); });
}

NPL_EXPORT void npl_set_hooks(npl_alloc_hook on_alloc, npl_free_hook on_free, void* ctx) {
    guarded_void("set_hooks", [&] { shim().hooks.set(on_alloc, on_free, ctx); });
}

NPL_EXPORT void npl_sim_complete(void* stream) { npl::sim::complete(stream); }
NPL_EXPORT void npl_sim_complete_all(void) { npl::sim::complete_all(); }
NPL_EXPORT void npl_sim_complete_to(void* stream, uint64_t position) { npl::sim::complete_to(stream, position); }
NPL_EXPORT uint64_t npl_sim_launch(void* stream) { return npl::sim::launch(stream); }
NPL_EXPORT void* npl_sim_record_event(void* stream) { return npl::sim::record_event(stream); }
NPL_EXPORT void npl_sim_wait_event(void* stream, void* event) { npl::sim::wait_event(stream, event); }
NPL_EXPORT void npl_sim_set_capturing(void* stream, int capturing) { npl::sim::set_capturing(stream, capturing != 0); }
NPL_EXPORT void npl_sim_set_memory_limit(uint64_t bytes) { npl::sim::set_memory_limit(bytes); }
NPL_EXPORT void npl_sim_set_device(int device) { npl::sim::set_device(device); }
NPL_EXPORT uint64_t npl_sim_stream_waits(void* stream) { return npl::sim::stream_waits(stream); }
NPL_EXPORT uint64_t npl_sim_incomplete_events(void) { return npl::sim::incomplete_events(); }
NPL_EXPORT uint64_t npl_sim_event_syncs(void) { return npl::sim::event_syncs(); }
NPL_EXPORT int npl_sim_fail_next(const char* call, uint64_t n) { return npl::sim::fail_next(call, n) ? 0 : -1; }
NPL_EXPORT uint64_t npl_sim_calls(const char* call) { return npl::sim::calls(call); }
NPL_EXPORT uint64_t npl_sim_completed(void* stream) { return npl::sim::completed(stream); }
NPL_EXPORT uint64_t npl_sim_mapped_bytes(void) { return npl::sim::mapped_bytes(); }
NPL_EXPORT uint64_t npl_sim_reserved_bytes(void) { return npl::sim::reserved_bytes(); }
NPL_EXPORT int npl_sim_accessible(const void* ptr, size_t size) { return npl::sim::accessible(ptr, size) ? 1 : 0; }
NPL_EXPORT uint64_t npl_sim_illegal_accesses(void) { return npl::sim::illegal_accesses(); }
NPL_EXPORT int npl_sim_fill(void* stream, void* ptr, int byte, size_t size) {
    int code = 0;
    return npl::sim_runtime()->memset_async(ptr, byte, size, stream, &code) == npl::Status::ok ? 0 : -1;
}

namespace {
size_t copy_nodes(const std::vector<npl::GraphNode>& nodes, void** out, size_t capacity) {
    for (size_t i = 0; i < nodes.size() && i < capacity; ++i) out[i] = nodes[i];
    return nodes.size();
}
}  // namespace

NPL_EXPORT size_t npl_sim_capture_frontier(void* stream, uint64_t* capture, void** out, size_t capacity) {
    return guarded("sim_capture_frontier", size_t{0}, [&] {
        npl::CaptureInfo info;
        int code = 0;
        if (npl::sim_capture_topology()->capture_info(stream, &info, &code) != npl::Status::ok) return size_t{0};
        if (capture != nullptr) *capture = info.id;
        return copy_nodes(info.frontier, out, capacity);
    });
}

NPL_EXPORT size_t npl_sim_node_parents(void* node, void** out, size_t capacity) {
    return guarded("sim_node_parents", size_t{0}, [&] {
        std::vector<npl::GraphNode> parents;
        int code = 0;
        if (npl::sim_capture_topology()->node_parents(node, &parents, &code) != npl::Status::ok) return size_t{0};
        return copy_nodes(parents, out, capacity);
    });
}
