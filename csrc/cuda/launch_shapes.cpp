// LaunchShapes' lookups (the header has the reasons).
#include "cuda/launch_shapes.hpp"

#include <tuple>

namespace freeride {

bool LaunchShapes::carveout_is_locked(const void* kernel, int percent) const {
  const auto it = carveout_.find(kernel);
  return it != carveout_.end() && it->second == percent;
}

void LaunchShapes::forget_occupancy_locked(const void* kernel) {
  std::erase_if(occupancy_, [&](const auto& entry) { return std::get<0>(entry.first) == kernel; });
}

}  // namespace freeride
