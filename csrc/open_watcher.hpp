// Rings a Doorbell once the GPU reaches a point of a stream, without putting anything
// that blocks into any stream: the CUDA backend marks every stream-ordered gate open this
// way, so that its executor thread can sleep while the gate is closed.
//
// A host function (cudaLaunchHostFunc) behind the open would do the same, but it holds
// the work queued behind it on its hardware queue until a driver thread has run it, and
// streams share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default, 1 under
// Megatron-LM): the training stream could wait for every ring. Here the training stream
// only records an event; one thread per device waits for those events in order
// (blocking-sync events: it sleeps in the driver) and rings.
#pragma once

#include <cuda_runtime_api.h>

#include "doorbell.hpp"

namespace freeride {

class OpenWatcher {
 public:
  // The device's watcher: made on first use, never destroyed (its thread may be waiting
  // for a stream that never gets there; events and bells outlive every backend).
  static OpenWatcher& for_device(int device);

  // Records an event on `stream` (the caller's current device must be the watcher's) and
  // rings `bell` once the GPU has reached it. Never blocks on the GPU. False, with the
  // thread's CUDA error cleared, where the event could not be recorded (no ring comes).
  bool ring_after(cudaStream_t stream, Doorbell* bell) noexcept;

  OpenWatcher(const OpenWatcher&) = delete;
  OpenWatcher& operator=(const OpenWatcher&) = delete;

 private:
  explicit OpenWatcher(int device);
  struct State;
  State* state_;  // leaked with the watcher
};

}  // namespace freeride
