// The protocol both backends implement: a gate, and runners that execute one task's
// phases as preemptible launches. The executor drives them and never touches a device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "admission_stamps.hpp"
#include "launch_slice_rule.hpp"
#include "task.hpp"

namespace freeride {

// Stream handle meaning "no stream": a gate write takes effect immediately.
constexpr uintptr_t kImmediate = ~uintptr_t(0);

// elapsed_ns() while a mark is still ahead of its stream.
constexpr int64_t kPending = INT64_MIN;

// Marks (timestamps in the device's own timeline) of one launch; 0 = not recorded.
struct LaunchMarks {
  uint64_t start = 0;
  uint64_t end = 0;
  // Whether the gate let the launch in (false: stopped while it waited), and the
  // sequence number of the open it was admitted under.
  bool admitted = false;
  uint32_t gate_seq = 0;
  // CUDA: enqueued by a training thread at a stream-ordered open (Backend::gate_write),
  // not by the executor when it saw the gate open. A launch that runs no item says
  // nothing then about the gate's mirror (the executor backs off only after one of its
  // own), only that its bubble was short or its phase already done.
  bool at_open = false;
  // CUDA: the executor's, queued behind a running launch (freeride/successor_rule.hpp).
  // One that runs no item found its predecessor's bubble closed: nothing about the
  // mirror either.
  bool successor = false;
  // run() returned without taking an end (PhaseRunner::hand_back): the launch it waited
  // for has not begun and is still in flight.
  bool handed_back = false;
};

// What a task must wait for before its first launch: the work its submitter's streams had
// enqueued at submit (its inputs may still be being written there). Backend-specific.
class StreamDependency {
 public:
  virtual ~StreamDependency() = default;

  // True once that work has completed, or can no longer complete (an error, which the
  // task's first launch then reports). Never blocks: the executor asks under its lock and
  // leaves a task whose dependency is not ready in the queue, running others meanwhile.
  virtual bool ready() const = 0;
};

// One task's execution state on a backend: the counters of its current phase.
class PhaseRunner {
 public:
  virtual ~PhaseRunner() = default;

  // Start `phase` of the task with `n_items` items: zero its claim and done counters.
  virtual void begin_phase(uint64_t phase, uint64_t n_items) = 0;

  // One launch of the current phase: waits on this thread until the gate is open or
  // stop() is requested (cuda with stream_wait: a stream wait on the side stream
  // instead), then runs items until the phase is complete, the gate closes or stop() is
  // requested. Returns once no item of the launch is executing any more. Throws if an
  // item or the launch failed, or if a launch of a task that follows the item protocol
  // left its phase unfinished although no block was held back by the gate or the stop
  // flag (a kernel that skipped for_each_item). With `record`, marks the launch's start
  // and end (a launch that never started, stopped while the gate was closed, has no marks).
  virtual LaunchMarks run(bool record) = 0;

  // Thread-safe. stop(): the running (or next) launch claims no further item; sticky
  // until resume(). The executor serialises both calls under its lock.
  virtual void stop() = 0;
  virtual void resume() = 0;

  // Launches at opens: from now on the training thread's stream-ordered opens enqueue this
  // runner's launches, before the executor's thread first runs it (run() arms a runner
  // itself). The executor arms the next task this way while the one before drains
  // launches that will run nothing (stopped for a more urgent task, cancelled, or with
  // every item done), so the next open carries the next task's launch instead of none
  // until the GPU has reached every open those were queued at. No effect where opens
  // carry no launch (the host backend), once stopped, or with launches of this runner in
  // flight. Never waits for the device.
  virtual void arm() {}
  // Thread-safe, after stop(): a run() waiting for the end of a launch that waits for its
  // open and has not begun returns at once without taking it (LaunchMarks::handed_back),
  // once, so that the executor's thread arms the next task now instead of when the GPU
  // reaches that open. A later run() waits for it as before.
  virtual void hand_back() {}
  // Thread-safe: a run() waiting for any launch's end returns at once without taking it
  // (LaunchMarks::handed_back), once: the executor takes a cancelled follower's ends
  // meanwhile, or arms a more urgent task while a withheld launch runs on.
  virtual void interrupt() {}
  // Thread-safe; preempted for a more urgent task (withhold_rule.hpp): as stop() for
  // launches not yet enqueued (no further one is taken, at an open or by run(), until
  // resume()), but those already enqueued claim items as before, each until its bubble's
  // close or its time slice. stop() afterwards stops them too. Where launches are not
  // queued ahead (the host backend), stop().
  virtual void withhold() { stop(); }
  // Bubbles the launches in flight run in, as far as the host can tell: one for each
  // open a launch not yet ended waits for, and one more where the oldest is the
  // executor's own (it runs in the bubble the executor saw open). withhold_rule.hpp.
  virtual uint64_t bubbles_in_flight() const { return in_flight() ? 1 : 0; }
  // Followers (follow_rule.hpp): as arm(), but the runner armed now keeps taking opens
  // too, and this one's launch is queued behind its launch at each (on the same stream
  // only). False where it does not follow (another stream; none where opens carry no
  // launch).
  virtual bool follow() { return false; }
  // Launches in flight (in_flight() counts them): CUDA's queued ahead at opens.
  virtual uint64_t launches_in_flight() const { return in_flight() ? 1 : 0; }

  // Items of the current phase finished so far; readable from any thread at any time.
  virtual uint64_t done() const = 0;

  // True while items of a launch may be executing: from admission (the gate read open)
  // until every block or worker exited (cuda with stream_wait: from enqueueing).
  virtual bool executing() const = 0;

  // Launches enqueued whose end run() has not returned yet (CUDA: launches at opens,
  // queued ahead of the GPU). While there are any the executor keeps calling run() on
  // this runner, one ended launch each, whatever else is queued: nothing else may be
  // enqueued on the stream behind them, the task is not final (its memory in use) until
  // they ended, and its next phase does not begin (begin_phase() is never called while
  // any is in flight) unless the runner begins phases in flight.
  virtual bool in_flight() const { return false; }

  // Phases ahead (phase_ahead_rule.hpp): begin_phase() may be called while launches of
  // the phase before are in flight (they claim nothing of the new phase), and launches at
  // opens may run the next phase before the executor begins it (done() then counts what
  // they finished as soon as it does). The executor still lets every launch end before
  // the task is final.
  virtual bool begins_phases_in_flight() const { return false; }
  // Phases ahead: items of the phase after the current one that launches chained at opens
  // finished and the runner has taken (done() counts them once that phase begins). The
  // executor adds them to items_done, so that a task cancelled or failed meanwhile keeps
  // an exact count. Any thread.
  virtual uint64_t done_ahead() const { return 0; }

  // After stop(): whether no launch in flight will run an item any more (the stop has
  // reached where launches read it, and none of them has begun) and every launch that
  // did run one has been taken, so done() is exact. The executor then makes a cancelled
  // task final without waiting for the GPU to reach the opens its launches were queued
  // for (they claim nothing); it still takes their ends before the task's memory goes.
  // Any thread, never blocking. False where a runner cannot tell.
  virtual bool inert() const { return false; }

  // For the bubble record (Executor::wait_launches_taken); any thread, never blocking.
  // launches_taken(): launches whose end run() has taken so far (returned it, or thrown
  // its error, or dropped it with a failure that ended every launch enqueued).
  // launches_ending(): that count plus the launches whose end has come and run() has not
  // taken yet (the host's workers all left, the GPU published its end record), and those
  // whose end comes without a further gate open: a launch that has begun, or is enqueued
  // to begin, while the gate reads closed, a stop is requested, or a time slice ends it.
  // A launch running on in an open bubble is not among them, nor one held back on the
  // device until the gate opens.
  virtual uint64_t launches_taken() const { return 0; }
  virtual uint64_t launches_ending() const { return launches_taken(); }

  // How long one block (CUDA) or worker (host) spends on one item of this task, in ns,
  // measured over its launches so far (freeride/item_time.hpp); 0 until one says. Any
  // thread, never blocking.
  virtual uint64_t block_item_ns() const { return 0; }

  // Close-time, past the executor's deadline (Executor::close): a run() in progress and
  // every later one throws Abandoned (check.hpp) at its next look instead of waiting on for a launch
  // that may never end. The runner then must not free what such a launch may still write.
  virtual void abandon() {}
};


class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string kind() const = 0;  // "host" or "cuda"
  virtual int device() const = 0;        // CUDA ordinal, -1 for the host
  // How gate writes on a stream are made: "batch", "memop", "copy" or "kernel" (see
  // cuda_driver::GateWrite); "host" on the host backend.
  virtual std::string gate_write_mechanism() const = 0;
  // Which writes of a batched gate write wait for the stream's earlier writes: "all" (the
  // batch's memory operations keep every fence, see CudaShared::enqueue_gate_batch); ""
  // for every other mechanism.
  virtual std::string gate_write_fences() const { return ""; }
  // How side kernels leave room for training's kernels: "occupancy-cap" or
  // "green-context (120 of 132 SMs)" on CUDA, "none" on the host. reserve_fallback():
  // why green-context was asked for and not used, else "".
  virtual std::string reserve_mechanism() const { return "none"; }
  virtual std::string reserve_fallback() const { return ""; }
  // The green context's workqueues: "shared" (the device's), "balanced" (its own,
  // FREERIDE_GREEN_WORKQUEUE=balanced), "shared (balanced not had: why)"; "" without a
  // green context.
  virtual std::string green_workqueues() const { return ""; }
  // Host backend: how its side threads stay out of training's way in every scheduling
  // group, not only their own ("sched-idle", "idle-cgroup" or "backoff": see
  // host_idle.hpp), and why that one; "" on CUDA.
  virtual std::string host_idle() const { return ""; }
  virtual std::string host_idle_reason() const { return ""; }

  // Gate. `stream` is a CUDA stream handle (0 = legacy default stream) or kImmediate.
  // `seq` is written beside the gate in the same order (before the value), so a reader of
  // the host-visible state knows which write it sees. Host backend: closing waits until
  // no item executes, which is when a close "takes effect" there. `launch` (CUDA, a
  // stream-ordered open): the open may carry the running task's next launch (see
  // CudaShared::launch_at_open); false where the caller knows the bubble is too short to
  // pay for one.
  virtual void gate_write(uint32_t value, uintptr_t stream, uint32_t seq, bool launch = true) = 0;
  // gate_write() and a mark() of where it took effect, in one call on the training
  // thread's path: before an open (side work has not resumed), after a close (it has
  // stopped), so recorded compute intervals hold no side work and bubbles all of it. 0
  // where no mark can be taken (CUDA: a write captured into a graph, where an event is no
  // point of the stream's timeline).
  virtual uint64_t gate_write_marked(uint32_t value, uintptr_t stream, uint32_t seq,
                                     bool launch = true) {
    if (value == FREERIDE_GATE_OPEN) {
      const uint64_t id = mark(stream);
      gate_write(value, stream, seq, launch);
      return id;
    }
    gate_write(value, stream, seq, launch);
    return mark(stream);
  }
  virtual uint32_t gate_read() const = 0;
  virtual uint32_t gate_seq() const = 0;
  // Sleeps until gate_read() is open (true) or `timeout_s` passed (false), without
  // polling: woken by opens (on CUDA once a stream-ordered open has taken effect; CUDA
  // under FREERIDE_ADMISSION=poll polls, and under "spin" yields between looks). For
  // threads that wait for bubbles beside training (iterative tasks).
  virtual bool wait_open(double timeout_s) const = 0;
  // Whether the gate reads open with a sequence number other than `seq` (an open newer
  // than the one `seq` names has taken effect: a new bubble), after sleeping until it
  // does, `timeout_s` passed or interrupt_waits() was called, whichever comes first.
  // Woken by opens like wait_open(), never by closes, so it costs nothing while training
  // computes (but under FREERIDE_ADMISSION=spin, which yields between looks); on CUDA any
  // other ring of the gate's bell ends it too, returning false (the first launch a
  // stream-ordered open enqueues, which a backing-off executor takes up; a runner's stop
  // or hand-back, rare), and callers look again. For waiters that already looked at the
  // bubble `seq` and found nothing to do in it: the executor after a launch that ran no
  // item, the iterative runner after a bubble without room for a step. (CUDA with
  // FREERIDE_ADMISSION=poll: nothing rings, it looks every 20 us. CUDA also looks at the
  // mirror every millisecond, and a mirror seen closed and then open again counts as a
  // newer open: a CUDA graph's replayed opens repeat their captured numbers and ring
  // nothing.)
  virtual bool wait_next_open(uint32_t seq, double timeout_s) const = 0;
  // Ends every wait_next_open() in progress and makes wait_open() look again: the
  // executor's submit, cancel and close, so that a wait for a new bubble does not hold
  // up a more urgent task or a close.
  virtual void interrupt_waits() = 0;
  // How a launch is admitted on CUDA: "ring" (the executor thread sleeps until a watcher
  // thread, waiting for an event recorded behind the open, wakes it), "poll" (it polls
  // the gate's mirror), "spin" (it yields between looks at the mirror and the bell) or
  // "stream-wait"; "host" on the host backend.
  virtual std::string admission() const { return "host"; }
  // CUDA: whether a stream-ordered open enqueues the running task's next launch then, at
  // the open's point of host order (see CudaShared::launch_at_open); false on the host.
  virtual bool launches_at_opens() const { return false; }
  // Whether the executor queues the next task behind a finishing one (follow_rule.hpp).
  virtual bool followers() const { return false; }
  // Whether a task preempted with launches queued at opens runs their items instead of
  // stopping them (withhold_rule.hpp).
  virtual bool withholds() const { return false; }
  // Whether a task that can serve every phase from one launch does
  // (Task::supports_device_phases; csrc/device_phases.hpp). Never on the host backend,
  // whose workers run a task's phases one after another themselves.
  virtual bool device_phases() const { return false; }
  // Stream-ordered opens whose launch was left out because it would wait behind another
  // training stream's open (freeride/open_launch_rule.hpp's G11); any thread.
  virtual uint64_t skipped_open_launches() const { return 0; }
  // Launches at stream-ordered opens left out because the executor's own launch for the
  // same open was on the side stream already (open_launch_rule.hpp's served_by_executor;
  // a follower's counts too); any thread.
  virtual uint64_t opens_served_by_executor() const { return 0; }
  // The most launches at opens enqueued and not yet begun at once, each counted as one
  // more was enqueued: how far ahead of the GPU the host queued side work (the lookahead
  // issue 36 asks to bound and report); any thread.
  virtual uint64_t max_lookahead() const { return 0; }
  // Stream-ordered opens that carried no launch because the lookahead bound was reached
  // (open_launch_rule.hpp's within_lookahead); any thread.
  virtual uint64_t opens_beyond_lookahead() const { return 0; }
  // Launches the open watcher's thread enqueued for the executor when the GPU reached an
  // open (FREERIDE_WATCHER_LAUNCH, watcher_launch_rule.hpp); any thread.
  virtual uint64_t watcher_launches() const { return 0; }
  // When the host-started path of the latest admissions passed its steps (benchmarks);
  // a step this backend does not have stays unstamped.
  virtual AdmissionStamps admission_stamps() const { return {}; }

  // Timestamps in stream order. mark() records "now" when `stream` reaches it (host: the
  // steady clock now) and returns an id; elapsed_ns(a, b) is the time from a to b once
  // both have been reached, else kPending; release_mark() frees an id. Thread-safe.
  virtual uint64_t mark(uintptr_t stream) = 0;
  virtual int64_t elapsed_ns(uint64_t from, uint64_t to) = 0;
  virtual void release_mark(uint64_t id) = 0;
  // Where `mark` stands on the wall clock: the Unix time (CLOCK_REALTIME ns) at which its
  // stream reached it, once it has; kPending where the backend cannot say within
  // `timeout_s` seconds (the mark not passed by then, the device's clock not tied to the
  // wall clock in time, or a backend without one: the default). May wait about
  // `timeout_s` on the calling thread; throws InvalidArgument for an unknown mark.
  // The bubble report's clock origin (merge_with_profiler_trace).
  virtual int64_t mark_unix_ns(uint64_t /*mark*/, double /*timeout_s*/) { return kPending; }
  // Address of the gate word as kernels see it (device pointer; host pointer on host).
  virtual uintptr_t gate_address() const = 0;

  // Captures, on the calling thread, the work enqueued so far on each of `streams` (CUDA
  // stream handles); a runner made with it starts its first launch only after that work.
  // nullptr where nothing needs waiting for (the host backend, whose compute is synchronous).
  virtual std::unique_ptr<StreamDependency> after_streams(const std::vector<uintptr_t>& streams) = 0;

  virtual std::unique_ptr<PhaseRunner> make_runner(std::shared_ptr<Task> task,
                                                   std::unique_ptr<StreamDependency> after) = 0;

  // Test-only (host backend; elsewhere it throws; Python reaches it only through
  // _C._testing.items_see_gate_closed): while `on`, items see the gate closed
  // whatever it reads, as kernels would see a closed gate word behind an open host
  // mirror (two gate writers racing on CUDA), so that tests can check what the executor
  // does about launches that a stale mirror admits and that run no item.
  virtual void test_items_see_gate_closed(bool on);

  // Close-time helper: lets a run() that is held waiting for the gate reach its stop
  // flag. Called repeatedly until the executor's run() returns.
  virtual void unblock() = 0;

  // The task's phases run plain, in order: no gate, no claims, no counters (the
  // item-overhead benchmark's reference for the same kernels). CUDA: enqueued on `stream`
  // (kImmediate: the side stream), returns once enqueued; host: every item on the
  // calling thread, returns when done.
  virtual void run_plain(Task& task, uintptr_t stream) = 0;

  // Called once on the executor's thread before its loop starts: the host backend runs
  // it at the workers' idle priority, so admitting launches never takes a core from
  // training (a normal-priority thread woken at every gate open and close would).
  virtual void on_executor_thread() {}

  // Side stream handle (0 on the host backend).
  virtual uintptr_t side_stream() const = 0;

  // Close-time, first of all (before the executor's loop may see that it is closing): no
  // launch is enqueued at an open from now on (CUDA); one in progress has been enqueued
  // when this returns, so the loop, looking after it, sees every launch it must drain.
  virtual void refuse_launches_at_opens() {}

  // Close-time, before the executor waits for its thread (which may still be in run()):
  // no launch starts after this, and the backend's own threads exit as soon as their
  // current item is done, at normal priority where the OS allows it (see
  // leave_idle_priority), so that closing on a busy machine does not wait for idle cores
  // several times over. A launch in progress ends at its next item boundary as with stop().
  virtual void begin_shutdown() {}

  // Close-time, before shutdown(), where launches were abandoned (PhaseRunner::abandon):
  // they may still run, so shutdown() waits for none of the side streams and frees
  // nothing they may write (CUDA; the host backend's items always finish).
  virtual void abandon_work() {}

  // Joins threads and frees resources. No run() may be in progress. Idempotent.
  virtual void shutdown() = 0;

  // After shutdown(): whether what launches left on the device (abandoned) may write has
  // been released, which happens once the device is seen to have passed them (CUDA: its
  // streams are idle); true where nothing was left. Never blocks.
  virtual bool reclaim_abandoned() { return true; }
};

// How a CUDA backend runs side kernels.
struct CudaOptions {
  // The gate word in mapped pinned host memory instead of device memory.
  bool gate_in_host_memory = false;
  // Admit launches with cuStreamWaitValue32 on the side stream rather than by polling
  // the gate's host mirror (see csrc/cuda/backend.cpp for why host admission is the default).
  bool stream_wait = false;
  // What side blocks leave free on every SM for the kernels training launches in bubbles.
  SmReserve reserve;
  // "occupancy-cap": `reserve` caps every side grid. "green-context": side kernels that
  // may (Task::runs_in_green_context) run in a green context holding all SMs but
  // `reserve_sms` (0: default_reserved_sms), uncapped; the rest keep the cap. Where the
  // driver offers no green context, occupancy-cap, with the reason recorded.
  std::string reserve_mechanism = "occupancy-cap";
  int reserve_sms = 0;
  // Longest a block of a launch keeps claiming items (0: until the gate closes; but see
  // launch_slice_rule.hpp).
  uint64_t slice_ns = kDefaultSliceNs;
  // Past its slice, the most slices a launch claims on in all while the close ending its
  // bubble is pending (fr_item_ctx.max_slices; 0: FREERIDE_MAX_SLICES).
  uint32_t max_slices = 0;
  // Gate write mechanism on a stream: "batch", "memop", "copy" or "kernel"; empty: the
  // FREERIDE_GATE_WRITE environment variable, else "batch". An unusable one falls back
  // (batch -> memop -> copy). Not exposed by the Python API: a benchmark and test knob.
  std::string gate_write;
};

// Factories. make_cuda_backend throws where the build has no CUDA or no device exists.
std::unique_ptr<Backend> make_host_backend(int workers);
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options);
// kind "host" (workers threads) or "cuda" (device ordinal and options).
std::unique_ptr<Backend> make_backend(const std::string& kind, int device, int workers,
                                      const CudaOptions& options);

}  // namespace freeride
