// Pools of fixed-size slots carved from slabs, and the process-wide keep of slabs that
// pools let go of. Plain C++ over an allocator policy: the CUDA backend's allocator makes
// device or mapped pinned slabs (gate_memory.hpp), and tests drive the same pool on the
// CPU with a host allocator.
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

namespace freeride::cuda {

struct Slab {
  char* dev = nullptr;   // device address
  char* host = nullptr;  // host address (mapped host pools only)
};

// Slabs a pool lets go of are kept for later pools of the same device and kind, never
// given to cudaFree or cudaFreeHost: both synchronise the whole device (CUDA's implicit
// synchronisation), so freeing at close waited for every stream's queued work, training's
// included (seen on an H200: close() and process exit took the 2 s of GPU work still
// queued on a training stream). Process-wide and leaked on purpose, like the gates.
// take_kept_slab: a kept slab of `bytes` for `device`, or false where none is kept.
bool take_kept_slab(int device, bool host_memory, size_t bytes, Slab* out);
void keep_slab(int device, bool host_memory, size_t bytes, Slab slab) noexcept;
// How many slabs are kept for (device, host_memory, bytes; 0: any size): tests count what
// a close gave.
size_t kept_slabs(int device, bool host_memory, size_t bytes);

constexpr size_t kSlotsPerSlab = 256;

// One slab per kSlotsPerSlab slots, reused via a free list. The caller serialises access.
// `Alloc` has `static Slab allocate(int device, bool host_memory, size_t bytes)` (throws)
// and `static int current_device()`, called once, before the first slab.
//
// What the pool's slabs go to when it lets them go depends on whether launches that may
// still write them are left on the GPU: normally to the keep (release_all), where a later
// pool takes them; after a close that abandoned launches (hold), to nowhere until the GPU
// is seen to have passed them (release_held), so that no later pool is handed memory an
// old kernel or stop-word write still lands in. A pool destroyed while held leaks its
// slabs.
template <typename Alloc>
class BasicSlotPool {
 public:
  using Slot = Slab;

  BasicSlotPool(bool host_memory, size_t stride) : host_memory_(host_memory), stride_(stride) {}
  BasicSlotPool(const BasicSlotPool&) = delete;
  BasicSlotPool& operator=(const BasicSlotPool&) = delete;
  ~BasicSlotPool() { release_all(); }

  Slot acquire() {
    if (free_.empty()) grow();
    Slot slot = free_.back();
    free_.pop_back();
    // A reused host slot may hold the previous runner's progress.
    if (slot.host != nullptr) std::memset(slot.host, 0, stride_);
    return slot;
  }

  // Cannot reallocate: every slot came from free_, whose capacity covers all of them.
  void release(Slot slot) noexcept { free_.push_back(slot); }

  // Hands every slab to the process-wide keep: nothing waits for the GPU. Not while held.
  void release_all() noexcept {
    if (held_) return;
    for (const Slab& slab : slabs_) keep_slab(device_, host_memory_, bytes(), slab);
    slabs_.clear();
    free_.clear();
  }

  // Launches that may still write the slabs were left on the GPU: from now on nothing is
  // handed out or kept until release_held().
  void hold() noexcept { held_ = true; }
  bool held() const { return held_; }
  // The GPU has passed them: the slabs go to the keep after all.
  void release_held() noexcept {
    held_ = false;
    release_all();
  }

  size_t slabs() const { return slabs_.size(); }

 private:
  size_t bytes() const { return kSlotsPerSlab * stride_; }

  void grow() {
    slabs_.reserve(slabs_.size() + 1);
    free_.reserve((slabs_.size() + 1) * kSlotsPerSlab);
    if (slabs_.empty()) device_ = Alloc::current_device();
    Slab base;
    if (!take_kept_slab(device_, host_memory_, bytes(), &base)) {
      base = Alloc::allocate(device_, host_memory_, bytes());
    }
    slabs_.push_back(base);
    // Reversed, so that slots are handed out in address order.
    for (size_t i = kSlotsPerSlab; i-- > 0;) {
      Slot s;
      s.dev = base.dev + i * stride_;
      if (base.host != nullptr) s.host = base.host + i * stride_;
      free_.push_back(s);
    }
  }

  bool host_memory_;
  size_t stride_;
  int device_ = 0;
  bool held_ = false;
  std::vector<Slab> slabs_;
  std::vector<Slot> free_;
};

}  // namespace freeride::cuda
