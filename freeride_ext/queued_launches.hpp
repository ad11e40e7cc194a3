// The launches of one runner of the test queue backend (queue_backend.hpp), as the test
// enqueues, begins and ends them, and the slot that says which runner the backend's
// opens launch: the model of the CUDA runner's launches at opens (queued ahead of the
// GPU, begun and ended in order on one stream) with nothing underneath.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "check.hpp"
#include "doorbell.hpp"
#include "open_launch_rule.hpp"
#include "phase_ahead_rule.hpp"
#include "task.hpp"

namespace freeride {
struct QueuedLaunches;

// Which runner the backend's opens launch (CudaShared::armed): the one armed last, by
// run() or arm(), until it is destroyed; and the one following it (follow()), whose
// launch each open queues behind the armed one's.
struct ArmSlot {
  std::mutex mu;
  std::weak_ptr<QueuedLaunches> armed;
  std::weak_ptr<QueuedLaunches> follower;
};

// One runner's launches, shared by the runner and the test (which may outlive it).
struct QueuedLaunches {
  static constexpr size_t kCapacity = 32;  // as kLaunchRing: the most a runner takes

  std::mutex mu;
  std::condition_variable cv;
  struct Launch {
    int64_t items = -1;  // what it ran once ended; -1 while it has not
    bool at_open = true;  // false: the executor's own (seen open on the mirror)
    uint64_t phase = 0;   // the phase it launches
    bool guarded = false;  // chained at an open behind phase - 1's (phases ahead)
    bool waits_open = false;  // the first of an open's launches (the lookahead counts them)
    bool begun = false;       // its blocks have started (begin(), or its end)
    bool saw_stop = false;    // it began with the stop set: it claims nothing
    uint64_t stamp = 0;       // its place in the backend's order of enqueues (1, 2, ...)
    uint64_t stream = 0;      // the training stream of its open (0 for the executor's own)
    uint32_t seq = 0;         // the open it was enqueued at or seen under (0: not given)
  };
  // The newest launch on the side stream that waits for an open of its own, or the
  // executor's (one chained behind another waits for none): what a launch enqueued now
  // waits behind (CudaRunner::waiting_opens_locked). stamp 0: none.
  struct Newest {
    uint64_t stamp = 0;
    bool at_open = false;
    bool begun = false;
    uint64_t stream = 0;
    uint32_t seq = 0;
    bool holds = false;  // not ended, its runner not stopped: it may run until the close
  };
  static Newest newer(const Newest& a, const Newest& b) { return b.stamp > a.stamp ? b : a; }
  std::deque<Launch> pending;
  uint64_t phases = 0;  // begin_phase() calls
  uint64_t phase = 0;   // the current phase (the last begun)
  uint64_t n_items = 0;
  uint64_t done = 0;    // the current phase's, as the runner reports it
  bool phase_done = false;
  // Phases ahead (phase_ahead_rule.hpp): begin_phase() with launches in flight, and
  // opens that chain a guarded launch of the next phase. The model's device: what every
  // phase finished (a launch's items are capped by what its phase has left, and a guarded
  // one runs none unless the phase before is complete as it ends).
  bool phases_ahead = false;
  std::shared_ptr<Task> task;
  // The lookahead bound (open_launch_rule.hpp), and the opens past it left without a launch
  // (the backend's count, shared by its runners). The model's "not begun": not ended.
  uint64_t lookahead_bound = 0;
  std::shared_ptr<std::atomic<uint64_t>> beyond_lookahead;
  // The cross-stream rule (open_launch_rule.hpp's waits_behind_another_stream): opens
  // left without a launch because it would wait behind another stream's open (the
  // backend's count), and the backend's stamps, which order launches across runners.
  std::shared_ptr<std::atomic<uint64_t>> cross_stream_skips =
      std::make_shared<std::atomic<uint64_t>>(0);
  // The executor's rule (open_launch_rule.hpp's served_by_executor): launches at opens
  // left out because the executor's own for the same open was queued already.
  std::shared_ptr<std::atomic<uint64_t>> executor_served_skips =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> stamps = std::make_shared<std::atomic<uint64_t>>(0);
  std::map<uint64_t, uint64_t> phase_done_items;
  uint64_t ran = 0;  // items every ended launch ran, in all
  bool stopped = false;
  bool withheld = false;  // PhaseRunner::withhold: takes no launch, those pending claim on
  bool abandoned = false;
  std::string failure;  // the next run() throws it (see fail())
  bool failure_drops = true;
  bool stop_fails = false;  // stop() throws, as a stop write does on a broken context
  // The backend's: set once it refuses launches at opens (close), and what an arrival
  // rings (an open's launch ends a backoff, as CudaRunner::launch_at_open's ring does).
  std::shared_ptr<std::atomic<bool>> refusing = std::make_shared<std::atomic<bool>>(false);
  Doorbell* bell = nullptr;
  std::shared_ptr<ArmSlot> arm_slot;
  size_t index = 0;     // the backend's made_ order
  uint64_t runs = 0;    // run() calls
  uint64_t taken = 0;   // ends run() took (or dropped with a failure)
  uint64_t stops = 0;   // stop() calls
  uint64_t withholds = 0;  // withhold() calls
  bool hand_back = false;  // PhaseRunner::hand_back, until a run() returns for it
  bool interrupt = false;  // PhaseRunner::interrupt, likewise

  // Launches enqueued at opens, as the CUDA runner takes them: none before its first
  // phase begins, once stopped or withheld, once the phase is done, when kCapacity are pending or
  // once the backend refuses them. How many were taken. `at_open` false: launches of the
  // executor's own instead (taken whatever the backend refuses: the executor makes them).
  // With phases ahead, an open takes what launches_at_open says (one launch or two), and
  // the count is of launches; the executor's own launch the current phase only.
  // `others`: launches of other runners waiting for their opens (the lookahead counts
  // them too: CudaShared::launch_at_open's WaitingOpens). `chained`: a follower's launch
  // right behind the armed runner's at the same open, which waits for none of its own.
  // `stream`: the training stream the opens are written on; `newest_other`: the newest
  // launch of other runners on the side stream, if any (the cross-stream rule weighs it).
  // `seq`: the open's number (the executor's own: the open it saw), 0 where not given.
  size_t arrive(size_t count, bool at_open = true, uint64_t others = 0, bool chained = false,
                uint64_t stream = 0, const Newest* newest_other = nullptr, uint32_t seq = 0) {
    size_t taken = 0;
    {
      std::lock_guard<std::mutex> lk(mu);
      for (size_t open = 0; open < count; ++open) {
        if (phases == 0 || stopped || withheld || abandoned || (at_open && refusing->load())) {
          break;
        }
        const OpenLaunches go = launches_at_open(*task, phases_ahead && at_open, phase,
                                                 phase_done, kCapacity - pending.size());
        if (!go.current && !go.next) break;
        if (at_open && !chained) {
          // As CudaRunner::launch_at_open: the executor's launch for this open, the
          // cross-stream rule, then the lookahead bound.
          const Newest n =
              newest_other != nullptr ? newer(newest_locked(), *newest_other) : newest_locked();
          if (n.stamp != 0 && served_by_executor(n.at_open, n.holds, n.seq, seq)) {
            executor_served_skips->fetch_add(1);
            continue;
          }
          if (n.stamp != 0 && waits_behind_another_stream(n.at_open, n.begun, n.stream == stream)) {
            cross_stream_skips->fetch_add(1);
            continue;
          }
          if (!within_lookahead(waiting_locked() + others, lookahead_bound)) {
            if (beyond_lookahead) beyond_lookahead->fetch_add(1);
            continue;
          }
        }
        const bool waits = at_open && !chained;
        auto push = [&](uint64_t launch_phase, bool guarded, bool waits_open) {
          pending.push_back({-1, at_open, launch_phase, guarded, waits_open});
          pending.back().stamp = stamps->fetch_add(1) + 1;
          pending.back().stream = at_open ? stream : 0;
          pending.back().seq = seq;
        };
        if (go.current) push(phase, false, waits);
        if (go.next) push(phase + 1, true, waits && !go.current);
        taken += (go.current ? 1 : 0) + (go.next ? 1 : 0);
      }
      cv.notify_all();
    }
    if (taken > 0 && bell != nullptr) bell->ring();
    return taken;
  }

  // This runner's newest launch that a launch enqueued now waits behind (caller holds mu).
  Newest newest_locked() const {
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
      if (it->waits_open || !it->at_open) {
        return {it->stamp, it->at_open, it->begun, it->stream, it->seq,
                it->items < 0 && !stopped};
      }
    }
    return {};
  }

  // As CudaRunner::bubbles_in_flight: the oldest launch not ended, and each later one that
  // waits for an open of its own (caller holds mu).
  uint64_t bubbles_locked() const {
    uint64_t n = 0;
    for (const Launch& l : pending) {
      if (l.items >= 0) continue;
      if (n == 0 || l.waits_open) ++n;
    }
    return n;
  }

  // Launches waiting for their opens (the model's "not begun": not ended; caller holds mu).
  uint64_t waiting_locked() const {
    uint64_t n = 0;
    for (const Launch& l : pending) n += l.waits_open && l.items < 0 ? 1 : 0;
    return n;
  }

  // As CudaRunner::takes_opens_locked (caller holds mu).
  bool takes_opens_locked() const {
    return phases > 0 && pending.empty() && !stopped && !withheld &&
           (!phase_done || (phases_ahead && phase + 1 < task->num_phases()));
  }

  // Launch `l` begins now, if it had not (caller holds mu): it sees the stop as it is.
  void begin_locked(Launch& l) {
    if (l.begun) return;
    l.begun = true;
    l.saw_stop = stopped;
  }

  // The oldest launch not yet begun begins (its first block starts): with the stop set, it
  // will claim nothing, as a kernel reads the stop word at its first claim.
  void begin() {
    std::lock_guard<std::mutex> lk(mu);
    for (Launch& l : pending) {
      if (!l.begun) {
        begin_locked(l);
        return;
      }
    }
    FR_THROW(InvalidArgument, "no launch is waiting to begin");
  }

  // The oldest launch not yet ended ends (beginning now if it had not), having run `items`
  // items: fewer where its phase has fewer left, none where it began stopped or is guarded
  // and the phase before is not complete.
  void end(int64_t items) {
    FR_ARG(items >= 0, "items must not be negative");
    std::lock_guard<std::mutex> lk(mu);
    for (Launch& l : pending) {
      if (l.items < 0) {
        begin_locked(l);
        uint64_t& finished = phase_done_items[l.phase];
        const bool ready =
            !l.guarded || phase_done_items[l.phase - 1] >= task->num_items(l.phase - 1);
        uint64_t can = l.saw_stop || !ready ? 0 : static_cast<uint64_t>(items);
        can = std::min<uint64_t>(can, task->num_items(l.phase) - finished);
        finished += can;
        l.items = static_cast<int64_t>(can);
        ran += can;
        cv.notify_all();
        return;
      }
    }
    FR_THROW(InvalidArgument, "no launch is pending");
  }

  // The next run() throws `message`: with `drop_pending`, as after a kernel fault (nothing
  // enqueued behind it runs: every pending launch is gone); otherwise as after a launch
  // that broke the item protocol (that launch ended, the others are still to come).
  void fail(std::string message, bool drop_pending) {
    std::lock_guard<std::mutex> lk(mu);
    failure = std::move(message);
    failure_drops = drop_pending;
    cv.notify_all();
  }
};

}  // namespace freeride
