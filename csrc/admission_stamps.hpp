// When the host-started path of a side admission passed each of its steps, for the
// benchmarks that split its delay (benchmarks/probes/probe_admission.py): the GPU
// reached an open and the thread waiting for it woke (the CUDA backend's open watcher),
// the executor's thread saw the gate open, and the launch was enqueued. Times are
// steady_now_ns()'s (steady_clock.hpp), so a probe can place its own readings among them.
#pragma once

#include <cstdint>
#include <mutex>

#include "steady_clock.hpp"

namespace freeride {

// One step's latest pass: the sequence number of the open it was for, and when.
// steady_ns 0: the step has not been passed yet.
struct AdmissionStamp {
  uint32_t seq = 0;
  int64_t steady_ns = 0;
};

struct AdmissionStamps {
  AdmissionStamp reached;   // the open watcher's wait for the open's event returned
  AdmissionStamp woke;      // the executor's thread saw the gate open, and launches
  AdmissionStamp launched;  // a launch the host made for that open was enqueued
};

// Keeps the latest of each step; written by the threads that pass them (one stamp per
// open at most: the watcher's, the executor's), read by benchmarks. A mutex, not
// atomics: a stamp is two words, read together.
class AdmissionStamper {
 public:
  void reached(uint32_t seq) { stamp(stamps_.reached, seq); }
  void woke(uint32_t seq) { stamp(stamps_.woke, seq); }
  void launched(uint32_t seq) { stamp(stamps_.launched, seq); }

  AdmissionStamps read() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stamps_;
  }

 private:
  void stamp(AdmissionStamp& step, uint32_t seq) {
    const int64_t now = steady_now_ns();
    std::lock_guard<std::mutex> lk(mu_);
    step = AdmissionStamp{seq, now};
  }

  mutable std::mutex mu_;
  AdmissionStamps stamps_;
};

}  // namespace freeride
