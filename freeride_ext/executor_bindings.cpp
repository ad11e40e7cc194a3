// freeride._C.Executor (executor_bindings.hpp).
#include "executor_bindings.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "admission_stamp_object.hpp"
#include "backend.hpp"
#include "check.hpp"
#include "executor.hpp"
#include "gate.hpp"
#include "marks.hpp"
#include "reserve_tuple.hpp"

namespace py = pybind11;
using freeride::Executor;
using freeride::Task;

namespace freeride_ext {
namespace {

using release_gil = py::call_guard<py::gil_scoped_release>;

std::unique_ptr<Executor> make_executor(const std::string& kind, int device, int workers,
                                        bool gate_in_host_memory, bool stream_wait,
                                        uint64_t memory_budget, const ReserveTuple& reserve,
                                        uint64_t slice_ns, const std::string& reserve_mechanism,
                                        int reserve_sms, uint32_t max_slices) {
  freeride::CudaOptions options;
  options.gate_in_host_memory = gate_in_host_memory;
  options.stream_wait = stream_wait;
  options.reserve = to_reserve(reserve);
  options.slice_ns = slice_ns;
  options.max_slices = max_slices;
  options.reserve_mechanism = reserve_mechanism;
  options.reserve_sms = reserve_sms;
  return std::make_unique<Executor>(freeride::make_backend(kind, device, workers, options),
                                    memory_budget);
}

py::tuple status_tuple(const Executor& ex, uint64_t id) {
  freeride::TaskStatus s;
  {
    // The executor's lock may be held across a launch's bookkeeping: never with the GIL.
    py::gil_scoped_release release;
    s = ex.status(id);
  }
  return py::make_tuple(freeride::state_name(s.state), s.items_done, s.items_total, s.phase,
                        s.launches, static_cast<int>(s.error_kind), s.error);
}

// Longest a blocking wait stays in C++ before Python's signal handlers get a turn.
constexpr double kSignalSlice = 0.05;

// A wait that Ctrl-C (or any signal with a Python handler) interrupts: `wait(slice)`
// waits up to `slice` seconds with the GIL released and returns true once done; between
// slices Python's pending signal handlers run (on the main thread), and an exception one
// raises (KeyboardInterrupt) propagates. timeout_s < 0: no limit. True once done.
template <typename Wait>
bool wait_interruptibly(double timeout_s, Wait wait) {
  using clock = std::chrono::steady_clock;
  const bool bounded = timeout_s >= 0;
  const clock::time_point deadline = bounded ? clock::now() + freeride::clamp_timeout(timeout_s)
                                             : clock::time_point::max();
  while (true) {
    double slice = kSignalSlice;
    if (bounded) {
      const double left = std::chrono::duration<double>(deadline - clock::now()).count();
      slice = std::clamp(left, 0.0, kSignalSlice);
    }
    bool done;
    {
      py::gil_scoped_release release;
      done = wait(slice);
    }
    if (done) return true;
    if (bounded && clock::now() >= deadline) return false;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace

void bind_executor(py::module_& m) {
  py::class_<Executor> executor(m, "Executor");
  executor
      .def(py::init(&make_executor), py::arg("kind"), py::arg("device"), py::arg("workers"),
           py::arg("gate_in_host_memory"), py::arg("stream_wait"), py::arg("memory_budget"),
           py::arg("reserve"), py::arg("slice_ns"),
           py::arg("reserve_mechanism") = "occupancy-cap", py::arg("reserve_sms") = 0,
           py::arg("max_slices") = 0, release_gil())
      .def("submit", &Executor::submit, py::arg("task"), py::arg("priority"),
           py::arg("after") = std::vector<uintptr_t>{}, release_gil(),
           "after: stream handles whose work so far the task's first launch waits for")
      .def("status", &status_tuple, py::arg("id"))
      // Blocking waits run Python's signal handlers every kSignalSlice: Ctrl-C reaches a
      // training loop waiting for a side task.
      .def(
          "wait",
          [](Executor& ex, uint64_t id, double timeout) {
            return wait_interruptibly(timeout, [&](double slice) { return ex.wait(id, slice); });
          },
          py::arg("id"), py::arg("timeout"))
      .def(
          "wait_all",
          [](Executor& ex, double timeout) {
            return wait_interruptibly(timeout, [&](double slice) { return ex.wait_all(slice); });
          },
          py::arg("timeout"))
      .def(
          "cancel",
          [](Executor& ex, uint64_t id, bool wait) {
            bool cancelled;
            {
              py::gil_scoped_release release;
              cancelled = ex.cancel(id, false);
            }
            if (cancelled && wait) {
              wait_interruptibly(-1.0, [&](double slice) { return ex.wait(id, slice); });
            }
            return cancelled;
          },
          py::arg("id"), py::arg("wait"))
      .def("forget", &Executor::forget, py::arg("id"), release_gil())
      .def("take_finished", &Executor::take_finished, release_gil(),
           "Ids of the tasks that became final since the last call.")
      .def("close", &Executor::close, py::arg("deadline") = Executor::kCloseDeadlineS,
           release_gil(),
           "Stops the thread and cancels what is not final; launches still in flight past "
           "`deadline` seconds are abandoned (see take_abandoned).")
      .def("take_abandoned", &Executor::take_abandoned, release_gil(),
           "Ids of the tasks whose launches close() abandoned: their memory must be kept "
           "(take_finished never names them).")
      .def("reclaim_abandoned", &Executor::reclaim_abandoned, release_gil(),
           "After close(): whether the device has passed every abandoned launch, so that "
           "their memory may go (what the backend held for them is then released).")
      // Each takes the executor's lock, which its thread may hold while admitting a task.
      .def_property_readonly("closed", py::cpp_function(&Executor::closed, release_gil()))
      .def_property_readonly("launches", py::cpp_function(&Executor::launches, release_gil()),
                             "Side launches so far.")
      .def_property_readonly("idle_launches",
                             py::cpp_function(&Executor::idle_launches, release_gil()),
                             "Launches the gate let in that ran no item.")
      .def_property_readonly("open_launches",
                             py::cpp_function(&Executor::open_launches, release_gil()),
                             "Launches enqueued at stream-ordered opens (CUDA).")
      .def_property_readonly("running_item_ns", &Executor::running_item_ns,
                             "How long one block (CUDA) or worker (host) spends on one item "
                             "of the task run last, in ns; 0 until measured.")
      .def_property_readonly(
          "skipped_open_launches",
          [](Executor& ex) { return ex.backend().skipped_open_launches(); },
          "Stream-ordered opens whose launch was left out: it would have waited behind "
          "another training stream's open.")
      .def_property_readonly(
          "opens_served_by_executor",
          [](Executor& ex) { return ex.backend().opens_served_by_executor(); },
          "Launches at stream-ordered opens left out: the executor's own launch for the "
          "same open was on the side stream already.")
      .def_property_readonly(
          "max_lookahead", [](Executor& ex) { return ex.backend().max_lookahead(); },
          "The most launches at opens enqueued and not yet begun at once.")
      .def_property_readonly(
          "opens_beyond_lookahead",
          [](Executor& ex) { return ex.backend().opens_beyond_lookahead(); },
          "Stream-ordered opens that carried no launch: the lookahead bound was reached.")
      .def_property_readonly("idle_open_launches",
                             py::cpp_function(&Executor::idle_open_launches, release_gil()),
                             "Launches enqueued at opens that ran no item.")
      .def_property_readonly("memory_budget", &Executor::memory_budget)
      .def_property_readonly("memory_used",
                             py::cpp_function(&Executor::memory_used, release_gil()))
      .def(
          "run_plain",
          [](Executor& ex, const std::shared_ptr<Task>& task, uint64_t stream) {
            ex.backend().run_plain(*task, static_cast<uintptr_t>(stream));
          },
          py::arg("task"), py::arg("stream"), release_gil())
      .def("set_recording", &Executor::set_recording, py::arg("on"), release_gil())
      .def("take_launch_log",
           [](Executor& ex) {
             std::vector<freeride::LaunchRecord> log;
             {
               py::gil_scoped_release release;
               log = ex.take_launch_log();
             }
             py::list out;
             for (const auto& r : log) {
               out.append(py::make_tuple(r.task_id, r.phase, r.start_mark, r.end_mark, r.items));
             }
             return out;
           })
      .def("wait_launches_taken", &Executor::wait_launches_taken, py::arg("timeout"),
           release_gil(),
           "Waits until every launch whose end has come, or comes without a further gate "
           "open, has been taken into the launch log (True), or timeout seconds passed "
           "(False). A launch running on in an open bubble is not waited for.")
      .def_property_readonly("side_stream",
                             [](Executor& ex) { return ex.backend().side_stream(); })
      .def_property_readonly("kind", [](Executor& ex) { return ex.backend().kind(); })
      .def_property_readonly("admission", [](Executor& ex) { return ex.backend().admission(); })
      .def_property_readonly("launches_at_opens",
                             [](Executor& ex) { return ex.backend().launches_at_opens(); })
      .def_property_readonly("device_phases",
                             [](Executor& ex) { return ex.backend().device_phases(); })
      .def_property_readonly("watcher_launches",
                             [](Executor& ex) { return ex.backend().watcher_launches(); })
      .def_property_readonly(
          "admission_stamps",
          [](Executor& ex) {
            const freeride::AdmissionStamps a = ex.backend().admission_stamps();
            py::dict out;
            out["reached"] = admission_stamp_object(a.reached);
            out["woke"] = admission_stamp_object(a.woke);
            out["launched"] = admission_stamp_object(a.launched);
            return out;
          },
          "When the host-started path of the latest admission passed each step: "
          "{'reached': the open watcher saw the GPU reach the open, 'woke': the executor "
          "saw the gate open and launches for it, 'launched': a launch the host made "
          "(the executor's, or the watcher's) was enqueued}, each "
          "(the open's sequence number, time.monotonic_ns()) or None where not yet "
          "(no watcher: 'reached' stays None). For benchmarks.")
      .def_property_readonly("reserve_mechanism",
                             [](Executor& ex) { return ex.backend().reserve_mechanism(); })
      .def_property_readonly("reserve_fallback",
                             [](Executor& ex) { return ex.backend().reserve_fallback(); })
      .def_property_readonly("green_workqueues",
                             [](Executor& ex) { return ex.backend().green_workqueues(); })
      .def_property_readonly("host_idle", [](Executor& ex) { return ex.backend().host_idle(); })
      .def_property_readonly("host_idle_reason",
                             [](Executor& ex) { return ex.backend().host_idle_reason(); })
      .def_property_readonly("device", [](Executor& ex) { return ex.backend().device(); });
  bind_gate(executor);
  bind_marks(executor);
}

}  // namespace freeride_ext
