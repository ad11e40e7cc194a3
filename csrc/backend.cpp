#include "backend.hpp"

#include "check.hpp"

namespace freeride {

void Backend::test_items_see_gate_closed(bool) {
  FR_THROW(RuntimeFailure, "test_items_see_gate_closed is a host-backend test hook");
}

std::unique_ptr<Backend> make_backend(const std::string& kind, int device, int workers,
                                      const CudaOptions& options) {
  if (kind == "host") return make_host_backend(workers);
  if (kind == "cuda") return make_cuda_backend(device, options);
  FR_THROW(InvalidArgument, "backend kind must be 'host' or 'cuda', got '" << kind << "'");
}

#ifndef FREERIDE_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int, const CudaOptions&) {
  FR_THROW(RuntimeFailure, "this build of freeride has no CUDA backend (rebuild with nvcc on "
                           "PATH or FREERIDE_CUDA=1)");
}
#endif

}  // namespace freeride
