// How long one block (CUDA) or one worker (host) spends on one item of a task, measured
// from its launches: what decides whether a bubble is long enough to be worth a launch
// (a launch holds its SMs up to an item past the close that ends its bubble).
#pragma once

#include <cstdint>

namespace freeride {

// From one launch that ended: its duration times its blocks over the items it finished
// (each block finished items / blocks of them, one after another). A launch that
// finished fewer items than it had blocks says nothing: blocks that ran none (a launch
// cut short as it began, a phase's last items) would pass for slow ones. 0: no estimate.
inline uint64_t launch_block_item_ns(int64_t duration_ns, uint64_t blocks, uint64_t items) {
  if (duration_ns <= 0 || blocks == 0 || items < blocks) return 0;
  const unsigned __int128 spent = static_cast<unsigned __int128>(duration_ns) * blocks;
  return static_cast<uint64_t>(spent / items);
}

// The running estimate after one more measurement: the first one as it is, then a moving
// average that weighs the newest a quarter (an item's cost drifts with its inputs and with
// what shares the device, but one launch cut by a close is not the whole story).
inline uint64_t smoothed_item_ns(uint64_t estimate, uint64_t measured) {
  if (measured == 0) return estimate;
  if (estimate == 0) return measured;
  return estimate - estimate / 4 + measured / 4;
}

}  // namespace freeride
