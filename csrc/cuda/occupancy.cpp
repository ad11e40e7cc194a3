#include "cuda/occupancy.hpp"

#include <algorithm>

namespace freeride {
namespace {

int64_t round_up(int64_t value, int64_t unit) { return (value + unit - 1) / unit * unit; }
int64_t divide_up(int64_t value, int64_t unit) { return (value + unit - 1) / unit; }

}  // namespace

void set_architecture_units(SmLimits& sm, int compute_capability) {
  const int major = compute_capability / 10;
  const int minor = compute_capability % 10;
  // cudaOccRegAllocationGranularity: 256 on every architecture it knows (3.x to 12.x).
  sm.register_unit = 256;
  // cudaOccSubPartitionsPerMultiprocessor: 4, but 2 on GP100 (6.0).
  sm.sub_partitions = major == 6 && minor == 0 ? 2 : 4;
  // cudaOccSMemAllocationGranularity: 256 up to Volta/Turing, 128 from Ampere on.
  sm.shared_unit = major <= 7 ? 256 : 128;
}

int64_t block_warps(const SmLimits& sm, int threads) {
  return divide_up(std::max(threads, 0), std::max(sm.warp_size, 1));
}

int64_t warp_registers(const SmLimits& sm, int registers_per_thread) {
  return round_up(int64_t{std::max(registers_per_thread, 0)} * std::max(sm.warp_size, 1),
                  std::max(sm.register_unit, 1));
}

int64_t block_shared_bytes(const SmLimits& sm, int shared_bytes) {
  return round_up(int64_t{std::max(shared_bytes, 0)} + sm.reserved_shared_per_block,
                  std::max(sm.shared_unit, 1));
}

int side_blocks_per_sm(const SmLimits& sm, const SmReserve& reserve, const KernelUse& use) {
  if (use.threads <= 0) return 0;
  const int64_t parts = std::max(sm.sub_partitions, 1);
  const int64_t n = std::max(reserve.blocks, 0);
  const int64_t reserve_warps = n > 0 ? block_warps(sm, reserve.threads) : 0;
  // Warp slots, not threads: a 48-thread block holds two whole warps.
  const int64_t free_warps = sm.threads / std::max(sm.warp_size, 1) - n * reserve_warps;
  const int64_t free_blocks = sm.blocks - n;
  // Registers of one sub-partition: each reserved block puts its warps, rounded up to a
  // multiple of the sub-partitions, evenly into all of them (the hardware's per-block
  // check), so the busiest one holds n * ceil(warps / parts) reserved warps.
  const int64_t free_partition_registers =
      sm.registers / parts -
      n * divide_up(reserve_warps, parts) * warp_registers(sm, reserve.registers_per_thread);
  const int64_t free_shared = sm.shared_bytes - n * block_shared_bytes(sm, reserve.shared_bytes);
  if (free_warps < 0 || free_blocks < 0 || free_partition_registers < 0 || free_shared < 0) {
    return 0;  // the reserve alone does not fit
  }
  const int64_t warps = block_warps(sm, use.threads);
  int64_t fit = std::min(free_warps / warps, free_blocks);
  const int64_t per_warp = warp_registers(sm, use.registers_per_thread);
  if (per_warp > 0) {
    // As cudaOccMaxBlocksPerSMRegsLimit: whole warps per sub-partition, times the
    // sub-partitions, in whole blocks.
    fit = std::min(fit, free_partition_registers / per_warp * parts / warps);
  }
  // Before Ampere a block without shared memory holds none (no system reservation).
  const int64_t shared = block_shared_bytes(sm, use.shared_bytes);
  if (shared > 0) fit = std::min(fit, free_shared / shared);
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

}  // namespace freeride
