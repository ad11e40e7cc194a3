// User kernels compiled outside the core (by CuPy's NVRTC) and run as preemptible tasks.
// The core sees only driver handles: a CUfunction per phase and the argument values the
// Python layer already checked against the kernel's signature.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "task.hpp"

namespace freeride {

// One kernel of the task and how it is launched.
struct RawPhase {
  uintptr_t function = 0;  // CUfunction, loaded in the device's primary context
  uint64_t items = 0;
  uint32_t block = 0;       // threads per block
  uint32_t shared_mem = 0;  // dynamic shared memory per block, bytes
  uint32_t grid = 0;        // 0: as many blocks as fit on the device at once
};

// Phase p of the `phases` runs kernels[p % kernels.size()], so an iterative algorithm of
// many phases costs no more than its distinct kernels. `args` holds one 8-byte
// little-endian word per kernel parameter after the fr_item_ctx; a parameter of size s
// reads the first s bytes of its word. `device_phases`: the one kernel takes its phase from
// freeride::for_each_phase_item, so one launch may serve every phase (device_phases.hpp).
std::shared_ptr<Task> make_raw_kernel_task(std::string name, std::vector<RawPhase> kernels,
                                           uint64_t phases, std::vector<uint64_t> args,
                                           bool device_phases = false);

// What the driver says about a loaded function, for checks before any launch.
struct FunctionInfo {
  int max_threads_per_block = 0;
  int static_shared_bytes = 0;
  int max_dynamic_shared_bytes = 0;  // current limit for this function
  int num_regs = 0;
  bool has_param_sizes = false;      // false where the driver predates cuFuncGetParamInfo
  std::vector<uint64_t> param_sizes;  // every parameter, fr_item_ctx included
};

// Throws RuntimeFailure where the build has no CUDA or the driver lacks the entry points.
FunctionInfo query_function(uintptr_t function);

// Raises the function's dynamic shared memory limit (needed above 48 KiB).
void set_max_dynamic_shared(uintptr_t function, int bytes);

}  // namespace freeride
