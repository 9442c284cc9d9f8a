// Controls of the simulated runtime, for tests and the CPU demo.
#pragma once

#include <cstdint>

#include "runtime.h"

namespace npl::sim {

void complete(Stream stream);  // `stream` runs: to its end, or to a wait on an event not yet complete
void complete_to(Stream stream, uint64_t position);  // the same, up to `position` at most
uint64_t launch(Stream stream);                      // a kernel queued on `stream`: its position
Event record_event(Stream stream);                   // a new event recorded on `stream` (a test's own)
void wait_event(Stream stream, Event event);         // `stream` waits for `event`
void complete_all();
void set_capturing(Stream stream, bool capturing);
void set_memory_limit(uint64_t bytes);  // 0: unlimited
uint64_t stream_waits(Stream stream);
uint64_t incomplete_events();
uint64_t event_syncs();        // host waits on events (event_synchronize)
void set_device(int device);   // the calling thread's current device
void lock_for_fork();          // pthread_atfork: hold the state's lock across fork()
void unlock_after_fork();
void reset_streams();  // forget every stream's progress, waits and capture state, and every event
                       // (and the call counts and failures below)
// The next `n` calls of the runtime function `call` ("event_create",
// "event_record", "event_query", "stream_synchronize", ... as the Runtime
// table names them) fail with an error; false for an unknown name.
bool fail_next(const char* call, uint64_t n);
uint64_t calls(const char* call);  // calls of `call` so far (UINT64_MAX: unknown name)
uint64_t completed(Stream stream);  // operations of `stream` that have run

// The virtual memory (runtime_sim_vm.cpp): a reservation is address space
// with no access; a mapped chunk makes its pages usable; fills and reads of
// reserved memory not mapped fail (counted, as a device would fault).
uint64_t mapped_bytes();        // bytes of physical chunks mapped now
uint64_t reserved_bytes();      // bytes of address space reserved now
bool accessible(const void* ptr, size_t size);  // memory a kernel may touch (malloc'd, or mapped with access)
uint64_t illegal_accesses();    // fills and reads refused for touching unmapped memory, and fills
                                // still queued on memory when it was freed

namespace detail {  // between the two files of the simulated runtime
const VirtualMemory* virtual_memory(std::string* why);
bool accessible(const void* ptr, size_t size);  // counts an illegal access when not
void count_illegal(uint64_t n);  // work the free of its memory found still queued (runtime_sim.cpp)
Status call_status(const char* call, int* code);  // counts `call`; an injected failure (fail_next)
Status charge(size_t bytes, int* code);  // device memory taken, within the limit
void refund(size_t bytes);
Status invalid(int* code);
void lock_virtual_memory();  // fork: after the runtime's own lock
void unlock_virtual_memory();
}  // namespace detail

}  // namespace npl::sim
