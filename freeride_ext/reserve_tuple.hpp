// The reserve as the Python API passes it to the extension: (blocks, threads, registers per
// thread, shared bytes). Read by the Executor's constructor and by side_blocks_per_sm.
#pragma once

#include <tuple>

#include "backend.hpp"

namespace freeride_ext {

using ReserveTuple = std::tuple<int, int, int, int>;

inline freeride::SmReserve to_reserve(const ReserveTuple& t) {
  return freeride::SmReserve{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
}

}  // namespace freeride_ext
