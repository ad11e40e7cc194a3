// The Executor class of freeride._C: its constructor, submits, waits (interruptible by
// Python's signal handlers), cancels, counters and the backend's views; the gate's and
// the marks' methods come from gate.cpp and marks.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace freeride_ext {

void bind_executor(pybind11::module_& m);

}  // namespace freeride_ext
