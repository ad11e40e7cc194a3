#include "sm_room.hpp"

#include <algorithm>

namespace freeride {
namespace {

constexpr int64_t kWarp = 32;
constexpr int64_t kRegisterUnit = 256;  // registers are allocated per warp in these units
constexpr int64_t kSharedUnit = 128;

int64_t round_up(int64_t value, int64_t unit) { return (value + unit - 1) / unit * unit; }

}  // namespace

int64_t block_registers(int threads, int registers_per_thread) {
  const int64_t warps = (std::max(threads, 0) + kWarp - 1) / kWarp;
  return warps * round_up(int64_t{std::max(registers_per_thread, 0)} * kWarp, kRegisterUnit);
}

int64_t block_shared_bytes(const SmLimits& sm, int shared_bytes) {
  return round_up(int64_t{std::max(shared_bytes, 0)} + sm.reserved_shared_per_block, kSharedUnit);
}

int side_blocks_per_sm(const SmLimits& sm, const SmReserve& reserve, const KernelUse& use) {
  if (use.threads <= 0) return 0;
  const int64_t n = std::max(reserve.blocks, 0);
  const int64_t free_threads = sm.threads - n * reserve.threads;
  const int64_t free_blocks = sm.blocks - n;
  const int64_t free_registers =
      sm.registers - n * block_registers(reserve.threads, reserve.registers_per_thread);
  const int64_t free_shared = sm.shared_bytes - n * block_shared_bytes(sm, reserve.shared_bytes);
  int64_t fit = std::min(free_threads / use.threads, free_blocks);
  const int64_t registers = block_registers(use.threads, use.registers_per_thread);
  if (registers > 0) fit = std::min(fit, free_registers / registers);
  fit = std::min(fit, free_shared / block_shared_bytes(sm, use.shared_bytes));
  return static_cast<int>(std::clamp<int64_t>(fit, 0, sm.blocks));
}

int carveout_percent(const SmLimits& sm, const SmReserve& reserve, const KernelUse& use,
                     int blocks) {
  if (sm.shared_bytes <= 0) return 100;
  const int64_t needed = int64_t{std::max(blocks, 0)} * block_shared_bytes(sm, use.shared_bytes) +
                         int64_t{std::max(reserve.blocks, 0)} *
                             block_shared_bytes(sm, reserve.shared_bytes);
  const int64_t percent = (needed * 100 + sm.shared_bytes - 1) / sm.shared_bytes;
  return static_cast<int>(std::clamp<int64_t>(percent, 0, 100));
}

int green_context_sms(int total, int reserved, int min_partition, int alignment) {
  const int64_t align = std::max(alignment, 1);
  const int64_t usable = int64_t{total} - std::max(reserved, 0);
  if (usable <= 0) return 0;
  const int64_t sms = usable / align * align;
  return sms >= std::max(min_partition, 1) ? static_cast<int>(sms) : 0;
}

int default_reserved_sms(int alignment) {
  return static_cast<int>(round_up(8, std::max(alignment, 1)));
}

int guideline_min_partition(int compute_capability) {
  if (compute_capability >= 90) return 8;
  if (compute_capability >= 80) return 4;
  return 2;
}

int guideline_alignment(int compute_capability) {
  return compute_capability >= 90 ? 8 : 2;
}

}  // namespace freeride
