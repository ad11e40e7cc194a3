#include "test_switches.hpp"

#include <atomic>

namespace freeride::test_switches {
namespace {

std::atomic<bool> g_fail_green_preload{false};

}  // namespace

void set_fail_green_preload(bool on) noexcept { g_fail_green_preload.store(on); }

bool fail_green_preload() noexcept { return g_fail_green_preload.load(); }

}  // namespace freeride::test_switches
