// CudaRunner: waiting for a launch's end and taking it (its counts, marks and the item
// protocol's check), settling the stream after it, and reading counts back where a launch
// ended without its end record.
#include "cuda/cuda_runner.hpp"

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "check.hpp"
#include "cuda/launch_ring.hpp"
#include "cuda/stream_idle.hpp"
#include "freeride/item_ctx.h"
#include "item_time.hpp"
#include "successor_rule.hpp"

namespace freeride::cuda {
namespace {

// An NVTX range on the calling thread for as long as it lives: each side launch, from the
// executor's taking it up to the host's seeing its end, on the executor thread, so that
// Nsight Systems shows side work beside the bubbles (python/freeride/profiling.py pushes
// those). NVTX is header-only and costs a pointer test per call unless a tool (nsys)
// injects itself.
class NvtxRange {
 public:
  explicit NvtxRange(const char* message) { nvtxRangePushA(message); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Waiting for a launch's end (CudaRunner::wait_for_end): spin this long, then sleep
// kEndPoll between looks at the end record where the end is near (the gate's mirror
// closed, a stop, the phase's items all claimed: a relaunch waits for that look, and 50 us
// is 2.5% of the default 2 ms slice), kEndPollFar where nothing says so (a launch that
// runs on in an open gate, or one queued ahead that has not begun: fewer wake-ups beside
// training; an open rings the bell and ends such a sleep), and ask the driver whether the
// stream is idle (a kernel that failed, or one that left without its end record) every
// kStreamQueryEvery. Under FREERIDE_ADMISSION=spin it yields instead of sleeping, but on
// the bell while a launch queued at an open waits for it. While the gate is closed, a
// launch queued ahead that has not begun (nearly always, while training runs ahead of the
// GPU) begins at an open at the earliest, and the watcher rings the bell then: where
// rings are on, this thread sleeps on it for kNotBegunWait and asks the driver only that
// often (review G14: 250 us sleeps and 1 ms queries woke it some 5,000 times a second
// through compute). Not while the gate reads open: a launch queued behind another begins
// when that one ends, unrung.
constexpr std::chrono::microseconds kEndSpin{20};
constexpr std::chrono::microseconds kEndPoll{50};
constexpr std::chrono::microseconds kEndPollFar{250};
constexpr std::chrono::microseconds kStreamQueryEvery{1000};
constexpr std::chrono::microseconds kNotBegunWait{20000};

// What a kernel whose launch broke the item protocol must do (both errors of it below),
// with what the task adds (device phases: for_each_phase_item).
std::string protocol_advice(const Task& task) {
  return "the kernel must call freeride::for_each_item(ctx, ...) in every block and not "
         "return before it ends, or it would be relaunched forever" +
         task.protocol_hint();
}

}  // namespace

// Waits for the oldest enqueued launch to end and takes it: its counts (the phase's
// progress), its marks and the item protocol's check.
LaunchMarks CudaRunner::finish_oldest() {
  CudaShared& s = *s_;
  Launch l;
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    FR_CHECK(!pending_.empty(), "no launch to take");
    l = pending_.front();
  }
  const NvtxRange range(nvtx_name_.c_str());
  LaunchEnd end;
  try {
    end = wait_for_end(l);
    if (end.handed_back) {
      LaunchMarks untaken;
      untaken.handed_back = true;
      return untaken;
    }
  } catch (const Abandoned&) {
    throw;  // still enqueued: ~CudaRunner leaks what it may write
  } catch (...) {
    // A CUDA error (a kernel that faulted): the context is broken, nothing enqueued
    // after it runs.
    std::lock_guard<std::mutex> lk(launch_mu_);
    taken_ += pending_.size();  // none of them ends now: their failure is taken instead
    pending_.clear();
    throw;
  }
  LaunchMarks marks;
  marks.admitted = true;
  marks.gate_seq = l.gate_seq;
  marks.at_open = l.at_open;
  marks.successor = l.successor;
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    pending_.pop_front();
    ++taken_;
    taken_stamp_ = std::max(taken_stamp_, l.stamp);
    // With phases ahead, a stale launch (its set of counters cleared since for the phase
    // two on) counts for nothing: it ran, before that clear, none of its phase's items.
    const uint64_t k = l.slot;
    if (!ahead_ || slot_phase_[k] == l.phase) {
      if (end.done >= ended_done_[k]) {
        const uint64_t measured =
            launch_block_item_ns(end.duration_ns, end.blocks, end.done - ended_done_[k]);
        block_item_ns_.store(smoothed_item_ns(block_item_ns_.load(), measured));
        ended_done_[k] = end.done;
      }
      raise_progress(k, end.done);
      // No further launch of it at an open.
      if (l.phase == phase_ && end.done >= l.n_items) phase_done_ = true;
    }
  }
  settle();
  if (l.record && end.duration_ns >= 0) {
    // Where its first block began and its last block left (no end record: no times).
    std::tie(marks.start, marks.end) =
        s.launch_marks(end.start_ns, end.start_ns + static_cast<uint64_t>(end.duration_ns));
  }
  if (end.broken) {
    // This launch has ended; those enqueued after it still run (the executor takes
    // them before the task fails, its memory still in use until then).
    FR_THROW(RuntimeFailure, task_->name() << ": a launch of phase " << l.phase
                                           << " ended without every block leaving through "
                                              "freeride::for_each_item: "
                                           << protocol_advice(*task_));
  }
  check_protocol(l, end.done, end.held);
  return marks;
}

// Until launch `l` has ended: its end record's number appears (written by the kernel's
// last block), or it turns out to have ended without one (the stream is idle, or the
// next launch has begun: a kernel that left the item protocol). Spins (yielding)
// kEndSpin, then sleeps between looks at the record (on the bell while the launch has
// not begun: an open rings it), and asks the driver about the stream only every
// kStreamQueryEvery (a failed kernel shows there).
LaunchEnd CudaRunner::wait_for_end(const Launch& l) {
  using clock = std::chrono::steady_clock;
  const auto started_wait = clock::now();
  auto next_query = started_wait + kStreamQueryEvery;
  // Sleeps on the bell for long: rung when this launch can begin (see kNotBegunWait).
  auto not_begun_in_compute = [&] {
    return s_->ring() && !s_->unrung.any() && s_->mirror() != FREERIDE_GATE_OPEN &&
           !ring_.started(l.number, launch_no_.load());
  };
  auto end_is_near = [&] {
    return s_->mirror() != FREERIDE_GATE_OPEN || stop_requested_.load() ||
           progress_seen(l.slot) >= l.n_items;
  };
  // Successors (freeride/successor_rule.hpp): decided once, kHandOverLeadNs before the
  // slice ends by this clock, counted from when the launch was first seen begun.
  bool successor_asked = !s_->successors || s_->slice_ns == 0;
  const bool spin = s_->admission == AdmissionMode::kSpin;
  clock::time_point seen_begun{};
  uint64_t progress_at_begin = 0;
  while (true) {
    throw_if_abandoned();
    if (ring_.published(l.number)) return ring_.read(l.number);
    // interrupt(): untaken whatever it does; hand_back(): only while it waits for its open
    // (each flag taken once either way).
    // (A load first: under FREERIDE_ADMISSION=spin this runs at every yield.)
    bool untaken = interrupt_.load() && interrupt_.exchange(false);
    if (!untaken && l.waits_open && hand_back_.load() && hand_back_.exchange(false)) {
      untaken = !ring_.started(l.number, launch_no_.load());
    }
    if (untaken) {
      LaunchEnd end;
      end.handed_back = true;
      return end;
    }
    const auto now = clock::now();
    if (!successor_asked && ring_.started(l.number, launch_no_.load())) {
      if (seen_begun == clock::time_point{}) {
        seen_begun = now;
        progress_at_begin = progress_seen(l.slot);
      }
      const long long lead = static_cast<long long>(s_->slice_ns) - kHandOverLeadNs;
      if (now - seen_begun >= std::chrono::nanoseconds(std::max(0LL, lead))) {
        successor_asked = true;
        maybe_queue_successor(progress_seen(l.slot) > progress_at_begin);
      }
    }
    if (now >= next_query) {
      bool idle = false;
      {
        const auto turn = s_->green_turn(green_);
        idle = stream_idle(stream_);
      }
      // The next launch begins only once this one has completed, after its record was
      // written: looked at before the record, so a record that arrived meanwhile is
      // seen below, not taken for a missing one.
      const bool next_began = !idle && ring_.started(l.number + 1, launch_no_.load());
      if (ring_.published(l.number)) return ring_.read(l.number);
      if (idle || next_began) return ended_without_record(l, idle);
      next_query = now + (not_begun_in_compute() ? kNotBegunWait : kStreamQueryEvery);
    }
    // Under FREERIDE_ADMISSION=spin, unless it has not begun and the gate reads closed (a
    // launch queued at an open that has not come: the GPU begins it by itself; one queued
    // at a later open while an earlier bubble is open spins through that bubble): its end
    // makes the executor's next launch due, which spin makes without a sleep's overshoot
    // (up to kEndPollFar, past a slice in an open gate).
    const bool spinning = spin && (s_->mirror() == FREERIDE_GATE_OPEN ||
                                   ring_.started(l.number, launch_no_.load()));
    if (now - started_wait < kEndSpin || spinning) {
      std::this_thread::yield();
    } else if (!ring_.started(l.number, launch_no_.load())) {
      Doorbell& bell = *s_->gate.bell;
      const uint64_t seen = bell.rings();
      if (!ring_.started(l.number, launch_no_.load()) && !abandoned_.load()) {
        // An open taking effect rings (where rings are on); so do a stop, an abandon
        // and a close.
        const auto left = std::chrono::duration_cast<std::chrono::microseconds>(next_query - now);
        bell.wait_for(seen, not_begun_in_compute() ? std::max(left, kEndPollFar) : kEndPollFar);
      }
    } else {
      std::this_thread::sleep_for(end_is_near() ? kEndPoll : kEndPollFar);
    }
    // Once it has begun, or the gate reads open, the driver is asked as often as before
    // (a query put 20 ms out while it waited in compute is brought back).
    if (!not_begun_in_compute()) next_query = std::min(next_query, clock::now() + kStreamQueryEvery);
  }
}

// Launch `l` ended without its end record: some block left without leave_launch (a
// kernel that returned before for_each_item or left it early). For a task that follows
// the item protocol that is a broken kernel, and relaunching it would repeat that for
// ever: it fails (finish_oldest). Otherwise (the kernel-slicing baseline) its counts
// are read back, on the stream once idle, and its launch counters cleared there for
// their next launch.
LaunchEnd CudaRunner::ended_without_record(const Launch& l, bool stream_is_idle) {
  if (task_->follows_item_protocol() || !stream_is_idle) {
    // (Without the protocol and with later launches enqueued, nothing may be read back
    // behind them: it fails too.)
    LaunchEnd broken;
    broken.broken = true;
    return broken;
  }
  return read_back(l.number);
}

// [done, stop, held] copied from the phase state and the launch's counters cleared, on
// the stream, idle: enqueued under launch_mu_ with this launch the only one pending (a
// task without the item protocol takes no launch at an open, accepting_locked, and this
// is asserted rather than assumed: review G13), then waited for by asking, never in a
// wait that close's deadline cannot end.
LaunchEnd CudaRunner::read_back(uint64_t number) {
  {
    std::lock_guard<std::mutex> lk(launch_mu_);
    const auto turn = s_->green_turn(green_);
    FR_CHECK(pending_.size() == 1 && stream_idle(stream_),
             task_->name() << ": a launch ended without its end record while another was "
                              "enqueued behind it: nothing can be read back");
    FR_CUDA_CHECK(cudaMemsetAsync(ring_.run_dev(number), 0, sizeof(fr_launch_run), stream_));
    FR_CUDA_CHECK(cudaMemcpyAsync(readback_host_, done_word(), 16, cudaMemcpyDeviceToHost,
                                  stream_));
    FR_CUDA_CHECK(cudaEventRecord(event_, stream_));
  }
  while (true) {
    throw_if_abandoned();
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaSuccess) break;
    if (err != cudaErrorNotReady) throw_cuda(err, "cudaEventQuery (read-back)", __FILE__, __LINE__);
    (void)cudaGetLastError();
    std::this_thread::sleep_for(kEndPoll);
  }
  LaunchEnd end;
  end.done = std::atomic_ref<unsigned long long>(readback_host_[0]).load();
  end.held = std::atomic_ref<unsigned int>(reinterpret_cast<unsigned int*>(readback_host_ + 1)[1])
                 .load();
  return end;
}

// After an end was taken: until this runner's kernel has left the stream, so that the
// next thing the executor enqueues (its own launch, a phase's reset, a read-back) does
// not queue behind it, and a final task's memory goes only once nothing of it runs (the
// kernel retires microseconds after its last block wrote the record). It has left once
// the stream is idle, once a launch enqueued after it (another task's: the next one
// armed, a follower) has begun, or, stopped, once the stop fence passed (stop() records
// it behind every launch of the runner, and before any of the next task's, which may
// wait for opens yet to come). Asking, with launch_mu_ held only around each look, never
// between them (review G12): a kernel that goes on working after for_each_item would
// otherwise hold a training thread's open, which takes launch_mu_ with the GIL held.
// Ends early where a launch of its own is enqueued meanwhile (the executor takes that
// one next, and it is stream-ordered behind this kernel anyway) or the runner is
// abandoned (close's deadline).
void CudaRunner::settle() {
  const auto begun = std::chrono::steady_clock::now();
  while (!abandoned_.load()) {
    uint64_t newest = 0;
    {
      std::lock_guard<std::mutex> lk(launch_mu_);
      if (!pending_.empty()) return;
      newest = newest_stamp_;
      const auto turn = s_->green_turn(green_);
      if (stopping() && stop_fenced_) {
        if (event_passed(stop_fence_)) return;
      } else if (stream_idle(stream_)) {
        return;  // (stopped without a fence yet, as an unstopped one: a stop() under way)
      }
    }
    if (s_->began_after(newest, stream_)) return;
    if (std::chrono::steady_clock::now() - begun < kEndSpin) {
      std::this_thread::yield();
    } else {
      Doorbell& bell = *s_->gate.bell;  // an abandon rings it
      bell.wait_for(bell.rings(), kEndPoll);
    }
  }
}

// Best effort after a failed enqueue in stream_wait mode: a gate wait kernel may be
// held on `side`. Waits by asking, never by enqueueing.
void CudaRunner::drain_side() noexcept {
  try {
    const auto turn = s_->green_turn(green_);
    while (!stream_idle(stream_) || !stream_idle(s_->side)) std::this_thread::sleep_for(kEndPoll);
  } catch (...) {
  }
  (void)cudaGetLastError();
}

// Every block of a launch exits either because no item is left or because the gate or
// the stop flag held it back (and counted itself in `held`). A launch that ends with
// its phase unfinished and nobody held back ran a kernel that never entered the item
// loop (or left it early): relaunching it would only repeat that, forever.
// A guarded launch whose phase before was not complete counts its blocks in `held` too
// (freeride/preempt.cuh: phase_ready). Each set of counters keeps its own `held`, which
// only ever counts up.
void CudaRunner::check_protocol(const Launch& l, uint64_t done, uint32_t held) {
  const uint64_t n_items = l.n_items;
  const bool held_back = held != last_held_[l.slot];
  last_held_[l.slot] = held;
  if (done >= n_items || held_back || !task_->follows_item_protocol()) return;
  FR_THROW(RuntimeFailure,
           "a launch of phase " << l.phase << " ended with " << done << " of " << n_items
                                << " items done although no block was held back by the gate "
                                   "or a stop: "
                                << protocol_advice(*task_));
}

void CudaRunner::raise_progress(uint64_t slot, uint64_t value) {
  std::lock_guard<std::mutex> lk(progress_mu_);
  max_seen_[slot] = std::max(max_seen_[slot], value);
}

}  // namespace freeride::cuda
