// Stream-ordered opens that carry no launch because their bubble is predicted too short to
// pay for one (the recorder's skip, python/freeride/record/recorder.py): the executor must
// not launch into them either. Its own launch would come a host round trip after the open
// took effect, land in the compute after the bubble, run nothing there and start a
// backoff (review G10).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace freeride::cuda {

class SkippedOpens {
 public:
  // The training thread, as it enqueues an open without a launch: noted before the open
  // can take effect. The oldest of kKept is forgotten: enough for every open the host
  // queues ahead of the GPU in an iteration of a pipeline schedule (a forgotten one would
  // get the executor's launch, as before).
  void note(uint32_t seq) {
    words_[next_.fetch_add(1, std::memory_order_relaxed) % kKept].store(
        kNoted | seq, std::memory_order_release);
  }

  // The executor, when the gate's mirror reads open under `seq`. Sequence numbers are
  // 32 bits, so a noted one comes again only after four billion gate writes.
  bool contains(uint32_t seq) const {
    for (const std::atomic<uint64_t>& word : words_) {
      if (word.load(std::memory_order_acquire) == (kNoted | seq)) return true;
    }
    return false;
  }

  static constexpr size_t kKept = 64;

 private:
  static constexpr uint64_t kNoted = 1ull << 32;  // a word's seq is valid
  std::array<std::atomic<uint64_t>, kKept> words_{};
  std::atomic<uint64_t> next_{0};
};

}  // namespace freeride::cuda
