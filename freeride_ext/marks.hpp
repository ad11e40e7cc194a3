// Executor's timestamp bindings (mark, elapsed_ns, release_mark, mark_unix_ns): the
// recorder's view of the device's timeline, apart from bindings.cpp's other methods.
#pragma once

#include <pybind11/pybind11.h>

#include "executor.hpp"

namespace freeride_ext {

void bind_marks(pybind11::class_<freeride::Executor>& executor);

}  // namespace freeride_ext
