// What a launch asks CUDA about its kernel, asked once per backend: registers and static
// shared memory never change for a loaded function on one device, nor does occupancy
// while its carveout stays as set (see set_carveout), yet sizing
// a persistent grid asked them at every launch, launches at opens included, which run on
// a training thread where each host microsecond is the training step's. The preferred
// carveout is a per-function setting: set again only where the value differs from the
// one this cache last set.
//
// The queries come in as callables, so the logic runs without CUDA (host arithmetic,
// compiled into every build like occupancy.hpp, and tested through freeride._C._testing).
// A query that throws leaves nothing cached: the next launch asks again, and fails as
// the first did where the cause remains.
//
// Keys are kernel handles as addresses: a runtime-API kernel's host stub or a driver
// CUfunction. One handle names one function for as long as a backend lives (built-ins
// are in the binary; RawKernel's modules are kept for the process's life by the Python
// layer's compile cache), and a backend lives within one device context: a new backend,
// after a device reset say, starts with an empty cache. Two harvesters alive on one
// device at once with different reserves would each take the carveout as theirs, while
// the function has one setting: the later set wins for both (before the cache every
// launch set its own, racing the other's launches anyway).
#pragma once

#include <map>
#include <mutex>
#include <tuple>

namespace freeride {

class LaunchShapes {
 public:
  struct Attributes {
    int registers_per_thread = 0;
    int static_shared_bytes = 0;
  };

  // Blocks of `kernel` one SM holds at `threads` threads and `dynamic_shared_bytes`:
  // query() (returning int) where not yet known. The lock is held across the query, so
  // concurrent first launches ask once; the queries are CUDA calls that take no lock of
  // ours, so this lock stays innermost.
  template <typename Query>
  int occupancy(const void* kernel, int threads, int dynamic_shared_bytes, Query&& query) {
    std::lock_guard<std::mutex> lk(mu_);
    return remembered(occupancy_, OccupancyKey{kernel, threads, dynamic_shared_bytes}, query);
  }

  // Registers per thread and static shared memory of `kernel`: query() (returning
  // Attributes) where not yet known. Per function: neither depends on the launch's shape.
  template <typename Query>
  Attributes attributes(const void* kernel, Query&& query) {
    std::lock_guard<std::mutex> lk(mu_);
    return remembered(attributes_, kernel, query);
  }

  // Calls set(percent) unless `percent` is the carveout this cache last set on `kernel`;
  // whether it called. Under the lock, so the value recorded is the one last set on the
  // function whatever the order of concurrent launches. A set that throws records
  // nothing (the function's setting is then unknown: the next launch sets it). Someone
  // else changing the setting behind our back is overwritten only once our value
  // changes: for built-ins no one else can name the function; for a RawKernel the user
  // owns it, and one who sets its carveout while it runs under a reserve gets what they
  // set until the reserve asks for another.
  //
  // A set forgets the kernel's occupancy: whether the driver's occupancy answer reads the
  // function's preferred carveout is not documented (the occupancy calculator's
  // cuda_occupancy.h does take a carveout), and the first answer may have been taken
  // under another one (the default, or an earlier harvester's). The next launch asks
  // again, under the carveout it runs with; that answer stays, as the carveout then does.
  template <typename Set>
  bool set_carveout(const void* kernel, int percent, Set&& set) {
    std::lock_guard<std::mutex> lk(mu_);
    if (carveout_is_locked(kernel, percent)) return false;
    carveout_.erase(kernel);
    set(percent);
    carveout_.emplace(kernel, percent);
    forget_occupancy_locked(kernel);
    return true;
  }

 private:
  using OccupancyKey = std::tuple<const void*, int, int>;  // kernel, threads, dynamic shared

  // map[key], from query() the first time (caller holds mu_). A query that throws adds
  // nothing.
  template <typename Map, typename Query>
  static typename Map::mapped_type remembered(Map& map, const typename Map::key_type& key,
                                              Query& query) {
    if (const auto it = map.find(key); it != map.end()) return it->second;
    return map.emplace(key, query()).first->second;
  }
  bool carveout_is_locked(const void* kernel, int percent) const;
  void forget_occupancy_locked(const void* kernel);

  // std::map: a handful of entries (each built-in kernel at its one shape, each RawKernel
  // phase's function), no hash to write, no rehash on a launch that adds one.
  std::mutex mu_;
  std::map<OccupancyKey, int> occupancy_;
  std::map<const void*, Attributes> attributes_;
  std::map<const void*, int> carveout_;  // the percent this cache last set, per function
};

// A CudaLaunch built by hand (a benchmark's or a test's) carries no cache: these then ask
// every time, as every launch did before the cache.
template <typename Query>
int cached_occupancy(LaunchShapes* shapes, const void* kernel, int threads,
                     int dynamic_shared_bytes, Query&& query) {
  return shapes != nullptr ? shapes->occupancy(kernel, threads, dynamic_shared_bytes, query)
                           : query();
}

template <typename Query>
LaunchShapes::Attributes cached_attributes(LaunchShapes* shapes, const void* kernel,
                                           Query&& query) {
  return shapes != nullptr ? shapes->attributes(kernel, query) : query();
}

template <typename Set>
void apply_carveout(LaunchShapes* shapes, const void* kernel, int percent, Set&& set) {
  if (shapes != nullptr) {
    shapes->set_carveout(kernel, percent, set);
  } else {
    set(percent);
  }
}

}  // namespace freeride
