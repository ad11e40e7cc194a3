// How many blocks of a side kernel one SM may hold while a reserve for the kernels that
// training launches during bubbles (NCCL's send/recv, a stage's receive) still fits
// beside them. A persistent side grid at full occupancy leaves such a kernel no room: it
// starts only when side work stops, and a gate close ordered behind it never comes.
// Host arithmetic only, so it is tested without a GPU.
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
};

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

// Registers one resident block holds: allocated per warp, in units of 256.
int64_t block_registers(int threads, int registers_per_thread);

// Shared memory one resident block holds, system reservation included, in 128-byte units.
int64_t block_shared_bytes(const SmLimits& sm, int shared_bytes);

// Side blocks of `use` that fit on one SM beside `reserve` (0 where not one does),
// before the kernel's own occupancy limit, which the caller applies as well.
int side_blocks_per_sm(const SmLimits& sm, const SmReserve& reserve, const KernelUse& use);

// Preferred shared-memory carveout (percent of sm.shared_bytes) for a side kernel with
// `blocks` resident blocks of `use` per SM: enough that the reserve's shared memory is
// configured beside them. An SM's carveout is chosen for the blocks it runs; a side
// kernel that needs little shared memory would otherwise leave a training kernel that
// needs 48 KiB no room, whatever the thread and register counts say.
int carveout_percent(const SmLimits& sm, const SmReserve& reserve, const KernelUse& use,
                     int blocks);

// Green-context reserve: side kernels run in a green context of whole SMs and the SMs
// left out are free for training. A green context's SM count must be a multiple of the
// driver's alignment and at least its minimum partition, so the SMs left out are
// `total` minus the largest such count that still leaves `reserved` out; 0 where no
// partition that small exists. alignment or min_partition <= 0 count as 1.
int green_context_sms(int total, int reserved, int min_partition, int alignment);

// SMs to leave out when the Reserve names none: 8 (the step Hopper partitions in, where
// the measured probe started within 9 us), rounded up to the partition alignment.
int default_reserved_sms(int alignment);

// The driver's partition rules where it reports none (fields that drivers before CUDA 13
// leave zero): its documented guideline per compute capability (major * 10 + minor).
int guideline_min_partition(int compute_capability);
int guideline_alignment(int compute_capability);

}  // namespace freeride
