// A doorbell: one thread sleeps until another rings it. The CUDA backend's executor thread
// sleeps on one while the gate is closed, and a watcher thread (cuda/open_watcher.hpp)
// rings it once a stream-ordered open has taken effect, so admitting a launch costs no CPU
// while training computes. The host backend sleeps on one too, so it stays in the core.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace freeride {

class Doorbell {
 public:
  // Safe from any thread (no CUDA call, a short lock).
  void ring() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      rings_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
  }

  // The rings so far: read it before checking the condition that ringing announces,
  // then wait_for(seen, ...) misses no ring in between. Lock-free (the count changes
  // only under the lock, so a sleeper cannot miss it): a waiter that spins on it
  // (FREERIDE_ADMISSION=spin) takes no lock a ringer needs.
  uint64_t rings() const { return rings_.load(std::memory_order_acquire); }

  // Sleeps until the count differs from `seen` or `timeout` passed; the count then.
  uint64_t wait_for(uint64_t seen, std::chrono::microseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return rings_.load(std::memory_order_relaxed) != seen; });
    return rings_.load(std::memory_order_relaxed);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> rings_{0};
};

// A timeout in seconds as a duration: negative or NaN is 0, and at most a day (a larger
// or infinite value would overflow the clock's arithmetic).
inline std::chrono::steady_clock::duration clamp_timeout(double timeout_s) {
  constexpr double kDay = 86400.0;
  const double s = timeout_s > 0.0 ? (timeout_s < kDay ? timeout_s : kDay) : 0.0;
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// is_ready() after sleeping on `bell` until it holds, the bell rings once or `timeout_s`
// passed: a ring that does not make it hold ends the wait too (the ringer wants the
// waiter to look at something else).
template <typename IsReady>
bool wait_for_ring(Doorbell& bell, double timeout_s, IsReady is_ready) {
  const uint64_t seen = bell.rings();  // before the check: a ring in between counts
  if (is_ready()) return true;
  bell.wait_for(seen, std::chrono::duration_cast<std::chrono::microseconds>(
                          clamp_timeout(timeout_s)) +
                          std::chrono::microseconds(1));
  return is_ready();
}

// Sleeps on `bell` until is_open() holds (true) or `timeout_s` passed (false). The bell
// must ring on every change that can make is_open() true.
template <typename IsOpen>
bool wait_for_open(Doorbell& bell, double timeout_s, IsOpen is_open) {
  const auto deadline = std::chrono::steady_clock::now() + clamp_timeout(timeout_s);
  while (true) {
    const uint64_t seen = bell.rings();  // before the check: a ring in between counts
    if (is_open()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    bell.wait_for(seen, std::chrono::duration_cast<std::chrono::microseconds>(deadline - now) +
                            std::chrono::microseconds(1));
  }
}

}  // namespace freeride
