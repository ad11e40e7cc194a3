// CudaShared's green context: building it, trying its stream with the runtime calls side
// launches make, checking that launches there stay on its SMs, and loading the built-in
// kernels into it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "capture_mode.hpp"
#include "cuda/green_context_plan.hpp"
#include "cuda/shared.hpp"
#include "test_switches.hpp"

namespace freeride::cuda {
namespace {

// CUDA 13.1's workqueue configuration, by the values its documentation gives (a 13.0
// toolkit's headers have none of it): the resource type
// (CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG), the balanced scope
// (CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED: "when possible, use non-overlapping workqueue
// resources with other balanced green contexts"), and where the scope sits in the
// resource's union (CUdevWorkqueueConfigResource: int device, unsigned int
// wqConcurrencyLimit, then the scope). The union starts where `sm` does in every CUDA 13
// header, and the resource's size is the same in 13.0 and 13.1, whose union is 8 bytes
// shorter for a pointer after it (nextResource), read by 13.1's calls.
constexpr int kWorkqueueDriver = 13010;
constexpr int kWorkqueueConfigType = 1000;
constexpr uint32_t kScopeBalanced = 1;
constexpr size_t kScopeOffset = 8;
constexpr size_t kNextResourceOffset = 136;
static_assert(sizeof(CUdevResource) == 144 && offsetof(CUdevResource, sm) == 96 &&
                  offsetof(CUdevResource, sm) + sizeof(CUdevSmResource) <= kNextResourceOffset,
              "CUdevResource's layout is not CUDA 13's");

// The device's workqueue configuration with the balanced scope, in *config (false, with
// *why, where the driver has none or refuses the query).
bool balanced_workqueues(const cuda_driver::Api& a, CUdevice dev, CUdevResource* config,
                         std::string* why) {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) (void)cudaGetLastError();
  if (driver < kWorkqueueDriver) {
    *why = "the driver is CUDA " + std::to_string(driver / 1000) + "." +
           std::to_string(driver % 1000 / 10) +
           "; a workqueue configuration needs CUDA 13.1 or later";
    return false;
  }
  if (a.device_get_dev_resource_13010 == nullptr || a.resource_generate_desc_13010 == nullptr ||
      a.green_ctx_create_13010 == nullptr) {
    *why = "the driver has no workqueue configuration (CUDA 13.1 or later): " +
           a.workqueue_error;
    return false;
  }
  *config = CUdevResource{};
  const int res = a.device_get_dev_resource_13010(dev, config, kWorkqueueConfigType);
  if (res != CUDA_SUCCESS) {
    *why = "cuDeviceGetDevResource(CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG) failed: " +
           cuda_driver::error_name(res);
    return false;
  }
  int type = 0;  // read as an int: the toolkit's CUdevResourceType lacks the value
  std::memcpy(&type, config, sizeof type);
  if (type != kWorkqueueConfigType) {
    *why = "cuDeviceGetDevResource answered a resource of type " + std::to_string(type) +
           " for the workqueue configuration";
    return false;
  }
  std::memcpy(reinterpret_cast<unsigned char*>(&config->sm) + kScopeOffset, &kScopeBalanced,
              sizeof kScopeBalanced);
  return true;
}

}  // namespace

void CudaShared::try_green_context(int reserved_wanted, int least_priority) {
  const cuda_driver::Api& a = cuda_driver::api();
  if (!a.has_green_contexts()) {
    reserve_fallback = "the driver offers no green contexts (a CUDA 12.5 driver, r555, or "
                       "later needed): " + a.green_error;
    return;
  }
  auto failed = [&](const char* call, int res) {
    reserve_fallback = std::string(call) + " failed: " + cuda_driver::error_name(res);
  };
  CUdevice dev = 0;
  int res = a.device_get(&dev, device);
  if (res != CUDA_SUCCESS) return failed("cuDeviceGet", res);
  CUdevResource all{};
  res = a.device_get_dev_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
  if (res != CUDA_SUCCESS) return failed("cuDeviceGetDevResource", res);
  // The partition rules: CUDA 13 headers have the fields, and drivers before CUDA 13
  // leave them zero. A 12.x build cannot read them at all. Zero either way means
  // plan_green_context applies the documented guideline for the compute capability.
  int min_partition = 0;
  int alignment = 0;
#if CUDA_VERSION >= 13000
  min_partition = static_cast<int>(all.sm.minSmPartitionSize);
  alignment = static_cast<int>(all.sm.smCoscheduledAlignment);
#endif
  int major = 0;
  int minor = 0;
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int total = static_cast<int>(all.sm.smCount);
  const GreenContextStep plan = plan_green_context(total, reserved_wanted, min_partition,
                                                   alignment, major * 10 + minor, device);
  FR_ARG(plan.action != GreenContextStep::Action::kRefuse, plan.message);
  if (plan.action != GreenContextStep::Action::kAsk) {
    reserve_fallback = plan.message;
    return;
  }
  CUdevResource group{};
  CUdevResource rest{};
  unsigned int groups = 1;
  res = a.sm_resource_split_by_count(&group, &groups, &all, &rest, 0,
                                     static_cast<unsigned int>(plan.sms));
  if (res != CUDA_SUCCESS) return failed("cuDevSmResourceSplitByCount", res);
  const GreenContextStep split =
      check_green_split(plan, total, groups, static_cast<int>(group.sm.smCount));
  if (split.action != GreenContextStep::Action::kUse) {
    reserve_fallback = split.message;
    return;
  }
  const int got = split.sms;
  CUdevResourceDesc desc = nullptr;
  CUgreenCtx ctx = nullptr;
  // With workqueues of its own where asked for and had; the context without them where
  // the driver refuses them, saying why.
  std::string not_had;
  CUdevResource parts[2] = {group, CUdevResource{}};
  // The SM group came from the 12.4 calls, for which those bytes were the union's: no
  // pointer for 13.1's call to follow.
  std::memset(reinterpret_cast<unsigned char*>(&parts[0]) + kNextResourceOffset, 0,
              sizeof(CUdevResource) - kNextResourceOffset);
  if (balanced_wanted && balanced_workqueues(a, dev, &parts[1], &not_had)) {
    res = a.resource_generate_desc_13010(&desc, parts, 2);
    if (res != CUDA_SUCCESS) {
      not_had = "cuDevResourceGenerateDesc with them failed: " + cuda_driver::error_name(res);
    } else {
      res = a.green_ctx_create_13010(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
      if (res != CUDA_SUCCESS) {
        not_had = "cuGreenCtxCreate with them failed: " + cuda_driver::error_name(res);
        ctx = nullptr;
      }
    }
  }
  if (ctx == nullptr) {
    res = a.resource_generate_desc(&desc, &group, 1);
    if (res != CUDA_SUCCESS) return failed("cuDevResourceGenerateDesc", res);
    res = a.green_ctx_create(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (res != CUDA_SUCCESS) return failed("cuGreenCtxCreate", res);
  }
  green_workqueues = !balanced_wanted  ? "shared"
                     : not_had.empty() ? "balanced"
                                       : "shared (balanced not had: " + not_had + ")";
  CUstream stream = nullptr;
  // Lowest priority, like `side` (see there for what that does and does not buy).
  res = a.green_ctx_stream_create(&stream, ctx, CU_STREAM_NON_BLOCKING, least_priority);
  if (res != CUDA_SUCCESS) {
    (void)a.green_ctx_destroy(ctx);
    return failed("cuGreenCtxStreamCreate", res);
  }
  green = ctx;
  green_side = reinterpret_cast<cudaStream_t>(stream);
  green_sms = got;
  reserve_mechanism = (detail::Msg() << "green-context (" << got << " of " << total << " SMs)")
                          .str();
}

void CudaShared::try_green_stream() {
  std::string refused;
  // [0]: the end of the trial; [1] on the side stream, [2] on the green one: a timed
  // pair across the two contexts, as the recorder resolves a launch's marks against an
  // anchor on the training stream.
  cudaEvent_t ev[3] = {nullptr, nullptr, nullptr};
  SlotPool::Slot slot;
  {
    std::lock_guard<std::mutex> lk(pool_mu);
    slot = states.acquire();
  }
  auto try_call = [&](cudaError_t err, const char* call) {
    if (err == cudaSuccess || !refused.empty()) return refused.empty();
    (void)cudaGetLastError();
    refused = std::string(call) + " failed: " + cudaGetErrorName(err);
    return false;
  };
  constexpr unsigned int kProbe = 0x600dfeedu;
  auto* word = reinterpret_cast<unsigned int*>(slot.dev);
  auto* seen = reinterpret_cast<volatile unsigned int*>(staging.host);
  *seen = 0u;
  bool ok = try_call(cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming),
                     "cudaEventCreateWithFlags") &&
            try_call(cudaEventCreateWithFlags(&ev[1], cudaEventDefault),
                     "cudaEventCreateWithFlags") &&
            try_call(cudaEventCreateWithFlags(&ev[2], cudaEventDefault),
                     "cudaEventCreateWithFlags") &&
            try_call(cudaEventRecord(ev[1], side), "cudaEventRecord on the side stream") &&
            try_call(cudaStreamWaitEvent(green_side, ev[1], 0), "cudaStreamWaitEvent") &&
            try_call(cudaMemsetAsync(word, 0, sizeof(fr_phase_state), green_side),
                     "cudaMemsetAsync");
  if (ok) {
    try {
      kernels::launch_gate_write(word, kProbe, green_side);
    } catch (const std::exception& e) {
      (void)cudaGetLastError();
      refused = std::string("a built-in kernel launch failed: ") + e.what();
      ok = false;
    }
  }
  ok = ok &&
       try_call(cudaEventRecord(ev[2], green_side), "cudaEventRecord") &&
       try_call(cudaMemcpyAsync(staging.host, word, sizeof(unsigned int),
                                cudaMemcpyDeviceToHost, green_side),
                "cudaMemcpyAsync") &&
       try_call(cudaEventRecord(ev[0], green_side), "cudaEventRecord");
  // Whatever was enqueued finishes before the slot goes back. A failure to wait for it
  // is the context's own (a synchronisation the green stream refused is retried
  // device-wide): that throws.
  cudaError_t waited = ok ? cudaEventSynchronize(ev[0]) : cudaStreamSynchronize(green_side);
  if (!ok && waited != cudaSuccess) {
    (void)cudaGetLastError();
    waited = cudaDeviceSynchronize();
  }
  if (ok && waited == cudaSuccess) {
    float ms = 0.f;
    ok = try_call(cudaEventElapsedTime(&ms, ev[1], ev[2]), "cudaEventElapsedTime");
  }
  for (cudaEvent_t e : ev) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  {
    std::lock_guard<std::mutex> lk(pool_mu);
    states.release(slot);
  }
  FR_CUDA_CHECK(waited);
  if (ok && *seen != kProbe) {
    refused = "a kernel on it wrote nothing";
    ok = false;
  }
  if (ok) return;
  destroy_green();
  (void)cudaGetLastError();
  green_sms = 0;
  reserve_mechanism = "occupancy-cap";
  reserve_fallback = "the green context's stream refused the runtime API: " + refused;
}

void CudaShared::check_green_partition() {
  static_assert(sizeof(SmCensus) <= kStateStride && sizeof(SmCensus) <= kWordStride);
  // Long enough for the block scheduler to place a grid that fills the device many times
  // over (thousands of blocks take microseconds), short beside making a harvester.
  constexpr uint64_t kHoldNs = 1'000'000;
  // The waits below beside a capture on another thread (a harvester made during one).
  const RelaxedCaptureScope relaxed;
  SlotPool::Slot dev;
  SlotPool::Slot host;
  {
    std::lock_guard<std::mutex> lk(pool_mu);
    dev = states.acquire();
    host = words.acquire();
  }
  auto* census = reinterpret_cast<SmCensus*>(dev.dev);
  std::string refused;
  auto try_call = [&](cudaError_t err, const char* call) {
    if (err == cudaSuccess || !refused.empty()) return refused.empty();
    (void)cudaGetLastError();
    refused = std::string(call) + " failed: " + cudaGetErrorName(err);
    return false;
  };
  bool ok = try_call(cudaMemsetAsync(census, 0, sizeof(SmCensus), green_side), "cudaMemsetAsync");
  if (ok) {
    try {
      kernels::launch_sm_census(census, sm_count, kHoldNs, green_side);
    } catch (const std::exception& e) {
      (void)cudaGetLastError();
      refused = std::string("the census kernel's launch failed: ") + e.what();
      ok = false;
    }
  }
  ok = ok && try_call(cudaMemcpyAsync(host.host, census, sizeof(SmCensus), cudaMemcpyDeviceToHost,
                                      green_side),
                      "cudaMemcpyAsync");
  // Bounded, by asking: nothing else runs on this stream, and a partition whose SMs stay
  // busy for seconds is no reserve either.
  const cudaError_t waited = wait_idle(green_side, kPartitionDeadline);
  PartitionSeen seen;
  seen.finished = waited == cudaSuccess;
  if (ok && seen.finished) {
    const auto* got = reinterpret_cast<const SmCensus*>(host.host);
    seen.sms = census_sms(got->seen, SmCensus::kWords);
    seen.beyond = static_cast<int>(got->beyond);
    seen.blocks = static_cast<int>(got->blocks);
    if (test_switches::green_partition_overflow()) seen.sms = green_sms + 1;
    green_sms_seen = seen.sms;
  }
  if (waited != cudaErrorNotReady) {
    // Done with both slots (a kernel that failed is done too). Left out otherwise: the
    // census may still land in them.
    std::lock_guard<std::mutex> lk(pool_mu);
    states.release(dev);
    words.release(host);
  }
  if (waited != cudaSuccess && waited != cudaErrorNotReady) {  // the context's own failure
    throw_cuda(waited, "the green context's partition check", __FILE__, __LINE__);
  }
  std::string why;
  if (!ok) {
    why = "the check that the green context's blocks stay on its SMs failed: " + refused;
  } else {
    const GreenContextStep step = freeride::check_green_partition(
        green_sms, sm_count, seen, static_cast<int>(kPartitionDeadline.count()));
    if (step.action == GreenContextStep::Action::kUse) return;
    why = step.message;
  }
  if (waited != cudaErrorNotReady) {
    destroy_green();
  } else {
    // Work still queued there: what cuGreenCtxDestroy does to it is not documented (a
    // synchronising teardown would wait for it), so the context and its stream are left.
    green_side = nullptr;
    green = nullptr;
  }
  (void)cudaGetLastError();
  green_sms = 0;
  reserve_mechanism = "occupancy-cap";
  reserve_fallback = why;
}

void CudaShared::preload_in_green_context() {
  const cuda_driver::Api& a = cuda_driver::api();  // has_green_contexts(): all three there
  std::string failed;
  auto give_up = [&](const char* call, int res) {
    failed = std::string(call) + " failed: " + cuda_driver::error_name(res);
  };
  CUcontext green_ctx = nullptr;
  CUcontext previous = nullptr;
  int res = a.ctx_from_green_ctx(&green_ctx, green);
  if (res != CUDA_SUCCESS) {
    give_up("cuCtxFromGreenCtx", res);
  } else if ((res = a.ctx_get_current(&previous)) != CUDA_SUCCESS) {
    give_up("cuCtxGetCurrent", res);
  } else if ((res = a.ctx_set_current(green_ctx)) != CUDA_SUCCESS) {
    give_up("cuCtxSetCurrent", res);
  } else {
    try {
      if (test_switches::fail_green_preload()) {
        FR_THROW(RuntimeFailure, "forced by freeride._C._testing.fail_green_preload");
      }
      if (test_switches::fail_kernel_load() == test_switches::KernelLoadFailure::kGreenContext) {
        kernels::load_failed(cudaErrorUnsupportedPtxVersion, "cudaFuncGetAttributes");
      }
      kernels::preload_all();
    } catch (const std::exception& e) {
      failed = e.what();
    }
    (void)a.ctx_set_current(previous);
  }
  (void)cudaGetLastError();
  if (failed.empty()) return;
  // A green context the built-in kernels cannot be loaded into would fail, or load lazily
  // (synchronising the context mid-training), at every task's first launch there: the
  // occupancy cap serves every task instead, and says why.
  destroy_green();
  (void)cudaGetLastError();
  green_sms = 0;
  reserve_mechanism = "occupancy-cap";
  reserve_fallback = "preload in the green context failed: " + failed;
}

}  // namespace freeride::cuda
