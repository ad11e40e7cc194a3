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
#include "cuda/slot_pool.hpp"
#include "doorbell.hpp"
#include "freeride/item_ctx.h"
#include "freeride/slice.h"
#include "phase_ahead_rule.hpp"

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
// A runner's device memory: its fr_phase_state, one every kPhaseStateStride bytes for
// each of phase_ahead_rule.hpp's kPhaseSlots sets of counters (only the first without
// phases ahead), then its ring of fr_launch_run.
constexpr size_t kPhaseStateStride = 32;
constexpr size_t kRunsOffset = 64;
constexpr size_t kStateStride = 1024;
static_assert(sizeof(fr_phase_state) <= kPhaseStateStride &&
              kPhaseSlots * kPhaseStateStride <= kRunsOffset && sizeof(fr_launch_run) == 24 &&
              kRunsOffset + kLaunchRing * sizeof(fr_launch_run) <= kStateStride);
// A runner's host words: [0, 8) the progress mirror, [8, 24) the fallback read-back
// [done, stop, held], [32, 40) the second set of counters' progress mirror (phases
// ahead), then its ring of fr_launch_end.
constexpr size_t kReadbackOffset = 8;
constexpr size_t kSecondProgressOffset = 32;
constexpr size_t kEndsOffset = 64;
constexpr size_t kWordStride = 2048;
static_assert(kReadbackOffset + 16 <= kSecondProgressOffset && kPhaseSlots == 2 &&
              kSecondProgressOffset + 8 <= kEndsOffset && kEndsOffset % 8 == 0 &&
              kEndsOffset + kLaunchRing * sizeof(fr_launch_end) <= kWordStride);
// max_slices took next_close's padding: kernels built against the header before it read
// the same layout.
static_assert(offsetof(fr_item_ctx, max_slices) == offsetof(fr_item_ctx, next_close) + 4 &&
              sizeof(fr_item_ctx) == offsetof(fr_item_ctx, max_slices) + 4);
// The pinned zeros a runner's state is cleared from is one host-word slot: large enough.
static_assert(kStateStride <= kWordStride);

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

// The CUDA backend's slabs: device memory, or mapped pinned host memory for host pools.
struct CudaSlabAlloc {
  static Slab allocate(int device, bool host_memory, size_t bytes);
  static int current_device();
};
using SlotPool = BasicSlotPool<CudaSlabAlloc>;

}  // namespace freeride::cuda
