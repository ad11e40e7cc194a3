// Check macros: every failure becomes a C++ exception carrying file and line,
// which the bindings turn into a Python exception instead of a crash.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace freeride {

// Bad arguments reaching the core (the Python layer validates first; this is the
// second line of defence). Mapped to ValueError.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Failures of the runtime itself (CUDA errors, misuse after close). Mapped to RuntimeError.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline std::string where(const char* file, int line) {
  std::ostringstream os;
  os << " (" << file << ":" << line << ")";
  return os.str();
}
}  // namespace detail

}  // namespace freeride

#define FR_THROW(kind, msg)                                               \
  do {                                                                    \
    std::ostringstream fr_os_;                                            \
    fr_os_ << msg << ::freeride::detail::where(__FILE__, __LINE__);       \
    throw kind(fr_os_.str());                                             \
  } while (0)

// Argument check: FR_ARG(n > 0, "items must be positive, got " << n).
#define FR_ARG(cond, msg)                                        \
  do {                                                           \
    if (!(cond)) FR_THROW(::freeride::InvalidArgument, msg);     \
  } while (0)

// Internal invariant or runtime state check.
#define FR_CHECK(cond, msg)                                      \
  do {                                                           \
    if (!(cond)) FR_THROW(::freeride::RuntimeFailure, msg);      \
  } while (0)

#ifdef FREERIDE_WITH_CUDA
#include <cuda_runtime_api.h>

#define FR_CUDA_CHECK(expr)                                                        \
  do {                                                                             \
    cudaError_t fr_err_ = (expr);                                                  \
    if (fr_err_ != cudaSuccess) {                                                  \
      FR_THROW(::freeride::RuntimeFailure,                                         \
               "CUDA error " << cudaGetErrorName(fr_err_) << " in " #expr ": "     \
                             << cudaGetErrorString(fr_err_));                      \
    }                                                                              \
  } while (0)

// Driver calls come through entry points, so their CUresult is an int here.
#define FR_CU_CHECK(expr)                                                          \
  do {                                                                             \
    int fr_res_ = static_cast<int>(expr);                                          \
    if (fr_res_ != 0) {                                                            \
      FR_THROW(::freeride::RuntimeFailure,                                         \
               "CUDA driver error " << fr_res_ << " in " #expr);                   \
    }                                                                              \
  } while (0)
#endif
