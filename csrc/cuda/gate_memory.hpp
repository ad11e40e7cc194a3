// Device and pinned memory of the CUDA backend: the process-lifetime gate slots, the
// pinned gate constants, and the pools of phase-state and host-word slots its runners
// take. Layout constants of those slots are here too: the runner and the kernels
// (freeride/item_ctx.h) agree on them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "check.hpp"
#include "doorbell.hpp"
#include "freeride/item_ctx.h"
#include "freeride/slice.h"

namespace freeride::cuda {

static_assert(std::is_same_v<uint32_t, unsigned int>, "gate words are 32-bit unsigned int");
static_assert(offsetof(fr_phase_state, next) == 0 && offsetof(fr_phase_state, done) == 8 &&
                  offsetof(fr_phase_state, stop) == 16 && offsetof(fr_phase_state, held) == 20,
              "begin_phase zeroes [next, done] as one range in front of stop; a launch that "
              "ended without its end record reads back [done, stop, held] as one copy");

// Launches of one runner that may be enqueued and not yet seen to end, at most: each has
// its own fr_launch_run (device memory) and fr_launch_end (host memory), the slot of
// number % kLaunchRing in the runner's rings, reused only once that launch has ended.
// Enough for every bubble of an iteration queued ahead of the GPU (a 1F1B schedule of 8
// micro-batches has 16), with room for the executor's own relaunch.
constexpr size_t kLaunchRing = 32;

constexpr size_t kGateStride = 128;           // one gate per 128-byte line: no false sharing
constexpr size_t kGateSlabBytes = 64 * 1024;  // 512 gates per allocation
// Words of a gate's line in mapped host memory (GateSlot::mirror): the gate's mirror, the
// sequence number of the last write that took effect, and the ordinal of the latest
// stream-ordered close the host has enqueued (fr_item_ctx.latest_close).
constexpr size_t kMirrorSeq = 1;
constexpr size_t kMirrorCloses = 2;
// Words of a gate's own line (GateSlot::dev): the gate, then from kCloseSlots the slots
// closes write their ordinals to as they execute (fr_item_ctx.closes_executed), 16-byte
// aligned for the kernels' one vector load.
constexpr size_t kCloseSlots = 4;
static_assert(kCloseSlots * sizeof(unsigned int) % 16 == 0 &&
              (kCloseSlots + FREERIDE_CLOSE_SLOTS) * sizeof(unsigned int) <= kGateStride);
// A runner's device memory: its fr_phase_state, then its ring of fr_launch_run.
constexpr size_t kRunsOffset = 64;
constexpr size_t kStateStride = 1024;
static_assert(sizeof(fr_phase_state) <= kRunsOffset && sizeof(fr_launch_run) == 16 &&
              kRunsOffset + kLaunchRing * sizeof(fr_launch_run) <= kStateStride);
// A runner's host words: [0, 8) the progress mirror, [8, 24) the fallback read-back
// [done, stop, held], then its ring of fr_launch_end.
constexpr size_t kReadbackOffset = 8;
constexpr size_t kEndsOffset = 64;
constexpr size_t kWordStride = 2048;
static_assert(kReadbackOffset + 16 <= kEndsOffset && kEndsOffset % 8 == 0 &&
              kEndsOffset + kLaunchRing * sizeof(fr_launch_end) <= kWordStride);
// The pinned zeros a runner's state is cleared from is one host-word slot: large enough.
static_assert(kStateStride <= kWordStride);
constexpr size_t kSlotsPerSlab = 256;

[[noreturn]] inline void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  detail::Msg os;
  os << "CUDA error " << cudaGetErrorName(err) << " in " << call << ": "
     << cudaGetErrorString(err) << detail::where(file, line);
  throw RuntimeFailure(os.str());
}


// Mapped pinned host memory and its device view; throws (freeing nothing left behind).
void alloc_mapped(size_t bytes, char** host, char** dev);

// ---------------------------------------------------------------------------------------
// Gates: a per-device, process-lifetime pool. Never freed and never reused: a training
// stream may still hold stream-ordered writes to a gate after its harvester closed, and
// they must neither land in freed memory nor flip a later harvester's gate.

struct GateSlot {
  unsigned int* dev = nullptr;         // the word kernels read, as the device sees it
  unsigned int* mirror = nullptr;      // host view of the host-visible copy; for a
                                       // host-memory gate, the gate itself
  unsigned int* mirror_dev = nullptr;  // device view of that copy (== dev for a host gate)
  // Rung once an open has taken effect (the backend's OpenWatcher), and by stops: the
  // executor thread sleeps on it while the gate is closed. As long-lived as the gate,
  // because the watcher may ring it for an open that a training stream reaches after the
  // harvester closed.
  Doorbell* bell = nullptr;
};

// A gate on `device` (in mapped pinned host memory with `host_memory`), never freed.
GateSlot acquire_gate(int device, bool host_memory);

// Process-lifetime pinned constants {CLOSED, OPEN}: the source of stream-ordered gate
// writes by copy on the fallback path. Never freed, for the same reason as the gates.
const unsigned int* gate_constants();

// Slabs a pool lets go of are kept for later pools of the same device and kind, never
// given to cudaFree or cudaFreeHost: both synchronise the whole device (CUDA's implicit
// synchronisation), so freeing at close waited for every stream's queued work, training's
// included (seen on an H200: close() and process exit took the 2 s of GPU work still
// queued on a training stream). Process-wide and leaked on purpose, like the gates.
struct Slab {
  char* dev = nullptr;   // device address
  char* host = nullptr;  // host address (mapped host pools only)
};
// A kept slab of `bytes` for `device`, or false where none is kept.
bool take_kept_slab(int device, bool host_memory, size_t bytes, Slab* out);
void keep_slab(int device, bool host_memory, size_t bytes, Slab slab) noexcept;

// Backend-owned slot pools: one slab per kSlotsPerSlab slots, reused via a free list. The
// caller serialises access (CudaShared::pool_mu) and makes the pool's device current.
class SlotPool {
 public:
  using Slot = Slab;

  SlotPool(bool host_memory, size_t stride) : host_memory_(host_memory), stride_(stride) {}
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;
  ~SlotPool() { free_all(); }

  Slot acquire() {
    if (free_.empty()) grow();
    Slot slot = free_.back();
    free_.pop_back();
    // A reused host slot may hold the previous runner's progress.
    if (slot.host != nullptr) std::memset(slot.host, 0, stride_);
    return slot;
  }

  // Cannot reallocate: every slot came from free_, whose capacity covers all of them.
  void release(Slot slot) noexcept { free_.push_back(slot); }

  // Hands every slab to the process-wide keep (see keep_slab): nothing waits for the GPU.
  void free_all() noexcept {
    for (const Slab& slab : slabs_) keep_slab(device_, host_memory_, bytes(), slab);
    slabs_.clear();
    free_.clear();
  }

 private:
  size_t bytes() const { return kSlotsPerSlab * stride_; }

  void grow() {
    slabs_.reserve(slabs_.size() + 1);
    free_.reserve((slabs_.size() + 1) * kSlotsPerSlab);
    if (slabs_.empty()) FR_CUDA_CHECK(cudaGetDevice(&device_));
    Slab base;
    if (!take_kept_slab(device_, host_memory_, bytes(), &base)) {
      if (host_memory_) {
        alloc_mapped(bytes(), &base.host, &base.dev);
      } else {
        void* dev = nullptr;
        FR_CUDA_CHECK(cudaMalloc(&dev, bytes()));
        base.dev = static_cast<char*>(dev);
      }
    }
    slabs_.push_back(base);
    // Reversed, so that slots are handed out in address order.
    for (size_t i = kSlotsPerSlab; i-- > 0;) {
      Slot s;
      s.dev = base.dev + i * stride_;
      if (base.host != nullptr) s.host = base.host + i * stride_;
      free_.push_back(s);
    }
  }

  bool host_memory_;
  size_t stride_;
  int device_ = 0;
  std::vector<Slab> slabs_;
  std::vector<Slot> free_;
};

}  // namespace freeride::cuda
