// The CUDA bridge: the shim as torch's CUDA allocator, with every entry
// point torch reaches, not only the ones a pluggable allocator can set.
//
// torch's CUDAPluggableAllocator takes alloc/free and eight setters; the
// rest of its CUDAAllocator interface raises "does not yet support":
// cacheInfo (cudnn benchmark's workspace sizing), recordHistory and the
// traces of snapshot() (torch.cuda.memory._record_memory_history, the
// memory_viz workflow), createOrIncrefPool/getPoolUseCount (MemPool),
// checkPoolLiveAllocations and the pool checkpoints cudagraph trees restore
// (getCheckpointState/setCheckpointPoolState).  ShimCudaAllocator is a
// CUDAPluggableAllocator that answers those from the shim, so torch's own
// C++ (the snapshot's conversion to Python, the storages a checkpoint
// rewires) runs unchanged on top.  Like oom_bridge.cpp it is built at
// install() against the torch in use (npu_lifetime/shim/bridge.py) and
// reaches the shim only through the shim's C ABI (found with dlsym in the
// loaded shim), so the shim itself stays free of torch and CUDA headers.
//
// Invariants:
// - every allocation torch sees goes through CUDAPluggableAllocator::malloc
//   (its bookkeeping of size/device/stream for raw_delete), checkpoint
//   restores included;
// - nothing here holds a lock while calling into the shim or into Python
//   (the context recorder takes the GIL): History's mutex guards only its
//   own containers;
// - no C++ exception leaves the extern "C" functions.
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "npu_lifetime_shim.h"

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::cuda::MempoolId_t;
using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// The shim's C ABI, as found in the loaded shim.
struct Shim {
    void* (*alloc)(ssize_t, int, void*);
    void (*free)(void*, ssize_t, int, void*);
    const char* (*oom_message)();
    void (*init)(int);
    void (*empty_cache)();
    void (*set_fraction)(double, int);
    void* (*base_alloc)(void*, size_t*);
    void (*record_stream)(void*, void*);
    void (*begin_pool)(int, MempoolId_t, std::function<bool(cudaStream_t)>);
    void (*end_pool)(int, MempoolId_t);
    void (*release_pool)(int, MempoolId_t);
    void (*empty_pool_cache)(int, uint64_t, uint64_t);
    void (*set_pool_allocator)(int, uint64_t, uint64_t, npl_segment_alloc_fn, npl_segment_free_fn, void*);
    char* (*stats_names_json)();
    size_t (*stats_values)(int, uint64_t*, size_t);
    void (*reset_peak)(int);
    void (*reset_accumulated)(int);
    double (*get_fraction)(int);
    void (*incref_pool)(int, uint64_t, uint64_t);
    int (*pool_use_count)(int, uint64_t, uint64_t);
    void (*set_pool_use_on_oom)(int, uint64_t, uint64_t, int);
    void (*set_pool_no_split)(int, uint64_t, uint64_t);
    size_t (*block_records)(npl_block_record*, size_t);
    void (*claim_next)(void*);
    int (*prepare_pool_checkpoint)(int, uint64_t, uint64_t);
    void (*set_history_hook)(npl_history_hook, void*);
    void (*set_expandable)(int);
    int (*set_capture_reuse)(int);
};

template <typename F>
bool find(void* lib, const char* name, F* out, std::string* missing) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (*out == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
    return *out != nullptr;
}

// The shim's functions, or the names it lacks.
std::string load_shim(const char* path, Shim* s) {
    void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return std::string("the shim is not loaded: ") + dlerror();
    std::string missing;
    find(lib, "npl_alloc", &s->alloc, &missing);
    find(lib, "npl_free", &s->free, &missing);
    find(lib, "npl_last_oom_message", &s->oom_message, &missing);
    find(lib, "npl_torch_init", &s->init, &missing);
    find(lib, "npl_torch_empty_cache", &s->empty_cache, &missing);
    find(lib, "npl_torch_set_memory_fraction", &s->set_fraction, &missing);
    find(lib, "npl_torch_base_alloc", &s->base_alloc, &missing);
    find(lib, "npl_torch_record_stream", &s->record_stream, &missing);
    find(lib, "npl_torch_begin_allocate_to_pool", &s->begin_pool, &missing);
    find(lib, "npl_torch_end_allocate_to_pool", &s->end_pool, &missing);
    find(lib, "npl_torch_release_pool", &s->release_pool, &missing);
    find(lib, "npl_empty_pool_cache", &s->empty_pool_cache, &missing);
    find(lib, "npl_set_pool_allocator", &s->set_pool_allocator, &missing);
    find(lib, "npl_stats_names_json", &s->stats_names_json, &missing);
    find(lib, "npl_stats_values", &s->stats_values, &missing);
    find(lib, "npl_reset_peak", &s->reset_peak, &missing);
    find(lib, "npl_reset_accumulated", &s->reset_accumulated, &missing);
    find(lib, "npl_get_memory_fraction", &s->get_fraction, &missing);
    find(lib, "npl_create_or_incref_pool", &s->incref_pool, &missing);
    find(lib, "npl_pool_use_count", &s->pool_use_count, &missing);
    find(lib, "npl_set_pool_use_on_oom", &s->set_pool_use_on_oom, &missing);
    find(lib, "npl_set_pool_no_split", &s->set_pool_no_split, &missing);
    find(lib, "npl_block_records", &s->block_records, &missing);
    find(lib, "npl_claim_next", &s->claim_next, &missing);
    find(lib, "npl_prepare_pool_checkpoint", &s->prepare_pool_checkpoint, &missing);
    find(lib, "npl_set_history_hook", &s->set_history_hook, &missing);
    find(lib, "npl_set_expandable_segments", &s->set_expandable, &missing);
    find(lib, "npl_set_graph_capture_record_stream_reuse", &s->set_capture_reuse, &missing);
    dlclose(lib);  // RTLD_NOLOAD took a reference; ctypes keeps the shim loaded
    return missing.empty() ? "" : "the shim lacks " + missing;
}

std::vector<npl_block_record> block_records(const Shim& shim) {
    std::vector<npl_block_record> out(256);
    for (;;) {
        size_t n = shim.block_records(out.data(), out.size());
        if (n <= out.size()) {
            out.resize(n);
            return out;
        }
        out.resize(n + 64);  // blocks were added between the two calls: ask again
    }
}

// The shim's statistics by name ("allocated_bytes.all.current": value).
std::unordered_map<std::string, int64_t> stats_by_name(const Shim& shim, int device) {
    std::vector<std::string> names;
    if (char* json = shim.stats_names_json()) {  // a JSON list of plain names: no escapes
        for (const char* p = json; (p = std::strchr(p, '"')) != nullptr;) {
            const char* end = std::strchr(p + 1, '"');
            if (end == nullptr) break;
            names.emplace_back(p + 1, end);
            p = end + 1;
        }
        std::free(json);
    }
    std::vector<uint64_t> values(names.size());
    std::unordered_map<std::string, int64_t> out;
    if (names.empty() || shim.stats_values(device, values.data(), values.size()) != names.size()) return out;
    for (size_t i = 0; i < names.size(); ++i) out[names[i]] = static_cast<int64_t>(values[i]);
    return out;
}

// torch's DeviceStats from the shim's: what C++ callers (torch.accelerator's
// memory_stats) read.
c10::CachingDeviceAllocator::DeviceStats device_stats(const Shim& shim, int device) {
    auto named = stats_by_name(shim, device);
    auto get = [&](const std::string& key) {
        auto it = named.find(key);
        return it == named.end() ? 0 : it->second;
    };
    auto fill = [&](auto& array, const char* name) {
        const char* pools[] = {"all", "small_pool", "large_pool"};
        for (size_t i = 0; i < 3; ++i) {
            std::string prefix = std::string(name) + "." + pools[i] + ".";
            array[i].current = get(prefix + "current");
            array[i].peak = get(prefix + "peak");
            array[i].allocated = get(prefix + "allocated");
            array[i].freed = get(prefix + "freed");
        }
    };
    c10::CachingDeviceAllocator::DeviceStats s;
    fill(s.allocation, "allocation");
    fill(s.segment, "segment");
    fill(s.active, "active");
    fill(s.inactive_split, "inactive_split");
    fill(s.allocated_bytes, "allocated_bytes");
    fill(s.reserved_bytes, "reserved_bytes");
    fill(s.active_bytes, "active_bytes");
    fill(s.inactive_split_bytes, "inactive_split_bytes");
    fill(s.requested_bytes, "requested_bytes");
    s.num_alloc_retries = get("num_alloc_retries");
    s.num_ooms = get("num_ooms");
    s.num_sync_all_streams = get("num_sync_all_streams");
    s.num_device_alloc = get("num_device_alloc");
    s.num_device_free = get("num_device_free");
    return s;
}

// A MemPool's own allocator as the shim's segment source for its pool
// (ctx: the allocator, kept alive by the bridge).  No exception crosses into
// the shim: a failed allocation is NULL, the shim's out-of-memory path.
void* pool_segment_alloc(size_t size, int device, void* stream, void* ctx) {
    try {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        return static_cast<cca::CUDAAllocator*>(ctx)->raw_alloc_with_stream(size, static_cast<cudaStream_t>(stream));
    } catch (...) {
        return nullptr;
    }
}

void pool_segment_free(void* ptr, size_t /*size*/, int device, void* /*stream*/, void* ctx) {
    try {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        static_cast<cca::CUDAAllocator*>(ctx)->raw_delete(ptr);
    } catch (...) {
    }
}

bool in_pool(const npl_block_record& r, MempoolId_t id) { return r.pool_id0 == id.first && r.pool_id1 == id.second; }

// torch's memory history (_record_memory_history): a trace ring per device
// and the stack of each live allocation, both from torch's context recorder.
// The entries are torch's allocator's, one for one and in its order: ALLOC
// and FREE_REQUESTED here around npl_alloc / npl_free, and what only the
// allocator sees (SEGMENT_ALLOC/FREE/MAP/UNMAP, FREE_COMPLETED once a free's
// events fired) from the shim's history hook, as it happens: for one
// allocation with a new segment and its free, SEGMENT_ALLOC, ALLOC,
// FREE_REQUESTED, FREE_COMPLETED.
// Every allocation and free passes through here: with history off (the
// usual case) and no stack kept, each call returns after atomic loads,
// without the lock.  As torch's allocator, a live block keeps the stack it
// was allocated with after history is turned off, until its free:
// cudagraph trees record history only while recording a graph and then
// name a leaked block by that stack (test_workspace_allocation_error).
class History {
   public:
    void configure(bool enabled, cca::CreateContextFn recorder, size_t max_entries, cca::RecordContext when,
                   bool clear) {
        std::lock_guard<std::mutex> lock(mu_);
        enabled_.store(enabled, std::memory_order_relaxed);
        recorder_ = recorder;
        max_entries_ = std::max<size_t>(max_entries, 1);
        when_ = enabled ? when : cca::RecordContext::NEVER;
        if (clear || !enabled) traces_.clear();
        if (!enabled) freeing_.clear();
    }
    bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
    // The caller's stack, if this kind of event keeps one (gathered without the lock).
    std::shared_ptr<c10::GatheredContext> context(cca::RecordContext needed) {
        if (!enabled()) return nullptr;
        cca::CreateContextFn recorder = nullptr;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (when_ >= needed) recorder = recorder_;
        }
        return recorder != nullptr ? recorder() : nullptr;
    }
    // The stack of the allocation or free this thread is inside, for the
    // shim's history hook (torch gives a segment the stack of its malloc).
    static std::shared_ptr<c10::GatheredContext>*& calling_context() {
        static thread_local std::shared_ptr<c10::GatheredContext>* ctx = nullptr;
        return ctx;
    }
    // npl_history_hook: under the shim's lock, never calling back into it.
    static void on_shim_action(int action, void* ptr, uint64_t size, int device, void* stream, uint64_t id0,
                               uint64_t id1, void* self) {
        try {
            static_cast<History*>(self)->shim_action(action, ptr, size, device, stream, MempoolId_t{id0, id1});
        } catch (...) {  // (no exception into the shim: an entry lost)
        }
    }
    void on_alloc(void* ptr, size_t size, int device, cudaStream_t stream,
                  const std::shared_ptr<c10::GatheredContext>& ctx) {
        if (!enabled()) return;
        std::lock_guard<std::mutex> lock(mu_);
        if (!enabled()) return;
        if (ctx != nullptr) {
            contexts_[ptr] = ctx;
            keeping_.store(true, std::memory_order_release);
        }
        add(cca::TraceEntry::ALLOC, device, ptr, size, stream, when_ >= cca::RecordContext::ALLOC ? ctx : nullptr);
    }
    // As torch's: the free's stack, else the allocation's; FREE_COMPLETED
    // follows from the shim once the block is really free (at once when it
    // waits for nothing) with the same stack.
    void on_free(void* ptr, size_t size, int device, cudaStream_t stream, std::shared_ptr<c10::GatheredContext> ctx) {
        if (!enabled() && !keeping_.load(std::memory_order_acquire)) return;
        std::lock_guard<std::mutex> lock(mu_);
        auto kept = contexts_.find(ptr);
        if (kept != contexts_.end()) {
            if (ctx == nullptr) ctx = kept->second;
            contexts_.erase(kept);
            if (contexts_.empty()) keeping_.store(false, std::memory_order_release);
        }
        if (!enabled()) return;
        add(cca::TraceEntry::FREE_REQUESTED, device, ptr, size, stream, ctx);
        freeing_[ptr] = std::move(ctx);
    }
    // torch's: the device's free memory as the address, the rounded size.
    void on_oom(int device, size_t size, cudaStream_t stream) {
        if (!enabled()) return;
        size_t free_bytes = 0, total = 0;
        {
            c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
            if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
                (void)cudaGetLastError();  // (the entry says 0 free)
                free_bytes = 0;
            }
        }
        size_t rounded = (size + 511) / 512 * 512;
        std::lock_guard<std::mutex> lock(mu_);
        if (enabled()) {
            add(cca::TraceEntry::OOM, device, reinterpret_cast<void*>(free_bytes), rounded, stream, nullptr);
        }
    }
    // As torch's allocator, each snapshot is an entry of each device's trace.
    void on_snapshot(int device, size_t active_bytes, MempoolId_t pool) {
        if (!enabled()) return;
        std::lock_guard<std::mutex> lock(mu_);
        if (enabled()) add(cca::TraceEntry::SNAPSHOT, device, nullptr, active_bytes, nullptr, nullptr, pool);
    }
    std::shared_ptr<c10::GatheredContext> allocated_at(void* ptr) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = contexts_.find(ptr);
        return it == contexts_.end() ? nullptr : it->second;
    }
    std::vector<std::vector<cca::TraceEntry>> traces(size_t devices) {
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<std::vector<cca::TraceEntry>> out(devices);
        for (auto& entry : traces_) {
            if (entry.first >= 0 && static_cast<size_t>(entry.first) < devices) {
                out[entry.first].assign(entry.second.begin(), entry.second.end());
            }
        }
        return out;
    }

   private:
    void shim_action(int action, void* ptr, uint64_t size, int device, void* stream, MempoolId_t pool) {
        if (!enabled()) return;
        std::lock_guard<std::mutex> lock(mu_);
        if (!enabled()) return;
        std::shared_ptr<c10::GatheredContext> ctx;
        cca::TraceEntry::Action entry = cca::TraceEntry::FREE_COMPLETED;
        switch (action) {
            case NPL_HISTORY_SEGMENT_ALLOC: entry = cca::TraceEntry::SEGMENT_ALLOC; break;
            case NPL_HISTORY_SEGMENT_FREE: entry = cca::TraceEntry::SEGMENT_FREE; break;
            case NPL_HISTORY_SEGMENT_MAP: entry = cca::TraceEntry::SEGMENT_MAP; break;
            case NPL_HISTORY_SEGMENT_UNMAP: entry = cca::TraceEntry::SEGMENT_UNMAP; break;
            case NPL_HISTORY_FREE_COMPLETED: {
                auto it = freeing_.find(ptr);
                if (it != freeing_.end()) {
                    ctx = std::move(it->second);
                    freeing_.erase(it);
                }
                break;
            }
            default: return;
        }
        if (action != NPL_HISTORY_FREE_COMPLETED && calling_context() != nullptr) ctx = *calling_context();
        add(entry, device, ptr, size, static_cast<cudaStream_t>(stream), std::move(ctx), pool);
    }

    void add(cca::TraceEntry::Action action, int device, void* ptr, size_t size, cudaStream_t stream,
             std::shared_ptr<c10::GatheredContext> ctx, MempoolId_t pool = {0, 0}) {
        auto& ring = traces_[device];
        ring.emplace_back(action, static_cast<c10::DeviceIndex>(device), reinterpret_cast<size_t>(ptr), size,
                          static_cast<void*>(stream), pool, c10::getApproximateTime(), std::move(ctx));
        while (ring.size() > max_entries_) ring.pop_front();
    }

    std::mutex mu_;
    std::atomic<bool> enabled_{false};
    std::atomic<bool> keeping_{false};  // contexts_ is not empty
    cca::CreateContextFn recorder_ = nullptr;
    size_t max_entries_ = 1;
    cca::RecordContext when_ = cca::RecordContext::NEVER;
    std::map<int, std::deque<cca::TraceEntry>> traces_;
    std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts_;
    std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> freeing_;  // FREE_REQUESTED, not completed
};

// torch's allocator setting graph_capture_record_stream_reuse
// (_set_allocator_settings, PYTORCH_CUDA_ALLOC_CONF), where this torch has
// it (2.9 and later); false where it does not.
template <typename Config>
auto torch_capture_reuse(int) -> decltype(bool(Config::graph_capture_record_stream_reuse())) {
    return Config::graph_capture_record_stream_reuse();
}
template <typename Config>
bool torch_capture_reuse(long) {
    return false;
}

// The snapshot's config_metadata names the setting where this torch's has the field.
template <typename Metadata>
auto note_capture_reuse(Metadata& m, bool on, int) -> decltype(void(m.graph_capture_record_stream_reuse = on)) {
    m.graph_capture_record_stream_reuse = on;
}
template <typename Metadata>
void note_capture_reuse(Metadata&, bool, long) {}

// A pool's live blocks at a checkpoint, each at its block's (rounded) size as
// torch's PrivatePoolState keeps them: what setCheckpointPoolState re-creates.
// The free blocks between them come back with them (what a claim leaves).
struct PoolState : cca::AllocatorState {
    struct Live {
        void* ptr;
        size_t size;
        cudaStream_t stream;
    };
    int device = 0;
    MempoolId_t id{0, 0};
    std::vector<Live> live;  // in address order
};

class ShimCudaAllocator : public CUDAPluggableAllocator {
   public:
    ShimCudaAllocator(const Shim& shim, std::shared_ptr<History> history)
        : CUDAPluggableAllocator(alloc_fn(shim, history), free_fn(shim, history)), shim_(shim), history_(history) {
        set_init_fn(shim.init);
        set_reset_fn(shim.empty_cache);
        set_memory_fraction_fn(shim.set_fraction);
        set_base_alloc_fn(shim.base_alloc);
        set_record_stream_fn(shim.record_stream);
        set_begin_allocate_to_pool(shim.begin_pool);
        set_end_allocate_to_pool_fn(shim.end_pool);
        set_release_pool(shim.release_pool);
    }

    std::string name() override { return "npu_lifetime"; }

    // A capture begins: torch's graph_capture_record_stream_reuse, read now
    // (torch's tests set it just before), becomes the shim's for this capture.
    void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id,
                             std::function<bool(cudaStream_t)> filter) override {
        bool reuse = torch_capture_reuse<cca::CUDAAllocatorConfig>(0);
        if (shim_.set_capture_reuse(reuse ? 1 : 0) != 0) {
            TORCH_WARN_ONCE("npu_lifetime shim: graph_capture_record_stream_reuse is not supported with this CUDA "
                            "runtime (no capture topology calls); a block freed during a capture with recorded "
                            "streams waits for the capture's end");
        }
        CUDAPluggableAllocator::beginAllocateToPool(device, id, std::move(filter));
    }

    // The shim needs no init: it is ready once installed, even where torch's
    // CUDA init ran before the install (torch.accelerator.memory_stats
    // returns {} for an allocator not initialized).
    bool initialized() override { return true; }

    // C++ callers of the statistics (torch.accelerator.memory_stats & co.).
    c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override { return device_stats(shim_, device); }
    void resetPeakStats(c10::DeviceIndex device) override { shim_.reset_peak(device); }
    void resetAccumulatedStats(c10::DeviceIndex device) override { shim_.reset_accumulated(device); }
    double getMemoryFraction(c10::DeviceIndex device) override { return shim_.get_fraction(device); }

    // ~MemPool empties its pool's cache (emptyCache(id)); the pluggable
    // allocator would empty every pool's, the eager cache included.
    void emptyCache(MempoolId_t id) override {
        if (id.first == 0 && id.second == 0) {
            shim_.empty_cache();
        } else {
            shim_.empty_pool_cache(-1, id.first, id.second);
        }
    }

    // cudnn benchmark sizes its workspace by the largest block it could get
    // without a new segment, or the device's free memory if none is cached.
    // torch's rule (cudnn benchmark's workspace cap, which passes 0): from
    // the device's free memory when *largest is 0, else from *largest, the
    // largest cached block of any pool, large, small or graph, if larger.
    void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
        size_t best = *largest != 0 ? *largest : getMemoryInfo(device).first;
        for (const npl_block_record& r : block_records(shim_)) {
            if (r.device == device && r.state == NPL_BLOCK_CACHED) best = std::max<size_t>(best, r.size);
        }
        *largest = best;
    }

    void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id,
                            std::shared_ptr<cca::CUDAAllocator> allocator) override {
        shim_.incref_pool(device, id.first, id.second);
        if (allocator == nullptr || allocator.get() == this) return;
        // The pool's segments come from its own allocator, which lives as long
        // as the process: a segment may outlive the pool and the Python
        // allocator object (test_tensor_delete_after_allocator_delete).
        {
            std::lock_guard<std::mutex> lock(pool_allocators_mu_);
            pool_allocators_.push_back(allocator);
        }
        shim_.set_pool_allocator(device, id.first, id.second, pool_segment_alloc, pool_segment_free, allocator.get());
    }

    // MemPool(use_on_oom=True): an eager allocation about to fail may take
    // the pool's cached blocks; torch's ~MemPool turns it off again.
    void setUseOnOOM(c10::DeviceIndex device, MempoolId_t id, bool use_on_oom) override {
        shim_.set_pool_use_on_oom(device, id.first, id.second, use_on_oom ? 1 : 0);
    }

    void setNoSplit(c10::DeviceIndex device, MempoolId_t id) override {
        shim_.set_pool_no_split(device, id.first, id.second);
    }

    int getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) override {
        return shim_.pool_use_count(device, id.first, id.second);
    }

    bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                  const std::unordered_set<void*>& expected) override {
        size_t live = 0;
        for (const npl_block_record& r : block_records(shim_)) {
            if (r.device != device || !in_pool(r, id) || r.state != NPL_BLOCK_LIVE) continue;
            if (expected.count(r.address) == 0) return false;
            live++;
        }
        return live == expected.size();
    }

    bool isHistoryEnabled() override { return history_->enabled(); }

    void recordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries, cca::RecordContext when,
                       bool clear, const std::vector<std::string>& /*skip_actions*/) override {
        history_->configure(enabled, recorder, max_entries, when, clear);
        // only while history is on: a free's hot path then pays nothing
        shim_.set_history_hook(enabled ? &History::on_shim_action : nullptr, history_.get());
    }

    cca::SnapshotInfo snapshot(MempoolId_t id, bool include_traces) override {
        cca::SnapshotInfo info;
        std::map<void*, size_t> segment_index;  // segment base -> its place in info.segments
        std::map<int, size_t> active;           // device -> bytes live or pending: torch's SNAPSHOT entry
        for (const npl_block_record& r : block_records(shim_)) {
            if ((id.first != 0 || id.second != 0) && !in_pool(r, id)) continue;
            if (r.state != NPL_BLOCK_CACHED) active[r.device] += r.size;
            auto found = segment_index.find(r.segment);
            if (found == segment_index.end()) {
                found = segment_index.emplace(r.segment, info.segments.size()).first;
                info.segments.push_back(segment_of(r));
            }
            add_block(info.segments[found->second], r);
        }
        // torch's allocator reads a device's trace before it notes the snapshot
        // there: a snapshot's entry shows in the next snapshot's traces, not its own
        if (include_traces) info.device_traces = history_->traces(c10::cuda::device_count());
        for (int device = 0; device < c10::cuda::device_count(); ++device) history_->on_snapshot(device, active[device], id);
        info.config_metadata.last_allocator_settings = "npu_lifetime shim";
        note_capture_reuse(info.config_metadata, torch_capture_reuse<cca::CUDAAllocatorConfig>(0), 0);
        return info;
    }

    std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
        check_checkpointable(device, id);
        auto state = std::make_shared<PoolState>();
        state->device = device;
        state->id = id;
        for (const npl_block_record& r : block_records(shim_)) {
            if (r.device == device && in_pool(r, id) && r.state == NPL_BLOCK_LIVE) {
                state->live.push_back({r.address, static_cast<size_t>(r.size), static_cast<cudaStream_t>(r.stream)});
            }
        }
        return state;
    }

    // As torch's own allocator does: every block of the pool live now is
    // freed, then every block live at the checkpoint is allocated again at
    // its address (a claim), and torch gets a DataPtr for each, which it
    // hands to the storages it rewires.
    cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                                std::shared_ptr<cca::AllocatorState> pps) override {
        auto* state = dynamic_cast<PoolState*>(pps.get());
        TORCH_CHECK(state != nullptr && state->device == device,
                    "npu_lifetime: a pool checkpoint taken by another allocator, or on another device");
        check_checkpointable(device, state->id);
        cca::CheckpointDelta delta;
        for (const npl_block_record& r : block_records(shim_)) {
            if (r.device == device && in_pool(r, state->id) && r.state == NPL_BLOCK_LIVE) {
                raw_delete(r.address);
                delta.ptrs_freed.push_back(r.address);
            }
        }
        for (const PoolState::Live& block : state->live) {
            shim_.claim_next(block.ptr);
            void* got = malloc(block.size, device, block.stream);
            TORCH_CHECK(got == block.ptr, "npu_lifetime: could not allocate the checkpointed block at ", block.ptr,
                        " again (got ", got, ")");
            delta.dataptrs_allocd.emplace_back(got, got, raw_deleter(), c10::Device(c10::DeviceType::CUDA, device));
        }
        return delta;
    }

   private:
    // torch's checks before a checkpoint is taken or restored, after the
    // frees a capture deferred are done (npl_prepare_pool_checkpoint).
    void check_checkpointable(c10::DeviceIndex device, MempoolId_t id) const {
        int verdict = shim_.prepare_pool_checkpoint(device, id.first, id.second);
        TORCH_CHECK(verdict != 1, "npu_lifetime: Not expected to checkpoint freeable graph");
        TORCH_CHECK(verdict == 0, "npu_lifetime: Could not find pool of id (", id.first, ", ", id.second, ")");
    }

    // torch's expandable_segments setting (PYTORCH_CUDA_ALLOC_CONF, or
    // torch.cuda.memory._set_allocator_settings at run time) as the shim's,
    // read at each allocation as torch's allocator reads it; the shim is told
    // only when it changes, so npl_set_expandable_segments holds until then.
    // CUDAAllocatorConfig::expandable_segments() is inline and, in code built
    // without torch's PYTORCH_C10_DRIVER_API_SUPPORTED (as this extension is),
    // answers false with a warning whatever the setting (seen on torch 2.11):
    // the setting itself is read where torch keeps it.
    static bool torch_expandable_setting() {
#if __has_include(<c10/core/AllocatorConfig.h>)
        return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
#else
        return cca::CUDAAllocatorConfig::expandable_segments();
#endif
    }

    static void follow_expandable_setting(const Shim& shim) {
        static std::atomic<int> told{0};  // torch's default: off
        int now = torch_expandable_setting() ? 1 : 0;
        // a plain load on the allocation path; the exchange only when it changed
        if (told.load(std::memory_order_relaxed) != now && told.exchange(now, std::memory_order_relaxed) != now)
            shim.set_expandable(now);
    }

    static std::function<void*(size_t, int, cudaStream_t)> alloc_fn(const Shim& shim,
                                                                   std::shared_ptr<History> history) {
        return [shim, history](size_t size, int device, cudaStream_t stream) -> void* {
            auto ctx = history->context(cca::RecordContext::STATE);
            follow_expandable_setting(shim);
            History::calling_context() = &ctx;  // a new segment's stack
            void* p = shim.alloc(static_cast<ssize_t>(size), device, stream);
            History::calling_context() = nullptr;
            if (p == nullptr && size != 0) {
                history->on_oom(device, size, stream);
                TORCH_CHECK_WITH(OutOfMemoryError, false, shim.oom_message());
            }
            history->on_alloc(p, size, device, stream, ctx);
            return p;
        };
    }

    static std::function<void(void*, size_t, int, cudaStream_t)> free_fn(const Shim& shim,
                                                                        std::shared_ptr<History> history) {
        return [shim, history](void* ptr, size_t size, int device, cudaStream_t stream) {
            auto ctx = history->context(cca::RecordContext::ALL);
            history->on_free(ptr, size, device, stream, ctx);
            History::calling_context() = &ctx;  // a segment empty_cache-like paths give back
            shim.free(ptr, static_cast<ssize_t>(size), device, stream);
            History::calling_context() = nullptr;
        };
    }

    static c10::CachingDeviceAllocator::SegmentInfo segment_of(const npl_block_record& r) {
        c10::CachingDeviceAllocator::SegmentInfo seg;
        seg.device = static_cast<c10::DeviceIndex>(r.device);
        seg.address = reinterpret_cast<size_t>(r.segment);
        seg.total_size = r.segment_size;
        seg.stream = r.segment_stream;
        seg.is_large = r.small == 0;
        seg.owner_private_pool_id = MempoolId_t{r.pool_id0, r.pool_id1};
        seg.is_expandable = r.expandable != 0;
        return seg;
    }

    void add_block(c10::CachingDeviceAllocator::SegmentInfo& seg, const npl_block_record& r) {
        c10::CachingDeviceAllocator::BlockInfo block;
        block.size = r.size;
        block.requested_size = r.state == NPL_BLOCK_LIVE ? r.requested : r.size;
        block.allocated = r.state == NPL_BLOCK_LIVE;
        block.active = r.state != NPL_BLOCK_CACHED;  // a pending block is torch's "active_pending_free"
        if (block.allocated) block.context_when_allocated = history_->allocated_at(r.address);
        seg.requested_size += block.allocated ? r.requested : 0;
        seg.allocated_size += block.allocated ? r.size : 0;
        seg.active_size += block.active ? r.size : 0;
        if (seg.blocks.empty()) seg.context_when_allocated = block.context_when_allocated;
        seg.blocks.push_back(std::move(block));
    }

    Shim shim_;
    std::shared_ptr<History> history_;
    std::mutex pool_allocators_mu_;
    std::vector<std::shared_ptr<cca::CUDAAllocator>> pool_allocators_;  // MemPools' own, never released
};

std::string last_error;

}  // namespace

// Makes a ShimCudaAllocator over the loaded shim at `shim_path` torch's CUDA
// allocator.  Returns NULL, or why not (torch refuses once its allocator has
// served an allocation).
extern "C" __attribute__((visibility("default"))) const char* npl_cuda_install(const char* shim_path) {
    try {
        // Installed already (by another copy of the Python package, say): the
        // shim is torch's allocator; swapping it for a second bridge would
        // drop the first one's state, and torch refuses it once initialized.
        cca::CUDAAllocator* current = cca::get();
        if (current != nullptr && current->name() == "npu_lifetime") return nullptr;
        Shim shim{};
        last_error = load_shim(shim_path, &shim);
        if (!last_error.empty()) return last_error.c_str();
        auto allocator = std::make_shared<ShimCudaAllocator>(shim, std::make_shared<History>());
        torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
        // torch's swap stores only CUDACachingAllocator::get(); the device
        // allocator registry (c10::GetAllocator / getDeviceAllocator, read by
        // torch.accelerator's statistics and by storages made through it)
        // would still name torch's own allocator, unused and empty.  The
        // registration torch makes at load has priority 0; so does this one.
        // (npl_cuda_registered says whether it took.)
        c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), 0);
        return nullptr;
    } catch (const std::exception& err) {
        last_error = err.what();
    } catch (...) {
        last_error = "unknown C++ exception";
    }
    return last_error.c_str();
}

// Whether torch's device allocator registry (c10::GetAllocator(kCUDA)) names
// the installed bridge: 0 where a registration of higher priority holds it.
extern "C" __attribute__((visibility("default"))) int npl_cuda_registered(void) {
    try {
        cca::CUDAAllocator* current = cca::get();
        return current != nullptr && current->name() == "npu_lifetime" &&
               c10::GetAllocator(c10::DeviceType::CUDA) == current;
    } catch (...) {
        return 0;
    }
}
