// freeride._C._testing: hooks tests use to drive the executor and the host backend into
// states that real work reaches only by chance. Registered by bindings.cpp only where
// FREERIDE_TEST_HOOKS=1 at import (tests/conftest.py sets it).
#include "test_hooks.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "check.hpp"
#include "cuda/close_ledger.hpp"
#include "cuda/green_context_plan.hpp"
#include "cuda/kernel_image.hpp"
#include "cuda/open_watcher.hpp"
#include "cuda/skipped_opens.hpp"
#include "cuda/slot_pool.hpp"
#include "doorbell.hpp"
#include "executor.hpp"
#include "follow_rule.hpp"
#include "item_time.hpp"
#include "latch_dependency.hpp"
#include "queue_backend.hpp"
#include "open_launch_rule.hpp"
#include "phase_ahead_rule.hpp"
#include "successor_rule.hpp"
#include "test_switches.hpp"
#include "watcher_launch_rule.hpp"

#ifdef FREERIDE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/admission.hpp"
#include "cuda/device_guard.hpp"
#include "launchers.hpp"
#endif

namespace py = pybind11;

namespace freeride_ext {
namespace {

// The open watcher with fake events, whose waits end only when the test releases them:
// its queue, thread and exit handling run as with CUDA's, on any machine. One set of
// counters per process (the events' calls carry no context); leaked, because a watcher
// thread may still be inside a wait when the process exits.
struct FakeEvents {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t made = 0;
  uint64_t waits = 0;     // waits begun
  uint64_t released = 0;  // the first `released` waits may end
};

FakeEvents& fake_events() {
  static auto* f = new FakeEvents();
  return *f;
}

const freeride::WatcherEvents& fake_watcher_events() {
  static const freeride::WatcherEvents events{
      [](int) {},
      [](void** event, std::string*) {
        FakeEvents& f = fake_events();
        std::lock_guard<std::mutex> lk(f.mu);
        *event = reinterpret_cast<void*>(static_cast<uintptr_t>(++f.made));
        return true;
      },
      [](void*, void*) { return true; },
      [](void*) {
        FakeEvents& f = fake_events();
        std::unique_lock<std::mutex> lk(f.mu);
        const uint64_t ticket = ++f.waits;
        f.cv.notify_all();
        f.cv.wait(lk, [&] { return f.released >= ticket; });
      },
      [](void*) {}};
  return events;
}

class FakeWatcher {
 public:
  // `hook`: the watcher calls back with each event's number (OpenWatcher::on_reached),
  // noted with the rings so far; one for `throw_at` throws.
  explicit FakeWatcher(bool hook, int64_t throw_at)
      : bell_(new freeride::Doorbell()),  // leaked: the thread may ring it after this ends
        reached_(std::make_shared<Reached>()),
        watcher_(std::make_unique<freeride::OpenWatcher>(0, fake_watcher_events())) {
    if (!hook) return;
    watcher_->on_reached([bell = bell_, seen = reached_, throw_at](uint32_t seq) {
      {
        std::lock_guard<std::mutex> lk(seen->mu);
        seen->calls.emplace_back(seq, bell->rings());
      }
      if (static_cast<int64_t>(seq) == throw_at) throw std::runtime_error("the hook failed");
    });
  }

  bool ring_after(uint32_t seq) { return watcher_->ring_after(nullptr, bell_, seq); }
  uint64_t rings() const { return bell_->rings(); }
  // (seq, rings before the call) of each hook call so far, in order.
  py::list reached() const {
    std::lock_guard<std::mutex> lk(reached_->mu);
    py::list out;
    for (const auto& [seq, rings] : reached_->calls) out.append(py::make_tuple(seq, rings));
    return out;
  }

  // Whether `count` waits (of this process's fake watchers) have begun within `timeout_s`.
  static bool waits_begun(uint64_t count, double timeout_s) {
    FakeEvents& f = fake_events();
    std::unique_lock<std::mutex> lk(f.mu);
    return f.cv.wait_for(lk, freeride::clamp_timeout(timeout_s),
                         [&] { return f.waits >= count; });
  }
  // Lets the first `count` waits end.
  static void release(uint64_t count) {
    FakeEvents& f = fake_events();
    {
      std::lock_guard<std::mutex> lk(f.mu);
      f.released = std::max(f.released, count);
    }
    f.cv.notify_all();
  }
  // Retires the watcher, as a backend's shutdown does.
  void retire() { watcher_.reset(); }

 private:
  struct Reached {  // shared with the hook, which the thread may call after this ends
    std::mutex mu;
    std::vector<std::pair<uint32_t, uint64_t>> calls;
  };
  freeride::Doorbell* bell_;
  std::shared_ptr<Reached> reached_;
  std::unique_ptr<freeride::OpenWatcher> watcher_;
};

// The host's close ledger (csrc/cuda/close_ledger.hpp) against a model of the device:
// streams whose closes execute when the test says, each writing its ordinal to its slot as
// a close's batch does, and a kernel's decision at a claim (freeride/slice.h) over what
// the ledger published and the slots hold.
class CloseModel {
 public:
  CloseModel() { ledger_.place(&latest_); }

  // A stream-ordered close enqueued on `stream`, as CudaBackend::gate_write makes it:
  // `captured`, written into a graph capture; `fail`, its enqueue throws.
  void enqueue_close(int stream, bool captured, bool fail) {
    ledger_.close(!captured, [&](uint32_t ordinal) {
      if (fail) FR_THROW(freeride::RuntimeFailure, "the close's enqueue failed (test)");
      streams_[stream].push_back(ordinal);
    });
  }

  // The oldest close still queued on `stream` takes effect on the device.
  void execute(int stream) {
    auto it = streams_.find(stream);
    FR_ARG(it != streams_.end() && !it->second.empty(), "no close is queued on stream " << stream);
    const uint32_t ordinal = it->second.front();
    it->second.pop_front();
    if (ordinal != 0u) slots_[freeride::cuda::CloseLedger::slot(ordinal)] = ordinal;
  }

  bool pending() const { return freeride::close_pending(ledger_.latest(), slots_); }
  bool may_claim(bool gate_open, uint64_t ran_ns, uint64_t slice_ns) const {
    return freeride::may_claim(gate_open, ran_ns, slice_ns, ledger_.latest(), slots_);
  }
  uint32_t latest() const { return ledger_.latest(); }

 private:
  freeride::cuda::CloseLedger ledger_;
  unsigned int latest_ = 0;
  unsigned int slots_[FREERIDE_CLOSE_SLOTS] = {};
  std::map<int, std::deque<uint32_t>> streams_;
};

// The CUDA backend's slot pools (csrc/cuda/slot_pool.hpp) over host memory, on a device
// number no GPU has: what they hand the process-wide keep, and when.
constexpr int kHostPoolDevice = -2;
struct HostSlabAlloc {
  static freeride::cuda::Slab allocate(int, bool, size_t bytes) {
    freeride::cuda::Slab slab;
    slab.host = new char[bytes];  // kept or leaked, never freed, as the real slabs
    slab.dev = slab.host;
    return slab;
  }
  static int current_device() { return kHostPoolDevice; }
};
using HostSlotPool = freeride::cuda::BasicSlotPool<HostSlabAlloc>;

#ifdef FREERIDE_WITH_CUDA
// The partition check's census on a stream of the primary context, which is not confined:
// (distinct SMs, blocks, blocks past the bitmap). What the green context's check would see
// if its launches escaped.
py::tuple sm_census_on_primary(int device) {
  const freeride::DeviceGuard guard(device);
  int sms = 0;
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaStream_t stream = nullptr;
  FR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* census = nullptr;
  freeride::SmCensus got{};
  try {
    FR_CUDA_CHECK(cudaMalloc(&census, sizeof(got)));
    FR_CUDA_CHECK(cudaMemsetAsync(census, 0, sizeof(got), stream));
    freeride::kernels::launch_sm_census(static_cast<freeride::SmCensus*>(census), sms,
                                        1'000'000, stream);
    FR_CUDA_CHECK(cudaMemcpyAsync(&got, census, sizeof(got), cudaMemcpyDeviceToHost, stream));
    FR_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    if (census != nullptr) (void)cudaFree(census);
    (void)cudaStreamDestroy(stream);
    throw;
  }
  (void)cudaFree(census);
  (void)cudaStreamDestroy(stream);
  return py::make_tuple(freeride::census_sms(got.seen, freeride::SmCensus::kWords), got.blocks,
                        got.beyond);
}
#endif

// A property of a runner's test launches, read under their lock (the runner's thread
// and the executor's change them).
template <typename Read>
auto locked(Read read) {
  return [read](freeride::QueuedLaunches& q) {
    std::lock_guard<std::mutex> lk(q.mu);
    return read(q);
  };
}

freeride::QueueBackend& queue_backend(freeride::Executor& ex) {
  auto* backend = dynamic_cast<freeride::QueueBackend*>(&ex.backend());
  FR_ARG(backend != nullptr, "the executor is not on the test queue backend");
  return *backend;
}

}  // namespace

void register_test_hooks(py::module_& m) {
  using freeride::Executor;
  using freeride::Latch;
  using freeride::Task;

  py::module_ t = m.def_submodule(
      "_testing", "Test-only hooks; present only where FREERIDE_TEST_HOOKS=1 at import.");

  // A dependency a test releases by hand (the host backend has no streams).
  py::class_<Latch, std::shared_ptr<Latch>>(t, "Latch")
      .def(py::init<>())
      .def("release", &Latch::release);

  t.def(
      "submit_after_latch",
      [](Executor& ex, std::shared_ptr<Task> task, int priority, std::shared_ptr<Latch> latch) {
        FR_ARG(latch != nullptr, "latch must not be None");
        return ex.submit_after(std::move(task), priority,
                               std::make_unique<freeride::LatchDependency>(std::move(latch)));
      },
      py::arg("executor"), py::arg("task"), py::arg("priority"), py::arg("latch"),
      py::call_guard<py::gil_scoped_release>(),
      "executor.submit() whose first launch waits until `latch` is released.");

  // The executor on a backend whose launches the test enqueues and ends (queue_backend.hpp).
  using freeride::QueueBackend;
  using freeride::QueuedLaunches;
  py::class_<QueuedLaunches, std::shared_ptr<QueuedLaunches>>(t, "QueuedLaunches")
      .def(
          "arrive",
          [](QueuedLaunches& q, size_t count, bool at_open) { return q.arrive(count, at_open); },
          py::arg("count") = 1, py::arg("at_open") = true, py::call_guard<py::gil_scoped_release>(),
           "Launches enqueued at opens (as many as the runner takes); how many were taken. "
           "at_open=False: launches of the executor's own (it backs off after one that "
           "ran nothing).")
      .def("begin", &QueuedLaunches::begin, py::call_guard<py::gil_scoped_release>(),
           "The oldest launch not yet begun begins: with the stop set, it claims nothing.")
      .def("end", &QueuedLaunches::end, py::arg("items"),
           py::call_guard<py::gil_scoped_release>(),
           "The oldest launch not yet ended ends, having run `items` items.")
      .def("fail", &QueuedLaunches::fail, py::arg("message"), py::arg("drop_pending") = true,
           py::call_guard<py::gil_scoped_release>(),
           "The next run() fails with `message`; with drop_pending (a kernel fault) every "
           "pending launch is gone, else only the oldest ended (a broken launch).")
      .def_property_readonly("pending",
                             locked([](const QueuedLaunches& q) { return q.pending.size(); }))
      .def_property_readonly("not_ended",
                             locked([](const QueuedLaunches& q) {
                               size_t n = 0;
                               for (const QueuedLaunches::Launch& l : q.pending) {
                                 n += l.items < 0 ? 1 : 0;
                               }
                               return n;
                             }),
                             "Launches pending that the test has not ended yet.")
      .def_property_readonly("stopped", locked([](const QueuedLaunches& q) { return q.stopped; }))
      .def_property_readonly("abandoned",
                             locked([](const QueuedLaunches& q) { return q.abandoned; }))
      .def(
          "make_stop_fail",
          [](QueuedLaunches& q) {
            std::lock_guard<std::mutex> lk(q.mu);
            q.stop_fails = true;
          },
          "From now on stop() throws, as a stop write does on a broken CUDA context.")
      .def_property_readonly("begun", locked([](const QueuedLaunches& q) { return q.phases > 0; }))
      .def_property_readonly("runs", locked([](const QueuedLaunches& q) { return q.runs; }))
      .def_property_readonly("phase", locked([](const QueuedLaunches& q) { return q.phase; }),
                             "The runner's current phase (the last begin_phase()).")
      .def_property_readonly("pending_phases",
                             locked([](const QueuedLaunches& q) {
                               py::list out;
                               for (const QueuedLaunches::Launch& l : q.pending) {
                                 out.append(py::make_tuple(l.phase, l.guarded));
                               }
                               return out;
                             }),
                             "(phase, guarded) of every launch pending, oldest first.")
      .def_property_readonly("ran", locked([](const QueuedLaunches& q) { return q.ran; }),
                             "Items every ended launch ran, in all (the model's device).");

  t.def(
      "queue_executor",
      [](uint64_t memory_budget, bool phases_ahead, uint64_t max_lookahead, bool followers) {
        return std::make_unique<Executor>(
            std::make_unique<QueueBackend>(phases_ahead, max_lookahead, followers),
            memory_budget);
      },
      py::arg("memory_budget") = 0, py::arg("phases_ahead") = false,
      py::arg("max_lookahead") = 0, py::arg("followers") = false,
      "An Executor on the test queue backend: its launches are enqueued and ended by the "
      "test (queue_launches). phases_ahead: its runners begin phases with launches in "
      "flight and chain the next phase's at opens (csrc/phase_ahead_rule.hpp). "
      "max_lookahead: the lookahead bound (csrc/open_launch_rule.hpp; 0: none). followers: "
      "the next task follows one in its tail (csrc/follow_rule.hpp).");
  t.def("within_lookahead", &freeride::within_lookahead, py::arg("opens_ahead"),
        py::arg("bound"), "csrc/open_launch_rule.hpp's within_lookahead.");
  t.def(
      "launches_at_open",
      [](bool enabled, uint64_t phase, uint64_t num_phases, bool phase_done, uint64_t next_items,
         size_t room) {
        const freeride::OpenLaunches go = freeride::launches_at_open(
            freeride::PhaseAheadState{enabled, phase, num_phases, phase_done, next_items, room});
        return py::make_tuple(go.current, go.next);
      },
      py::arg("enabled"), py::arg("phase"), py::arg("num_phases"), py::arg("phase_done"),
      py::arg("next_items"), py::arg("room"),
      "csrc/phase_ahead_rule.hpp's launches_at_open: (current, next) an open carries.");
  t.def("phase_slot", &freeride::phase_slot, py::arg("phase"),
        "csrc/phase_ahead_rule.hpp's phase_slot: which set of counters a phase uses.");
  t.def(
      "queue_launches",
      [](Executor& ex, size_t index, double timeout) {
        return queue_backend(ex).launches(index, timeout);
      },
      py::arg("executor"), py::arg("index"), py::arg("timeout") = 10.0,
      py::call_guard<py::gil_scoped_release>(),
      "The launches of the index-th runner the executor made (admission order).");
  t.def(
      "queue_open",
      [](Executor& ex, size_t count) { return queue_backend(ex).open(count); },
      py::arg("executor"), py::arg("count") = 1, py::call_guard<py::gil_scoped_release>(),
      "`count` stream-ordered opens, each launching the runner armed then: (its index in "
      "admission order, or -1 where none is armed, launches it took).");
  t.def(
      "queue_open_one",
      [](Executor& ex) {
        std::vector<int64_t> queued;
        {
          py::gil_scoped_release released;
          queued = queue_backend(ex).open_one();
        }
        py::list out;
        for (const int64_t index : queued) out.append(index);
        return out;
      },
      py::arg("executor"),
      "One open: the runner index of every launch it queued, in stream order (the armed "
      "runner's, then its follower's).");
  t.def(
      "queue_follower", [](Executor& ex) { return queue_backend(ex).follower(); },
      py::arg("executor"), "The index of the runner following the armed one (-1: none).");
  t.def(
      "follow_next",
      [](bool enabled, bool last_phase, uint64_t items_left, uint64_t items_per_open,
         uint64_t in_flight) {
        return freeride::follow_next(
            freeride::FollowState{enabled, last_phase, items_left, items_per_open, in_flight});
      },
      py::arg("enabled"), py::arg("last_phase"), py::arg("items_left"),
      py::arg("items_per_open"), py::arg("in_flight"), "csrc/follow_rule.hpp's follow_next.");
  t.def(
      "queue_hold_backoffs",
      [](Executor& ex, bool on) {
        queue_backend(ex).hold_backoffs(on);
      },
      py::arg("executor"), py::arg("on"),
      "While on, each backoff of the executor lasts until a submit, cancel or close.");
  t.def(
      "queue_wait_backoffs",
      [](Executor& ex, uint64_t count, double timeout) {
        return queue_backend(ex).wait_backoffs(count, timeout);
      },
      py::arg("executor"), py::arg("count"), py::arg("timeout") = 10.0,
      py::call_guard<py::gil_scoped_release>(),
      "Whether `count` backoffs have begun within `timeout` seconds.");
  t.def(
      "queue_abandoned_work",
      [](Executor& ex) {
        return queue_backend(ex).abandoned_work();
      },
      py::arg("executor"), "Whether close() told the backend that launches were abandoned.");

  t.def(
      "items_see_gate_closed",
      [](Executor& ex, bool on) { ex.backend().test_items_see_gate_closed(on); },
      py::arg("executor"), py::arg("on"),
      "Host backend: items see the gate closed while admission sees it open (the CUDA "
      "race of a stale open mirror over a closed gate).");

  t.def("fail_green_preload", &freeride::test_switches::set_fail_green_preload, py::arg("on"),
        "CUDA backends made from now on fail to load the built-in kernels into their green "
        "context (and fall back to the occupancy cap).");

  t.def("green_partition_overflow", &freeride::test_switches::set_green_partition_overflow,
        py::arg("on"),
        "CUDA backends made from now on see their green context's blocks run on one SM more "
        "than it holds (and fall back to the occupancy cap).");

  t.def(
      "fail_kernel_load",
      [](const std::string& where) {
        using freeride::test_switches::KernelLoadFailure;
        KernelLoadFailure failure = KernelLoadFailure::kNone;
        if (where == "everywhere") {
          failure = KernelLoadFailure::kEverywhere;
        } else if (where == "green-context") {
          failure = KernelLoadFailure::kGreenContext;
        } else {
          FR_ARG(where.empty(), "where must be '', 'everywhere' or 'green-context', got '"
                                    << where << "'");
        }
        freeride::test_switches::set_fail_kernel_load(failure);
      },
      py::arg("where"),
      "Loads of the built-in kernels fail from now on as where the driver cannot JIT the "
      "build's PTX: 'everywhere' (no CUDA backend can be made), 'green-context' (only the "
      "load into a green context, which then falls back), '' (none).");

  t.def("is_kernel_image_error", &freeride::is_kernel_image_error, py::arg("error"),
        "Whether a load failing with this CUDA error name means no code the driver can run.");

  t.def(
      "kernel_image_message",
      [](const std::string& error, int device, int compute_capability, int toolkit,
         const std::string& ptx_isa, const std::string& architectures, int runtime,
         int driver) {
        return freeride::kernel_image_message(freeride::KernelImageFacts{
            error, device, compute_capability, toolkit, ptx_isa, architectures, runtime,
            driver});
      },
      py::arg("error"), py::arg("device"), py::arg("compute_capability"), py::arg("toolkit"),
      py::arg("ptx_isa"), py::arg("architectures"), py::arg("runtime"), py::arg("driver"),
      "The message of a built-in kernel load the driver cannot do, from these facts.");

  t.def(
      "raise_kernel_image_error",
      [](const std::string& message) { throw freeride::KernelImageError(message); },
      py::arg("message"), "Raises what a load the driver cannot do raises, with `message`.");

  t.def(
      "kernel_load_error",
      []() -> py::object {
#ifdef FREERIDE_WITH_CUDA
        try {
          freeride::kernels::load_failed(cudaErrorUnsupportedPtxVersion, "a test");
        } catch (const freeride::KernelImageError& e) {
          return py::str(e.what());
        }
#endif
        return py::none();
      },
      "The message a load failing with cudaErrorUnsupportedPtxVersion raises, with this "
      "build's and machine's facts; None without CUDA.");

#ifdef FREERIDE_WITH_CUDA
  t.def("successors_enabled", &freeride::cuda::successors_enabled,
        "csrc/cuda/admission.hpp's successors_enabled: FREERIDE_SUCCESSORS as read.");
  t.def("phases_ahead_enabled", &freeride::cuda::phases_ahead_enabled,
        "csrc/cuda/admission.hpp's phases_ahead_enabled: FREERIDE_PHASES_AHEAD as read.");
  t.def("watcher_launch_enabled", &freeride::cuda::watcher_launch_enabled,
        "csrc/cuda/admission.hpp's watcher_launch_enabled: FREERIDE_WATCHER_LAUNCH as read.");
  t.def("lookahead_bound", &freeride::cuda::lookahead_bound,
        "csrc/cuda/admission.hpp's lookahead_bound: FREERIDE_MAX_LOOKAHEAD as read.");
  t.def("sm_census_on_primary", &sm_census_on_primary, py::arg("device"),
        "(distinct SMs, blocks, blocks past the bitmap) of the partition check's census "
        "launched on a stream of the primary context (not confined).");
#endif

  t.def("delay_launch_end", &freeride::test_switches::set_delay_launch_end_ms, py::arg("ms"),
        "Host backend: the executor thread takes each launch's end up to `ms` "
        "milliseconds after its workers left it, as an idle-priority thread waiting for a "
        "core on a loaded machine does; 0 takes them at once, ending the delays under way.");

  t.def("refuse_idle_cgroup", &freeride::test_switches::set_refuse_idle_cgroup, py::arg("on"),
        "Host backends made from now on find no idle cgroup, as an unprivileged user's "
        "(a session leader's then backs off).");

  t.attr("HOST_POOL_DEVICE") = kHostPoolDevice;
  py::class_<HostSlotPool>(t, "HostSlotPool",
                           "The CUDA backend's slot pool over host memory "
                           "(device HOST_POOL_DEVICE, mapped-host kind).")
      .def(py::init([](size_t stride) { return std::make_unique<HostSlotPool>(true, stride); }),
           py::arg("stride"))
      .def("acquire", [](HostSlotPool& p) { (void)p.acquire(); })
      .def("hold", &HostSlotPool::hold)
      .def("release_held", &HostSlotPool::release_held)
      .def("release_all", &HostSlotPool::release_all)
      .def_property_readonly("slabs", &HostSlotPool::slabs)
      .def_property_readonly("held", &HostSlotPool::held);
  t.attr("SLOTS_PER_SLAB") = freeride::cuda::kSlotsPerSlab;
  t.def("kept_slabs", &freeride::cuda::kept_slabs, py::arg("device"), py::arg("host_memory"),
        py::arg("bytes"),
        "Slabs the process keeps for later pools of (device, kind, slab size).");
  t.def("streams_never_idle", &freeride::test_switches::set_streams_never_idle, py::arg("on"),
        "CUDA backends' shutdown finds every stream busy (their slabs, streams and green "
        "context are then held), and reclaiming them finds the same.");

  py::class_<CloseModel>(t, "CloseModel",
                         "The host's close ledger against a model of the device's close "
                         "slots, and the kernels' claim decision over them (freeride/slice.h).")
      .def(py::init<>())
      .def("enqueue_close", &CloseModel::enqueue_close, py::arg("stream") = 0,
           py::arg("captured") = false, py::arg("fail") = false)
      .def("execute", &CloseModel::execute, py::arg("stream") = 0)
      .def_property_readonly("pending", &CloseModel::pending)
      .def_property_readonly("latest", &CloseModel::latest)
      .def("may_claim", &CloseModel::may_claim, py::arg("gate_open"), py::arg("ran_ns"),
           py::arg("slice_ns"));
  t.def(
      "slice_time",
      [](uint64_t ran_ns, uint64_t slice_ns) {
        return static_cast<int>(freeride::slice_time(ran_ns, slice_ns));
      },
      py::arg("ran_ns"), py::arg("slice_ns"),
      "freeride/slice.h's slice_time: 0 within the slice, 1 extendable, 2 over.");
  t.def(
      "look_at_pending",
      [](uint64_t word, uint64_t now_ns) {
        const freeride::PendingLook look = freeride::look_at_pending(word, now_ns);
        return py::make_tuple(look.refresh, look.answer, static_cast<uint64_t>(look.kept));
      },
      py::arg("word"), py::arg("now_ns"),
      "freeride/slice.h's look_at_pending: (refresh, answer, kept).");
  t.def(
      "pending_word",
      [](bool pending, uint64_t at_ns, bool in_flight) {
        return static_cast<uint64_t>(freeride::pending_word(pending, at_ns, in_flight));
      },
      py::arg("pending"), py::arg("at_ns"), py::arg("in_flight") = false,
      "freeride/slice.h's pending_word.");
  t.def(
      "pending_answer",
      [](uint64_t word, uint64_t now_ns) { return freeride::pending_answer(word, now_ns); },
      py::arg("word"), py::arg("now_ns"), "freeride/slice.h's pending_answer.");
  t.attr("PENDING_FRESH_NS") = py::int_(FREERIDE_PENDING_FRESH_NS);
  py::class_<freeride::cuda::SkippedOpens>(
      t, "SkippedOpens",
      "The CUDA backend's record of stream-ordered opens written without a launch "
      "(csrc/cuda/skipped_opens.hpp).")
      .def(py::init<>())
      .def("note", &freeride::cuda::SkippedOpens::note, py::arg("seq"))
      .def("contains", &freeride::cuda::SkippedOpens::contains, py::arg("seq"))
      .def_property_readonly_static(
          "KEPT", [](const py::object&) { return freeride::cuda::SkippedOpens::kKept; });
  t.def(
      "queue_successor",
      [](bool enabled, bool has_slice, size_t pending, bool newest_running, bool progressed,
         bool gate_open, bool stopping, bool phase_done, bool follows_protocol) {
        freeride::SuccessorState s;
        s.enabled = enabled;
        s.has_slice = has_slice;
        s.pending = pending;
        s.newest_running = newest_running;
        s.progressed = progressed;
        s.gate_open = gate_open;
        s.stopping = stopping;
        s.phase_done = phase_done;
        s.follows_protocol = follows_protocol;
        return freeride::queue_successor(s);
      },
      py::arg("enabled") = true, py::arg("has_slice") = true, py::arg("pending") = 1,
      py::arg("newest_running") = true, py::arg("progressed") = true,
      py::arg("gate_open") = true, py::arg("stopping") = false, py::arg("phase_done") = false,
      py::arg("follows_protocol") = true, "freeride/successor_rule.hpp's queue_successor.");
  t.def(
      "watcher_launches",
      [](bool enabled, bool pending, bool accepting, bool stopping, bool gate_open,
         bool same_open, bool skipped) {
        freeride::ReachedOpen o;
        o.enabled = enabled;
        o.pending = pending;
        o.accepting = accepting;
        o.stopping = stopping;
        o.gate_open = gate_open;
        o.same_open = same_open;
        o.skipped = skipped;
        return freeride::watcher_launches(o);
      },
      py::arg("enabled") = true, py::arg("pending") = false, py::arg("accepting") = true,
      py::arg("stopping") = false, py::arg("gate_open") = true, py::arg("same_open") = true,
      py::arg("skipped") = false, "csrc/watcher_launch_rule.hpp's watcher_launches.");
  t.def("waits_behind_another_stream", &freeride::waits_behind_another_stream,
        py::arg("newest_at_open"), py::arg("newest_begun"), py::arg("same_stream"),
        "freeride/open_launch_rule.hpp's waits_behind_another_stream.");
  t.def("launch_block_item_ns", &freeride::launch_block_item_ns, py::arg("duration_ns"),
        py::arg("blocks"), py::arg("items"), "freeride/item_time.hpp's launch_block_item_ns.");
  t.def("smoothed_item_ns", &freeride::smoothed_item_ns, py::arg("estimate"),
        py::arg("measured"), "freeride/item_time.hpp's smoothed_item_ns.");

  py::class_<FakeWatcher>(t, "FakeWatcher",
                          "An open watcher (csrc/cuda/open_watcher.hpp) with fake events: "
                          "each wait ends only once release() lets it.")
      .def(py::init<bool, int64_t>(), py::arg("hook") = false, py::arg("throw_at") = -1)
      .def("ring_after", &FakeWatcher::ring_after, py::arg("seq") = 0,
           "Queues one fake event for open `seq`; rings once it ends.")
      .def("rings", &FakeWatcher::rings)
      .def("reached", &FakeWatcher::reached,
           "(seq, rings before the call) of each of the hook's calls, in order.")
      .def("retire", &FakeWatcher::retire, py::call_guard<py::gil_scoped_release>())
      .def_static("waits_begun", &FakeWatcher::waits_begun, py::arg("count"),
                  py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def_static("release", &FakeWatcher::release, py::arg("count"));
}

}  // namespace freeride_ext
