// How many blocks of a side kernel one SM may hold while a reserve for the kernels that
// training launches during bubbles (NCCL's send/recv, a stage's receive) still fits
// beside them. A persistent side grid at full occupancy leaves such a kernel no room: it
// starts only when side work stops, and a gate close ordered behind it never comes.
// Host arithmetic only, compiled into every build (the host build too): tests check it
// without a GPU, and task.hpp's CudaLaunch carries its types.
#pragma once

#include <cstdint>

namespace freeride {

// Per-SM resources of a device (cudaDevAttr*PerMultiprocessor and friends).
struct SmLimits {
  int threads = 0;                    // resident threads
  int blocks = 0;                     // resident blocks
  int registers = 0;                  // 32-bit registers
  int shared_bytes = 0;               // shared memory with the largest carveout
  int reserved_shared_per_block = 0;  // shared memory the system takes per resident block
  int warp_size = 32;
  // No device attribute reports these; set_architecture_units fills them in by compute
  // capability, from the CUDA occupancy calculator (cuda_occupancy.h). The defaults are
  // sm_80's and sm_90's.
  int register_unit = 256;  // registers are allocated per warp in multiples of this
  int sub_partitions = 4;   // a warp's registers come from one of these equal slices
  int shared_unit = 128;    // shared memory is allocated per block in multiples of this
};

// register_unit, sub_partitions and shared_unit for compute capability major * 10 +
// minor, as cuda_occupancy.h has them; an architecture newer than it knows gets the
// newest values.
void set_architecture_units(SmLimits& sm, int compute_capability);

// Room side blocks leave free on every SM: `blocks` blocks of `threads` threads, each
// with `registers_per_thread` registers and `shared_bytes` of shared memory. blocks == 0:
// no reserve (side grids may take whole SMs).
struct SmReserve {
  int blocks = 1;
  int threads = 512;
  int registers_per_thread = 64;
  int shared_bytes = 48 * 1024;
};

// One block of a side kernel.
struct KernelUse {
  int threads = 0;
  int registers_per_thread = 0;
  int shared_bytes = 0;  // static plus dynamic
};

// Warp slots one resident block holds: a partial warp takes a whole slot.
int64_t block_warps(const SmLimits& sm, int threads);

// Registers one warp holds: registers_per_thread for every lane, rounded up to the
// allocation unit.
int64_t warp_registers(const SmLimits& sm, int registers_per_thread);

// Shared memory one resident block holds, system reservation included, in allocation units.
int64_t block_shared_bytes(const SmLimits& sm, int shared_bytes);

// Side blocks of `use` that fit on one SM beside `reserve` (0 where not one does, or the
// reserve alone does not fit), before the kernel's own occupancy limit, which the caller
// applies as well. Counts as the occupancy calculator does: warp slots, blocks, shared
// memory, and registers per sub-partition (a warp's registers must fit in one of
// sm.sub_partitions slices; side warps are spread evenly over them, and each reserved
// block is charged its warps rounded up to a multiple of the sub-partitions, as the
// hardware's per-block register check assumes).
int side_blocks_per_sm(const SmLimits& sm, const SmReserve& reserve, const KernelUse& use);

// Preferred shared-memory carveout (percent of sm.shared_bytes) for a side kernel with
// `blocks` resident blocks of `use` per SM: enough that the reserve's shared memory is
// configured beside them. An SM's carveout is chosen for the blocks it runs; a side
// kernel that needs little shared memory would otherwise leave a training kernel that
// needs 48 KiB no room, whatever the thread and register counts say. Rounded up: the
// driver takes percent * sm.shared_bytes / 100, rounded down, then up to a carveout the
// architecture offers.
int carveout_percent(const SmLimits& sm, const SmReserve& reserve, const KernelUse& use,
                     int blocks);

}  // namespace freeride
