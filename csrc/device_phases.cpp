#include "device_phases.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "check.hpp"

namespace freeride {
namespace {

// The task of `phases` phases of `per_phase` items as one phase of them all: launches
// carry ctx.phase_items, so the kernel maps each claim back to its phase and item.
class DevicePhasesView final : public Task {
 public:
  explicit DevicePhasesView(std::shared_ptr<Task> inner)
      : inner_(std::move(inner)), phases_(inner_->num_phases()), per_phase_(inner_->num_items(0)) {
    FR_ARG(per_phase_ > 0, inner_->name() << ": device phases need items in every phase");
    // As many as total_items() looks at, which submit asks for anyway.
    for (uint64_t p = 1; p < phases_; ++p) {
      FR_ARG(inner_->num_items(p) == per_phase_,
             inner_->name() << ": device phases need as many items in every phase; phase "
                            << p << " has " << inner_->num_items(p) << ", phase 0 " << per_phase_);
    }
    FR_ARG(per_phase_ <= UINT64_MAX / phases_, inner_->name() << ": items * phases overflows");
    set_memory_bytes(inner_->memory_bytes());
  }

  std::string name() const override { return inner_->name(); }
  uint64_t num_phases() const override { return 1; }
  uint64_t num_items(uint64_t) const override { return per_phase_ * phases_; }
  bool follows_item_protocol() const override { return true; }
  bool runs_in_green_context() const override { return inner_->runs_in_green_context(); }

  uint64_t reported_phase(uint64_t, uint64_t items_done) const override {
    return std::min(items_done / per_phase_, phases_ - 1);
  }

  std::string protocol_hint() const override {
    return " (the task runs with device phases, on unless FREERIDE_DEVICE_PHASES=0: its "
           "kernel must run its items through freeride::for_each_phase_item, which gives "
           "each item's phase, and for_each_item claims nothing there)";
  }

  // No backend that runs items on the host takes device phases: its workers keep the
  // phases in order themselves, where items of this one phase would not be.
  void run_item(uint64_t, uint64_t) override {
    FR_THROW(RuntimeFailure, name() << ": device phases run on the CUDA backend only");
  }

  void launch_cuda(const CudaLaunch& launch) override {
    CudaLaunch l = launch;
    l.ctx.phase = 0;
    l.ctx.phase_items = per_phase_;
    inner_->launch_cuda(l);
  }

 private:
  std::shared_ptr<Task> inner_;
  uint64_t phases_;
  uint64_t per_phase_;
};

}  // namespace

std::shared_ptr<Task> with_device_phases(std::shared_ptr<Task> task, bool enabled) {
  if (!enabled || task == nullptr || !task->supports_device_phases() ||
      !task->follows_item_protocol() || task->num_phases() < 2) {
    return task;
  }
  return std::make_shared<DevicePhasesView>(std::move(task));
}

}  // namespace freeride
