// Lowering or raising an atomic to a value, lock-free: for extremes several threads
// report (the first start and last end of a launch's items, the most launches queued
// ahead of the GPU at once).
#pragma once

#include <atomic>

namespace freeride {

template <typename T>
void atomic_min(std::atomic<T>& word, T value) {
  T seen = word.load();
  while (value < seen && !word.compare_exchange_weak(seen, value)) {
  }
}

template <typename T>
void atomic_max(std::atomic<T>& word, T value) {
  T seen = word.load();
  while (value > seen && !word.compare_exchange_weak(seen, value)) {
  }
}

}  // namespace freeride
