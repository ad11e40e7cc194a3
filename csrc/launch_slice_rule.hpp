// The time slice a launch carries (fr_item_ctx.slice_ns; freeride/slice.h).
//
// A launch that the executor or the watcher makes for an open it holds no ordinal for
// (next_close 0: an open replayed from a CUDA graph, or one forgotten among the kKept
// newer ones of csrc/cuda/recent_opens.hpp) has nothing but the gate and its blocks'
// first look at the close slots to keep it in its bubble. Beginning after that bubble's
// close and the next open (queued behind training's work under one hardware queue, its
// blocks waiting for SMs), it serves the next bubble, whose own launch at its open then
// waits behind it on the side stream, with training's work, the next close included,
// behind that in the one queue. With the harvester's time_slice=None nothing else would
// end such a launch: a hang. So it keeps a slice: the harvester's, or kDefaultSliceNs
// where the harvester has none, which makes that a stall of at most the slice bound
// (FREERIDE_MAX_SLICES slices, whatever the harvester's max_slices: the close behind it
// is pending). The gate's first open,
// before any write, is noted when the backend is made, so the first bubble has one. A
// launch at an open always has its ordinal (the training thread reads the ledger as it
// writes the open), and stream_wait's launches wait on the GPU for whichever open comes
// next, knowing none by design (stream_wait is refused under one hardware queue).
#pragma once

#include <cstdint>

namespace freeride {

// The default time slice (Harvester's time_slice=0.002, BackendOptions::slice_ns).
inline constexpr uint64_t kDefaultSliceNs = 2'000'000;

inline uint64_t launch_slice_ns(uint64_t slice_ns, bool at_open, uint32_t next_close,
                                bool stream_wait) {
  if (slice_ns != 0 || at_open || next_close != 0 || stream_wait) return slice_ns;
  return kDefaultSliceNs;
}

}  // namespace freeride
