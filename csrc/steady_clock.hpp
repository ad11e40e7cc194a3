// The host's steady clock as one integer: what the host backend's marks, the ItemCounter's
// recorded item times and the admission stamps are taken on. std::chrono::steady_clock is
// CLOCK_MONOTONIC on Linux, the clock Python's time.monotonic_ns() reads, so Python can
// place its own readings among them.
#pragma once

#include <chrono>
#include <cstdint>

namespace freeride {

// Nanoseconds since the steady clock's epoch.
inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace freeride
