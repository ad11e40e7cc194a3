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

#include "capture_mode.hpp"
#include "check.hpp"
#include "thread_name.hpp"

#ifdef FREERIDE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/driver.hpp"
#endif

namespace freeride {
namespace {

// Made up front, so that the training thread's first opens create none.
constexpr int kSpareEvents = 8;

}  // namespace

struct OpenWatcher::State {
  int device = 0;
  WatcherEvents events{};
  std::mutex mu;
  std::condition_variable cv;
  struct Recorded {
    void* event;
    Doorbell* bell;
    uint32_t seq;
  };
  std::deque<Recorded> pending;  // in recording order
  std::vector<void*> spare;      // waited for, to record again
  Reached reached;               // on_reached's: set before the first event, then read only
  std::shared_ptr<AdmissionStamper> stamps;  // set at construction, then read only
  bool started = false;          // the thread is past start_thread
  bool retired = false;          // the backend let go of it
  bool exiting = false;  // the process is exiting: no further wait, no CUDA call
  bool in_hook = false;  // `reached` runs (it may make CUDA calls)
};

namespace {

// Every watcher's state, so that the process's exit can tell the threads.
struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<OpenWatcher::State>> states;
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: used by the exit handler itself
  return *r;
}

// The process's exit does not wait for the watcher threads: one is, at any time, most
// likely inside a wait for an event its training stream has not reached yet, which may
// be seconds of queued GPU work away, or never (a peer rank died). So this handler only
// flags every watcher as exiting and returns; a thread that comes back from its wait sees
// the flag and leaves at once, and one that does not is ended with the process.
//
// Why a thread may be left inside its wait while the process exits. The order at exit:
// Python's finalizers (the harvester closes: its watcher is retired), the C atexit
// handlers in reverse order of registration (this one, registered after CUDA initialised,
// before the statically linked runtime's teardown), the shared libraries' destructors,
// then exit_group, which ends every remaining thread wherever it is.
// - The wait is cuEventSynchronize through the driver's entry point (cuda_wait), not
//   cudaEventSynchronize: the thread sleeps in libcuda, not in the static runtime, whose
//   teardown frees the runtime's own state, which a thread inside the runtime's call
//   would still use. libcuda is assumed to stay loaded until the process ends: the
//   runtime loads it with dlopen (so do torch's and NCCL's), and glibc unmaps a library
//   only at its last dlclose.
// - Once the flag is set the thread makes no CUDA call: its events are left to the
//   process's end rather than destroyed, and flag and destruction are both under the
//   state's mutex, so no destruction runs beside the runtime's teardown. The thread
//   touches only memory that outlives it: its state (it holds it), the registry (leaked)
//   and the gates' bells (never freed).
// - What is not guaranteed: the runtime's teardown releases the primary context, and
//   where that was the last reference (no torch in the process) the context is destroyed
//   while the thread sleeps on one of its events. cuCtxDestroy leaves concurrent calls to
//   the caller, so what the wait then does is the driver's: return an error (the thread
//   then leaves, as above) or sleep on until exit_group. The handler this one replaced
//   left the thread in the same place after waiting 2 s for it. Neither this nor the
//   assumption above has been seen on a GPU yet (tests/test_gpu.py's exit test is the
//   check).
// - The hook (on_reached) makes CUDA calls, a launch's: one under way (a harvester left
//   open at exit, its GPU reaching an open just then) is waited for, up to kHookAtExit,
//   so that it does not run beside the runtime's teardown; it takes microseconds unless
//   a lock it needs is held by a thread stopped in the middle of a call.
constexpr std::chrono::milliseconds kHookAtExit{100};

void end_watchers_at_exit() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  for (const auto& weak : r.states) {
    if (auto state = weak.lock()) {
      std::unique_lock<std::mutex> slk(state->mu);  // held only for bookkeeping: short
      state->exiting = true;
      state->retired = true;
      state->cv.notify_all();
      state->cv.wait_for(slk, kHookAtExit, [&] { return !state->in_hook; });
    }
  }
}

// Retired or exiting while the wait went on (a backend's shutdown usually comes while its
// watcher waits): no call, and at exit none of the CUDA calls the hook would make.
void call_reached(OpenWatcher::State& s, uint32_t seq) {
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.retired) return;
    s.in_hook = true;
  }
  try {
    s.reached(seq);
  } catch (...) {
    // The bell still rings: whoever waits on it looks at the gate itself.
  }
  std::lock_guard<std::mutex> lk(s.mu);
  s.in_hook = false;
  s.cv.notify_all();  // the exit handler may wait for it
}

void watch(const std::shared_ptr<OpenWatcher::State>& s) {
  name_this_thread("freeride-watch");
  s->events.start_thread(s->device);
  std::unique_lock<std::mutex> lk(s->mu);
  s->started = true;
  s->cv.notify_all();
  while (true) {
    s->cv.wait(lk, [&] { return !s->pending.empty() || s->retired; });
    if (s->pending.empty() || s->exiting) break;  // retired and drained, or exiting
    const OpenWatcher::State::Recorded r = s->pending.front();
    s->pending.pop_front();
    lk.unlock();
    s->events.wait(r.event);
    if (s->stamps) s->stamps->reached(r.seq);
    if (s->reached) call_reached(*s, r.seq);
    r.bell->ring();  // also after an error: the waiter looks at the gate itself
    lk.lock();
    try {
      s->spare.push_back(r.event);  // room reserved for every event there can be
    } catch (...) {
      s->events.destroy(r.event);  // out of memory past that: one event fewer
    }
  }
  if (!s->exiting) {  // at exit: no CUDA call (see end_watchers_at_exit)
    for (void* event : s->spare) s->events.destroy(event);
    s->spare.clear();
  }
}

#ifdef FREERIDE_WITH_CUDA
void cuda_start_thread(int device) {
  (void)cudaSetDevice(device);
  // Its waits must not invalidate a CUDA graph that training captures meanwhile (the
  // mode is the thread's, for the driver's calls too).
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  (void)cudaGetLastError();
}

bool cuda_make(void** event, std::string* why) {
  cudaEvent_t made = nullptr;
  // On a training thread (an open with every spare event pending): beside a capture in
  // global mode on another thread, as every call freeride makes there.
  const RelaxedCaptureScope relaxed;
  // Blocking sync: the waiting thread sleeps in the driver instead of spinning.
  const cudaError_t err =
      cudaEventCreateWithFlags(&made, cudaEventBlockingSync | cudaEventDisableTiming);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string("cudaEventCreateWithFlags failed: ") + cudaGetErrorName(err);
    return false;
  }
  *event = made;
  return true;
}

bool cuda_record(void* event, void* stream) {
  if (cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)) ==
      cudaSuccess) {
    return true;
  }
  (void)cudaGetLastError();
  return false;
}

void cuda_wait(void* event) {
  // An error (a context that failed) ends the wait like success: the bell rings and the
  // executor looks at the gate and its stream itself.
  (void)cuda_driver::api().event_synchronize(static_cast<CUevent>(event));
}

void cuda_destroy(void* event) {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
  (void)cudaGetLastError();
}

const WatcherEvents& cuda_events() {
  const cuda_driver::Api& a = cuda_driver::api();
  FR_CHECK(a.event_synchronize != nullptr,
           "the open watcher needs the driver's cuEventSynchronize: " << a.error);
  static const WatcherEvents events{cuda_start_thread, cuda_make, cuda_record, cuda_wait,
                                    cuda_destroy};
  return events;
}
#endif

}  // namespace

#ifdef FREERIDE_WITH_CUDA
OpenWatcher::OpenWatcher(int device, std::shared_ptr<AdmissionStamper> stamps)
    : OpenWatcher(device, cuda_events(), std::move(stamps)) {}
#endif

OpenWatcher::OpenWatcher(int device, const WatcherEvents& events,
                         std::shared_ptr<AdmissionStamper> stamps)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.device = device;
  s.events = events;
  s.stamps = std::move(stamps);
  // Room for every event there can be (the spares and kMaxPending pending), so that
  // giving one back never allocates on the watcher's thread.
  s.spare.reserve(kSpareEvents + kMaxPending + 1);
  for (int i = 0; i < kSpareEvents; ++i) {
    void* event = nullptr;
    std::string why;
    if (!s.events.make(&event, &why)) {
      for (void* made : s.spare) s.events.destroy(made);
      FR_THROW(RuntimeFailure, "the open watcher's events: " << why);
    }
    s.spare.push_back(event);
  }
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(end_watchers_at_exit); });
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    std::erase_if(r.states, [](const auto& weak) { return weak.expired(); });
    r.states.push_back(state_);
  }
  // Detached: see ~OpenWatcher. The thread holds the state as long as it runs.
  try {
    std::thread(watch, state_).detach();
  } catch (...) {
    for (void* made : s.spare) s.events.destroy(made);
    s.spare.clear();
    throw;
  }
  // Its runtime calls (device, capture mode) are over before the harvester exists, so
  // none of them can run beside the runtime's teardown at exit.
  std::unique_lock<std::mutex> lk(s.mu);
  s.cv.wait(lk, [&] { return s.started; });
}

OpenWatcher::~OpenWatcher() {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->retired = true;
  }
  state_->cv.notify_one();
}

void OpenWatcher::on_reached(Reached hook) {
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->reached = std::move(hook);
}

bool OpenWatcher::ring_after(void* stream, Doorbell* bell, uint32_t seq,
                             AfterRecord then) noexcept {
  State& s = *state_;
  void* event = nullptr;
  bool full = false;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    full = s.pending.size() >= kMaxPending;
    if (!full && !s.spare.empty()) {
      event = s.spare.back();
      s.spare.pop_back();
    }
  }
  if (!full && event == nullptr) {
    std::string why;
    if (!s.events.make(&event, &why)) event = nullptr;
  }
  const bool recorded = event != nullptr && s.events.record(event, stream);
  if (then.call != nullptr) {
    // Before the thread may wait for the event: until it has, nothing records it again.
    try {
      then.call(then.context, recorded ? event : nullptr);
    } catch (...) {
    }
  }
  if (event == nullptr) return false;
  try {
    std::lock_guard<std::mutex> lk(s.mu);
    if (recorded) {
      s.pending.push_back(State::Recorded{event, bell, seq});
    } else {
      s.spare.push_back(event);
    }
  } catch (...) {
    return false;  // out of memory: the event is lost, the open counts as unrung
  }
  if (recorded) s.cv.notify_one();
  return recorded;
}

}  // namespace freeride
