// Rings a Doorbell once the GPU reaches a point of a stream, without putting anything
// that blocks into any stream: the CUDA backend marks every stream-ordered gate open this
// way, so that its executor thread can sleep while the gate is closed.
//
// A host function (cudaLaunchHostFunc) behind the open would do the same, but it holds
// the work queued behind it on its hardware queue until a driver thread has run it, and
// streams share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default, 1 under
// Megatron-LM): the training stream could wait for every ring. Here the training stream
// only records an event; the watcher's thread waits for those events in order
// (blocking-sync events: it sleeps in the driver) and rings.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "doorbell.hpp"

namespace freeride {

class OpenWatcher {
 public:
  // Starts the thread; `device` must be current on the calling thread (events are made
  // there). One watcher per backend: its events come from that harvester's training
  // streams, which reach them in order, so the first in the queue is the first done.
  explicit OpenWatcher(int device);
  // Never blocks: the thread ends by itself once it has waited for every event queued
  // (it may wait forever for a stream that never gets there, a rank whose peer died; its
  // state lives as long as it does).
  ~OpenWatcher();
  OpenWatcher(const OpenWatcher&) = delete;
  OpenWatcher& operator=(const OpenWatcher&) = delete;

  // Records an event on `stream` (the caller's current device must be the watcher's) and
  // rings `bell` once the GPU has reached it. Never blocks on the GPU. False where no
  // ring will come: the event could not be recorded (the thread's CUDA error is cleared),
  // or kMaxPending events are already waiting (a stream far behind, or stuck).
  bool ring_after(cudaStream_t stream, Doorbell* bell) noexcept;

  static constexpr size_t kMaxPending = 1024;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace freeride
