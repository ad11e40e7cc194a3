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

}  // namespace freeride
