#include "cuda/launch_shapes.hpp"

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

}  // namespace freeride
