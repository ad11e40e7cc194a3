// Asking whether a stream's (or an event's) work has completed, without putting anything on it: a
// question to the driver, never an operation queued behind a kernel that may still run.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/gate_memory.hpp"

namespace freeride::cuda {

// A query's answer (cudaStreamQuery, cudaEventQuery): done, not yet (cleared from the
// thread's last error, which the query also sets), or a failed kernel's error, thrown.
inline bool query_says_done(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  if (cudaPeekAtLastError() == err) (void)cudaGetLastError();
  if (err == cudaErrorNotReady) return false;
  throw_cuda(err, what, __FILE__, __LINE__);
}

// Whether everything enqueued on `stream` has completed: a question to the driver, never
// an operation on the stream.
inline bool stream_idle(cudaStream_t stream) {
  return query_says_done(cudaStreamQuery(stream), "cudaStreamQuery (side stream)");
}

// Whether the work enqueued before `event`'s record has completed, asked the same way.
inline bool event_passed(cudaEvent_t event) {
  return query_says_done(cudaEventQuery(event), "cudaEventQuery (stop fence)");
}

}  // namespace freeride::cuda
