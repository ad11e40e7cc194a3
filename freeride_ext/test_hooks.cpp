// freeride._C._testing: hooks tests use to drive the executor and the host backend into
// states that real work reaches only by chance. Registered by bindings.cpp only where
// FREERIDE_TEST_HOOKS=1 at import (tests/conftest.py sets it).
#include "test_hooks.hpp"

#include <memory>
#include <utility>

#include "backend.hpp"
#include "check.hpp"
#include "executor.hpp"
#include "latch_dependency.hpp"
#include "queue_backend.hpp"

namespace py = pybind11;

namespace freeride_ext {

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
      .def("arrive", &QueuedLaunches::arrive, py::arg("count") = 1,
           py::call_guard<py::gil_scoped_release>(),
           "Launches enqueued at opens (as many as the runner takes); how many were taken.")
      .def("end", &QueuedLaunches::end, py::arg("items"),
           py::call_guard<py::gil_scoped_release>(),
           "The oldest launch not yet ended ends, having run `items` items.")
      .def("fail", &QueuedLaunches::fail, py::arg("message"), py::arg("drop_pending") = true,
           py::call_guard<py::gil_scoped_release>(),
           "The next run() fails with `message`; with drop_pending (a kernel fault) every "
           "pending launch is gone, else only the oldest ended (a broken launch).")
      .def_property_readonly("pending",
                             [](QueuedLaunches& q) {
                               std::lock_guard<std::mutex> lk(q.mu);
                               return q.pending.size();
                             })
      .def_property_readonly("stopped",
                             [](QueuedLaunches& q) {
                               std::lock_guard<std::mutex> lk(q.mu);
                               return q.stopped;
                             })
      .def_property_readonly("abandoned",
                             [](QueuedLaunches& q) {
                               std::lock_guard<std::mutex> lk(q.mu);
                               return q.abandoned;
                             })
      .def(
          "make_stop_fail",
          [](QueuedLaunches& q) {
            std::lock_guard<std::mutex> lk(q.mu);
            q.stop_fails = true;
          },
          "From now on stop() throws, as a stop write does on a broken CUDA context.")
      .def_property_readonly("begun",
                             [](QueuedLaunches& q) {
                               std::lock_guard<std::mutex> lk(q.mu);
                               return q.epoch > 0;
                             })
      .def_property_readonly("runs", [](QueuedLaunches& q) {
        std::lock_guard<std::mutex> lk(q.mu);
        return q.runs;
      });

  t.def(
      "queue_executor",
      [](uint64_t memory_budget) {
        return std::make_unique<Executor>(std::make_unique<QueueBackend>(), memory_budget);
      },
      py::arg("memory_budget") = 0,
      "An Executor on the test queue backend: its launches are enqueued and ended by the "
      "test (queue_launches).");
  t.def(
      "queue_launches",
      [](Executor& ex, size_t index, double timeout) {
        auto* backend = dynamic_cast<QueueBackend*>(&ex.backend());
        FR_ARG(backend != nullptr, "the executor is not on the test queue backend");
        return backend->launches(index, timeout);
      },
      py::arg("executor"), py::arg("index"), py::arg("timeout") = 10.0,
      py::call_guard<py::gil_scoped_release>(),
      "The launches of the index-th runner the executor made (admission order).");
  t.def(
      "queue_abandoned_work",
      [](Executor& ex) {
        auto* backend = dynamic_cast<QueueBackend*>(&ex.backend());
        FR_ARG(backend != nullptr, "the executor is not on the test queue backend");
        return backend->abandoned_work();
      },
      py::arg("executor"), "Whether close() told the backend that launches were abandoned.");

  t.def(
      "items_see_gate_closed",
      [](Executor& ex, bool on) { ex.backend().test_items_see_gate_closed(on); },
      py::arg("executor"), py::arg("on"),
      "Host backend: items see the gate closed while admission sees it open (the CUDA "
      "race of a stale open mirror over a closed gate).");
}

}  // namespace freeride_ext
