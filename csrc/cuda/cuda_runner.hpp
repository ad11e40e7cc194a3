// CudaRunner, the PhaseRunner that make_runner (cuda/runner.hpp) returns; private to
// csrc/cuda. Its member functions are defined by concern: runner.cpp its construction,
// destruction and phase control; runner_launch.cpp enqueueing launches (the executor's,
// those at opens, stream_wait's hold) and the stop word; runner_end.cpp waiting for their
// ends, settling the stream and reading counts back.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "backend.hpp"
#include "cuda/dependency.hpp"
#include "cuda/launch_ring.hpp"
#include "cuda/shared.hpp"
#include "cuda/slot_pool.hpp"
#include "freeride/item_ctx.h"
#include "phase_ahead_rule.hpp"
#include "task.hpp"

namespace freeride::cuda {

// One task's phases on the side (or green-context) stream.
//
// Launches come from two places. A training thread's stream-ordered open enqueues one
// (launch_at_open: the runner is armed while the executor runs it), ordered after the
// open by an event, at the open's point of host order; and the executor enqueues one
// itself when it sees the gate open with none enqueued (a bubble whose open carried none,
// a relaunch after a launch's time slice), or, with FREERIDE_WATCHER_LAUNCH, the open
// watcher's thread enqueues that one for it when the GPU reaches such an open
// (launch_at_reached_open). Launches queue back to back on the one stream,
// each with its own counters and end record (rings of kLaunchRing, by launch number), and
// the executor takes their ends in order, one per run(). Nothing else is enqueued on the
// stream while any is enqueued and not seen to end: everything the executor enqueues
// (its own launch, a phase's reset, a read-back) goes to an idle stream, so it never
// waits behind a launch whose bubble has not come.
//
// A phase's launches at opens may be queued ahead of the GPU when the phase ends: they
// claim no item (every item of their phase is claimed) and are taken like any other; the
// executor begins the next phase, whose counters are reset on the stream, only once the
// last of them ended (it never calls begin_phase() with launches in flight). With phases
// ahead (phase_ahead_rule.hpp) it does not wait: phases alternate between two sets of
// counters, each cleared on the stream before its new phase's first launch, and an open
// also chains a guarded launch of the next phase.
class CudaRunner final : public PhaseRunner, public OpenLauncher {
 public:
  CudaRunner(std::shared_ptr<CudaShared> shared, std::shared_ptr<Task> task,
             std::unique_ptr<StreamDependency> after);
  ~CudaRunner() override;

  void begin_phase(uint64_t phase, uint64_t n_items) override;
  bool begins_phases_in_flight() const override { return ahead_; }
  bool inert() const override;
  uint64_t done_ahead() const override;
  LaunchMarks run(bool record) override;
  bool launch_at_open(cudaStream_t training, cudaEvent_t opened, uint32_t seq,
                      const OpenContext& context) noexcept override;
  void add_waiting_opens(WaitingOpens& into, cudaStream_t stream) const noexcept override;
  bool launch_at_reached_open(uint32_t seq, bool others_pending) noexcept override;
  bool pending_on(cudaStream_t stream) const noexcept override;
  bool begun_after(uint64_t stamp) const noexcept override;
  void stop() override;
  void withhold() override;
  void resume() override;
  void arm() override;
  void hand_back() override;
  bool follow() override;
  void interrupt() override;
  uint64_t launches_in_flight() const override;
  uint64_t bubbles_in_flight() const override;
  cudaStream_t launch_stream() const noexcept override { return stream_; }
  uint64_t done() const override;
  bool executing() const override;
  bool in_flight() const override;
  uint64_t launches_taken() const override;
  uint64_t launches_ending() const override;
  uint64_t block_item_ns() const override { return block_item_ns_.load(); }
  void abandon() override;

 private:
  // A launch enqueued and not yet seen to end.
  struct Launch {
    uint64_t number = 0;
    uint64_t stamp = 0;    // CudaShared::launch_stamps: its place among every runner's
    uint64_t phase = 0;    // the phase it launches
    uint64_t slot = 0;     // the set of counters it claims from (phase_slot; 0 without ahead_)
    bool guarded = false;  // chained behind the phase before (fr_item_ctx.after_done)
    bool waits_open = false;  // waits on the side stream for its open (not a chained one)
    uint64_t n_items = 0;  // that phase's items
    bool record = false;   // marks wanted
    uint32_t gate_seq = 0;  // the open it was enqueued at (or seen under)
    bool at_open = false;
    bool successor = false;  // the executor's, queued behind a running launch
    cudaStream_t training = nullptr;  // at an open: the training stream it waits on
    uint64_t slice_ns = 0;  // the time slice it carries (fr_item_ctx.slice_ns; 0: none)
  };

  // Whether launches may be enqueued at all (begun, no stop, no error...); and whether the
  // current phase takes one more (accepting_locked). Caller holds launch_mu_.
  bool open_for_launches_locked() const;
  // Whether this runner should be the one opens launch (run() and arm()): not stopped,
  // nothing of it in flight, and a phase for them to run. Caller holds launch_mu_.
  bool takes_opens_locked() const;
  bool accepting_locked() const;
  bool stop_landed_and_none_begun() const;  // inert(), which catches what this throws
  // Launches at opens that wait for their open on the stream and have not begun: opens
  // the host is ahead of the GPU by, as far as this runner's launches tell. Caller holds
  // launch_mu_.
  uint64_t opens_ahead_locked() const;
  // add_waiting_opens with launch_mu_ held.
  void waiting_opens_locked(WaitingOpens& into, cudaStream_t stream) const;
  // stop(): stop_fence_ recorded on the stream behind every launch of this runner.
  void fence_stopped_locked();
  uint64_t slot_of(uint64_t phase) const { return ahead_ ? phase_slot(phase) : 0; }
  // Phases ahead: the set of counters of `phase`, cleared on the stream (behind every
  // launch enqueued so far) unless it is already that phase's. Caller holds launch_mu_
  // and the green context's turn.
  void claim_slot_locked(uint64_t phase);
  // Set k cleared for `phase`, on the stream and in the host's view. Caller holds
  // launch_mu_ and the green context's turn.
  void clear_set_locked(uint64_t k, uint64_t phase);
  // While the oldest launch runs, near its slice's end (`progressed`: the phase's progress
  // moved since it began): the executor's next one behind it, where
  // freeride/successor_rule.hpp says so. A failed enqueue is kept as arrival_error_, as a
  // failed launch at an open is (run() raises it, and the executor drains what is in
  // flight), never thrown here: the running launch must stay pending.
  void maybe_queue_successor(bool progressed) noexcept;
  bool end_has_come_locked(const Launch& l) const;
  void throw_if_abandoned() const;
  void throw_arrival_error_locked();
  void enqueue_locked(cudaEvent_t opened, uint32_t seq, bool at_open, bool record,
                      uint64_t phase, bool guarded = false);
  void hold_until_open();
  LaunchMarks run_held(bool record);
  LaunchMarks finish_oldest();
  LaunchEnd wait_for_end(const Launch& l);
  LaunchEnd ended_without_record(const Launch& l, bool stream_is_idle);
  LaunchEnd read_back(uint64_t number);
  void settle();
  bool quietly_idle() noexcept;
  void drain_side() noexcept;
  void destroy_events() noexcept;
  void check_protocol(const Launch& l, uint64_t done, uint32_t held);
  void set_stop(uint32_t value);
  unsigned int* stop_word(uint64_t slot = 0) const;
  const void* done_word(uint64_t slot = 0) const;
  void raise_progress(uint64_t slot, uint64_t value);
  // 0 for a set cleared while launches of the phase that used it before were in flight
  // (phases ahead): a store of theirs may land after the clear, and nothing tells it from
  // this phase's; exact counts (ended launches) stand in for the mirror then.
  uint64_t progress_mirror(uint64_t slot) const {
    if (!mirror_live_[slot].load(std::memory_order_acquire)) return 0;
    return std::atomic_ref<unsigned long long>(*progress_host_[slot]).load();
  }
  // The set's progress as far as seen: the larger of the mirror and what the ended
  // launches of its phase counted (raise_progress), kept so that it never goes back
  // within a phase. done(), and the looks that pace a wait or queue a successor.
  uint64_t progress_seen(uint64_t slot) const {
    std::lock_guard<std::mutex> lk(progress_mu_);
    max_seen_[slot] = std::max<uint64_t>(max_seen_[slot], progress_mirror(slot));
    return max_seen_[slot];
  }
  void give_back_slots() noexcept;

  std::shared_ptr<CudaShared> s_;
  std::shared_ptr<Task> task_;
  SlotPool::Slot state_slot_;
  SlotPool::Slot word_slot_;
  // Phases ahead (ahead_: FREERIDE_PHASES_AHEAD, a task with the item protocol): phases
  // use the kPhaseSlots sets of counters alternately; otherwise only the first.
  bool ahead_ = false;
  fr_phase_state* state_[kPhaseSlots] = {};               // device memory
  unsigned long long* progress_dev_[kPhaseSlots] = {};    // word slot [0] and [32], device view
  unsigned long long* progress_host_[kPhaseSlots] = {};   // the same, host view
  uint64_t slot_phase_[kPhaseSlots] = {0, 1};  // the phase each set was last cleared for
  // Whether each set's progress mirror is its phase's alone (progress_mirror).
  std::atomic<bool> mirror_live_[kPhaseSlots] = {true, true};
  unsigned long long* readback_host_ = nullptr;   // word slot: [done, stop, held]
  LaunchRing ring_;                               // each launch's counters and end record
  std::string nvtx_name_;                         // NvtxRange's message
  cudaEvent_t event_ = nullptr;                   // read_back()'s
  // The stream this task's launches and their bookkeeping go to: the side stream, or the
  // green context's. bridge_: stream_wait's admission on `side`, carried over to stream_.
  cudaStream_t stream_ = nullptr;
  bool green_ = false;
  cudaEvent_t bridge_ = nullptr;
  uint32_t last_held_[kPhaseSlots] = {};  // each set's `held` after its last launch taken

  // Guards what enqueueing a launch reads and writes: the executor's thread and training
  // threads (launch_at_open) both enqueue. Never held while waiting for the GPU: settle()
  // holds it around one stream query at a time. The exception is drain_side(), after an
  // enqueue failed in stream_wait mode, which waits for the side stream unbounded (left
  // for the settle and drain work of issue 36).
  mutable std::mutex launch_mu_;
  std::deque<Launch> pending_;            // enqueued, end not taken yet; oldest first
  uint64_t taken_ = 0;                    // launches_taken(): ends taken from pending_
  uint64_t newest_stamp_ = 0;             // the newest launch enqueued (its stamp)
  uint64_t taken_stamp_ = 0;              // the newest launch whose end was taken
  std::atomic<uint64_t> launch_no_{0};    // the last launch enqueued (written under launch_mu_)
  std::unique_ptr<CudaDependency> after_;  // waited for by the first launch, then dropped
  std::string arrival_error_;             // a launch at an open failed: run() raises it
  uint64_t phase_ = 0;
  uint64_t n_items_ = 0;
  bool begun_ = false;
  bool phase_done_ = false;     // an ended launch counted every item of the phase
  uint64_t ended_done_[kPhaseSlots] = {};  // each set's `done` at its last end taken
  std::atomic<uint64_t> block_item_ns_{0};  // block_item_ns(), over every phase

  std::atomic<bool> abandoned_{false};
  std::atomic<bool> hand_back_{false};  // hand_back(): wait_for_end returns once, untaken
  std::atomic<bool> interrupt_{false};  // interrupt(): the same, whether or not begun
  // Recorded by stop() or withhold() on the stream behind every launch of this runner
  // (it takes no further one until resumed): settle() waits for it, not for the stream to
  // go idle, since launches of the next task at opens yet to come may be queued behind.
  // stop_fenced_ (under launch_mu_): recorded since the latest resume (where the record
  // failed, settle() asks the stream, which reports a broken context).
  cudaEvent_t stop_fence_ = nullptr;
  bool stop_fenced_ = false;
  std::atomic<bool> stop_requested_{false};  // host copy of the stop flag, for admission
  std::atomic<bool> withheld_{false};        // withhold(): no further launch, no stop word
  // No further launch is taken (at an open, by the watcher, by run(), as a successor):
  // stopped or withheld. The stop word itself only for stop_requested_.
  bool stopping() const { return stop_requested_.load() || withheld_.load(); }
  // Guards the three below: stop()/resume() on any thread, launches on theirs.
  mutable std::mutex stop_mu_;
  uint32_t device_stop_ = 0;         // the stop word's value as last enqueued
  // device_stop_ is 1, read without stop_mu_ (waiting_opens_locked): a launch of this
  // runner leaves at its next claim once the GPU reaches that write, which is ahead of any
  // launch enqueued after this reads true.
  std::atomic<bool> stop_enqueued_{false};
  cudaEvent_t stop_written_ = nullptr;  // recorded on the control stream after that write
  bool launch_waits_ = false;        // the next launch must wait for stop_written_
  // inert(): when a look first saw the latest stop write landed (zero: not yet), and how
  // long after it a look may answer (see CudaRunner::stop_landed_and_none_begun).
  mutable std::chrono::steady_clock::time_point stop_landed_seen_{};
  static constexpr std::chrono::microseconds kInertSettle{200};
  mutable std::mutex progress_mu_;
  mutable uint64_t max_seen_[kPhaseSlots] = {};  // done() never goes backwards within a phase
};

}  // namespace freeride::cuda
