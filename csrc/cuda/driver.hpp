// CUDA driver API access without linking libcuda. The few driver functions the CUDA
// backend needs come through cudaGetDriverEntryPointByVersion of the statically linked
// runtime, so the extension still imports (and reports "no CUDA") on a machine without
// a driver. <cuda.h> is included for types and constants only: nothing here may call a
// cu* symbol directly, or the link would need libcuda.
//
// Toolkits: CUDA 12.5 or later (cmake/FreerideCudaFloor.cmake says why). Entry points are
// asked for by the CUDA version that introduced the ABI each PFN_*_vNNNNN type names, so
// what a pointer means does not depend on the toolkit, and a driver older than that
// version answers "not sufficient": each Api member below is then null. The minimum
// driver is the runtime's (CUDA minor version compatibility: r525 for a 12.x build, r580
// for 13.x); newer entry points (green contexts, kernel parameter sizes) are optional.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include <cudaTypedefs.h>

#if CUDA_VERSION < 12050
#error "freeride needs CUDA 12.5 or later: see cmake/FreerideCudaFloor.cmake"
#endif

namespace freeride::cuda_driver {

// Entry points, resolved once per process. A null pointer: the driver lacks the function
// (or there is no driver); `error` says why.
struct Api {
  PFN_cuStreamWriteValue32_v11070 stream_write_value32 = nullptr;
  PFN_cuStreamWaitValue32_v11070 stream_wait_value32 = nullptr;
  PFN_cuStreamBatchMemOp_v11070 stream_batch_mem_op = nullptr;  // gate writes, one per transition
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_ctx_get_state = nullptr;
  // User kernels (RawKernel): functions that CuPy loaded into the primary context.
  PFN_cuLaunchKernel_v4000 launch_kernel = nullptr;
  PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050 occupancy = nullptr;
  PFN_cuFuncGetAttribute_v2020 func_get_attribute = nullptr;
  PFN_cuFuncSetAttribute_v9000 func_set_attribute = nullptr;
  PFN_cuFuncGetParamInfo_v12040 func_get_param_info = nullptr;  // null before CUDA 12.4
  // The open watcher's wait (cuda/open_watcher.cpp): in the driver, not the runtime.
  PFN_cuEventSynchronize_v2000 event_synchronize = nullptr;
  // Green contexts (Reserve(mechanism="green-context")): 12.4 drivers have the context
  // calls, the stream inside one needs 12.5, so a driver before 12.5 has none of it.
  PFN_cuDeviceGetDevResource_v12040 device_get_dev_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 sm_resource_split_by_count = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 resource_generate_desc = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_ctx_create = nullptr;
  PFN_cuGreenCtxDestroy_v12040 green_ctx_destroy = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 green_ctx_stream_create = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
  // A green context with workqueues of its own (FREERIDE_GREEN_WORKQUEUE=balanced): the
  // same calls as of CUDA 13.1, whose drivers know the workqueue configuration resource
  // (an older one answers cudaErrorInvalidValue: the caller looks at the driver's version
  // first). The query's type is an int: the toolkit's CUdevResourceType may lack the
  // workqueue's value.
  CUresult(CUDAAPI* device_get_dev_resource_13010)(CUdevice, CUdevResource*, int) = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 resource_generate_desc_13010 = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_ctx_create_13010 = nullptr;
  std::string workqueue_error;  // why one of those is missing
  // Loading the built-in kernels into a green context when the harvester is made.
  PFN_cuCtxFromGreenCtx_v12040 ctx_from_green_ctx = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  // For backend_info only: whether modules load lazily (module_loading_mode()).
  PFN_cuModuleGetLoadingMode_v11070 module_get_loading_mode = nullptr;
  std::string error;         // why a gate or context entry point is missing
  std::string kernel_error;  // why a user-kernel entry point is missing
  std::string batch_error;   // why cuStreamBatchMemOp is missing
  std::string green_error;   // why a green-context entry point is missing
  std::string info_error;    // why cuModuleGetLoadingMode is missing

  bool has_memops() const {
    return stream_write_value32 != nullptr && stream_wait_value32 != nullptr;
  }
  bool has_green_contexts() const {
    return device_get != nullptr && device_get_dev_resource != nullptr &&
           sm_resource_split_by_count != nullptr && resource_generate_desc != nullptr &&
           green_ctx_create != nullptr && green_ctx_destroy != nullptr &&
           green_ctx_stream_create != nullptr && stream_destroy != nullptr &&
           ctx_from_green_ctx != nullptr && ctx_get_current != nullptr &&
           ctx_set_current != nullptr;
  }
};

// Thread-safe, resolves on first use; never throws. FREERIDE_DRIVER_API_MAX (read then,
// once per process) makes every entry point newer than that CUDA version count as missing,
// as on an older driver: the fallbacks of older drivers are then reachable on a new one
// (tests force them so). A value that is not a CUDA version number is ignored here; the
// Python API refuses it before a harvester is made. FREERIDE_DRIVER_HIDE (comma-separated
// names, e.g. cuStreamBatchMemOp) does the same for the entry points it names: for the
// fallbacks no driver freeride runs on selects by its version (every r525+ driver has the
// stream memory operations and their batch).
const Api& api();

// FREERIDE_DRIVER_API_MAX as the number CUDA_VERSION writes (12040 for CUDA 12.4), 0 where
// unset or not such a number. Read from the environment at each call.
int driver_api_max_from_env();

// FREERIDE_NO_STREAM_MEMOPS set to anything but "" or "0": use the fallback kernels.
// Read on every call, so a test can flip it between backends.
bool memops_disabled_by_env();

// "CUDA_ERROR_NOT_SUPPORTED" for 801; "CUresult N" where the driver cannot name it.
std::string error_name(int result);

// How this process loads kernels: "lazy" (each at its first launch, CUDA's default since
// 12.2) or "eager" (CUDA_MODULE_LOADING=EAGER, read once when CUDA initialised); "" where
// unknown (no driver, a driver before 11.7, or CUDA not initialised yet). A lazy load may
// synchronise the context, so a first launch beside a side launch that waits for a close
// can deadlock (Harvester(time_slice=None) warns). Never throws.
std::string module_loading_mode();

// Whether the primary context of a device already exists. False where unknown: callers
// use it to avoid creating a context (hundreds of MiB of device memory) as a side effect.
bool primary_context_active(int device);

// Enqueues a trial cuStreamWriteValue32(word := value) and a cuStreamWaitValue32 on it
// (already satisfied), then synchronises `stream`. Returns false, with the reason in
// *why, where the driver refuses either operation (CUDA_ERROR_NOT_SUPPORTED on platforms
// without stream memory operations). The calling thread's current device must be
// `device`. Throws only if the stream synchronisation itself fails. Records the outcome
// for stream_mem_ops_usable() unless `record` is false (a measurement's own look, which
// must not change what backend_info and the backends read).
bool probe_stream_mem_ops(int device, CUstream stream, uint32_t* device_word, uint32_t value,
                          std::string* why, bool record = true);

// What a backend on `device` would use, for backend_info: false when disabled by the
// environment or the entry points are missing; otherwise the trial's outcome where a
// backend has run one, else true (the V2 memory operations need no opt-in since CUDA
// 11.7, and CUDA 12 removed the device attribute that used to tell). Never creates a
// context; never throws.
bool stream_mem_ops_usable(int device);

// How a CUDA backend writes the gate on a stream (the training stream's close and open):
// one cuStreamBatchMemOp carrying every word of the transition, three
// cuStreamWriteValue32, copies from pinned constants, or one-thread write kernels. Each
// falls back to the next where unusable: batch -> memop -> copy; kernel is only ever
// chosen by name.
enum class GateWrite { kBatch, kMemop, kCopy, kKernel };

const char* gate_write_name(GateWrite how);

// The mechanism asked for: `option` if not empty, else FREERIDE_GATE_WRITE (read at each
// call, so once per backend), else batch. Throws InvalidArgument for an unknown name.
GateWrite requested_gate_write(const std::string& option);

// What a backend on `device` asking for `wanted` would use, after the fallbacks above:
// batch needs the entry point and, where a backend has tried one, a batch that the
// driver accepted (record_batch_probe); memop needs stream_mem_ops_usable(device).
// Never creates a context; never throws.
GateWrite usable_gate_write(int device, GateWrite wanted);

// A backend's trial of a batched gate write on `device`, for usable_gate_write.
void record_batch_probe(int device, bool ok);

// How the most recent CUDA backend on a device keeps room for training's kernels
// ("occupancy-cap" or "green-context (120 of 132 SMs)"), why green-context was not used
// where it was asked for ("" otherwise), and on how many SMs its green context's
// partition check saw blocks run (0: no check counted). For backend_info: what a
// harvester made on the device used; nothing recorded means none was made
// ("occupancy-cap", the default).
struct ReserveRecord {
  std::string mechanism = "occupancy-cap";
  std::string fallback;
  int green_sms_seen = 0;
};
void record_reserve_mechanism(int device, const ReserveRecord& record);
ReserveRecord reserve_mechanism(int device);

[[noreturn]] void throw_driver_error(int result, const char* expr, const char* file, int line);

inline CUdeviceptr device_ptr(const volatile void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
}

// One entry of a cuStreamBatchMemOp: `value` written to the 32-bit `word`.
inline CUstreamBatchMemOpParams write_value_op(const volatile void* word, uint32_t value) {
  CUstreamBatchMemOpParams op;
  std::memset(&op, 0, sizeof(op));
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = device_ptr(word);
  op.writeValue.value = value;
  op.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return op;
}

}  // namespace freeride::cuda_driver

// Like FR_CU_CHECK, with the driver's name for the error.
#define FR_DRV_CHECK(expr)                                                           \
  do {                                                                               \
    const int fr_drv_res_ = static_cast<int>(expr);                                  \
    if (fr_drv_res_ != 0) {                                                          \
      ::freeride::cuda_driver::throw_driver_error(fr_drv_res_, #expr, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)
