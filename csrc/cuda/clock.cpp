// CudaShared's clock anchor: %globaltimer, the clock kernels read and end records carry,
// placed on the marks' event timeline, so that a launch's marks are where its first block
// began and its last block left (see shared.hpp).
#include <chrono>
#include <thread>
#include <utility>

#include "capture_mode.hpp"
#include "cuda/shared.hpp"
#include "launchers.hpp"

namespace freeride::cuda {

void CudaShared::enqueue_anchor_locked() {
  auto* stamp = reinterpret_cast<unsigned long long*>(clock_slot.host);
  std::atomic_ref<unsigned long long>(*stamp).store(0);
  PendingAnchor made;
  made.before = mark_locked(control);
  try {
    kernels::launch_clock_stamp(reinterpret_cast<unsigned long long*>(clock_slot.dev), control);
    made.after = mark_locked(control);
  } catch (...) {
    release_locked(made.before);
    throw;
  }
  pending_anchor = made;
}

bool CudaShared::adopt_anchor_locked() {
  if (pending_anchor.before == 0) return false;
  cudaEvent_t before = marks.at(pending_anchor.before);
  cudaEvent_t after = marks.at(pending_anchor.after);
  float ms = 0.f;
  const cudaError_t err = cudaEventElapsedTime(&ms, before, after);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  const uint64_t stamp = std::atomic_ref<unsigned long long>(
                             *reinterpret_cast<unsigned long long*>(clock_slot.host))
                             .load();
  const PendingAnchor done = pending_anchor;
  pending_anchor = PendingAnchor{};
  release_locked(done.after);
  const auto bracket_ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  // The first anchor is taken whatever its bracket (better than none); a later one only
  // where its events were close (the stamp kernel found an SM at once).
  const bool take = err == cudaSuccess && stamp != 0 &&
                    (anchor.mark == 0 || bracket_ns <= kAnchorBracketNs);
  if (err != cudaSuccess) (void)cudaGetLastError();
  if (!take) {
    release_locked(done.before);
    return false;
  }
  const uint64_t old = anchor.mark;
  anchor = ClockAnchor{done.before, stamp, bracket_ns / 2};
  if (old != 0) release_locked(old);  // freed now, or with the last mark standing on it
  return true;
}

void CudaShared::anchor_clock() {
  const RelaxedCaptureScope relaxed;
  std::lock_guard<std::mutex> lk(marks_mu);
  enqueue_anchor_locked();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!adopt_anchor_locked() && pending_anchor.before != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::pair<uint64_t, uint64_t> CudaShared::launch_marks(uint64_t start_ns, uint64_t end_ns) {
  const RelaxedCaptureScope relaxed;
  std::lock_guard<std::mutex> lk(marks_mu);
  (void)adopt_anchor_locked();
  if (anchor.mark == 0) return {0, 0};
  const int64_t since = static_cast<int64_t>(start_ns - anchor.timer_ns);
  if ((since > kReanchorNs || since < -kReanchorNs) && pending_anchor.before == 0) {
    try {
      enqueue_anchor_locked();
    } catch (...) {
      (void)cudaGetLastError();  // the old anchor serves on
    }
  }
  const uint64_t base = anchor.mark;
  const int64_t from = anchor.offset_ns + since;
  const int64_t to = from + static_cast<int64_t>(end_ns - start_ns);
  return {derive_locked(base, from), derive_locked(base, to)};
}

}  // namespace freeride::cuda
