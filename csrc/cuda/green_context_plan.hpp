// The green-context reserve's decisions: how many SMs to ask the driver to split off for
// side work, and whether what it split off will do. The CUDA calls that act on them are
// in green_context.cpp. Host arithmetic only, compiled into every build (the host build
// too), so it is tested without a GPU.
#pragma once

#include <cstddef>
#include <string>

namespace freeride {

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

// The partition check: whether launches on the green context's stream stay on its SMs.
// Documented for the driver API, it is the runtime's <<<>>> launches that side work makes
// there, and an older runtime or driver could run them on the whole device, silently
// voiding the reserve. A grid large enough to fill every SM of the device, each block
// holding its place for a while, runs there; each block records the SM it ran on (%smid)
// in an SmCensus, which the host reads back.
//
// Where launches are confined, every %smid is one of the context's SMs, so the count
// never exceeds the partition, whatever else runs on the device. Where they are not,
// blocks held in place fill whichever SMs have room, those outside the partition
// included: the count can fall short of the truth (SMs busy with other work) but never
// overstate it, so the check never drops a working green context.
struct SmCensus {
  static constexpr int kWords = 128;  // SM ids 0..4095: %smid is below %nsmid, < 4096 so far
  unsigned int seen[kWords];          // bit i of word w: a block ran on SM id 32 * w + i
  unsigned int beyond;                // blocks on SM ids past the bitmap
  unsigned int blocks;                // blocks that ran
  unsigned long long start_ns;        // the first block's start on %globaltimer; 0: none
};

// Distinct SMs a census's bitmap of `words` words names.
int census_sms(const unsigned int* seen, std::size_t words);

// What the host read back: `finished` false where the grid had not ended within the
// check's deadline (`deadline_s`), and then nothing else counts.
struct PartitionSeen {
  bool finished = false;
  int sms = 0;      // census_sms of the bitmap
  int beyond = 0;   // SmCensus::beyond
  int blocks = 0;   // SmCensus::blocks
};

// After the partition check of a green context of `green_sms` of `total` SMs: kUse, or
// kFallBack with the reason (reserve_fallback). `sms` is what was seen.
GreenContextStep check_green_partition(int green_sms, int total, const PartitionSeen& seen,
                                       int deadline_s);

}  // namespace freeride
