#include "open_watcher.hpp"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace freeride {

struct OpenWatcher::State {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<cudaEvent_t, Doorbell*>> pending;  // recorded, in recording order
  std::vector<cudaEvent_t> spare;                         // waited for, to record again
};

OpenWatcher& OpenWatcher::for_device(int device) {
  static std::mutex mu;
  static auto* watchers = new std::map<int, OpenWatcher*>();  // leaked on purpose
  std::lock_guard<std::mutex> lk(mu);
  OpenWatcher*& w = (*watchers)[device];
  if (w == nullptr) w = new OpenWatcher(device);
  return *w;
}

OpenWatcher::OpenWatcher(int device) : state_(new State()) {
  state_->device = device;
  State* s = state_;
  // Detached: it may wait forever for a stream that never gets there (a rank whose peer
  // died), and nothing it touches is ever freed.
  std::thread([s] {
    (void)cudaSetDevice(s->device);
    // Its waits must not invalidate a CUDA graph that training captures meanwhile.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    (void)cudaGetLastError();
    std::unique_lock<std::mutex> lk(s->mu);
    while (true) {
      s->cv.wait(lk, [&] { return !s->pending.empty(); });
      const auto [event, bell] = s->pending.front();
      s->pending.pop_front();
      lk.unlock();
      // A blocking-sync event: the thread sleeps in the driver until the GPU gets there.
      const cudaError_t err = cudaEventSynchronize(event);
      if (err != cudaSuccess) (void)cudaGetLastError();
      bell->ring();  // also on an error: the waiter looks at the gate itself
      lk.lock();
      s->spare.push_back(event);
    }
  }).detach();
}

bool OpenWatcher::ring_after(cudaStream_t stream, Doorbell* bell) noexcept {
  State* s = state_;
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lk(s->mu);
    if (!s->spare.empty()) {
      event = s->spare.back();
      s->spare.pop_back();
    }
  }
  if (event == nullptr &&
      cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool recorded = cudaEventRecord(event, stream) == cudaSuccess;
  if (!recorded) (void)cudaGetLastError();
  {
    std::lock_guard<std::mutex> lk(s->mu);
    if (recorded) {
      s->pending.emplace_back(event, bell);
    } else {
      s->spare.push_back(event);
    }
  }
  if (recorded) s->cv.notify_one();
  return recorded;
}

}  // namespace freeride
