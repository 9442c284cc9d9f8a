// Running a runtime call with a given device current, for runtimes (CUDA,
// ACL) whose allocations and events belong to the current device.
#pragma once

#include "runtime.h"

namespace npl {

// Runs `call` with `device` current, through the runtime's `get`/`set`, and
// restores the previous device.  Error codes go through `status_of`.
template <typename Err, typename Id, typename StatusOf, typename Call>
Status on_device(int device, int* code, Err (*get)(Id*), Err (*set)(Id), Err success, StatusOf status_of, Call call) {
    Id previous = -1;
    Err err = get(&previous);
    if (err != success) return status_of(err, code);
    if (previous != device && (err = set(static_cast<Id>(device))) != success) return status_of(err, code);
    Status s = status_of(call(), code);
    if (previous != device) {
        Err back = set(previous);
        if (back != success && s == Status::ok) return status_of(back, code);
    }
    return s;
}

}  // namespace npl
