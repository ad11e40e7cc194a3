// The error of a failed load of a built-in kernel: where the driver has no code it can run
// on the device, the facts cuda/kernel_image.hpp words it from. In a .cu file so that the
// toolkit named is nvcc's own, the one that wrote the build's PTX.
#include <cuda_runtime.h>

#include <string>

#include "check.hpp"
#include "common.cuh"
#include "cuda/kernel_image.hpp"
#include "launchers.hpp"

// Set by CMakeLists.txt for this file: the build's CMAKE_CUDA_ARCHITECTURES (its ';' as
// ',') and the PTX ISA version nvcc writes.
#ifndef FREERIDE_CUDA_ARCHITECTURES
#define FREERIDE_CUDA_ARCHITECTURES ""
#endif
#ifndef FREERIDE_PTX_ISA
#define FREERIDE_PTX_ISA ""
#endif

namespace freeride {

KernelImageFacts cuda_build_facts() {
  KernelImageFacts facts;
  facts.toolkit = __CUDACC_VER_MAJOR__ * 1000 + __CUDACC_VER_MINOR__ * 10;
  facts.ptx_isa = FREERIDE_PTX_ISA;
  facts.architectures = FREERIDE_CUDA_ARCHITECTURES;
  return facts;
}

}  // namespace freeride

namespace freeride::kernels {

void load_failed(int error, const char* call) {
  const auto err = static_cast<cudaError_t>(error);
  (void)cudaGetLastError();  // not sticky: the thread's next call must not see it
  const char* name = cudaGetErrorName(err);
  if (!is_kernel_image_error(name)) {
    throw RuntimeFailure((detail::Msg() << "CUDA error " << name << " in " << call << ": "
                                        << cudaGetErrorString(err))
                             .str());
  }
  KernelImageFacts facts = cuda_build_facts();
  facts.error = name;
  // Best effort: each stays 0 where the runtime cannot say.
  (void)cudaRuntimeGetVersion(&facts.runtime);
  (void)cudaDriverGetVersion(&facts.driver);
  if (cudaGetDevice(&facts.device) == cudaSuccess) {
    int major = 0;
    int minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, facts.device) ==
            cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, facts.device) ==
            cudaSuccess) {
      facts.compute_capability = major * 10 + minor;
    }
  }
  (void)cudaGetLastError();
  throw KernelImageError(kernel_image_message(facts));
}

}  // namespace freeride::kernels
