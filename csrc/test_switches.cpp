#include "test_switches.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace freeride::test_switches {
namespace {

std::atomic<bool> g_fail_green_preload{false};
std::atomic<bool> g_refuse_idle_cgroup{false};
std::atomic<bool> g_streams_never_idle{false};
std::atomic<bool> g_green_partition_overflow{false};
std::atomic<KernelLoadFailure> g_fail_kernel_load{KernelLoadFailure::kNone};
std::atomic<unsigned> g_fail_call_costs_block{0};
std::atomic<unsigned> g_delay_open_launch_us{0};

// delay_launch_end: the delay, and what a release wakes.
std::atomic<unsigned> g_delay_launch_end_ms{0};
std::mutex g_delay_mutex;
std::condition_variable g_delay_cv;

}  // namespace

void set_fail_green_preload(bool on) noexcept { g_fail_green_preload.store(on); }

bool fail_green_preload() noexcept { return g_fail_green_preload.load(); }

void set_streams_never_idle(bool on) noexcept { g_streams_never_idle.store(on); }

bool streams_never_idle() noexcept { return g_streams_never_idle.load(); }

void set_green_partition_overflow(bool on) noexcept { g_green_partition_overflow.store(on); }

bool green_partition_overflow() noexcept { return g_green_partition_overflow.load(); }

void set_fail_kernel_load(KernelLoadFailure where) noexcept { g_fail_kernel_load.store(where); }

KernelLoadFailure fail_kernel_load() noexcept { return g_fail_kernel_load.load(); }

void set_delay_launch_end_ms(unsigned ms) {
  {
    std::lock_guard<std::mutex> lock(g_delay_mutex);
    g_delay_launch_end_ms.store(ms);
  }
  g_delay_cv.notify_all();
}

void delay_launch_end() {
  const unsigned ms = g_delay_launch_end_ms.load();
  if (ms == 0) return;
  std::unique_lock<std::mutex> lock(g_delay_mutex);
  g_delay_cv.wait_for(lock, std::chrono::milliseconds(ms),
                      [] { return g_delay_launch_end_ms.load() == 0; });
}

void set_delay_open_launch_us(unsigned us) noexcept { g_delay_open_launch_us.store(us); }

void delay_open_launch() noexcept {
  const unsigned us = g_delay_open_launch_us.load();
  if (us != 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void set_refuse_idle_cgroup(bool on) noexcept { g_refuse_idle_cgroup.store(on); }

bool refuse_idle_cgroup() noexcept { return g_refuse_idle_cgroup.load(); }

void set_fail_call_costs_block(unsigned block) noexcept { g_fail_call_costs_block.store(block); }

unsigned fail_call_costs_block() noexcept { return g_fail_call_costs_block.load(); }

}  // namespace freeride::test_switches
