// Executor's gate bindings. The training thread writes the gate around every compute
// action: dropping and retaking the GIL there costs a wake-up of whichever thread grabs it
// meanwhile, and a stream-ordered write only enqueues (a launch queue that is full blocks,
// as torch's own launches do with the GIL held). An immediate write is different: on CUDA
// it waits for a stream, so it lets other Python threads run meanwhile.
#include "gate.hpp"

#include <cstdint>

#include "backend.hpp"

namespace py = pybind11;
using freeride::Executor;

namespace freeride_ext {
namespace {

using release_gil = py::call_guard<py::gil_scoped_release>;

// `write` with the GIL released where the write is immediate.
template <typename Write>
auto held_unless_immediate(uint64_t stream, Write write) {
  if (static_cast<uintptr_t>(stream) == freeride::kImmediate) {
    py::gil_scoped_release release;
    return write(static_cast<uintptr_t>(stream));
  }
  return write(static_cast<uintptr_t>(stream));
}

}  // namespace

void bind_gate(py::class_<Executor>& executor) {
  executor
      .def(
          "gate_write",
          [](Executor& ex, uint32_t value, uint64_t stream, uint32_t seq, bool launch) {
            held_unless_immediate(stream, [&](uintptr_t handle) {
              ex.backend().gate_write(value, handle, seq, launch);
            });
          },
          py::arg("value"), py::arg("stream"), py::arg("seq"), py::arg("launch") = true)
      .def(
          "gate_write_marked",
          [](Executor& ex, uint32_t value, uint64_t stream, uint32_t seq, bool launch) {
            return held_unless_immediate(stream, [&](uintptr_t handle) {
              return ex.backend().gate_write_marked(value, handle, seq, launch);
            });
          },
          py::arg("value"), py::arg("stream"), py::arg("seq"), py::arg("launch") = true,
          "gate_write with a mark of where it took effect: before an open, after a close; "
          "0 where none can be taken (a write captured into a CUDA graph).")
      .def("gate_read", [](Executor& ex) { return ex.backend().gate_read(); })
      .def("gate_seq", [](Executor& ex) { return ex.backend().gate_seq(); })
      .def(
          "gate_wait_open",
          [](Executor& ex, double timeout) { return ex.backend().wait_open(timeout); },
          py::arg("timeout"), release_gil(),
          "Sleeps until the gate reads open (True) or timeout seconds passed (False).")
      .def(
          "gate_wait_next_open",
          [](Executor& ex, uint32_t seq, double timeout) {
            return ex.backend().wait_next_open(seq, timeout);
          },
          py::arg("seq"), py::arg("timeout"), release_gil(),
          "Sleeps until the gate reads open with a sequence number other than seq (a newer "
          "open took effect: True) or timeout seconds passed (False). Never woken by closes.")
      .def_property_readonly("gate_address",
                             [](Executor& ex) { return ex.backend().gate_address(); })
      .def_property_readonly("gate_write_mechanism",
                             [](Executor& ex) { return ex.backend().gate_write_mechanism(); })
      .def_property_readonly("gate_write_fences",
                             [](Executor& ex) { return ex.backend().gate_write_fences(); });
}

}  // namespace freeride_ext
