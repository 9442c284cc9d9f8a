// The device runtime as a table of functions, resolved at run time.
#pragma once

#include <cstddef>
#include <string>

namespace npl {

using Stream = void*;
using Event = void*;

enum class Status { ok, not_ready, out_of_memory, error };

struct Runtime {
    const char* name;
    // Each call returns its status; `code` receives the runtime's own code.
    Status (*malloc)(void** ptr, size_t size, int device, int* code);
    Status (*free)(void* ptr, int device, int* code);
    Status (*event_create)(Event* event, int device, int* code);
    Status (*event_destroy)(Event event, int device, int* code);
    Status (*event_record)(Event event, Stream stream, int* code);
    Status (*event_query)(Event event, int* code);  // ok = complete
    Status (*stream_wait_event)(Stream stream, Event event, int* code);
    Status (*stream_capturing)(Stream stream, bool* capturing, int* code);
};

// Each returns nullptr and explains in `why` when the runtime can't be loaded.
const Runtime* cuda_runtime(std::string* why);
const Runtime* acl_runtime(const char* library_path, std::string* why);
const Runtime* sim_runtime();

// True when the process already has a CUDA / ACL runtime library loaded.
bool library_loaded(const char* name_fragment, std::string* path);

}  // namespace npl
