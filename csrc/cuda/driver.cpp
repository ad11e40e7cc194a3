#include "cuda/driver.hpp"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "check.hpp"

namespace freeride::cuda_driver {
namespace {

// Entry points newer than this count as missing (FREERIDE_DRIVER_API_MAX); 0: none hidden.
int g_api_max = 0;
// Entry points named here count as missing (FREERIDE_DRIVER_HIDE): ",name,name,".
std::string g_hide;

// cudaEnableLegacyStream: a stream handle of 0 must mean the legacy default stream, as it
// does for PyTorch and CuPy, not the per-thread default stream.
template <typename Fn>
void resolve(const char* symbol, unsigned int version, Fn* out, std::string* error) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaSuccess;
  const bool hidden = g_api_max > 0 && version > static_cast<unsigned int>(g_api_max);
  const bool named = g_hide.find("," + std::string(symbol) + ",") != std::string::npos;
  if (hidden) {
    status = cudaDriverEntryPointVersionNotSufficent;  // what an older driver answers
  } else if (named) {
    status = cudaDriverEntryPointSymbolNotFound;
  } else {
    err = cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableLegacyStream,
                                           &status);
  }
  if (err == cudaSuccess && status == cudaDriverEntryPointSuccess && fn != nullptr) {
    *out = reinterpret_cast<Fn>(fn);
    return;
  }
  // The failure would otherwise linger as this thread's last error and be reported by the
  // next unrelated cudaGetLastError check (after a kernel launch) as that launch's failure.
  (void)cudaGetLastError();
  *out = nullptr;
  detail::Msg os;
  os << symbol << ": ";
  if (err != cudaSuccess) {
    os << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ")";
  } else if (status == cudaDriverEntryPointVersionNotSufficent) {
    os << "the driver is older than CUDA " << version / 1000 << "." << (version % 1000) / 10;
    if (hidden) os << " (FREERIDE_DRIVER_API_MAX=" << g_api_max << ")";
  } else {
    os << "not found in the driver";
    if (named) os << " (FREERIDE_DRIVER_HIDE)";
  }
  if (!error->empty()) *error += "; ";
  *error += os.str();
}

std::once_flag g_api_once;
Api g_api;

std::mutex g_probe_mu;
std::map<int, bool> g_probe;  // device -> outcome of the last trial on it
std::map<int, bool> g_batch_probe;  // device -> outcome of the last batched gate write
std::map<int, ReserveRecord> g_reserve;  // device -> the last backend's reserve mechanism

}  // namespace

const Api& api() {
  std::call_once(g_api_once, [] {
    Api a;
    g_api_max = driver_api_max_from_env();
    if (const char* hide = std::getenv("FREERIDE_DRIVER_HIDE")) {
      g_hide = "," + std::string(hide) + ",";
    }
    try {
      resolve("cuStreamWriteValue32", 11070, &a.stream_write_value32, &a.error);
      resolve("cuStreamWaitValue32", 11070, &a.stream_wait_value32, &a.error);
      resolve("cuStreamBatchMemOp", 11070, &a.stream_batch_mem_op, &a.batch_error);
      resolve("cuGetErrorName", 6000, &a.get_error_name, &a.error);
      resolve("cuDeviceGet", 2000, &a.device_get, &a.error);
      resolve("cuDevicePrimaryCtxGetState", 7000, &a.primary_ctx_get_state, &a.error);
      resolve("cuLaunchKernel", 4000, &a.launch_kernel, &a.kernel_error);
      resolve("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, &a.occupancy, &a.kernel_error);
      resolve("cuFuncGetAttribute", 2020, &a.func_get_attribute, &a.kernel_error);
      resolve("cuFuncSetAttribute", 9000, &a.func_set_attribute, &a.kernel_error);
      resolve("cuFuncGetParamInfo", 12040, &a.func_get_param_info, &a.kernel_error);
      resolve("cuEventSynchronize", 2000, &a.event_synchronize, &a.error);
      resolve("cuDeviceGetDevResource", 12040, &a.device_get_dev_resource, &a.green_error);
      resolve("cuDevSmResourceSplitByCount", 12040, &a.sm_resource_split_by_count,
              &a.green_error);
      resolve("cuDevResourceGenerateDesc", 12040, &a.resource_generate_desc, &a.green_error);
      resolve("cuGreenCtxCreate", 12040, &a.green_ctx_create, &a.green_error);
      resolve("cuGreenCtxDestroy", 12040, &a.green_ctx_destroy, &a.green_error);
      resolve("cuGreenCtxStreamCreate", 12050, &a.green_ctx_stream_create, &a.green_error);
      resolve("cuDeviceGetDevResource", 13010, &a.device_get_dev_resource_13010,
              &a.workqueue_error);
      resolve("cuDevResourceGenerateDesc", 13010, &a.resource_generate_desc_13010,
              &a.workqueue_error);
      resolve("cuGreenCtxCreate", 13010, &a.green_ctx_create_13010, &a.workqueue_error);
      resolve("cuStreamDestroy", 4000, &a.stream_destroy, &a.green_error);
      resolve("cuCtxFromGreenCtx", 12040, &a.ctx_from_green_ctx, &a.green_error);
      resolve("cuCtxGetCurrent", 4000, &a.ctx_get_current, &a.green_error);
      resolve("cuCtxSetCurrent", 4000, &a.ctx_set_current, &a.green_error);
      resolve("cuModuleGetLoadingMode", 11070, &a.module_get_loading_mode, &a.info_error);
    } catch (...) {
      // Only std::string growth can throw here; keep whatever resolved.
    }
    g_api = std::move(a);
  });
  return g_api;
}

int driver_api_max_from_env() {
  const char* v = std::getenv("FREERIDE_DRIVER_API_MAX");
  if (v == nullptr || v[0] == '\0') return 0;
  long value = 0;
  for (const char* c = v; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || value > 1000000) return 0;
    value = value * 10 + (*c - '0');
  }
  return static_cast<int>(value);
}

bool memops_disabled_by_env() {
  const char* v = std::getenv("FREERIDE_NO_STREAM_MEMOPS");
  return v != nullptr && v[0] != '\0' && !(v[0] == '0' && v[1] == '\0');
}

std::string error_name(int result) {
  const Api& a = api();
  if (a.get_error_name != nullptr) {
    const char* name = nullptr;
    if (a.get_error_name(static_cast<CUresult>(result), &name) == CUDA_SUCCESS &&
        name != nullptr) {
      return name;
    }
  }
  return "CUresult " + std::to_string(result);
}

std::string module_loading_mode() {
  const Api& a = api();
  if (a.module_get_loading_mode == nullptr) return "";
  CUmoduleLoadingMode mode{};
  if (a.module_get_loading_mode(&mode) != CUDA_SUCCESS) return "";
  switch (mode) {
    case CU_MODULE_LAZY_LOADING:
      return "lazy";
    case CU_MODULE_EAGER_LOADING:
      return "eager";
  }
  return "";
}

bool primary_context_active(int device) {
  const Api& a = api();
  if (a.device_get == nullptr || a.primary_ctx_get_state == nullptr) return false;
  CUdevice dev = 0;
  if (a.device_get(&dev, device) != CUDA_SUCCESS) return false;
  unsigned int flags = 0;
  int active = 0;
  if (a.primary_ctx_get_state(dev, &flags, &active) != CUDA_SUCCESS) return false;
  return active != 0;
}

bool probe_stream_mem_ops(int device, CUstream stream, uint32_t* device_word, uint32_t value,
                          std::string* why, bool record) {
  const Api& a = api();
  if (!a.has_memops()) {
    if (why != nullptr) *why = "stream memory operations unavailable: " + a.error;
    return false;
  }
  int res = a.stream_write_value32(stream, device_ptr(device_word), value,
                                   CU_STREAM_WRITE_VALUE_DEFAULT);
  const char* op = "cuStreamWriteValue32";
  if (res == CUDA_SUCCESS) {
    res = a.stream_wait_value32(stream, device_ptr(device_word), value, CU_STREAM_WAIT_VALUE_EQ);
    op = "cuStreamWaitValue32";
  }
  // Whatever part of the trial was enqueued must finish before the caller relies on the
  // word; an asynchronous failure here means the context itself is broken.
  FR_CUDA_CHECK(cudaStreamSynchronize(stream));
  const bool ok = res == CUDA_SUCCESS;
  if (!ok && why != nullptr) *why = std::string(op) + " failed: " + error_name(res);
  if (record) {
    std::lock_guard<std::mutex> lk(g_probe_mu);
    g_probe[device] = ok;
  }
  return ok;
}

bool stream_mem_ops_usable(int device) {
  if (memops_disabled_by_env()) return false;
  if (!api().has_memops()) return false;
  std::lock_guard<std::mutex> lk(g_probe_mu);
  const auto it = g_probe.find(device);
  return it == g_probe.end() ? true : it->second;
}

const char* gate_write_name(GateWrite how) {
  switch (how) {
    case GateWrite::kBatch:
      return "batch";
    case GateWrite::kMemop:
      return "memop";
    case GateWrite::kCopy:
      return "copy";
    case GateWrite::kKernel:
      return "kernel";
  }
  return "unknown";
}

GateWrite requested_gate_write(const std::string& option) {
  std::string name = option;
  if (name.empty()) {
    const char* v = std::getenv("FREERIDE_GATE_WRITE");
    name = v == nullptr ? "" : v;
  }
  if (name.empty()) return GateWrite::kBatch;
  for (GateWrite how : {GateWrite::kBatch, GateWrite::kMemop, GateWrite::kCopy, GateWrite::kKernel}) {
    if (name == gate_write_name(how)) return how;
  }
  FR_THROW(InvalidArgument, "gate write mechanism must be batch, memop, copy or kernel "
                            "(FREERIDE_GATE_WRITE), got '" << name << "'");
}

GateWrite usable_gate_write(int device, GateWrite wanted) {
  if (wanted == GateWrite::kBatch) {
    bool ok = api().stream_batch_mem_op != nullptr && stream_mem_ops_usable(device);
    if (ok) {
      std::lock_guard<std::mutex> lk(g_probe_mu);
      const auto it = g_batch_probe.find(device);
      ok = it == g_batch_probe.end() || it->second;
    }
    wanted = ok ? GateWrite::kBatch : GateWrite::kMemop;
  }
  if (wanted == GateWrite::kMemop && !stream_mem_ops_usable(device)) wanted = GateWrite::kCopy;
  return wanted;
}

void record_batch_probe(int device, bool ok) {
  std::lock_guard<std::mutex> lk(g_probe_mu);
  g_batch_probe[device] = ok;
}

void record_reserve_mechanism(int device, const ReserveRecord& record) {
  std::lock_guard<std::mutex> lk(g_probe_mu);
  g_reserve[device] = record;
}

ReserveRecord reserve_mechanism(int device) {
  std::lock_guard<std::mutex> lk(g_probe_mu);
  const auto it = g_reserve.find(device);
  return it == g_reserve.end() ? ReserveRecord{} : it->second;
}

void throw_driver_error(int result, const char* expr, const char* file, int line) {
  throw RuntimeFailure((detail::Msg() << "CUDA driver error " << error_name(result) << " in "
                                      << expr << detail::where(file, line))
                           .str());
}

}  // namespace freeride::cuda_driver
