// A StreamDependency released by hand: on the host backend, which has no streams to wait
// for, tests hold a queued task on it to drive the executor's dependency handling. Only
// _C._testing (test_hooks.cpp) uses it, so it lives beside the bindings, not in the core.
#pragma once

#include <atomic>
#include <memory>
#include <utility>

#include "backend.hpp"

namespace freeride {

class Latch {
 public:
  void release() { released_.store(true); }
  bool released() const { return released_.load(); }

 private:
  std::atomic<bool> released_{false};
};

class LatchDependency final : public StreamDependency {
 public:
  explicit LatchDependency(std::shared_ptr<const Latch> latch) : latch_(std::move(latch)) {}
  bool ready() const override { return latch_->released(); }

 private:
  std::shared_ptr<const Latch> latch_;
};

}  // namespace freeride
