#include "cuda/slot_pool.hpp"

#include <map>
#include <mutex>
#include <tuple>

namespace freeride::cuda {
namespace {

using SlabKey = std::tuple<int, bool, size_t>;

std::mutex& kept_mu() {
  static std::mutex mu;
  return mu;
}

std::map<SlabKey, std::vector<Slab>>& kept() {
  static auto* slabs = new std::map<SlabKey, std::vector<Slab>>();  // leaked on purpose
  return *slabs;
}

}  // namespace

bool take_kept_slab(int device, bool host_memory, size_t bytes, Slab* out) {
  std::lock_guard<std::mutex> lk(kept_mu());
  auto it = kept().find({device, host_memory, bytes});
  if (it == kept().end() || it->second.empty()) return false;
  *out = it->second.back();
  it->second.pop_back();
  return true;
}

void keep_slab(int device, bool host_memory, size_t bytes, Slab slab) noexcept {
  try {
    std::lock_guard<std::mutex> lk(kept_mu());
    kept()[{device, host_memory, bytes}].push_back(slab);
  } catch (...) {
    // Out of host memory for the list: the slab leaks, which is all freeing it saves.
  }
}

size_t kept_slabs(int device, bool host_memory, size_t bytes) {
  std::lock_guard<std::mutex> lk(kept_mu());
  size_t n = 0;
  for (const auto& [key, slabs] : kept()) {
    const auto& [d, h, b] = key;
    if (d == device && h == host_memory && (bytes == 0 || b == bytes)) n += slabs.size();
  }
  return n;
}

}  // namespace freeride::cuda
