// A runner's launches as the host sees them: each launch's own counters (fr_launch_run,
// device memory) and end record (fr_launch_end, mapped pinned memory), in rings of
// kLaunchRing indexed by the launch's number, so that launches queued back to back need
// nothing reset between them (see freeride/preempt.cuh for what the kernel writes).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cuda/gate_memory.hpp"
#include "freeride/item_ctx.h"

namespace freeride::cuda {

// What the host learns of a launch that ended.
struct LaunchEnd {
  uint64_t done = 0;        // the phase's `done` when it ended
  uint32_t held = 0;        // the phase's `held` then
  int64_t duration_ns = -1;  // < 0: no end record (counts read back, or none)
  uint64_t start_ns = 0;    // %globaltimer of its first block (with duration_ns >= 0)
  uint64_t blocks = 0;      // its grid (0: no end record)
  bool broken = false;      // no end record from a task that follows the item protocol
  bool handed_back = false;  // not ended: CudaRunner::hand_back, the launch not begun
};

class LaunchRing {
 public:
  // `state`, `words`: the runner's slots (device memory; mapped host memory).
  void place(const SlotPool::Slot& state, const SlotPool::Slot& words) {
    runs_dev_ = reinterpret_cast<fr_launch_run*>(state.dev + kRunsOffset);
    ends_host_ = reinterpret_cast<fr_launch_end*>(words.host + kEndsOffset);
    ends_dev_ = reinterpret_cast<fr_launch_end*>(words.dev + kEndsOffset);
  }

  // Before launch `number` is enqueued: its end record is cleared (the launch that used
  // the slot before has ended: a runner has fewer than kLaunchRing in flight).
  void clear(uint64_t number) {
    fr_launch_end& e = ends_host_[number % kLaunchRing];
    for (unsigned long long* word : {&e.done, &e.held, &e.start_ns, &e.end_ns, &e.blocks, &e.launch}) {
      std::atomic_ref<unsigned long long>(*word).store(0);
    }
  }

  // Where launch `number`'s kernel writes its own counters and its end record.
  fr_launch_run* run_dev(uint64_t number) const { return runs_dev_ + number % kLaunchRing; }
  fr_launch_end* end_dev(uint64_t number) const { return ends_dev_ + number % kLaunchRing; }

  // Its last block has written the record (the number last, after a system-scope fence).
  bool published(uint64_t number) const {
    return std::atomic_ref<unsigned long long>(ends_host_[number % kLaunchRing].launch)
               .load(std::memory_order_acquire) == number;
  }

  // Its first block has begun (and written its start), or it has ended. `last` is the
  // last launch enqueued: a later number has no record of its own yet.
  bool started(uint64_t number, uint64_t last) const {
    if (number > last) return false;
    const fr_launch_end& e = ends_host_[number % kLaunchRing];
    return std::atomic_ref<const unsigned long long>(e.start_ns).load() != 0 || published(number);
  }

  // The record of launch `number` (published).
  LaunchEnd read(uint64_t number) const {
    const fr_launch_end& e = ends_host_[number % kLaunchRing];
    LaunchEnd end;
    end.done = std::atomic_ref<const unsigned long long>(e.done).load();
    end.held = static_cast<uint32_t>(std::atomic_ref<const unsigned long long>(e.held).load());
    const uint64_t start = std::atomic_ref<const unsigned long long>(e.start_ns).load();
    const uint64_t stop = std::atomic_ref<const unsigned long long>(e.end_ns).load();
    end.duration_ns = start != 0 && stop >= start ? static_cast<int64_t>(stop - start) : -1;
    end.start_ns = start;
    end.blocks = std::atomic_ref<const unsigned long long>(e.blocks).load();
    return end;
  }

 private:
  fr_launch_run* runs_dev_ = nullptr;
  fr_launch_end* ends_host_ = nullptr;
  fr_launch_end* ends_dev_ = nullptr;
};

}  // namespace freeride::cuda
