// The CUDA backend's runners: one task's phases as preemptible launches on the side (or
// green-context) stream, and the stream dependency a task's first launch waits for.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend.hpp"
#include "cuda/shared.hpp"

namespace freeride::cuda {

// Events recorded now, on the calling thread, on each of `streams` (CUDA stream handles).
std::unique_ptr<StreamDependency> make_dependency(const std::vector<uintptr_t>& streams);

// Whether `dependency` is one of make_dependency's (a runner takes no other).
bool is_cuda_dependency(const StreamDependency* dependency);

std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<CudaShared> shared, std::shared_ptr<Task> task,
                                         std::unique_ptr<StreamDependency> after);

}  // namespace freeride::cuda
