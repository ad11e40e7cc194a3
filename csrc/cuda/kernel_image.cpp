#include "cuda/kernel_image.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>
#include <vector>

#include "check.hpp"

namespace freeride {
namespace {

constexpr std::string_view kUnsupportedPtx = "cudaErrorUnsupportedPtxVersion";
constexpr std::string_view kInvalidPtx = "cudaErrorInvalidPtx";
constexpr std::string_view kJitNotFound = "cudaErrorJitCompilerNotFound";
constexpr std::string_view kJitDisabled = "cudaErrorJitCompilationDisabled";
// No image for the device at all (the last is what older runtimes said for it).
constexpr std::array<std::string_view, 3> kNoImage = {
    "cudaErrorNoKernelImageForDevice", "cudaErrorInvalidKernelImage",
    "cudaErrorInvalidDeviceFunction"};

std::string cuda_version(int v) {
  return (detail::Msg() << v / 1000 << "." << v % 1000 / 10).str();
}

std::string capability(int cc) { return (detail::Msg() << cc / 10 << "." << cc % 10).str(); }

// The oldest driver branch whose CUDA version is at least `toolkit`'s, among releases
// since the 12.5 floor; "" past the newest known.
std::string driver_branch(int toolkit) {
  constexpr std::array<std::pair<int, const char*>, 5> kBranches = {
      {{12050, "r555"}, {12060, "r560"}, {12080, "r570"}, {12090, "r575"}, {13000, "r580"}}};
  for (const auto& [version, branch] : kBranches) {
    if (toolkit <= version) return branch;
  }
  return "";
}

// CMAKE_CUDA_ARCHITECTURES entries: "90" is machine code and PTX, "90-real" machine code,
// "90-virtual" PTX. Arch-specific ones ("90a", "100f") run on their own family only and
// count as machine code. `known` is false for anything else ("all", "native").
struct Architectures {
  bool known = true;
  std::vector<int> machine;
  std::vector<int> ptx;
  std::string text;  // as FREERIDE_CUDA_ARCHS writes them
};

Architectures parse(std::string_view list) {
  Architectures out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t end = list.find_first_of(",;", at);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view entry = list.substr(at, end - at);
    at = end + 1;
    if (entry.empty()) continue;
    if (!out.text.empty()) out.text += ";";
    out.text += entry;
    size_t digits = 0;
    while (digits < entry.size() && std::isdigit(static_cast<unsigned char>(entry[digits]))) {
      ++digits;
    }
    if (digits == 0 || digits > 4) {
      out.known = false;
      continue;
    }
    const int arch = std::stoi(std::string(entry.substr(0, digits)));
    std::string_view rest = entry.substr(digits);
    const bool specific = !rest.empty() && (rest[0] == 'a' || rest[0] == 'f');
    if (specific) rest.remove_prefix(1);
    if (rest == "-real" || (specific && rest.empty())) {
      out.machine.push_back(arch);
    } else if (rest == "-virtual") {
      if (!specific) out.ptx.push_back(arch);
    } else if (rest.empty()) {
      out.machine.push_back(arch);
      out.ptx.push_back(arch);
    } else {
      out.known = false;
    }
  }
  return out;
}

bool fits_any(const std::vector<int>& archs, bool (*fits)(int, int), int cc) {
  return std::any_of(archs.begin(), archs.end(), [&](int a) { return fits(a, cc); });
}

}  // namespace

bool is_kernel_image_error(std::string_view error) {
  return error == kUnsupportedPtx || error == kInvalidPtx || error == kJitNotFound ||
         error == kJitDisabled ||
         std::find(kNoImage.begin(), kNoImage.end(), error) != kNoImage.end();
}

std::string kernel_image_message(const KernelImageFacts& f) {
  const Architectures archs = parse(f.architectures);
  const int cc = f.compute_capability;
  // Machine code runs on its major version at the same or a later minor; PTX is compiled
  // for its own architecture and every later one.
  const bool runs_machine_code =
      archs.known && cc > 0 &&
      fits_any(archs.machine, [](int a, int c) { return a / 10 == c / 10 && a <= c; }, cc);
  const bool ptx_fits =
      !archs.known || cc <= 0 || fits_any(archs.ptx, [](int a, int c) { return a <= c; }, cc);
  const bool jit = !runs_machine_code && ptx_fits;

  detail::Msg m;
  m << "freeride's built-in kernels cannot be loaded on CUDA device " << f.device;
  if (cc > 0) m << " (compute capability " << capability(cc) << ")";
  m << ": " << f.error << ". This freeride was built by the CUDA " << cuda_version(f.toolkit)
    << " toolkit";
  if (!f.ptx_isa.empty()) m << " (PTX ISA " << f.ptx_isa << ")";
  m << " for the CUDA architectures " << (archs.text.empty() ? "(unknown)" : archs.text)
    << "; the NVIDIA driver supports CUDA "
    << (f.driver > 0 ? cuda_version(f.driver) : std::string("(unknown)"));
  if (f.runtime > 0) m << " (the runtime linked in is CUDA " << cuda_version(f.runtime) << ")";
  m << ". ";

  const bool driver_too_old = f.driver > 0 && f.driver < f.toolkit;
  const bool no_machine_code = archs.known && cc > 0 && !runs_machine_code;
  const std::string_view e = f.error;
  const bool ptx_error = e == kUnsupportedPtx || e == kInvalidPtx;
  const bool jit_error = e == kJitNotFound || e == kJitDisabled;
  if (ptx_error || jit_error) {
    m << (no_machine_code ? "The build has no machine code for this device, so the driver "
                            "must JIT-compile its PTX, and "
                          : "The driver must JIT-compile the build's PTX for this device, and ");
    if (e == kInvalidPtx) {
      m << "its JIT compiler failed on it";
    } else if (e == kUnsupportedPtx) {
      m << (driver_too_old ? "a driver compiles PTX only from toolkits no newer than the "
                             "CUDA version it supports"
                           : "it does not accept the PTX's version");
    } else if (e == kJitNotFound) {
      m << "the driver's JIT compiler (libnvidia-ptxjitcompiler) was not found";
    } else {
      m << "PTX JIT compilation is disabled (CUDA_DISABLE_PTX_JIT)";
    }
  } else if (!ptx_fits) {
    m << "The build holds no code this device can run: its PTX is for newer architectures "
         "only";
  } else if (runs_machine_code) {
    m << "The build has machine code for this device's architecture, and the driver "
         "refused it";
  } else {
    m << "The build holds no code the driver can run on this device";
    if (jit) m << " (its PTX needs the driver's JIT compiler)";
  }
  // A newer driver helps where it is the driver that refuses code this device could run.
  const bool newer_driver = ptx_error || runs_machine_code || (!jit_error && jit);
  m << ". To use this GPU, ";
  if (e == kJitNotFound) m << "install the NVIDIA driver's PTX JIT compiler, or ";
  if (e == kJitDisabled) m << "unset CUDA_DISABLE_PTX_JIT, or ";
  if (newer_driver) {
    m << "install an NVIDIA driver that supports CUDA " << cuda_version(f.toolkit)
      << " or later";
    const std::string branch = driver_branch(f.toolkit);
    if (!branch.empty()) m << " (" << branch << " or newer)";
    if (!runs_machine_code) m << ", or ";
  }
  if (!runs_machine_code) {
    m << "rebuild freeride with FREERIDE_CUDA_ARCHS naming this device's architecture";
    if (cc > 0) {
      // Added to the build's own list where it is one; the device's alone otherwise.
      m << " (FREERIDE_CUDA_ARCHS=\"";
      if (archs.known && !archs.text.empty()) m << archs.text << ";" << cc << "-real";
      if (!archs.known || archs.text.empty()) m << cc;
      m << "\" pip install ., with an nvcc that supports compute capability " << capability(cc)
        << ")";
    }
  }
  m << ".";
  return m.str();
}

}  // namespace freeride
