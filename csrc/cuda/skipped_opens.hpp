// Stream-ordered opens that carry no launch because their bubble is predicted too short to
// pay for one (the recorder's skip, python/freeride/record/recorder.py): the executor must
// not launch into them either. Its own launch would come a host round trip after the open
// took effect, land in the compute after the bubble, run nothing there and start a
// backoff (review G10).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/recent_opens.hpp"

namespace freeride::cuda {

class SkippedOpens {
 public:
  // The training thread, as it enqueues an open without a launch: noted before the open
  // can take effect. The oldest of kKept is forgotten: enough for every open the host
  // queues ahead of the GPU in an iteration of a pipeline schedule (a forgotten one would
  // get the executor's launch, as before).
  void note(uint32_t seq) { opens_.note(seq, 1u); }

  // The executor, when the gate's mirror reads open under `seq`.
  bool contains(uint32_t seq) const { return opens_.find(seq) != 0u; }

  static constexpr size_t kKept = RecentOpens::kKept;

 private:
  RecentOpens opens_;
};

}  // namespace freeride::cuda
