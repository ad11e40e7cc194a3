#include "cuda/open_watcher.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
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
  bool exiting = false;  // the process is exiting: wait for no further event
};

namespace {

// Every watcher thread, so that the process's exit can end them before the statically
// linked CUDA runtime tears down under a thread still inside cudaEventSynchronize.
struct Threads {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  std::vector<std::weak_ptr<OpenWatcher::State>> states;
};

Threads& threads() {
  static auto* t = new Threads();  // leaked: used by the exit handler itself
  return *t;
}

// How long the exit waits for watcher threads: each is at most in one wait for an event
// its training stream reaches within an iteration; one stuck for good (a peer rank died)
// is left behind after this.
constexpr std::chrono::seconds kExitWait{2};

// Registered (once) by the first watcher, after CUDA initialised in this process, so it
// runs before the runtime's own exit handler (atexit runs them in reverse order).
void end_watchers_at_exit() {
  Threads& t = threads();
  std::unique_lock<std::mutex> lk(t.mu);
  for (const auto& weak : t.states) {
    if (auto state = weak.lock()) {
      std::lock_guard<std::mutex> slk(state->mu);
      state->exiting = true;
      state->retired = true;
      state->cv.notify_one();
    }
  }
  t.cv.wait_for(lk, kExitWait, [&] { return t.running == 0; });
}

}  // namespace

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
    if (s->pending.empty() || s->exiting) break;  // retired and drained, or exiting
    const auto [event, bell] = s->pending.front();
    s->pending.pop_front();
    lk.unlock();
    // A blocking-sync event: the thread sleeps in the driver until the GPU gets there.
    if (cudaEventSynchronize(event) != cudaSuccess) (void)cudaGetLastError();
    bell->ring();  // also after an error: the waiter looks at the gate itself
    lk.lock();
    s->spare.push_back(event);
  }
  if (!s->exiting) {  // at exit the runtime may already be going: leave the events
    for (cudaEvent_t event : s->spare) (void)cudaEventDestroy(event);
    s->spare.clear();
    (void)cudaGetLastError();
  }
  lk.unlock();
  Threads& t = threads();
  std::lock_guard<std::mutex> tlk(t.mu);
  --t.running;
  t.cv.notify_all();
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
  // Detached: see ~OpenWatcher. The thread holds the state as long as it runs; the exit
  // handler ends it (end_watchers_at_exit).
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(end_watchers_at_exit); });
  {
    Threads& t = threads();
    std::lock_guard<std::mutex> lk(t.mu);
    std::erase_if(t.states, [](const auto& weak) { return weak.expired(); });
    t.states.push_back(state_);
    ++t.running;
  }
  try {
    std::thread(watch, state_).detach();
  } catch (...) {
    Threads& t = threads();
    std::lock_guard<std::mutex> lk(t.mu);
    --t.running;
    throw;
  }
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
