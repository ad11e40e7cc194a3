#include "open_watcher.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "check.hpp"
#include "thread_name.hpp"

namespace freeride {
namespace {

// Made up front, so that the training thread's first opens create none.
constexpr int kSpareEvents = 8;

cudaError_t make_event(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventBlockingSync | cudaEventDisableTiming);
}

}  // namespace

struct OpenWatcher::State {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<cudaEvent_t, Doorbell*>> pending;  // recorded, in recording order
  std::vector<cudaEvent_t> spare;                         // waited for, to record again
  bool retired = false;                                   // the backend let go of it
};

namespace {

void watch(const std::shared_ptr<OpenWatcher::State>& s) {
  name_this_thread("freeride-watch");
  (void)cudaSetDevice(s->device);
  // Its waits must not invalidate a CUDA graph that training captures meanwhile.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  (void)cudaGetLastError();
  std::unique_lock<std::mutex> lk(s->mu);
  while (true) {
    s->cv.wait(lk, [&] { return !s->pending.empty() || s->retired; });
    if (s->pending.empty()) break;  // retired, and nothing left to wait for
    const auto [event, bell] = s->pending.front();
    s->pending.pop_front();
    lk.unlock();
    // A blocking-sync event: the thread sleeps in the driver until the GPU gets there.
    if (cudaEventSynchronize(event) != cudaSuccess) (void)cudaGetLastError();
    bell->ring();  // also after an error: the waiter looks at the gate itself
    lk.lock();
    s->spare.push_back(event);
  }
  for (cudaEvent_t event : s->spare) (void)cudaEventDestroy(event);
  s->spare.clear();
  (void)cudaGetLastError();
}

}  // namespace

OpenWatcher::OpenWatcher(int device) : state_(std::make_shared<State>()) {
  state_->device = device;
  for (int i = 0; i < kSpareEvents; ++i) {
    cudaEvent_t event = nullptr;
    const cudaError_t err = make_event(&event);
    if (err != cudaSuccess) {
      for (cudaEvent_t made : state_->spare) (void)cudaEventDestroy(made);
      FR_CUDA_CHECK(err);
    }
    state_->spare.push_back(event);
  }
  // Detached: see ~OpenWatcher. The thread holds the state as long as it runs.
  std::thread(watch, state_).detach();
}

OpenWatcher::~OpenWatcher() {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->retired = true;
  }
  state_->cv.notify_one();
}

bool OpenWatcher::ring_after(cudaStream_t stream, Doorbell* bell) noexcept {
  State& s = *state_;
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.pending.size() >= kMaxPending) return false;
    if (!s.spare.empty()) {
      event = s.spare.back();
      s.spare.pop_back();
    }
  }
  if (event == nullptr && make_event(&event) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool recorded = cudaEventRecord(event, stream) == cudaSuccess;
  if (!recorded) (void)cudaGetLastError();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (recorded) {
      s.pending.emplace_back(event, bell);
    } else {
      s.spare.push_back(event);
    }
  }
  if (recorded) s.cv.notify_one();
  return recorded;
}

}  // namespace freeride
