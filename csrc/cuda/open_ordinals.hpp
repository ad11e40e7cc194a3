// For each recent open, the ordinal the first close after it gets (freeride/slice.h:
// bubble_over): what the executor's own launches for that open's bubble carry
// (fr_item_ctx.next_close). A launch made at an open reads the ledger on the thread that
// wrote the open; the executor launches later, when the gate's mirror reads open under
// the open's number, by which time the host may have enqueued that bubble's close (it
// runs ahead of the GPU). Without the ordinal such a launch, beginning only after that
// close has executed (queued behind training's work under one hardware queue), would
// take the close for history and run into the next bubble, with that bubble's launch
// waiting behind it on the stream.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace freeride::cuda {

class OpenOrdinals {
 public:
  // The thread writing an open, before the open can take effect: `next_close` is the
  // ledger's next ordinal then (CloseLedger::next, never 0). The oldest of kKept is
  // forgotten (its launches then go by their first look alone).
  void note(uint32_t seq, uint32_t next_close) {
    words_[next_.fetch_add(1, std::memory_order_relaxed) % kKept].store(
        (static_cast<uint64_t>(next_close) << 32) | seq, std::memory_order_release);
  }

  // The ordinal noted for the open numbered `seq`, or 0 (none noted: an open captured
  // into a graph, or one forgotten).
  uint32_t next_close(uint32_t seq) const {
    for (const std::atomic<uint64_t>& word : words_) {
      const uint64_t w = word.load(std::memory_order_acquire);
      const uint32_t next_close = static_cast<uint32_t>(w >> 32);
      if (static_cast<uint32_t>(w) == seq && next_close != 0u) return next_close;
    }
    return 0u;
  }

  static constexpr size_t kKept = 64;

 private:
  std::array<std::atomic<uint64_t>, kKept> words_{};
  std::atomic<uint64_t> next_{0};
};

}  // namespace freeride::cuda
