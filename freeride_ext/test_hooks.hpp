// Test-only bindings: freeride._C._testing, which bindings.cpp creates only where
// FREERIDE_TEST_HOOKS=1 at import, so the shipped module offers none of it by default.
#pragma once

#include <pybind11/pybind11.h>

namespace freeride_ext {

// Adds the submodule `_testing` to `m`: Latch, submit_after_latch, items_see_gate_closed,
// the test queue backend (queue_executor, queue_launches, queue_abandoned_work),
// fail_green_preload, delay_launch_end, FakeWatcher.
void register_test_hooks(pybind11::module_& m);

}  // namespace freeride_ext
