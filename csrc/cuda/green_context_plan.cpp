#include "cuda/green_context_plan.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "check.hpp"

namespace freeride {
namespace {

int64_t round_up(int64_t value, int64_t unit) { return (value + unit - 1) / unit * unit; }

}  // namespace

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

GreenContextStep plan_green_context(int total, int reserve_sms, int min_partition,
                                    int alignment, int compute_capability, int device) {
  using Action = GreenContextStep::Action;
  GreenContextStep step;
  step.min_partition =
      min_partition > 0 ? min_partition : guideline_min_partition(compute_capability);
  step.alignment = alignment > 0 ? alignment : guideline_alignment(compute_capability);
  const bool explicit_sms = reserve_sms > 0;
  step.reserved = explicit_sms ? reserve_sms : default_reserved_sms(step.alignment);
  step.sms = green_context_sms(total, step.reserved, step.min_partition, step.alignment);
  if (step.sms > 0) {
    step.action = Action::kAsk;
    return step;
  }
  // Asked for by name, the reserve is an error; the default one falls back instead.
  if (explicit_sms) {
    step.action = Action::kRefuse;
    step.message = (detail::Msg() << "reserve.sms=" << step.reserved
                                  << " leaves fewer SMs than the smallest green context ("
                                  << step.min_partition << " SMs) for side work on device "
                                  << device << " (" << total << " SMs)")
                       .str();
  } else {
    step.action = Action::kFallBack;
    step.message = (detail::Msg() << "no green context of at least " << step.min_partition
                                  << " SMs leaves " << step.reserved << " of the " << total
                                  << " SMs free")
                       .str();
  }
  return step;
}

GreenContextStep check_green_split(const GreenContextStep& plan, int total, unsigned groups,
                                   int got) {
  GreenContextStep step = plan;
  step.sms = got;
  if (groups < 1 || got <= 0 || got > total - plan.reserved) {
    // The driver rounded the partition up past the SMs it must leave out.
    step.action = GreenContextStep::Action::kFallBack;
    step.message = (detail::Msg() << "the driver split " << got << " of " << total
                                  << " SMs off for side work, which leaves fewer than "
                                  << plan.reserved << " free")
                       .str();
  } else {
    step.action = GreenContextStep::Action::kUse;
    step.message.clear();
  }
  return step;
}

int census_sms(const unsigned int* seen, std::size_t words) {
  int sms = 0;
  for (std::size_t i = 0; i < words; ++i) sms += std::popcount(seen[i]);
  return sms;
}

GreenContextStep check_green_partition(int green_sms, int total, const PartitionSeen& seen,
                                       int deadline_s) {
  GreenContextStep step;
  step.sms = seen.sms;
  step.reserved = total - green_sms;
  step.action = GreenContextStep::Action::kFallBack;
  if (!seen.finished) {
    step.sms = 0;
    step.message = (detail::Msg() << "the check that the green context's blocks stay on its "
                                  << green_sms << " SMs did not finish within " << deadline_s
                                  << " s")
                       .str();
  } else if (seen.blocks <= 0) {
    step.message = "the check that the green context's blocks stay on its SMs ran no block";
  } else if (seen.beyond > 0) {
    // Not told apart: they might be any number of SMs outside the partition.
    step.message = (detail::Msg() << "the green context's blocks ran on SM ids past "
                                  << SmCensus::kWords * 32 - 1 << " (" << seen.beyond
                                  << " of " << seen.blocks
                                  << " blocks): the SMs they ran on cannot be counted")
                       .str();
  } else if (seen.sms > green_sms) {
    step.message = (detail::Msg() << "the green context's blocks ran on " << seen.sms
                                  << " SMs, more than its " << green_sms << " (of " << total
                                  << "): the driver does not confine runtime launches to the "
                                     "partition")
                       .str();
  } else {
    step.action = GreenContextStep::Action::kUse;
  }
  return step;
}

}  // namespace freeride
