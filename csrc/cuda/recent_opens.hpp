// A note of 32 bits on each of the last kKept opens, found by the open's sequence
// number: written by the thread that writes the open, before the open can take effect,
// read by the executor and the watcher when the gate's mirror reads open under that
// number. Lock-free: one 64-bit word per note (the note above the number), the oldest
// overwritten. Sequence numbers are 32 bits, so a number comes again only after four
// billion gate writes. SkippedOpens and OpenOrdinals keep their notes here.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace freeride::cuda {

class RecentOpens {
 public:
  // `note` must not be 0 (that is "no note").
  void note(uint32_t seq, uint32_t note) {
    words_[next_.fetch_add(1, std::memory_order_relaxed) % kKept].store(
        (static_cast<uint64_t>(note) << 32) | seq, std::memory_order_release);
  }

  // The note of the open numbered `seq`, or 0 (none, or forgotten).
  uint32_t find(uint32_t seq) const {
    for (const std::atomic<uint64_t>& word : words_) {
      const uint64_t w = word.load(std::memory_order_acquire);
      const uint32_t note = static_cast<uint32_t>(w >> 32);
      if (static_cast<uint32_t>(w) == seq && note != 0u) return note;
    }
    return 0u;
  }

  static constexpr size_t kKept = 64;

 private:
  std::array<std::atomic<uint64_t>, kKept> words_{};
  std::atomic<uint64_t> next_{0};
};

}  // namespace freeride::cuda
