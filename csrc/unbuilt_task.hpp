// A task refused before its buffers were made: it needs more memory than the harvester's
// whole budget, which the Python layer can tell from the task's shapes alone. Submitting
// it fails it at once through the executor's own budget check (Executor::submit_after),
// so its handle reads as any task's that failed the budget (its phases and items those
// of the task it stands for), and nothing was allocated on the device for it (allocating
// first could take training's memory). Were it ever admitted, its first item would fail
// it: it has phases to run, so the executor never takes it for done.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "check.hpp"
#include "task.hpp"

namespace freeride {

class UnbuiltTask final : public Task {
 public:
  UnbuiltTask(std::string name, uint64_t memory_bytes, uint64_t phases, uint64_t items)
      : name_(std::move(name)), phases_(phases), items_(items) {
    FR_ARG(phases > 0 && items > 0, "an unbuilt task stands for at least one phase and item");
    set_memory_bytes(memory_bytes);
  }
  std::string name() const override { return name_; }
  uint64_t num_phases() const override { return phases_; }
  uint64_t num_items(uint64_t) const override { return items_; }
  void run_item(uint64_t, uint64_t) override {
    FR_CHECK(false, name_ << " was refused before its buffers were made: its items cannot run");
  }
  void launch_cuda(const CudaLaunch&) override {
    FR_CHECK(false, name_ << " was refused before its buffers were made: it has no kernel");
  }

 private:
  std::string name_;
  uint64_t phases_;
  uint64_t items_;
};

inline std::shared_ptr<Task> make_unbuilt_task(std::string name, uint64_t memory_bytes,
                                               uint64_t phases, uint64_t items) {
  return std::make_shared<UnbuiltTask>(std::move(name), memory_bytes, phases, items);
}

}  // namespace freeride
