// The stream iterative tasks' steps run on (python/freeride/iterative.py).
#pragma once

#include <cstdint>

namespace freeride {

// Handle (cudaStream_t) of `device`'s step stream: non-blocking, at the device's least
// urgent priority, made by this module on first use and shared by every harvester on the
// device. No library hands it out to anyone else, unlike torch's pool streams (32 per
// priority per device, round-robin), one of which a user's torch.cuda.Stream() could be,
// serialising side steps with training work. Never destroyed: close() may abandon a
// thread whose hung step still enqueues on it. Throws RuntimeFailure in builds without
// CUDA, InvalidArgument for a device that does not exist.
uintptr_t step_stream(int device);

}  // namespace freeride
