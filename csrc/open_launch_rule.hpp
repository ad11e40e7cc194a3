// Whether an open's launch is left out because it would wait behind another training
// stream's open (review G11). Launches at opens go on one side stream, in order, each
// after its own open: behind the newest, still waiting for an open on another stream that
// the GPU has not reached, this one would wait for that stream too, however far behind
// it runs (`h.bubble(stream=...)` on several streams, several training threads). The
// integrations write the gate on one stream and never meet it. Such an open gets no
// launch and is counted (Harvester.launch_counts().skipped_at_opens): stream-ordered gate
// writes are meant to come from one stream (the gate is one word), and where they do not,
// a lagging stream costs the others' bubbles their launches instead of holding them.
#pragma once

namespace freeride {

inline bool waits_behind_another_stream(bool newest_at_open, bool newest_begun,
                                        bool same_stream) {
  return newest_at_open && !newest_begun && !same_stream;
}

// Whether an open's launch is left out because the executor's own launch for the same open
// is already on the side stream: under FREERIDE_ADMISSION=spin or poll (or in the ring's
// first looks) the executor may see the open take effect, where the GPU had caught up
// with the host, before the training thread that wrote it enqueues the launch at it. That
// launch serves the bubble. One at the open behind it would wait for it on the stream,
// and it ends only with this bubble's close, which training enqueues after the open's
// launch: under one hardware queue (or any shared with training) the waiting launch would
// hold training's work, that close included, for the slice bound, or for good with
// time_slice=None. Such a launch is counted (Harvester.launch_counts().served_by_executor).
// `newest_holds`: that launch may run until the bubble's close (it has not ended, and no
// stop its runner enqueued is ahead of this launch: a stopped launch leaves at its next
// claim, and one behind it waits an item at most). `newest_seq`: the open it was
// enqueued at or seen under; 0 (no open known) serves nothing.
inline bool served_by_executor(bool newest_at_open, bool newest_holds, unsigned int newest_seq,
                               unsigned int seq) {
  return !newest_at_open && newest_holds && newest_seq != 0u && newest_seq == seq;
}

// The lookahead bound (issue 36, review G2): whether an open may carry a launch while
// `opens_ahead` launches enqueued at earlier opens wait for theirs (not begun). Each waits
// on the side stream for a future open, and under shared hardware queues (the default
// eight) a stream sharing the side stream's may be held behind that wait until training
// reaches the open; the bound keeps such a hold to the next `bound` bubbles. An open past
// it carries no launch (counted, Harvester.launch_counts().beyond_lookahead); the
// executor's own launch serves its bubble where the gate reads open with none in flight.
// `bound` 0: no bound (FREERIDE_MAX_LOOKAHEAD, unset or 0: the default, since the H200
// run of 2026-11-27 saw no other stream held, 0 of 24, under either reserve).
inline bool within_lookahead(unsigned long long opens_ahead, unsigned long long bound) {
  return bound == 0 || opens_ahead < bound;
}

}  // namespace freeride
