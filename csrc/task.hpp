// A side task as the executor sees it: a sequence of phases, each a set of items.
#pragma once

#include <cstdint>
#include <string>

#include "freeride/item_ctx.h"
#include "cuda/occupancy.hpp"

namespace freeride {

class LaunchShapes;  // cuda/launch_shapes.hpp

// What a CUDA launch of one phase gets from the backend.
struct CudaLaunch {
  fr_item_ctx ctx;      // device pointers of gate and counters, items of this phase
  void* stream;         // the side stream (cudaStream_t)
  int sm_count;         // multiprocessors of the device, for sizing persistent grids
  int device;           // CUDA device ordinal
  SmLimits sm;          // per-SM resources of the device
  SmReserve reserve;    // what side blocks leave free on every SM (blocks == 0: nothing)
  // With a green-context reserve, for a task that runs in it: sm_count is the green
  // context's SMs and reserve is empty (the SMs left out are the room).
  // The backend's answers to what a launch asks CUDA about its kernel. Null in a launch
  // built by hand: every launch then asks.
  LaunchShapes* shapes = nullptr;
};

// Items a launch's grid is sized for: its items, or with device phases (ctx.phase_items)
// one phase's. A larger grid would hold claims of more than two phases at once, each
// phase's blocks waiting for the one before, and a close or stop would then take as many
// items to drain as there are phases in flight (with at most one phase's worth of blocks,
// two items); no more than a phase's items can run at once anyway.
inline uint64_t grid_items(const fr_item_ctx& ctx) {
  return ctx.phase_items != 0 && ctx.phase_items < ctx.n_items ? ctx.phase_items : ctx.n_items;
}

class Task {
 public:
  virtual ~Task() = default;

  virtual std::string name() const = 0;
  virtual uint64_t num_phases() const = 0;
  virtual uint64_t num_items(uint64_t phase) const = 0;

  // Bytes of memory this task holds on the harvester's device (inputs, outputs and
  // workspaces); charged against the harvester's budget while the task is admitted.
  uint64_t memory_bytes() const { return memory_bytes_; }
  void set_memory_bytes(uint64_t bytes) { memory_bytes_ = bytes; }

  // True when every launch obeys the item protocol (each block loops in for_each_item
  // until no item is left or the gate or stop flag holds it back), so a launch that ends
  // with its phase unfinished and no block held back is a broken kernel. Kernels that
  // deliberately ignore the gate (the slicing baseline) return false.
  virtual bool follows_item_protocol() const { return true; }

  // CUDA backend with a green-context reserve: whether this task's kernels may run on the
  // green context's stream. Built-in kernels are launched through the runtime API, which
  // green-context streams are documented to take; RawKernel overrides this (see there).
  virtual bool runs_in_green_context() const { return true; }

  // True when one launch may serve every phase of the task (device phases,
  // csrc/device_phases.hpp): every phase runs the same kernel with the same arguments
  // over as many items, and that kernel takes its phase from freeride::for_each_phase_item
  // rather than from ctx.phase.
  virtual bool supports_device_phases() const { return false; }

  // The phase status() reports for the executor's `phase` of this task with `items_done`
  // in all (a task served by device phases is one phase to the executor).
  virtual uint64_t reported_phase(uint64_t phase, uint64_t /*items_done*/) const { return phase; }

  // Added to the error of a launch that broke the item protocol: what this task's kernel
  // must do besides calling freeride::for_each_item.
  virtual std::string protocol_hint() const { return ""; }

  // Host backend: runs one item on the calling worker thread. May throw; the task then fails.
  virtual void run_item(uint64_t phase, uint64_t item) = 0;

  // CUDA backend: enqueues one preemptible kernel for the phase on launch.stream.
  // Throws where the task has no CUDA implementation or the build has no CUDA.
  virtual void launch_cuda(const CudaLaunch& launch) = 0;

  uint64_t total_items() const {
    uint64_t total = 0;
    for (uint64_t p = 0; p < num_phases(); ++p) total += num_items(p);
    return total;
  }

 private:
  uint64_t memory_bytes_ = 0;
};

}  // namespace freeride
