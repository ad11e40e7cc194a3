// The built-in tasks' constructors of freeride._C (spin, saxpy, the item counter,
// PageRank and its CSR transpose, blur, resize), RawKernel's task and what it asks the
// driver about a function, and the Task class they return.
#pragma once

#include <pybind11/pybind11.h>

namespace freeride_ext {

void bind_tasks(pybind11::module_& m);

}  // namespace freeride_ext
