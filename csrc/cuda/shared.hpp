// The state the CUDA backend and its runners share: streams, the gate and how it is
// written, the pools, the green context, the marks. The methods that are not one-liners
// are in shared.cpp, its green-context methods in green_context.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "admission_stamps.hpp"
#include "backend.hpp"
#include "check.hpp"
#include "cuda/close_ledger.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/driver.hpp"
#include "cuda/gate_memory.hpp"
#include "cuda/gate_wait.hpp"
#include "cuda/launch_shapes.hpp"
#include "cuda/occupancy.hpp"
#include "cuda/open_watcher.hpp"
#include "cuda/open_ordinals.hpp"
#include "cuda/skipped_opens.hpp"
#include "cuda/unrung_opens.hpp"
#include "doorbell.hpp"
#include "launchers.hpp"
#include "task.hpp"

namespace freeride::cuda {

// Launches that wait on a side stream for opens the GPU has not reached, over every
// runner but the one asking (CudaShared::launch_at_open): a task armed while the one
// before drains its stopped launches, or a follower, shares the stream and the hardware
// queues with them.
struct WaitingOpens {
  uint64_t count = 0;  // launches at opens not begun, on any stream (the lookahead)
  // The newest launch enqueued on the asker's stream (by CudaShared::launch_stamps), and
  // what the cross-stream rule asks of it (open_launch_rule.hpp). 0: none.
  uint64_t newest_stamp = 0;
  bool newest_at_open = false;
  bool newest_begun = false;
  cudaStream_t newest_training = nullptr;
  uint32_t newest_seq = 0;  // the open it was enqueued at or seen under (served_by_executor)
  bool newest_holds = false;  // it may run until its bubble's close (served_by_executor)
};

// What CudaShared::launch_at_open hands the runner it launches.
struct OpenContext {
  WaitingOpens others;
  // A follower's launch right behind the armed runner's launch at this open, on the same
  // stream: it waits for no open of its own, and adds none to the lookahead.
  bool chained = false;
  // `opened` is recorded on the training stream at this open already (the watcher's
  // event): a launch only waits for it.
  bool recorded = false;
};

// A runner that takes a launch at a stream-ordered open (CudaShared::launch_at_open).
class OpenLauncher {
 public:
  virtual ~OpenLauncher() = default;

  // On the thread that writes the open (a training thread), just after the open's writes
  // on `training` (a stream not being captured), with CudaShared::arm_mu held and the
  // device current: enqueues one launch on the runner's stream, ordered after that point
  // of `training` by `opened` (an event this call records there, or recorded there
  // already: context.recorded). `seq` is the open's
  // sequence number. Never throws: a failure is the task's, and the executor's next run()
  // of the runner raises it. Whether it enqueued a launch that waits for this open.
  virtual bool launch_at_open(cudaStream_t training, cudaEvent_t opened, uint32_t seq,
                              const OpenContext& context) noexcept = 0;
  // The stream its launches go to (a follower is taken only on the armed runner's).
  virtual cudaStream_t launch_stream() const noexcept = 0;
  // Adds its launches to `into` (see WaitingOpens), the newest only if on `stream`. Takes
  // its own launch lock; never throws.
  virtual void add_waiting_opens(WaitingOpens& into, cudaStream_t stream) const noexcept = 0;
  // On the open watcher's thread, once the GPU has reached the stream-ordered open `seq`
  // (CudaShared::launch_at_reached), with CudaShared::arm_mu and `life` (shared, not shut
  // down) held: the executor's own launch, enqueued where its run() would enqueue it at
  // this moment (watcher_launch_rule.hpp), a wake-up before run() could. Never throws (a
  // failure is the task's, raised by the executor's next run()), and leaves no CUDA error
  // as the thread's last. Whether it enqueued one.
  virtual bool launch_at_reached_open(uint32_t seq, bool others_pending) noexcept = 0;
  // Whether a launch of it is enqueued on `stream` and its end not taken. Takes its own
  // launch lock; never throws.
  virtual bool pending_on(cudaStream_t stream) const noexcept = 0;
  // Whether a launch of it stamped after `stamp` has begun (or ended). Takes its own
  // launch lock; never throws.
  virtual bool begun_after(uint64_t stamp) const noexcept = 0;
};

// ---------------------------------------------------------------------------------------
// State shared by the backend and its runners. Runners may outlive shutdown() (the
// executor drops them later), so their memory is released only once both the backend is
// shut down and the last runner is gone.

struct CudaShared {
  int device = -1;
  bool host_gate = false;
  bool stream_wait = false;  // admit launches with cuStreamWaitValue32 instead of polling
  bool memops = false;  // stream memory operations usable on this device
  std::string memops_reason;
  // How gate writes on a stream are made.
  cuda_driver::GateWrite gate_write = cuda_driver::GateWrite::kCopy;
  int sm_count = 0;
  SmLimits sm;
  SmReserve reserve;
  uint64_t slice_ns = 0;
  uint32_t max_slices = 0;  // CudaOptions::max_slices
  cudaStream_t side = nullptr;
  cudaStream_t control = nullptr;
  GateSlot gate;
  // How a closed gate is waited for: by the bell, which `watcher` rings once a
  // stream-ordered open has taken effect (ring_and_launch), by polling the mirror
  // (FREERIDE_ADMISSION=poll), or by spinning on the mirror and the bell ("spin": the
  // watcher still rings). Null where polling, and after shutdown.
  std::unique_ptr<OpenWatcher> watcher;
  AdmissionMode admission = AdmissionMode::kRing;
  bool ring() const { return admission != AdmissionMode::kPoll; }  // the watcher rings
  // When the host-started path passed its steps (Backend::admission_stamps): the
  // watcher's thread stamps `reached`, run() `woke`, a host-made launch `launched`.
  // Shared with the watcher, whose thread may outlive this.
  std::shared_ptr<AdmissionStamper> stamps = std::make_shared<AdmissionStamper>();
  // Whether an open may take effect without a ring: waits for the gate then look at the
  // mirror every kAdmissionPoll, and only as a backstop until then.
  UnrungOpens unrung;
  // Green-context reserve: the context and the lowest-priority stream in it that tasks
  // which may (Task::runs_in_green_context) run on instead of `side`. Null otherwise.
  CUgreenCtx green = nullptr;
  cudaStream_t green_side = nullptr;
  int green_sms = 0;
  int green_sms_seen = 0;  // by check_green_partition; 0 where it did not count
  std::string reserve_mechanism = "occupancy-cap";
  std::string reserve_fallback;
  // The green context's workqueues (FREERIDE_GREEN_WORKQUEUE): asked for the balanced
  // scope, and what it got ("shared", "balanced", or "shared (balanced not had: why)").
  bool balanced_wanted = false;
  std::string green_workqueues = "shared";
  // A green context is used from one thread at a time: the executor's launches and a
  // plain run's (run_plain, from a benchmark's thread) take turns on its stream.
  mutable std::mutex green_mu;
  std::unique_lock<std::mutex> green_turn(bool green) const {
    return green ? std::unique_lock<std::mutex>(green_mu) : std::unique_lock<std::mutex>();
  }

  // Shared by every operation, exclusive for shutdown(): shutdown cannot pull streams
  // out from under a call in progress. Readers never wait for each other.
  std::shared_mutex life;
  bool shut_down = false;  // written under `life` held exclusively
  bool abandoned = false;  // close abandoned launches: shutdown waits for no side stream

  // Until everything enqueued on `stream` has completed (cudaSuccess), an error of that
  // work, or `within` has passed (cudaErrorNotReady, which is then not the thread's last
  // error). By asking, not by cudaStreamSynchronize: a wait that ends.
  static cudaError_t wait_idle(cudaStream_t stream, std::chrono::steady_clock::duration within);

  // An immediate write on the control stream, complete on return. Under one hardware queue
  // (CUDA_DEVICE_MAX_CONNECTIONS=1) the control stream's work is executed in host order,
  // after everything any stream enqueued before it: an immediate write then takes effect
  // once the GPU has got through training's queued work, and throws after
  // kImmediateWriteWait rather than wait for a queue that never drains (a peer that died).
  void finish_on_control(const char* what);
  static constexpr std::chrono::seconds kImmediateWriteWait{30};

  std::mutex pool_mu;  // guards the pools, `runners`, `orphaned`
  SlotPool states{false, kStateStride};
  SlotPool words{true, kWordStride};
  int runners = 0;
  bool orphaned = false;  // shut down: free the pools when the last runner goes
  // Shut down with launches left on the GPU (abandoned at close, or a stream that did not
  // drain in time): the streams, the green context and the pools' slabs are kept as they
  // are, nothing handed to another harvester, until reclaim() sees the GPU has passed them.
  // Both pools are held together (hold_for_launches_left): the state pool says for both.
  // Caller holds pool_mu (or is the destructor).
  bool held() const { return states.held(); }

  std::mutex staging_mu;       // guards `staging`
  SlotPool::Slot staging;      // pinned bounce word for immediate reads and copies
  SlotPool::Slot zeros;        // pinned zeros (never written) to clear a phase state

  CudaShared() = default;
  CudaShared(const CudaShared&) = delete;
  CudaShared& operator=(const CudaShared&) = delete;

  ~CudaShared();

  void destroy_streams() noexcept;
  // Set by destroy_streams (under `life` held exclusively, or before any runner exists):
  // runners read it under `life` shared before they query their stream (~CudaRunner).
  bool streams_destroyed = false;

  // The stream first: cuGreenCtxDestroy leaves a green context's streams behind, leaked.
  // Never while a launch may be queued in it (see `held`): the driver does not say what
  // destroying a green context under queued work does (it may wait for it, or take the
  // context from under the kernel).
  void destroy_green() noexcept;

  // Where a task's launches and their bookkeeping go.
  bool in_green(const Task& task) const {
    return green_side != nullptr && task.runs_in_green_context();
  }
  cudaStream_t stream_for(const Task& task) const { return in_green(task) ? green_side : side; }

  // Builds the green context for Reserve(mechanism="green-context"), or records in
  // reserve_fallback why not (the occupancy cap then applies to every task). Throws only
  // for a reserve_sms that no partition of this device can leave out.
  //
  // Runtime-API launches into its stream: the driver API's own stream (cuGreenCtxStreamCreate)
  // is handed to <<<>>> launches and cudaMemsetAsync/cudaMemcpyAsync/cudaEventRecord as a
  // cudaStream_t. Documented: the CUDA Programming Guide, "Green Contexts" (4.6): using
  // them needs "no GPU code (kernel) changes, just small host-side changes (e.g., green
  // context creation and stream creation for this green context)"; cuda.h (13.0),
  // cuStreamGetCtx: a green-context stream's context is the one cuCtxFromGreenCtx
  // returns, "a normal primary context but with the resources of the specified green
  // context", and cuStreamGetCtx_v2 names the device's primary context for it, which is
  // where the runtime loaded the built-in kernels; PyTorch's torch.cuda.green_contexts
  // documents runtime-launched operations on such a stream as running on the green
  // context's resources, synchronised with other streams by events. Measured: a standalone
  // probe program on an H100 (not freeride) launched nvcc-compiled kernels with <<<>>> on
  // such a stream (120 of 132 SMs) and a 32 x 512-thread probe started within 8.5 us.
  // With balanced_wanted (FREERIDE_GREEN_WORKQUEUE=balanced, CUDA 13.1 drivers), the
  // context also gets a workqueue configuration of the balanced scope, and where that is
  // refused it is made without, saying why in green_workqueues.
  void try_green_context(int reserved_wanted, int least_priority);

  // Runs, once on the green context's stream, every kind of runtime-API call a task's
  // launches put there (run, begin_phase, mark, drain_side): an event of the primary
  // context recorded on it and waited for by it, a memset, a built-in kernel, a copy, and
  // the elapsed time from an event on the primary context's side stream to one on it.
  // Only the kernel launch is measured to work on such a stream (the probe program
  // above); cuEventRecord documents that event and stream "must be from the same
  // context", and a green context's stream belongs to the context cuCtxFromGreenCtx
  // returns. Where any call is refused, the green context goes and the occupancy cap
  // applies with the reason in reserve_fallback, instead of every launch of every task
  // failing later. Needs `staging`; throws only where the context itself failed.
  void try_green_stream();

  // Checks that launches on the green context's stream run on its SMs only (see
  // check_green_partition in green_context_plan.hpp): the probe above shows they run,
  // not where. Records what it saw in green_sms_seen. Where they ran on more SMs than the
  // context holds, or the check could not tell within kPartitionDeadline, the green
  // context goes and the occupancy cap applies with the reason in reserve_fallback.
  // Throws only where the context itself failed. Runs after try_green_stream, before
  // preload_in_green_context.
  void check_green_partition();
  static constexpr std::chrono::seconds kPartitionDeadline{5};

  // Loads every built-in kernel into the green context now, on the thread that makes the
  // harvester, before any side work runs: with CUDA's lazy loading a kernel is loaded
  // into a context at its first launch there, which synchronises that context, on the
  // executor thread in the middle of side work. cudaFuncGetAttributes loads a kernel
  // into the current context, so the green context is made current around it. Never
  // throws: where loading fails, the green context goes and the occupancy cap applies
  // with the reason in reserve_fallback. Runs after try_green_stream.
  void preload_in_green_context();

  // Caller holds pool_mu (or is the destructor). Nothing while held.
  void free_pools() noexcept {
    states.release_all();
    words.release_all();
  }

  // shutdown()'s, where launches may still run: see `held`. Caller holds `life` exclusively.
  void hold_for_launches_left() noexcept;
  // Whether what held() keeps is released: once every stream it kept is idle (a question
  // to the driver, nothing enqueued), its streams and green context are destroyed and the
  // pools' slabs go to the keep; true then, or where nothing was held. Caller holds `life`
  // exclusively, the device current.
  bool reclaim() noexcept;

  // In the green context the SMs left out are the room: grids are sized for the
  // context's SMs at full occupancy, with no per-SM cap. A task that runs beside it on
  // the primary context (RawKernel) keeps the per-SM cap and is sized for the green
  // context's SMs too: the block scheduler spreads a grid over every SM, so its blocks
  // also land on the SMs left out, and fewer of them leave those SMs emptier (with the
  // cap, room for `reserve` is left on every SM whatever).
  CudaLaunch launch(const fr_item_ctx& ctx, void* stream, bool in_green_context) const {
    if (in_green_context) {
      return CudaLaunch{ctx, stream, green_sms, device, sm, SmReserve{0}, &shapes};
    }
    const int sms = green_side != nullptr ? green_sms : sm_count;
    return CudaLaunch{ctx, stream, sms, device, sm, reserve, &shapes};
  }
  // Per backend, not per process: a harvester made after a device reset (the functions'
  // settings gone with the context) or with another reserve (another carveout) starts
  // with none of an earlier one's answers. Mutable: launch() is const, and the cache
  // locks itself.
  mutable LaunchShapes shapes;

  // Stream-ordered write of a 32-bit word on `stream`, by `how` (never kBatch: see
  // enqueue_gate_write).
  void enqueue_write(unsigned int* word, uint32_t value, cudaStream_t stream,
                     cuda_driver::GateWrite how) const;

  // Immediate write of a device-memory word: through the high-priority control stream,
  // complete (visible to the device) on return.
  void write_now(unsigned int* word, uint32_t value);

  // Stream-ordered gate write: the word kernels read, then its host mirror, so that a
  // mirror reading open implies the gate is open. The sequence word (beside the mirror)
  // goes before an open and after a close: a close is never held behind it, and an open
  // is seen with its own sequence number. A close with an ordinal (closes.close) writes it
  // to its slot last: executed, it no longer reads as pending (freeride/slice.h), and
  // whether its slot lands before or after the gate, a kernel past its slice stops.
  void enqueue_gate_write(uint32_t value, cudaStream_t stream, uint32_t seq,
                          uint32_t ordinal = 0) const;

  // The same writes, in the same order, as one batch: one operation for the stream to
  // execute instead of three. Every write keeps its memory fence (all of the stream's
  // earlier writes visible first): the v2 memory operations that cuStreamBatchMemOp
  // resolves to do not support CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER, and the H200's
  // driver (580) refused a batch asking for it.
  CUresult enqueue_gate_batch(uint32_t value, cudaStream_t stream, uint32_t seq,
                              uint32_t ordinal = 0) const;

  // Stream-ordered closes and their ordinals (freeride/slice.h). The latest ordinal is the
  // mirror line's kMirrorCloses word; the slots are in the gate's own line.
  CloseLedger closes;
  // Stream-ordered opens written without a launch: the executor's own stays out too.
  SkippedOpens skipped;
  // The ordinal of the first close after each recent open, for the executor's launches.
  OpenOrdinals open_ordinals;
  unsigned int* close_slots() const { return gate.dev + kCloseSlots; }
  const unsigned int* latest_close_dev() const { return gate.mirror_dev + kMirrorCloses; }
  // The constructor's: the latest ordinal and the slots read zero (no close yet). Caller
  // holds nothing; the control stream is idle.
  void clear_close_slots();

  // Whether the driver takes the batch of an open, tried on the control stream with the
  // gate's current words (the constructor's state: nothing else writes them yet).
  bool try_batch();

  // Immediate gate write, complete on return.
  // In the stream-ordered writes' order: the sequence number before an open and after a
  // close, so a reader of the mirror, then the number, never takes a closing bubble for a
  // new one. With stream_wait an open stores the mirror first: launches held by the
  // stream wait (on the mirror) are let go before the device word's write goes on the
  // control stream, which may share the held launch's hardware queue and would
  // otherwise wait behind it for good.
  //
  // Where stream-ordered writes are batches, an immediate one is the same batch on the
  // control stream: the gate, its mirror and the number are then written by the GPU, in
  // the same order, by either writer, so an immediate write racing a stream-ordered one
  // can interleave with it only within the few hundred nanoseconds a batch takes, not
  // across a host round trip (a device write, a synchronise, then a host store), which
  // could leave the mirror closed over an open gate (a bubble lost) or open over a closed
  // one (launches that run no item: the executor backs off, see executor.cpp).
  void write_gate_now(uint32_t value, uint32_t seq);

  // After the writes of the open `seq` on `stream`: has gate.bell rung once the GPU
  // reaches that point (one event record on the training stream, which the watcher's
  // thread waits for), and with `launch`, the armed runner's launch at the open
  // (launch_at_open), ordered after that point by the same event. Caller holds `life`
  // shared (shutdown drops the watcher under it held exclusively: no ring after), with
  // the device current, and has checked that `stream` is not being captured into a graph
  // (waiting for an event recorded in a capture would invalidate it). Never throws: the
  // open itself is enqueued, and where no ring comes it is noted in `unrung`, so that the
  // executor thread looks at the mirror every kAdmissionPoll from then on.
  void ring_and_launch(cudaStream_t stream, uint32_t seq, bool launch) noexcept;

  // Launches from the watcher (FREERIDE_WATCHER_LAUNCH, watcher_launch_rule.hpp): once the
  // GPU has reached the open `seq`, the watcher's thread enqueues the armed runner's
  // launch, where the executor would, before it rings. Off: the executor launches after
  // the ring wakes it (two wake-ups in series).
  bool watcher_launch = false;
  std::atomic<uint64_t> watcher_launches{0};  // enqueued so far (Backend::watcher_launches)
  // The watcher's hook (OpenWatcher::on_reached), on its thread; takes `life` shared, then
  // arm_mu, then the runner's launch lock, as launch_at_open does. Never throws.
  void launch_at_reached(uint32_t seq) noexcept;

  // Whether work enqueued on `stream` now would join a graph capture (the stream is
  // capturing, or it is the legacy default stream while a blocking stream captures), or
  // the runtime cannot say (then: yes). Callers then add no event, mark or launch; the
  // gate write itself is still enqueued, and where the stream cannot take work (the
  // legacy default stream during such a capture, which the runtime documents as unusable
  // until it ends: training's own work there fails alike) it raises that error. Never
  // throws.
  static bool captures(cudaStream_t stream) noexcept;

  // Launches at opens. The runner the executor runs now takes a launch at each
  // stream-ordered open (see OpenLauncher): the open's bubble then has its side launch in
  // the GPU's queues at the open's point of host order, ahead of what training enqueues
  // next (its wait for a neighbour's data, its next compute), not only once the host sees
  // the open take effect, by when, with the host far ahead of the GPU, that launch would
  // queue behind all of it (with one hardware queue) and find its bubble over. arm_mu
  // orders arm/disarm against a launch in progress, so a runner is never called after
  // disarm() returned. The launches wait for the watcher's event of the open (one event
  // recorded per open, review G9); `opened` is the one event they record on the training
  // stream where the watcher recorded none (polling admission, a full or failed watcher):
  // a stream wait takes the record made just before it, so it is reused (under arm_mu).
  bool launch_at_opens = true;  // FREERIDE_LAUNCH_AT_OPEN (see launch_at_opens_enabled)
  std::mutex arm_mu;
  OpenLauncher* armed = nullptr;
  cudaEvent_t opened = nullptr;
  // Opens whose launch waits_behind_another_stream left out (open_launch_rule.hpp).
  std::atomic<uint64_t> cross_stream_skips{0};
  // Launches at opens served_by_executor left out (open_launch_rule.hpp).
  std::atomic<uint64_t> executor_served_skips{0};
  // Backend::max_lookahead: raised by each launch at an open as it is enqueued.
  std::atomic<uint64_t> max_lookahead{0};
  // The lookahead bound (open_launch_rule.hpp's within_lookahead; 0: none), and the opens
  // past it that carried no launch.
  uint64_t lookahead_bound = 0;
  std::atomic<uint64_t> beyond_lookahead{0};
  // The executor queues its next launch behind the one running (FREERIDE_SUCCESSORS, see
  // freeride/successor_rule.hpp).
  bool successors = false;
  // Runners of tasks with the item protocol begin phases with launches in flight and chain
  // the next phase's at opens (FREERIDE_PHASES_AHEAD, see phase_ahead_rule.hpp).
  bool phases_ahead = false;
  // The executor queues the next task behind a finishing one (FREERIDE_FOLLOW, see
  // follow_rule.hpp): `follower` takes a launch at each open after `armed`, on its stream.
  bool followers = false;
  OpenLauncher* follower = nullptr;
  // Every runner alive (enlist(), until disarm()): launch_at_open asks the others what
  // of theirs still waits for an open. Under arm_mu.
  std::vector<OpenLauncher*> launchers;
  // Numbers every launch enqueued, over all runners (WaitingOpens::newest_stamp).
  std::atomic<uint64_t> launch_stamps{0};
  void enlist(OpenLauncher* runner) {
    std::lock_guard<std::mutex> lk(arm_mu);
    launchers.push_back(runner);
  }
  // Whether a launch enqueued on `stream` after the one stamped `stamp` has begun, which
  // on one stream means that one has left (no programmatic dependent launch here). Caller
  // holds no runner's launch lock.
  bool began_after(uint64_t stamp, cudaStream_t stream) {
    if (launch_stamps.load() <= stamp) return false;  // nothing enqueued since
    std::lock_guard<std::mutex> lk(arm_mu);
    for (const OpenLauncher* runner : launchers) {
      if (runner->launch_stream() == stream && runner->begun_after(stamp)) return true;
    }
    return false;
  }
  void arm(OpenLauncher* runner) {
    std::lock_guard<std::mutex> lk(arm_mu);
    if (refusing) return;
    armed = runner;
    if (follower == runner ||
        (follower != nullptr && follower->launch_stream() != runner->launch_stream())) {
      follower = nullptr;
    }
  }
  bool follow(OpenLauncher* runner) {
    std::lock_guard<std::mutex> lk(arm_mu);
    if (refusing || armed == runner) return false;
    // On another stream it would not wait for the armed runner's launch to leave.
    if (armed != nullptr && armed->launch_stream() != runner->launch_stream()) return false;
    follower = runner;
    return true;
  }
  // Also takes it off `launchers`: a runner's destructor calls it first.
  void disarm(OpenLauncher* runner) {
    std::lock_guard<std::mutex> lk(arm_mu);
    if (armed == runner) armed = nullptr;
    if (follower == runner) follower = nullptr;
    std::erase(launchers, runner);
  }
  // After an open's writes on `stream` (not capturing), on the writing thread; caller
  // holds `life` shared with the device current. `recorded`: an event recorded on
  // `stream` at that point already (the watcher's), which the launches wait for; null:
  // they record `opened` there. Never throws.
  void launch_at_open(cudaStream_t stream, uint32_t seq, cudaEvent_t recorded) noexcept;
  // Close-time (Backend::begin_shutdown): no launch at an open from now on, whatever is
  // armed. Launches already enqueued are the executor's to drain or abandon.
  void refuse_launches_at_opens() {
    std::lock_guard<std::mutex> lk(arm_mu);
    armed = nullptr;
    follower = nullptr;
    refusing = true;
  }
  bool refusing = false;  // under arm_mu

  uint32_t mirror() const { return std::atomic_ref<unsigned int>(*gate.mirror).load(); }
  uint32_t mirror_seq() const {
    return std::atomic_ref<unsigned int>(gate.mirror[kMirrorSeq]).load();
  }
  // The gate's state as a wait for it reads it between looks (gate_wait.hpp): the mirror
  // and its number, which together change with every write that takes effect.
  uint64_t gate_word() const { return (uint64_t{mirror_seq()} << 32) | mirror(); }
  GateWatch gate_watch() const { return GateWatch{*gate.bell, unrung, admission}; }
  // The mirror reads open under an open that was not skipped (SkippedOpens): the mirror,
  // its number, the mirror again, then the number again. A close writes its value, then
  // its number: one landing between the first two reads would pair the open value read
  // before it with the close's number, which no skip names (an executor's launch into the
  // closed gate: an idle launch and a backoff), and where the next open lands too before
  // the third read, the mirror reads open again under the close's number, which no
  // ordinal names either (a launch that knows no bubble, queued ahead of the new open's
  // own: open_launch_rule.hpp's served_by_executor would not see it). An open writes its
  // number before its value, so a number read the same on both sides of an open mirror
  // is that open's. Where true, `open_seq` (if given) gets that open's number: a launch
  // for it carries that open's ordinal (OpenOrdinals), which a later read of the number
  // could miss, a close having landed since.
  bool open_unskipped(uint32_t* open_seq = nullptr) const {
    if (mirror() != FREERIDE_GATE_OPEN) return false;
    const uint32_t seq = mirror_seq();
    if (skipped.contains(seq) || mirror() != FREERIDE_GATE_OPEN || mirror_seq() != seq) {
      return false;
    }
    if (open_seq != nullptr) *open_seq = seq;
    return true;
  }

  // Marks: pooled timing events. Their ids are the executor's and Python's handles. A
  // derived mark is another mark plus an offset in nanoseconds (a launch's start and end:
  // the clock anchor's mark plus where its first block began and its last block left on
  // %globaltimer), so that no event has to be recorded for a launch at all, neither
  // behind a kernel that may still run nor, for a launch at an open, by the training
  // thread. A mark that derived marks stand on lives until the last of them is released.
  std::mutex marks_mu;
  std::unordered_map<uint64_t, cudaEvent_t> marks;
  std::unordered_map<uint64_t, std::pair<uint64_t, int64_t>> derived;  // id -> (mark, ns)
  std::unordered_map<uint64_t, int> bases;  // mark -> derived marks standing on it
  std::vector<cudaEvent_t> free_events;
  uint64_t next_mark = 1;

  // The clock anchor: where %globaltimer (the clock kernels read, which end records
  // carry) stands on the marks' event timeline. A one-thread kernel on the control stream
  // writes %globaltimer between two events; the stamp is placed halfway between them
  // (at most half their distance off). Made when the backend starts, and made anew
  // (without waiting: adopted once it has run, if its events are close enough) when
  // launches end more than kReanchorNs from it, since a mark's elapsed time is a float of
  // milliseconds and loses precision with distance. Guarded by marks_mu.
  struct ClockAnchor {
    uint64_t mark = 0;         // the event before the stamp; 0: none
    uint64_t timer_ns = 0;     // the stamp
    int64_t offset_ns = 0;     // the stamp's place after `mark`
  };
  struct PendingAnchor {
    uint64_t before = 0;  // event marks around the stamp; 0: none enqueued
    uint64_t after = 0;
  };
  ClockAnchor anchor;
  PendingAnchor pending_anchor;
  SlotPool::Slot clock_slot;  // the stamp's host word
  // Threads in mark_unix_ns watching the stamp word for the pending anchor's store: no
  // anchor is enqueued meanwhile (enqueueing clears the word).
  int stamp_watchers = 0;
  static constexpr int64_t kReanchorNs = 1'000'000'000;
  static constexpr int64_t kAnchorBracketNs = 50'000;  // a later anchor's events, at most

  // The first anchor, waited for: at construction, on the idle control stream. Where it
  // cannot be made (the stamp never ran within a second) launches get no marks.
  void anchor_clock();
  // Marks of a launch that ran from `start_ns` to `end_ns` on %globaltimer: (0, 0) without
  // an anchor. Caller holds `life` shared with the device current.
  std::pair<uint64_t, uint64_t> launch_marks(uint64_t start_ns, uint64_t end_ns);
  // Backend::mark_unix_ns: once `id` has passed, an anchor enqueued on the control stream
  // (or the re-anchor in flight), whose stamp's store into the mapped host word this
  // thread watches, spinning without marks_mu: the system clock when it lands, less half
  // the anchor's bracket, is the Unix time of its `before` event, whatever backlog the
  // stamp queued behind. The mark is that less the events' distance. Up to `timeout_s`
  // (a stamp seen by then may take a few milliseconds more to time); kPending where the
  // mark has not passed, the stamp has not landed or the events did not time by then.
  // Caller holds `life` shared with the device current.
  int64_t mark_unix_ns(uint64_t id, double timeout_s);
  // Caller holds marks_mu.
  void enqueue_anchor_locked();
  bool adopt_anchor_locked();
  uint64_t mark_locked(cudaStream_t stream);
  void release_locked(uint64_t id) noexcept;

  uint64_t mark(cudaStream_t stream);

  // Caller holds marks_mu: a mark `offset_ns` after the event mark `base`.
  uint64_t derive_locked(uint64_t base, int64_t offset_ns);

  // Caller holds marks_mu: the event mark under `id` and the offset from it.
  std::pair<uint64_t, int64_t> resolve_locked(uint64_t id) const {
    auto it = derived.find(id);
    return it == derived.end() ? std::make_pair(id, int64_t{0}) : it->second;
  }

  int64_t elapsed_ns(uint64_t from_id, uint64_t to_id);

  void release_mark(uint64_t id) noexcept;

  void destroy_events() noexcept;
};

}  // namespace freeride::cuda
