// Executor's timestamp bindings: marks are recorded beside gate writes on the training
// thread and resolved later, off it (the recorder's flush).
#include "marks.hpp"

#include <cmath>
#include <cstdint>

#include "backend.hpp"
#include "check.hpp"

namespace py = pybind11;
using freeride::Executor;

namespace freeride_ext {

void bind_marks(py::class_<Executor>& executor) {
  executor
      // An event record (host: a clock read) never waits, so the GIL stays held, as for
      // gate_write.
      .def(
          "mark",
          [](Executor& ex, uint64_t stream) {
            return ex.backend().mark(static_cast<uintptr_t>(stream));
          },
          py::arg("stream"))
      // A query that never waits (cudaEventElapsedTime answers NotReady; host: a map
      // lookup), so the GIL stays held: the iterative runner calls it after every step,
      // and a thread that drops and retakes the GIL that often keeps one waiting for it
      // from ever asking for it (the wait restarts at every hand-over), the training
      // thread held off for a whole task of short Python steps.
      .def(
          "elapsed_ns",
          [](Executor& ex, uint64_t from, uint64_t to) -> py::object {
            const int64_t ns = ex.backend().elapsed_ns(from, to);
            if (ns == freeride::kPending) return py::none();
            return py::int_(ns);
          },
          py::arg("from_mark"), py::arg("to_mark"))
      .def(
          "release_mark", [](Executor& ex, uint64_t id) { ex.backend().release_mark(id); },
          py::arg("id"))
      // Waits (CUDA: spins) up to `timeout` on the calling thread: never with the GIL.
      .def(
          "mark_unix_ns",
          [](Executor& ex, uint64_t mark, double timeout) -> py::object {
            FR_ARG(std::isfinite(timeout) && timeout >= 0.0,
                   "timeout must be a finite number of seconds >= 0, got " << timeout);
            int64_t ns;
            {
              py::gil_scoped_release release;
              ns = ex.backend().mark_unix_ns(mark, timeout);
            }
            if (ns == freeride::kPending) return py::none();
            return py::int_(ns);
          },
          py::arg("mark"), py::arg("timeout"),
          "Unix time (ns) at which the device passed `mark`, or None where the backend "
          "cannot say within `timeout` seconds. CUDA: an anchor's stamp, watched as it "
          "lands, ties the device's events to the wall clock whatever work was queued "
          "ahead of it.");
}

}  // namespace freeride_ext
