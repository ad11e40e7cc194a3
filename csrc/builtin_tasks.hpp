// The built-in tasks of the core: each has a host item function and a CUDA launcher.
// Pointers refer to memory on the harvester's device; the Python layer validates them.
#pragma once

#include <cstdint>
#include <memory>

#include "task.hpp"

namespace freeride {

// Every item busy-waits ns_per_item nanoseconds (globaltimer on the GPU).
std::shared_ptr<Task> make_spin_task(uint64_t items, uint64_t phases, uint64_t ns_per_item);

// y += a * x over n elements of dtype (0 = float32, 1 = float64), `chunk` elements an item.
std::shared_ptr<Task> make_saxpy_task(double a, uintptr_t x, uintptr_t y, uint64_t n,
                                      uint64_t chunk, int dtype);

// Test probe for the item protocol: counts is uint32[phases * items], phase_done and
// violations are uint64[phases] and uint64[1], all zeroed by the caller. Item
// (fail_phase, fail_item) throws, to test failure handling (-1: none; host backend only).
// times (0: none) is uint64[phases * items * 2]: each item's start and end, steady-clock
// ns on the host, %globaltimer ns on a GPU.
std::shared_ptr<Task> make_item_counter_task(uint64_t items, uint64_t phases, uintptr_t counts,
                                             uintptr_t phase_done, uintptr_t violations,
                                             uintptr_t times, uint64_t ns_per_item,
                                             int64_t fail_phase, int64_t fail_item);

}  // namespace freeride
