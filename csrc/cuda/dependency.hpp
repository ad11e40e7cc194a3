// What a task's first launch waits for on CUDA: events recorded on the submitter's streams
// at submit (its inputs may still be being written there).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend.hpp"

namespace freeride::cuda {

class CudaDependency final : public StreamDependency {
 public:
  // Records an event on each of `streams` (CUDA stream handles) now, on the calling thread.
  explicit CudaDependency(const std::vector<uintptr_t>& streams);
  ~CudaDependency() override;
  CudaDependency(const CudaDependency&) = delete;
  CudaDependency& operator=(const CudaDependency&) = delete;

  // cudaEventQuery does not block (it reads the event's state), so the executor may ask
  // under its lock. On the event's device: on a thread with no current context the
  // runtime would otherwise create device 0's.
  bool ready() const override;

  // The stream's next work waits for every captured stream. Destroying the events
  // afterwards is fine: a wait holds on to what it waits for.
  void enqueue_wait(cudaStream_t stream) const;

 private:
  void destroy() noexcept;

  int device_ = 0;
  std::vector<cudaEvent_t> events_;
};

}  // namespace freeride::cuda
