// Process-wide switches that only the test hooks set (freeride._C._testing, present where
// FREERIDE_TEST_HOOKS=1 at import), each forcing a failure that real drivers produce too
// rarely or too unpredictably for a test to wait for. Compiled into every build; read
// where the failure would happen, so the code after it is the code that runs for real.
#pragma once

namespace freeride::test_switches {

// Loading the built-in kernels into a new green context fails (CudaShared::
// preload_in_green_context), as where the runtime refuses the green context as current.
void set_fail_green_preload(bool on) noexcept;
bool fail_green_preload() noexcept;

// Host backends made from now on find no idle cgroup (HostIdle), as where the cgroup
// hierarchy is not writable: the fallback chosen then is what unprivileged users get.
void set_refuse_idle_cgroup(bool on) noexcept;
bool refuse_idle_cgroup() noexcept;

}  // namespace freeride::test_switches
