// LaunchShapes' lookups (the header has the reasons).
#include "cuda/launch_shapes.hpp"

#include <tuple>

namespace freeride {

const int* LaunchShapes::find_occupancy_locked(const OccupancyKey& key) const {
  const auto it = occupancy_.find(key);
  return it == occupancy_.end() ? nullptr : &it->second;
}

const LaunchShapes::Attributes* LaunchShapes::find_attributes_locked(const void* kernel) const {
  const auto it = attributes_.find(kernel);
  return it == attributes_.end() ? nullptr : &it->second;
}

bool LaunchShapes::carveout_is_locked(const void* kernel, int percent) const {
  const auto it = carveout_.find(kernel);
  return it != carveout_.end() && it->second == percent;
}

void LaunchShapes::forget_occupancy_locked(const void* kernel) {
  std::erase_if(occupancy_, [&](const auto& entry) { return std::get<0>(entry.first) == kernel; });
}

}  // namespace freeride
