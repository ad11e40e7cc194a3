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

// The green context's partition check (CudaShared::check_green_partition) counts one SM
// more than the partition holds, as where runtime launches escape it.
void set_green_partition_overflow(bool on) noexcept;
bool green_partition_overflow() noexcept;

// Loading the built-in kernels fails as where the driver cannot JIT-compile the build's
// PTX (cudaErrorUnsupportedPtxVersion): every load (kernels::preload, so the CUDA backend
// cannot be made), or only the load into a green context (which then falls back).
enum class KernelLoadFailure { kNone, kEverywhere, kGreenContext };
void set_fail_kernel_load(KernelLoadFailure where) noexcept;
KernelLoadFailure fail_kernel_load() noexcept;

// The host backend's executor thread takes a launch's end up to this many milliseconds
// after the launch's workers have left it (HostRunner::run), as on a loaded machine where
// that idle-priority thread waits for a core while the training thread asks for its
// report. Setting 0 ends the delays under way: a long delay is a hold the test releases.
void set_delay_launch_end_ms(unsigned ms);
// Called where the end is taken: returns at once unless a delay is set.
void delay_launch_end();

// A stream-ordered open's launch is enqueued this many microseconds after the open's
// writes (CudaShared::ring_and_launch), as where the training thread is descheduled
// between the two: an executor looking at the mirror then sees the open first (a GPU
// caught up with the host), which open_launch_rule.hpp's served_by_executor handles.
void set_delay_open_launch_us(unsigned us) noexcept;
void delay_open_launch() noexcept;

// The CUDA backend's shutdown finds its streams still busy (CudaShared::wait_idle answers
// "not ready" at once) and so does reclaiming what it then holds (CudaShared::reclaim),
// as where launches are left queued behind a training stream that has stalled.
void set_streams_never_idle(bool on) noexcept;
bool streams_never_idle() noexcept;

// Host backends made from now on find no idle cgroup (HostIdle), as where the cgroup
// hierarchy is not writable: the fallback chosen then is what unprivileged users get.
void set_refuse_idle_cgroup(bool on) noexcept;
bool refuse_idle_cgroup() noexcept;

// measure_call_costs (csrc/cuda/call_costs.cpp) throws inside its timed block number
// `block` (0: never), while a stream wait holds its stream, as where a timed call fails
// there: what it held must be let go and the error reach the caller.
void set_fail_call_costs_block(unsigned block) noexcept;
unsigned fail_call_costs_block() noexcept;

}  // namespace freeride::test_switches
