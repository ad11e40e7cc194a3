#include "test_switches.hpp"

#include <atomic>

namespace freeride::test_switches {
namespace {

std::atomic<bool> g_fail_green_preload{false};
std::atomic<bool> g_refuse_idle_cgroup{false};

}  // namespace

void set_fail_green_preload(bool on) noexcept { g_fail_green_preload.store(on); }

bool fail_green_preload() noexcept { return g_fail_green_preload.load(); }

void set_refuse_idle_cgroup(bool on) noexcept { g_refuse_idle_cgroup.store(on); }

bool refuse_idle_cgroup() noexcept { return g_refuse_idle_cgroup.load(); }

}  // namespace freeride::test_switches
