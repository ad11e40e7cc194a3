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

namespace {

// Environment variable `name`: unset or `on` (true), `off` (false); anything else is
// refused, naming the variable and both values.
bool env_switch(const char* name, const char* on, const char* off) {
  const char* value = std::getenv(name);
  const std::string wanted = value == nullptr ? "" : value;
  FR_ARG(wanted.empty() || wanted == on || wanted == off,
         name << " must be '" << on << "' or '" << off << "', got '" << wanted << "'");
  return wanted != off;
}

}  // namespace

bool launch_at_opens_enabled() { return env_switch("FREERIDE_LAUNCH_AT_OPEN", "1", "0"); }

bool successors_enabled() { return !env_switch("FREERIDE_SUCCESSORS", "0", "1"); }

bool followers_enabled() { return !env_switch("FREERIDE_FOLLOW", "0", "1"); }

bool phases_ahead_enabled() { return !env_switch("FREERIDE_PHASES_AHEAD", "0", "1"); }

bool device_phases_enabled() { return env_switch("FREERIDE_DEVICE_PHASES", "1", "0"); }

bool watcher_launch_enabled() { return !env_switch("FREERIDE_WATCHER_LAUNCH", "0", "1"); }

bool withhold_enabled() { return !env_switch("FREERIDE_WITHHOLD", "0", "1"); }

uint64_t lookahead_bound() {
  const char* value = std::getenv("FREERIDE_MAX_LOOKAHEAD");
  const std::string text = value == nullptr ? "" : value;
  if (text.empty()) return 0;
  const bool digits = text.size() <= 6 && text.find_first_not_of("0123456789") == std::string::npos;
  FR_ARG(digits, "FREERIDE_MAX_LOOKAHEAD must be a whole number of opens (0: no bound), got '"
                     << text << "'");
  return std::stoull(text);
}

bool balanced_workqueues_wanted() {
  return !env_switch("FREERIDE_GREEN_WORKQUEUE", "shared", "balanced");
}

AdmissionMode admission_mode() {
  const char* value = std::getenv("FREERIDE_ADMISSION");
  const std::string wanted = value == nullptr ? "" : value;
  if (wanted.empty() || wanted == "ring") return AdmissionMode::kRing;
  if (wanted == "poll") return AdmissionMode::kPoll;
  FR_ARG(wanted == "spin",
         "FREERIDE_ADMISSION must be 'ring', 'poll' or 'spin', got '" << wanted << "'");
  return AdmissionMode::kSpin;
}

}  // namespace freeride::cuda
