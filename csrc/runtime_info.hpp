// What this build and this machine offer: reported by fr.backend_info().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace freeride {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int compute_capability = 0;  // major * 10 + minor
  bool stream_mem_ops = false; // cuStreamWriteValue32 / cuStreamWaitValue32 usable
  std::string gate_write;      // what a new backend would write the gate with
  bool green_contexts = false; // the driver has the green-context entry points
  std::string reserve_mechanism = "occupancy-cap";  // the last harvester's on this device
  std::string reserve_fallback;  // why it was not green-context where that was asked for
  int green_sms_seen = 0;  // SMs its green context's blocks ran on (0: not counted)
};

struct BackendInfo {
  bool cuda_built = false;     // compiled with the CUDA backend
  bool cuda = false;           // a usable CUDA device is present
  int runtime_version = 0;     // CUDA runtime linked in (0 without CUDA)
  int driver_version = 0;      // 0 where no driver is installed
  std::vector<DeviceInfo> devices;
  std::string reason;          // why cuda is false, when it is
  // The CUDA runtime's name for the error that made CUDA unusable ("" otherwise), e.g.
  // cudaErrorInsufficientDriver: a driver older than the runtime freeride was built with.
  std::string cuda_error;
  // The build's CUDA code (with cuda_built): the nvcc that made it (as CUDA_VERSION
  // writes it), its architectures (CMAKE_CUDA_ARCHITECTURES, ',' between them) and the
  // PTX ISA version it wrote.
  int build_toolkit = 0;
  std::string build_architectures;
  std::string build_ptx_isa;
  // "lazy" or "eager": how the driver loads kernels in this process
  // (cuda_driver::module_loading_mode); "" without a usable device.
  std::string module_loading;
};

BackendInfo query_backend_info();

// Bytes of device memory free on `device` now (cudaMemGetInfo), asked in relaxed capture
// mode: the recorder samples it on the training thread, and in the default global mode
// the query could invalidate a graph another thread is capturing. Throws RuntimeFailure
// on a CUDA error and in builds without CUDA.
uint64_t free_device_memory(int device);

}  // namespace freeride
