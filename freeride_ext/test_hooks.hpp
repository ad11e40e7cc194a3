// Test-only bindings: freeride._C._testing, which bindings.cpp creates only where
// FREERIDE_TEST_HOOKS=1 at import, so the shipped module offers none of it by default.
#pragma once

#include <pybind11/pybind11.h>

namespace freeride_ext {

// Adds the submodule `_testing` to `m`: Latch, submit_after_latch, items_see_gate_closed,
// the test queue backend (test_queue_hooks.cpp), the rules (test_rule_hooks.cpp), the
// wait for the gate (test_gate_wait_hooks.cpp), fail_green_preload, delay_launch_end,
// FakeWatcher, LaunchShapes.
void register_test_hooks(pybind11::module_& m);

// The test queue backend's part of `_testing` (test_queue_hooks.cpp).
void register_queue_hooks(pybind11::module_& t);

// The scheduling rules' part of `_testing` (test_rule_hooks.cpp): CloseModel, the slice
// rule's pieces, SkippedOpens, UnrungOpens, OpenOrdinals and the rule functions.
void register_rule_hooks(pybind11::module_& t);

// The CUDA backend's wait for the gate, per admission mode, over the test's own bell and
// gate (test_gate_wait_hooks.cpp): wait_for_gate, SPIN_LOOK_EVERY_MS.
void register_gate_wait_hooks(pybind11::module_& t);

}  // namespace freeride_ext
