// For each recent open, the ordinal the first close after it gets (freeride/slice.h:
// bubble_over): what the executor's own launches for that open's bubble carry
// (fr_item_ctx.next_close). A launch made at an open reads the ledger on the thread that
// wrote the open; the executor launches later, when the gate's mirror reads open under
// the open's number, by which time the host may have enqueued that bubble's close (it
// runs ahead of the GPU). Without the ordinal such a launch, beginning only after that
// close has executed (queued behind training's work under one hardware queue), would
// take the close for history and run into the next bubble, with that bubble's launch
// waiting behind it on the stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/recent_opens.hpp"

namespace freeride::cuda {

class OpenOrdinals {
 public:
  // The thread writing an open, before the open can take effect: `next_close` is the
  // ledger's next ordinal then (CloseLedger::next, never 0). The oldest of kKept is
  // forgotten (its launches then go by their first look alone).
  void note(uint32_t seq, uint32_t next_close) { opens_.note(seq, next_close); }

  // The ordinal noted for the open numbered `seq`, or 0 (none noted: an open captured
  // into a graph, or one forgotten).
  uint32_t next_close(uint32_t seq) const { return opens_.find(seq); }

  static constexpr size_t kKept = RecentOpens::kKept;

 private:
  RecentOpens opens_;
};

}  // namespace freeride::cuda
