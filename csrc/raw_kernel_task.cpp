#include "raw_kernel_task.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "check.hpp"
#include "cuda/launch_shapes.hpp"
#ifdef FREERIDE_WITH_CUDA
#include "cuda/driver.hpp"
#endif

namespace freeride {
namespace {

#ifdef FREERIDE_WITH_CUDA
const cuda_driver::Api& kernel_api() {
  const cuda_driver::Api& a = cuda_driver::api();
  FR_CHECK(a.launch_kernel != nullptr && a.occupancy != nullptr &&
               a.func_get_attribute != nullptr && a.func_set_attribute != nullptr,
           "user kernels need CUDA driver entry points that are missing: " << a.kernel_error);
  return a;
}

CUfunction as_function(uintptr_t f) { return reinterpret_cast<CUfunction>(f); }

// Parameters a launch passes from the stack (fr_item_ctx included); more go on the heap.
constexpr size_t kInlineParams = 16;

int function_attribute(const cuda_driver::Api& a, CUfunction f, CUfunction_attribute attr) {
  int value = 0;
  FR_DRV_CHECK(a.func_get_attribute(&value, attr, f));
  return value;
}
#endif

class RawKernelTask final : public Task {
 public:
  RawKernelTask(std::string name, std::vector<RawPhase> kernels, uint64_t phases,
                std::vector<uint64_t> args, bool device_phases)
      : name_(std::move(name)), kernels_(std::move(kernels)), phases_(phases),
        args_(std::move(args)), device_phases_(device_phases) {
    FR_ARG(!kernels_.empty(), "a RawKernel task needs at least one kernel");
    FR_ARG(!device_phases_ || kernels_.size() == 1,
           "device_phases needs one kernel for every phase, got " << kernels_.size());
    FR_ARG(phases_ > 0, "a RawKernel task needs at least one phase");
    for (const RawPhase& p : kernels_) {
      FR_ARG(p.function != 0, "RawKernel phase without a function");
      FR_ARG(p.items > 0, "RawKernel phase with no items");
      FR_ARG(p.block > 0 && p.block <= 1024, "block must be in [1, 1024], got " << p.block);
    }
  }

  std::string name() const override { return name_; }
  uint64_t num_phases() const override { return phases_; }
  // The user says its kernel takes the phase from freeride::for_each_phase_item.
  bool supports_device_phases() const override { return device_phases_; }

  // Stays on the primary context's side stream under the occupancy cap even with a
  // green-context reserve. Its CUfunctions were loaded by CuPy into the primary context,
  // and while the runtime-API launches of the built-in kernels into a green-context
  // stream are documented (see csrc/cuda/green_context.cpp) and measured, a cuLaunchKernel of a
  // module function loaded in the primary context into a stream of a green context is
  // not documented either way; until a GPU run shows it works, RawKernel is not moved.
  bool runs_in_green_context() const override { return false; }
  uint64_t num_items(uint64_t phase) const override { return kernel_of(phase).items; }

  void run_item(uint64_t, uint64_t) override {
    FR_THROW(RuntimeFailure, name_ << ": a RawKernel runs CUDA code and needs the cuda backend");
  }

  void launch_cuda(const CudaLaunch& launch) override {
#ifdef FREERIDE_WITH_CUDA
    const cuda_driver::Api& a = kernel_api();
    FR_CHECK(launch.ctx.phase < phases_, name_ << ": launch of phase " << launch.ctx.phase
                                                << " of " << phases_);
    const RawPhase& p = kernel_of(launch.ctx.phase);
    const CUfunction f = as_function(p.function);
    const uint64_t resident = resident_blocks(a, p, launch);
    // A grid the user chose is capped too: blocks beyond the resident ones would wait
    // for a slot, and on a reserved device they would take the reserve's.
    const uint64_t grid = std::min<uint64_t>(
        {p.grid == 0 ? resident : std::min<uint64_t>(p.grid, resident), grid_items(launch.ctx),
         1u << 30});
    // The driver copies each parameter's bytes out of these pointers during the call. On
    // the stack, not the heap, up to kInlineParams: a launch at an open runs on a training
    // thread. Not a member either: a plain run (run_plain) may launch this task from
    // another thread while the executor does.
    fr_item_ctx ctx = launch.ctx;
    std::array<void*, kInlineParams> inline_params;
    std::vector<void*> many_params;
    void** params = inline_params.data();
    if (args_.size() + 1 > kInlineParams) {
      many_params.resize(args_.size() + 1);
      params = many_params.data();
    }
    params[0] = &ctx;
    for (size_t i = 0; i < args_.size(); ++i) params[i + 1] = &args_[i];
    FR_DRV_CHECK(a.launch_kernel(f, static_cast<unsigned int>(grid), 1, 1, p.block, 1, 1, p.shared_mem,
                                 static_cast<CUstream>(launch.stream), params, nullptr));
#else
    (void)launch;
    FR_THROW(RuntimeFailure, name_ << ": this build of freeride has no CUDA support");
#endif
  }

 private:
  const RawPhase& kernel_of(uint64_t phase) const { return kernels_[phase % kernels_.size()]; }

#ifdef FREERIDE_WITH_CUDA
  // Blocks that may be resident at once: the kernel's occupancy, capped per SM by the
  // launch's reserve. What this asks the driver is asked once per backend
  // (launch.shapes, see cuda/launch_shapes.hpp); its first launch may be a launch at an
  // open on a training thread (the runner is armed before the executor launches), where
  // DeviceGuard has made the device's primary context current and compile() has loaded
  // the function already, so the query loads nothing. A launch built by hand has no
  // backend cache: the task's own then keeps the occupancy, as it always did.
  uint64_t resident_blocks(const cuda_driver::Api& a, const RawPhase& p,
                           const CudaLaunch& launch) {
    const CUfunction f = as_function(p.function);
    LaunchShapes& cache = launch.shapes != nullptr ? *launch.shapes : own_occupancy_;
    int per_sm = cache.occupancy(f, static_cast<int>(p.block), static_cast<int>(p.shared_mem),
                                 [&] {
      int blocks = 0;
      FR_DRV_CHECK(a.occupancy(&blocks, f, static_cast<int>(p.block), p.shared_mem));
      FR_CHECK(blocks > 0, name_ << ": not one block of " << p.block << " threads and "
                                 << p.shared_mem << " bytes of shared memory fits on an SM");
      return blocks;
    });
    if (launch.reserve.blocks > 0 && launch.sm.threads > 0) {
      const LaunchShapes::Attributes known = cached_attributes(launch.shapes, f, [&] {
        return LaunchShapes::Attributes{
            function_attribute(a, f, CU_FUNC_ATTRIBUTE_NUM_REGS),
            function_attribute(a, f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)};
      });
      const KernelUse use{static_cast<int>(p.block), known.registers_per_thread,
                          known.static_shared_bytes + static_cast<int>(p.shared_mem)};
      per_sm = std::min(per_sm, side_blocks_per_sm(launch.sm, launch.reserve, use));
      FR_ARG(per_sm > 0, name_ << ": a block of " << p.block << " threads, " << use.registers_per_thread
                               << " registers per thread and " << use.shared_bytes
                               << " bytes of shared memory does not fit on an SM beside the "
                                  "harvester's reserve; use smaller blocks or a smaller reserve");
      // The user owns this function and may set its carveout too: see
      // LaunchShapes::set_carveout for when ours is set again.
      const int carveout = carveout_percent(launch.sm, launch.reserve, use, per_sm);
      apply_carveout(launch.shapes, f, carveout, [&](int percent) {
        FR_DRV_CHECK(
            a.func_set_attribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent));
      });
    }
    return static_cast<uint64_t>(per_sm) * static_cast<uint64_t>(std::max(launch.sm_count, 1));
  }
#endif

  std::string name_;
  std::vector<RawPhase> kernels_;
  uint64_t phases_;
  std::vector<uint64_t> args_;
  bool device_phases_;
  LaunchShapes own_occupancy_;  // for launches that carry no cache (see resident_blocks)
};

}  // namespace

std::shared_ptr<Task> make_raw_kernel_task(std::string name, std::vector<RawPhase> kernels,
                                           uint64_t phases, std::vector<uint64_t> args,
                                           bool device_phases) {
  return std::make_shared<RawKernelTask>(std::move(name), std::move(kernels), phases,
                                         std::move(args), device_phases);
}

FunctionInfo query_function(uintptr_t function) {
  FR_ARG(function != 0, "function handle is null");
#ifdef FREERIDE_WITH_CUDA
  const cuda_driver::Api& a = kernel_api();
  const CUfunction f = as_function(function);
  FunctionInfo info;
  info.max_threads_per_block = function_attribute(a, f, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  info.static_shared_bytes = function_attribute(a, f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  info.max_dynamic_shared_bytes =
      function_attribute(a, f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  info.num_regs = function_attribute(a, f, CU_FUNC_ATTRIBUTE_NUM_REGS);
  if (a.func_get_param_info != nullptr) {
    info.has_param_sizes = true;
    for (size_t i = 0; i < 65536; ++i) {
      size_t offset = 0, size = 0;
      const CUresult res = a.func_get_param_info(f, i, &offset, &size);
      if (res == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
      FR_DRV_CHECK(res);
      info.param_sizes.push_back(size);
    }
  }
  return info;
#else
  FR_THROW(RuntimeFailure, "this build of freeride has no CUDA support");
#endif
}

void set_max_dynamic_shared(uintptr_t function, int bytes) {
  FR_ARG(function != 0, "function handle is null");
#ifdef FREERIDE_WITH_CUDA
  const cuda_driver::Api& a = kernel_api();
  FR_DRV_CHECK(a.func_set_attribute(as_function(function),
                                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
#else
  (void)bytes;
  FR_THROW(RuntimeFailure, "this build of freeride has no CUDA support");
#endif
}

}  // namespace freeride
