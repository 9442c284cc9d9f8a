// The entry points torch's pluggable-allocator setters take, each with the
// exact type the setter's Python binding casts its integer to (torch 2.11,
// torch/csrc/cuda/Module.cpp; checked on the GPU by tests/test_gpu_graphs.py):
//
//   set_init_fn                void(int)
//   set_reset_fn               void()                   (torch.cuda.empty_cache)
//   set_memory_fraction_fn     void(double, int)
//   set_base_alloc_fn          void*(void*, size_t*)
//   set_record_stream_fn       void(void*, cudaStream_t)
//   set_begin_allocate_to_pool void(int, MempoolId_t, std::function<bool(cudaStream_t)>)
//   set_end_allocate_to_pool_fn void(int, MempoolId_t)
//   set_release_pool           void(int, MempoolId_t)
// torch_npu's NPUPluggableAllocator adds
//   set_reset_fn               void(bool)               (torch.npu.empty_cache)
//   set_erase_stream_fn        void(void*, aclrtStream)
//
// MempoolId_t is std::pair<unsigned long long, unsigned long long>; the
// std::function is libstdc++'s, as torch's (both built with g++).  These are
// C++ functions with C linkage (found with dlsym); like the C ABI, none lets
// an exception escape.
#include <functional>
#include <utility>

#include "shim.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

#define NPL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using MempoolId = std::pair<unsigned long long, unsigned long long>;
using CudaStreamFilter = std::function<bool(CUstream_st*)>;

npl::PoolId pool_id(MempoolId id) { return npl::PoolId{id.first, id.second}; }

}  // namespace

NPL_EXPORT void npl_torch_init(int device_count) { npl_init(device_count); }

NPL_EXPORT void npl_torch_empty_cache() { npl_empty_cache(); }

NPL_EXPORT void npl_torch_npu_empty_cache(bool /*check_error*/) { npl_empty_cache(); }

NPL_EXPORT void npl_torch_set_memory_fraction(double fraction, int device) { npl_set_memory_fraction(fraction, device); }

NPL_EXPORT void* npl_torch_base_alloc(void* ptr, size_t* size) { return npl_base_allocation(ptr, size); }

NPL_EXPORT void npl_torch_record_stream(void* ptr, void* stream) { npl_record_stream(ptr, stream); }

NPL_EXPORT void npl_torch_erase_stream(void* ptr, void* stream) { npl_erase_stream(ptr, stream); }

NPL_EXPORT void npl_torch_begin_allocate_to_pool(int device, MempoolId id, CudaStreamFilter filter) {
    npl::guarded("begin_allocate_to_pool", 0, [&] {
        npl::StreamFilter wrapped;
        if (filter) {
            wrapped = [f = std::move(filter)](npl::Stream s) {
                try {
                    return f(static_cast<CUstream_st*>(s));
                } catch (...) {  // torch's filter queries the runtime; an error claims nothing
                    return false;
                }
            };
        }
        npl::shim().allocator.begin_allocate_to_pool(device, pool_id(id), std::move(wrapped));
        return 0;
    });
}

NPL_EXPORT void npl_torch_end_allocate_to_pool(int device, MempoolId id) {
    npl_end_allocate_to_pool(device, id.first, id.second);
}

NPL_EXPORT void npl_torch_release_pool(int device, MempoolId id) { npl_release_pool(device, id.first, id.second); }
