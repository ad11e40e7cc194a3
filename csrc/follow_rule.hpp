// Followers (issue 36 item 1: "the next task is queued behind one that is finishing"):
// whether the next task's launch should be queued, at each open, behind the running
// task's. On one in-order stream the follower begins only once the running task's launch
// has left, which in the tail of its last phase is when it runs out of items, often in
// the middle of a bubble: the follower takes the rest of it from the GPU's own queue,
// instead of the executor's host-started launch (two thread wake-ups and an enqueue
// later). Before the tail a follower would begin only at its bubble's close and exit at
// once, an empty grid dispatch per open: so it is queued only once what the launches
// already queued ahead and this open's can run covers what is left. Followers are off by
// default (FREERIDE_FOLLOW=1) until a GPU run has measured them.
#pragma once

#include <cstdint>

namespace freeride {

struct FollowState {
  bool enabled = false;          // FREERIDE_FOLLOW (Backend::followers)
  bool last_phase = false;       // the running task is in its last phase
  uint64_t items_left = 0;       // of that phase, as the host last saw them
  uint64_t items_per_open = 0;   // what its launches at opens ran each, lately (0: unknown)
  uint64_t in_flight = 0;        // its launches queued ahead, not yet taken
};

inline bool follow_next(const FollowState& s) {
  if (!s.enabled || !s.last_phase || s.items_per_open == 0) return false;
  return s.items_left <= s.items_per_open * (s.in_flight + 1);
}

}  // namespace freeride
