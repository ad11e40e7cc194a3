// freeride._C._testing: hooks tests use to drive the executor and the host backend into
// states that real work reaches only by chance. Registered by bindings.cpp only where
// FREERIDE_TEST_HOOKS=1 at import (tests/conftest.py sets it).
#include "test_hooks.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "admission_stamp_object.hpp"
#include "backend.hpp"
#include "check.hpp"
#include "cuda/green_context_plan.hpp"
#include "cuda/kernel_image.hpp"
#include "cuda/launch_shapes.hpp"
#include "cuda/open_watcher.hpp"
#include "cuda/slot_pool.hpp"
#include "doorbell.hpp"
#include "executor.hpp"
#include "latch_dependency.hpp"
#include "test_switches.hpp"

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
        stamps_(std::make_shared<freeride::AdmissionStamper>()),
        watcher_(std::make_unique<freeride::OpenWatcher>(0, fake_watcher_events(), stamps_)) {
    if (!hook) return;
    watcher_->on_reached([bell = bell_, seen = reached_, throw_at](uint32_t seq) {
      {
        std::lock_guard<std::mutex> lk(seen->mu);
        seen->calls.emplace_back(seq, bell->rings());
      }
      if (static_cast<int64_t>(seq) == throw_at) throw std::runtime_error("the hook failed");
    });
  }

  // `then`: called with the event recorded (its fake number; 0: none), as CudaShared's
  // launch at the open is.
  bool ring_after(uint32_t seq, const py::object& then) {
    if (then.is_none()) return watcher_->ring_after(nullptr, bell_, seq);
    return watcher_->ring_after(nullptr, bell_, seq, [&](void* event) {
      then(reinterpret_cast<uintptr_t>(event));
    });
  }
  uint64_t rings() const { return bell_->rings(); }
  // The watcher's latest `reached` stamp: (seq, steady-clock ns), or None before any.
  py::object reached_stamp() const {
    return freeride_ext::admission_stamp_object(stamps_->read().reached);
  }
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
  std::shared_ptr<freeride::AdmissionStamper> stamps_;  // the watcher stamps `reached`
  std::unique_ptr<freeride::OpenWatcher> watcher_;
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

  register_queue_hooks(t);

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
  t.def("device_phases_enabled", &freeride::cuda::device_phases_enabled,
        "csrc/cuda/admission.hpp's device_phases_enabled: FREERIDE_DEVICE_PHASES as read.");
  t.def("watcher_launch_enabled", &freeride::cuda::watcher_launch_enabled,
        "csrc/cuda/admission.hpp's watcher_launch_enabled: FREERIDE_WATCHER_LAUNCH as read.");
  t.def("lookahead_bound", &freeride::cuda::lookahead_bound,
        "csrc/cuda/admission.hpp's lookahead_bound: FREERIDE_MAX_LOOKAHEAD as read.");
  t.def("balanced_workqueues_wanted", &freeride::cuda::balanced_workqueues_wanted,
        "csrc/cuda/admission.hpp's balanced_workqueues_wanted: FREERIDE_GREEN_WORKQUEUE as "
        "read.");
  t.def(
      "admission_mode",
      []() -> std::string {
        switch (freeride::cuda::admission_mode()) {
          case freeride::cuda::AdmissionMode::kPoll:
            return "poll";
          case freeride::cuda::AdmissionMode::kSpin:
            return "spin";
          case freeride::cuda::AdmissionMode::kRing:
            break;
        }
        return "ring";
      },
      "csrc/cuda/admission.hpp's admission_mode: FREERIDE_ADMISSION as read.");
  t.def("sm_census_on_primary", &sm_census_on_primary, py::arg("device"),
        "(distinct SMs, blocks, blocks past the bitmap) of the partition check's census "
        "launched on a stream of the primary context (not confined).");
#endif

  t.def("delay_launch_end", &freeride::test_switches::set_delay_launch_end_ms, py::arg("ms"),
        "Host backend: the executor thread takes each launch's end up to `ms` "
        "milliseconds after its workers left it, as an idle-priority thread waiting for a "
        "core on a loaded machine does; 0 takes them at once, ending the delays under way.");

  t.def("delay_open_launch", &freeride::test_switches::set_delay_open_launch_us,
        py::arg("us"),
        "CUDA: each stream-ordered open's launch is enqueued `us` microseconds after the "
        "open's writes, as where the training thread is descheduled between them; 0: at "
        "once.");

  t.def("refuse_idle_cgroup", &freeride::test_switches::set_refuse_idle_cgroup, py::arg("on"),
        "Host backends made from now on find no idle cgroup, as an unprivileged user's "
        "(a session leader's then backs off).");
  t.def("fail_call_costs_block", &freeride::test_switches::set_fail_call_costs_block,
        py::arg("block"),
        "measure_call_costs throws inside its timed block number `block` (0: never), while "
        "a stream wait holds its stream.");

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

  register_rule_hooks(t);
  register_gate_wait_hooks(t);

  // The queries are Python callables, run with the GIL; the cache's own lock is taken
  // without it, as a launch takes it with no Python in sight, so threads contend there.
  py::class_<freeride::LaunchShapes>(t, "LaunchShapes",
                                     "The CUDA backend's cache of what launches ask CUDA "
                                     "about their kernels (csrc/cuda/launch_shapes.hpp).")
      .def(py::init<>())
      .def(
          "occupancy",
          [](freeride::LaunchShapes& s, uintptr_t kernel, int threads, int dynamic_shared,
             const py::function& query) {
            py::gil_scoped_release released;
            return s.occupancy(reinterpret_cast<const void*>(kernel), threads, dynamic_shared,
                               [&] {
                                 py::gil_scoped_acquire held;
                                 return query().cast<int>();
                               });
          },
          py::arg("kernel"), py::arg("threads"), py::arg("dynamic_shared"), py::arg("query"),
          "query() -> int where (kernel, threads, dynamic_shared) is not yet known.")
      .def(
          "attributes",
          [](freeride::LaunchShapes& s, uintptr_t kernel, const py::function& query) {
            py::gil_scoped_release released;
            const freeride::LaunchShapes::Attributes a =
                s.attributes(reinterpret_cast<const void*>(kernel), [&] {
                  py::gil_scoped_acquire held;
                  const auto [registers, shared] = query().cast<std::pair<int, int>>();
                  return freeride::LaunchShapes::Attributes{registers, shared};
                });
            return std::make_pair(a.registers_per_thread, a.static_shared_bytes);
          },
          py::arg("kernel"), py::arg("query"),
          "(registers per thread, static shared bytes): query() -> that pair where the "
          "kernel is not yet known.")
      .def(
          "set_carveout",
          [](freeride::LaunchShapes& s, uintptr_t kernel, int percent, const py::function& set) {
            py::gil_scoped_release released;
            return s.set_carveout(reinterpret_cast<const void*>(kernel), percent, [&](int p) {
              py::gil_scoped_acquire held;
              set(p);
            });
          },
          py::arg("kernel"), py::arg("percent"), py::arg("set"),
          "set(percent) unless percent is the kernel's carveout last set here; whether it "
          "called.");

  py::class_<FakeWatcher>(t, "FakeWatcher",
                          "An open watcher (csrc/cuda/open_watcher.hpp) with fake events: "
                          "each wait ends only once release() lets it.")
      .def(py::init<bool, int64_t>(), py::arg("hook") = false, py::arg("throw_at") = -1)
      .def("ring_after", &FakeWatcher::ring_after, py::arg("seq") = 0,
           py::arg("then") = py::none(),
           "Queues one fake event for open `seq`; rings once it ends. `then(event)` is "
           "called with the event's number before the watcher's thread can wait for it.")
      .def("rings", &FakeWatcher::rings)
      .def("reached_stamp", &FakeWatcher::reached_stamp,
           "The watcher's latest `reached` stamp (csrc/admission_stamps.hpp): (seq, "
           "time.monotonic_ns() as its wait returned), or None before the first.")
      .def("reached", &FakeWatcher::reached,
           "(seq, rings before the call) of each of the hook's calls, in order.")
      .def("retire", &FakeWatcher::retire, py::call_guard<py::gil_scoped_release>())
      .def_static("waits_begun", &FakeWatcher::waits_begun, py::arg("count"),
                  py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def_static("release", &FakeWatcher::release, py::arg("count"));
}

}  // namespace freeride_ext
