// What each CUDA call that a close+open pair of the hooks makes costs the calling thread,
// one kind of call at a time: the parts of the host cost per pair (`freeride bench hooks
// --mode gpu`), so that the next reduction aims at the largest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace freeride {

struct CallCost {
  std::string call;          // the call, and where a pair makes it
  std::vector<int64_t> ns;   // each call's host time (steady clock); empty where unavailable
  std::string unavailable;   // why it was not measured ("" where it was)
};

struct CallCosts {
  // Whether a stream wait held the stream while each block was timed (the enqueues then
  // queued ahead of the GPU, as a training thread's do); false without stream memory
  // operations, where the GPU takes each as it comes.
  bool held = false;
  std::vector<CallCost> calls;  // the first is the clock's own floor
};

// Calls of each kind in a block at most, timed one by one; the stream is released and
// synchronised between blocks, so that no queue fills.
constexpr int kCallCostBlock = 64;

// `calls` of each kind (after one block of each, untimed, to warm up), on a non-blocking
// stream of `device`. Throws InvalidArgument for calls outside [1, 1000000] or a device
// that does not exist, RuntimeFailure in a build without CUDA or where a call fails.
CallCosts measure_call_costs(int device, int calls);

}  // namespace freeride
