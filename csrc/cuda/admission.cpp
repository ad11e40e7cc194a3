#include "cuda/admission.hpp"

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cstdlib>
#include <string>

#include "check.hpp"

namespace freeride::cuda {

void tighten_timer_slack() {
#ifdef __linux__
  thread_local bool done = false;
  if (!done) {
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    done = true;
  }
#endif
}

bool single_connection() {
  const char* value = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return value != nullptr && std::strtol(value, nullptr, 10) == 1;
}

bool launch_at_opens_enabled() {
  const char* value = std::getenv("FREERIDE_LAUNCH_AT_OPEN");
  const std::string wanted = value == nullptr ? "" : value;
  FR_ARG(wanted.empty() || wanted == "1" || wanted == "0",
         "FREERIDE_LAUNCH_AT_OPEN must be '1' or '0', got '" << wanted << "'");
  return wanted != "0";
}

bool admission_rings() {
  const char* mode = std::getenv("FREERIDE_ADMISSION");
  const std::string wanted = mode == nullptr ? "" : mode;
  FR_ARG(wanted.empty() || wanted == "ring" || wanted == "poll",
         "FREERIDE_ADMISSION must be 'ring' or 'poll', got '" << wanted << "'");
  return wanted != "poll";
}

}  // namespace freeride::cuda
