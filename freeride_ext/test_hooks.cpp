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

  t.def(
      "items_see_gate_closed",
      [](Executor& ex, bool on) { ex.backend().test_items_see_gate_closed(on); },
      py::arg("executor"), py::arg("on"),
      "Host backend: items see the gate closed while admission sees it open (the CUDA "
      "race of a stale open mirror over a closed gate).");
}

}  // namespace freeride_ext
