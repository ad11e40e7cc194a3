// How many blocks of a side kernel one SM may hold while a reserve for the kernels that
// training launches during bubbles (NCCL's send/recv, a stage's receive) still fits
// beside them. A persistent side grid at full occupancy leaves such a kernel no room: it
// starts only when side work stops, and a gate close ordered behind it never comes.
// Also the green-context reserve's decisions (how many SMs to ask the driver for, and
// whether what it split off will do). Host arithmetic only, so it is tested without a GPU.
#pragma once

#include <cstdint>
#include <string>

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

// One decision on the way to a green-context reserve.
struct GreenContextStep {
  enum class Action {
    kAsk,       // ask the driver to split `sms` SMs off
    kUse,       // what the driver split off (`sms`) leaves the reserve free: use it
    kFallBack,  // use the occupancy cap instead; `message` says why (reserve_fallback)
    kRefuse,    // the Reserve cannot be honoured on this device: `message` is the error
  };
  Action action = Action::kFallBack;
  int sms = 0;
  int reserved = 0;       // SMs that must stay out of the green context
  int min_partition = 0;  // the rules applied, the driver's or the guideline
  int alignment = 0;
  std::string message;
};

// Before the split: `total` SMs on `device`, `reserve_sms` asked for (0: the default,
// which falls back where it cannot be honoured; explicit: refused), and the partition
// rules the driver reported (0: none, the guideline for `compute_capability` applies).
GreenContextStep plan_green_context(int total, int reserve_sms, int min_partition,
                                    int alignment, int compute_capability, int device);

// After the split: the driver returned `groups` groups, the first of `got` SMs. It may
// round a partition up past the SMs the plan must leave free.
GreenContextStep check_green_split(const GreenContextStep& plan, int total, unsigned groups,
                                   int got);

}  // namespace freeride
