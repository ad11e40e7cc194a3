// Check macros: every failure becomes a C++ exception carrying file and line,
// which the bindings turn into a Python exception instead of a crash.
//
// Messages are built by Msg, not by iostreams: formatting a number through std::ostream
// goes through the locale's facets, which is where a process holding two copies of
// libstdc++ (torch's and a statically linked one) crashed. Msg only appends characters.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

// A launch given up on at close (PhaseRunner::abandon): it may still run on the device.
class Abandoned : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

// The driver cannot run the build's code on a device (cuda/kernel_image.hpp says why):
// the CUDA backend cannot be made there. Mapped to freeride.errors.CudaUnavailableError,
// which device="auto" answers with the host backend.
class KernelImageError : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

namespace detail {

// An error message: Msg() << "items must be positive, got " << n << " (max " << m << ")".
class Msg {
 public:
  Msg& operator<<(std::string_view s) {
    text_.append(s.data(), s.size());
    return *this;
  }
  Msg& operator<<(const char* s) { return *this << std::string_view(s ? s : "(null)"); }
  Msg& operator<<(const std::string& s) { return *this << std::string_view(s); }
  Msg& operator<<(char c) {
    text_.push_back(c);
    return *this;
  }
  Msg& operator<<(bool b) { return *this << (b ? "true" : "false"); }
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                              !std::is_same_v<T, char>,
                                          int> = 0>
  Msg& operator<<(T v) {
    if constexpr (std::is_signed_v<T>) {
      return append_format("%lld", static_cast<long long>(v));
    } else {
      return append_format("%llu", static_cast<unsigned long long>(v));
    }
  }
  template <typename T, std::enable_if_t<std::is_enum_v<T>, int> = 0>
  Msg& operator<<(T v) {
    return *this << static_cast<std::underlying_type_t<T>>(v);
  }
  Msg& operator<<(double v) { return append_format("%g", v); }
  Msg& operator<<(float v) { return *this << static_cast<double>(v); }
  Msg& operator<<(const void* p) { return append_format("%p", p); }

  const std::string& str() const { return text_; }

 private:
  template <typename T>
  Msg& append_format(const char* format, T v) {
    char buf[48];
    const int n = std::snprintf(buf, sizeof(buf), format, v);
    if (n > 0) text_.append(buf, static_cast<size_t>(n) < sizeof(buf) ? n : sizeof(buf) - 1);
    return *this;
  }

  std::string text_;
};

inline std::string where(const char* file, int line) {
  return (Msg() << " (" << file << ":" << line << ")").str();
}

}  // namespace detail

}  // namespace freeride

#define FR_THROW(kind, msg)                                                          \
  do {                                                                               \
    ::freeride::detail::Msg fr_msg_;                                                 \
    fr_msg_ << msg << ::freeride::detail::where(__FILE__, __LINE__);                 \
    throw kind(fr_msg_.str());                                                       \
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
