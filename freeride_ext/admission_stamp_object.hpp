// An admission stamp (csrc/admission_stamps.hpp) as Python sees it: (the open's sequence
// number, time.monotonic_ns() when the step was passed), or None before the first pass.
// Executor.admission_stamps (bindings.cpp) and the test FakeWatcher (test_hooks.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include "admission_stamps.hpp"

namespace freeride_ext {

inline pybind11::object admission_stamp_object(const freeride::AdmissionStamp& st) {
  if (st.steady_ns == 0) return pybind11::none();
  return pybind11::make_tuple(st.seq, st.steady_ns);
}

}  // namespace freeride_ext
