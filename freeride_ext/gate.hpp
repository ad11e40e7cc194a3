// Executor's gate bindings (gate_write, gate_write_marked, reads and waits, how writes are
// made): the training thread's path, apart from bindings.cpp's other methods.
#pragma once

#include <pybind11/pybind11.h>

#include "executor.hpp"

namespace freeride_ext {

void bind_gate(pybind11::class_<freeride::Executor>& executor);

}  // namespace freeride_ext
