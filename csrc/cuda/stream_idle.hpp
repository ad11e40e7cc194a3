// Asking whether a stream's (or an event's) work has completed, without putting anything on it: a
// question to the driver, never an operation queued behind a kernel that may still run.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/gate_memory.hpp"

namespace freeride::cuda {

// Whether everything enqueued on `stream` has completed: a question to the driver, never
// an operation on the stream. Throws the error of a failed kernel (cleared from the
// thread's last error, which cudaStreamQuery also sets for "not ready").
inline bool stream_idle(cudaStream_t stream) {
  const cudaError_t err = cudaStreamQuery(stream);
  if (err == cudaSuccess) return true;
  if (cudaPeekAtLastError() == err) (void)cudaGetLastError();
  if (err == cudaErrorNotReady) return false;
  throw_cuda(err, "cudaStreamQuery (side stream)", __FILE__, __LINE__);
}

// Whether the work enqueued before `event`'s record has completed, asked the same way.
inline bool event_passed(cudaEvent_t event) {
  const cudaError_t err = cudaEventQuery(event);
  if (err == cudaSuccess) return true;
  if (cudaPeekAtLastError() == err) (void)cudaGetLastError();
  if (err == cudaErrorNotReady) return false;
  throw_cuda(err, "cudaEventQuery (stop fence)", __FILE__, __LINE__);
}

}  // namespace freeride::cuda
