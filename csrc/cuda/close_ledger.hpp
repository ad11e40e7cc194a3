// The host's half of the rule in freeride/slice.h: which stream-ordered closes carry an
// ordinal, and when the latest one is published for kernels to read. Plain C++ (no CUDA),
// so that tests drive it on the CPU against a model of the device's slots.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "freeride/slice.h"

namespace freeride::cuda {

class CloseLedger {
 public:
  // `latest`: the host-visible word kernels read the latest ordinal from (mapped host
  // memory), zeroed here; the device's slots must read zero too before the first close.
  void place(unsigned int* latest) {
    latest_ = latest;
    std::atomic_ref<unsigned int>(*latest_).store(0);
  }

  // One stream-ordered close: `enqueue(ordinal)` puts the close's writes in its stream,
  // with the write of `ordinal` to its slot where the ordinal is not 0. A close that is
  // `counted` gets the next ordinal, published once `enqueue` returned: a close that failed
  // to enqueue never reads as pending, and one published before it executed can only read
  // as pending until it does. One that is not (captured into a graph: a replay would write
  // its ordinal again, long after later ones) gets 0 and changes nothing. Ordinals are
  // taken and published in one critical section, so they are published in the order
  // their closes were enqueued, whichever thread enqueues them.
  template <typename Enqueue>
  void close(bool counted, Enqueue&& enqueue) {
    if (!counted || latest_ == nullptr) {
      enqueue(0u);
      return;
    }
    std::lock_guard<std::mutex> lk(mu_);
    const uint32_t next =
        after(std::atomic_ref<unsigned int>(*latest_).load(std::memory_order_relaxed));
    enqueue(next);
    std::atomic_ref<unsigned int>(*latest_).store(next, std::memory_order_release);
  }

  uint32_t latest() const {
    return latest_ == nullptr ? 0u : std::atomic_ref<unsigned int>(*latest_).load();
  }

  // The ordinal the next counted close will get (fr_item_ctx.next_close of a launch made
  // at an open, read on the thread that wrote the open, before it can enqueue the close).
  uint32_t next() const { return after(latest()); }

  // The ordinal after `ordinal`: 0 is "no close yet" (the slots' first value), skipped.
  static uint32_t after(uint32_t ordinal) { return ordinal + 1u == 0u ? 1u : ordinal + 1u; }

  // Where the close with `ordinal` writes it, as an index into the slots.
  static unsigned int slot(uint32_t ordinal) { return ordinal & (FREERIDE_CLOSE_SLOTS - 1u); }

 private:
  std::mutex mu_;
  unsigned int* latest_ = nullptr;
};

}  // namespace freeride::cuda
