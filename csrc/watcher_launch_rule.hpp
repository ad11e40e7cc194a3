// Whether the open watcher's thread enqueues the armed runner's launch itself when the GPU
// has reached a stream-ordered open (FREERIDE_WATCHER_LAUNCH=1, issue 36 item 1, review
// G8). An open that carries no launch with none in flight (launches at opens off, the
// first bubble after a submit; not a full ring or the lookahead bound, where launches are
// in flight) is otherwise host-started through two sleeping threads in series: the
// watcher wakes from its event and rings, the executor wakes from the bell and launches (266 us median on an H200, 20-150 us a wake-up). With
// this the watcher launches, then rings: one wake-up. The executor is unchanged: its run()
// finds the launch in flight and takes its end.
//
// The watcher launches only where the executor's run() would launch at that moment (its
// own launch, admitted on the gate's mirror), so the launch is the one run() would have
// made, a wake-up earlier; anything else stays with the executor.
#pragma once

namespace freeride {

struct ReachedOpen {
  bool enabled = false;    // FREERIDE_WATCHER_LAUNCH, rings on, not stream_wait
  bool pending = false;    // a launch of the runner is enqueued and its end not taken: the
                           // common case, where the open carried one (or the executor's is
                           // in flight); run() takes that one's end instead
  bool accepting = false;  // the runner takes a launch of its phase now (begun, phase not
                           // done, no error, the ring not full, not shut down)
  bool stopping = false;   // a stop is requested, or the runner is abandoned
  bool gate_open = false;  // the gate's mirror reads open...
  bool same_open = false;  // ...under this open's sequence number: not a later close and
                           // open (whose own event comes next), nor an immediate one
  bool skipped = false;    // the open was written without a launch on purpose (too short
                           // for one: SkippedOpens), which the executor stays out of too
  bool others_pending = false;  // another runner's launch is enqueued on the same stream,
                                // its end not taken (a task being drained or retired while
                                // this one is armed, whose launches may wait for later
                                // opens): a launch now would queue behind them, into a
                                // later bubble. (Stricter than run(), which may launch
                                // behind a follower's launch: that one waits for no open
                                // after this one.)
};

inline bool watcher_launches(const ReachedOpen& o) {
  return o.enabled && !o.pending && o.accepting && !o.stopping && o.gate_open && o.same_open &&
         !o.skipped && !o.others_pending;
}

}  // namespace freeride
