#include "runtime_info.hpp"

#include "check.hpp"

#ifdef FREERIDE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <exception>
#include <string>

#include "capture_mode.hpp"
#include "cuda/device_guard.hpp"
#include "cuda/driver.hpp"
#include "cuda/kernel_image.hpp"
#endif

namespace freeride {

#ifdef FREERIDE_WITH_CUDA
namespace {

std::string describe(const char* call, cudaError_t err) {
  return std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
         cudaGetErrorString(err) + ")";
}

std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// Why cudaGetDeviceCount failed, in the user's terms. The runtime answers "insufficient
// driver" both where no driver is installed (cudaDriverGetVersion then reports 0) and
// where the driver is older than the runtime; the first is by far the common case on a
// machine without a GPU, and its runtime message would send users to upgrade a driver
// they do not have.
std::string no_device_reason(cudaError_t err, int driver_version, int runtime_version) {
  if (err == cudaErrorInsufficientDriver && driver_version == 0) {
    return "no NVIDIA driver found: no CUDA device is usable on this machine";
  }
  if (err == cudaErrorInsufficientDriver) {
    return "the NVIDIA driver supports CUDA " + cuda_version(driver_version) +
           ", older than the CUDA " + cuda_version(runtime_version) +
           " runtime freeride was built with: update the driver";
  }
  if (err == cudaErrorNoDevice) {
    return "the NVIDIA driver sees no CUDA device (check CUDA_VISIBLE_DEVICES)";
  }
  return describe("cudaGetDeviceCount", err);
}

// Fills info from the runtime. Only device attributes are read: none of the calls below
// creates a context, so asking costs no device memory on any GPU.
void query_cuda(BackendInfo& info) {
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info.runtime_version = runtime;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) info.driver_version = driver;  // 0: none

  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // cudaErrorNoDevice, cudaErrorInsufficientDriver, ... must not linger as the thread's
    // last error.
    (void)cudaGetLastError();
    info.reason = no_device_reason(err, info.driver_version, info.runtime_version);
    info.cuda_error = cudaGetErrorName(err);
    return;
  }
  if (count <= 0) {
    info.reason = "no CUDA device visible";
    return;
  }
  for (int i = 0; i < count; ++i) {
    DeviceInfo dev;
    dev.index = i;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      dev.name = prop.name;
      dev.sm_count = prop.multiProcessorCount;
      dev.compute_capability = prop.major * 10 + prop.minor;
    } else {
      (void)cudaGetLastError();
      dev.name = "unknown";
    }
    dev.stream_mem_ops = cuda_driver::stream_mem_ops_usable(i);
    try {
      dev.gate_write = cuda_driver::gate_write_name(
          cuda_driver::usable_gate_write(i, cuda_driver::requested_gate_write("")));
    } catch (const std::exception& e) {
      dev.gate_write = std::string("invalid: ") + e.what();  // a harvester would refuse it
    }
    dev.green_contexts = cuda_driver::api().has_green_contexts();
    const cuda_driver::ReserveRecord reserve = cuda_driver::reserve_mechanism(i);
    dev.reserve_mechanism = reserve.mechanism;
    dev.reserve_fallback = reserve.fallback;
    dev.green_sms_seen = reserve.green_sms_seen;
    info.devices.push_back(std::move(dev));
  }
  info.module_loading = cuda_driver::module_loading_mode();
  info.cuda = true;
}

}  // namespace
#endif

BackendInfo query_backend_info() {
  BackendInfo info;
#ifdef FREERIDE_WITH_CUDA
  info.cuda_built = true;
  const KernelImageFacts build = cuda_build_facts();
  info.build_toolkit = build.toolkit;
  info.build_architectures = build.architectures;
  info.build_ptx_isa = build.ptx_isa;
  try {
    query_cuda(info);
  } catch (const std::exception& e) {
    info.cuda = false;
    info.devices.clear();
    info.reason = std::string("querying CUDA failed: ") + e.what();
  } catch (...) {
    info.cuda = false;
    info.devices.clear();
    info.reason = "querying CUDA failed";
  }
#else
  info.cuda_built = false;
  info.cuda = false;
  info.reason = "built without CUDA";
#endif
  return info;
}

uint64_t free_device_memory(int device) {
#ifdef FREERIDE_WITH_CUDA
  const RelaxedCaptureScope relaxed;
  DeviceGuard guard(device);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    FR_THROW(RuntimeFailure, describe("cudaMemGetInfo", err));
  }
  return free_bytes;
#else
  (void)device;
  FR_THROW(RuntimeFailure, "free_device_memory(): built without CUDA");
#endif
}

}  // namespace freeride
