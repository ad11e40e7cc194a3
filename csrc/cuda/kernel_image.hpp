// Why the driver cannot load the built-in kernels on a device, in the user's terms: which
// load errors mean that the build carries no code this driver can run there, and the
// message that names the versions involved and what to do. Host strings only, compiled
// into every build (the host build too), so it is tested without a GPU; the facts are
// gathered where a load fails (kernels/load_error.cu).
//
// The build holds machine code for some architectures and PTX for the newest of them
// (CMakeLists.txt). On any other device the driver JIT-compiles that PTX, and a driver
// compiles only PTX of a version it knows: PTX from a toolkit newer than the driver's
// CUDA version is refused (CUDA's minor version compatibility does not extend to PTX),
// and PTX for a newer architecture than the device's cannot run there at all.
#pragma once

#include <string>
#include <string_view>

namespace freeride {

struct KernelImageFacts {
  std::string error;          // the CUDA runtime's name for the load failure
  int device = 0;
  int compute_capability = 0;  // major * 10 + minor; 0: unknown
  int toolkit = 0;            // the nvcc that wrote the code, as CUDA_VERSION writes it
  std::string ptx_isa;        // the PTX ISA version it wrote ("9.0"); "": unknown
  std::string architectures;  // the build's CMAKE_CUDA_ARCHITECTURES ("80-real;90")
  int runtime = 0;            // cudaRuntimeGetVersion
  int driver = 0;             // cudaDriverGetVersion: the CUDA version the driver supports
};

// What the build's CUDA code was made with (KernelImageFacts' toolkit, ptx_isa and
// architectures): `freeride info` reports it. Defined in kernels/load_error.cu, whose
// compile definitions carry them.
KernelImageFacts cuda_build_facts();

// Whether a failed load with this error (cudaGetErrorName) means the build has no code
// the driver can run on the device: no image for it, PTX it cannot or may not JIT.
bool is_kernel_image_error(std::string_view error);

// The error's message: the device and its compute capability, the toolkit and PTX ISA
// the build was made with and its architectures, the driver's and runtime's CUDA
// versions, why that fails, and what to do (a newer driver where one would help, a
// build whose FREERIDE_CUDA_ARCHS names the device's architecture).
std::string kernel_image_message(const KernelImageFacts& facts);

}  // namespace freeride
