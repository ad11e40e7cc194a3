// A task refused before its buffers were made: it needs more memory than the harvester's
// whole budget, which the Python layer can tell from the task's shapes alone. Submitting
// it fails it at once through the executor's own budget check (Executor::submit_after),
// so its handle reads as any task's that failed the budget, and nothing was allocated
// on the device for it (allocating first could take training's memory).
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
  UnbuiltTask(std::string name, uint64_t memory_bytes) : name_(std::move(name)) {
    set_memory_bytes(memory_bytes);
  }
  std::string name() const override { return name_; }
  uint64_t num_phases() const override { return 0; }
  uint64_t num_items(uint64_t) const override { return 0; }
  void run_item(uint64_t, uint64_t) override {
    FR_CHECK(false, name_ << " was refused before its buffers were made: it has no items");
  }
  void launch_cuda(const CudaLaunch&) override {
    FR_CHECK(false, name_ << " was refused before its buffers were made: it has no kernels");
  }

 private:
  std::string name_;
};

inline std::shared_ptr<Task> make_unbuilt_task(std::string name, uint64_t memory_bytes) {
  return std::make_shared<UnbuiltTask>(std::move(name), memory_bytes);
}

}  // namespace freeride
