#include "cuda/gate_memory.hpp"

#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

namespace freeride::cuda {

void alloc_mapped(size_t bytes, char** host, char** dev) {
  void* h = nullptr;
  FR_CUDA_CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  void* d = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&d, h, 0);
  if (err != cudaSuccess) {
    (void)cudaFreeHost(h);
    throw_cuda(err, "cudaHostGetDevicePointer", __FILE__, __LINE__);
  }
  *host = static_cast<char*>(h);
  *dev = static_cast<char*>(d);
}

GateSlot acquire_gate(int device, bool host_memory) {
  struct Slab {
    char* dev = nullptr;
    char* host = nullptr;      // mapped pinned: the mirrors (or host-memory gates)
    char* host_dev = nullptr;  // device view of `host`
    size_t used = kGateSlabBytes;  // "full": the first acquire allocates
  };
  static std::mutex mu;
  static auto* slabs = new std::map<std::pair<int, bool>, Slab>();  // leaked on purpose
  std::lock_guard<std::mutex> lk(mu);
  Slab& slab = (*slabs)[{device, host_memory}];
  if (slab.used + kGateStride > kGateSlabBytes) {
    Slab fresh;
    fresh.used = 0;
    alloc_mapped(kGateSlabBytes, &fresh.host, &fresh.host_dev);
    if (host_memory) {
      fresh.dev = fresh.host_dev;
    } else {
      void* dev = nullptr;
      FR_CUDA_CHECK(cudaMalloc(&dev, kGateSlabBytes));
      fresh.dev = static_cast<char*>(dev);
    }
    slab = fresh;  // the previous slab is abandoned, not freed
  }
  GateSlot slot;
  slot.dev = reinterpret_cast<unsigned int*>(slab.dev + slab.used);
  slot.mirror = reinterpret_cast<unsigned int*>(slab.host + slab.used);
  slot.mirror_dev = reinterpret_cast<unsigned int*>(slab.host_dev + slab.used);
  slot.bell = new Doorbell();  // leaked on purpose, like the gate
  slab.used += kGateStride;
  return slot;
}

Slab CudaSlabAlloc::allocate(int, bool host_memory, size_t bytes) {
  Slab slab;
  if (host_memory) {
    alloc_mapped(bytes, &slab.host, &slab.dev);
  } else {
    void* dev = nullptr;
    FR_CUDA_CHECK(cudaMalloc(&dev, bytes));
    slab.dev = static_cast<char*>(dev);
  }
  return slab;
}

int CudaSlabAlloc::current_device() {
  int device = 0;
  FR_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

const unsigned int* gate_constants() {
  static std::mutex mu;
  static unsigned int* constants = nullptr;
  std::lock_guard<std::mutex> lk(mu);
  if (constants == nullptr) {
    void* p = nullptr;
    FR_CUDA_CHECK(cudaHostAlloc(&p, 2 * sizeof(unsigned int), cudaHostAllocPortable));
    constants = static_cast<unsigned int*>(p);
    constants[FREERIDE_GATE_CLOSED] = FREERIDE_GATE_CLOSED;
    constants[FREERIDE_GATE_OPEN] = FREERIDE_GATE_OPEN;
  }
  return constants;
}

}  // namespace freeride::cuda
