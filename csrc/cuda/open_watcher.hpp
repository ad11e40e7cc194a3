// Rings a Doorbell once the GPU reaches a point of a stream, without putting anything
// that blocks into any stream: the CUDA backend marks every stream-ordered gate open this
// way, so that its executor thread can sleep while the gate is closed.
//
// A host function (cudaLaunchHostFunc) behind the open would do the same, but it holds
// the work queued behind it on its hardware queue until a driver thread has run it, and
// streams share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default, 1 under
// Megatron-LM): the training stream could wait for every ring. Here the training stream
// only records an event; the watcher's thread waits for those events in order
// (blocking-sync events: it sleeps in the driver) and rings.
//
// The queue, the thread and what happens at the process's exit are compiled into every
// build; only the events are CUDA's (WatcherEvents), so tests drive the rest with fakes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#include "admission_stamps.hpp"
#include "doorbell.hpp"

namespace freeride {

// What the watcher does with its events. The CUDA backend's are blocking-sync runtime
// events waited for in the driver (cuEventSynchronize); tests give fakes.
struct WatcherEvents {
  void (*start_thread)(int device);               // on the watcher's thread, first
  bool (*make)(void** event, std::string* why);   // false: none made, *why says why
  bool (*record)(void* event, void* stream);      // false: not recorded (error cleared)
  void (*wait)(void* event);  // until the stream reached it (or the wait failed)
  void (*destroy)(void* event);
};

class OpenWatcher {
 public:
#ifdef FREERIDE_WITH_CUDA
  // With CUDA events; `device` must be current on the calling thread (events are made
  // there). Throws where the driver lacks cuEventSynchronize.
  explicit OpenWatcher(int device, std::shared_ptr<AdmissionStamper> stamps = nullptr);
#endif
  // Starts the thread (returns once it runs). One watcher per backend: its events come
  // from that harvester's training streams, which reach them in order, so the first in
  // the queue is the first done. (Opens written from two threads on two streams may be
  // queued out of the order the GPU reaches them, more so where ring_after's `then`
  // takes long: the later ring waits for the earlier open in the queue. Stream-ordered
  // gate writes come from one stream, docs/design.md; once opens came from two, the
  // executor also looks at the mirror by itself every kAdmissionPoll: UnrungOpens.)
  // `stamps`, where given, gets reached(seq) as each wait returns, before the hook and the
  // ring (shared: the thread may outlive the watcher).
  OpenWatcher(int device, const WatcherEvents& events,
              std::shared_ptr<AdmissionStamper> stamps = nullptr);
  // Never blocks: the thread ends by itself once it has waited for every event queued
  // (it may wait forever for a stream that never gets there, a rank whose peer died; its
  // state lives as long as it does).
  ~OpenWatcher();
  OpenWatcher(const OpenWatcher&) = delete;
  OpenWatcher& operator=(const OpenWatcher&) = delete;

  // Records an event on `stream` (a cudaStream_t; the caller's current device must be the
  // watcher's) and rings `bell` once the GPU has reached it. Never blocks on the GPU
  // (but for what `then` does).
  // False where no ring will come: the event could not be recorded (the thread's CUDA
  // error is cleared), or kMaxPending events are already waiting (a stream far behind, or
  // stuck). `bell` must outlive the watcher's thread (the gates' bells are never freed).
  // `seq` is the open's sequence number, handed to the hook below.
  //
  // `then`, where given, is called once with the event just recorded (null where none
  // was), before the watcher's thread can see it: until it returns, nothing records that
  // event again, so work that must follow the same point of `stream` can wait for it
  // (cudaStreamWaitEvent takes the record made before it) instead of recording one of
  // its own. The ring waits for it to return: it must be short (a launch's enqueue
  // blocks only where the driver's launch queue is full, as training's own do).
  struct AfterRecord {
    void (*call)(void* context, void* event);  // null: nothing to call
    void* context;
  };
  bool ring_after(void* stream, Doorbell* bell, uint32_t seq = 0,
                  AfterRecord then = {nullptr, nullptr}) noexcept;
  template <typename Then>
    requires(!std::is_same_v<std::decay_t<Then>, AfterRecord>)
  bool ring_after(void* stream, Doorbell* bell, uint32_t seq, Then&& then) noexcept {
    using Fn = std::remove_reference_t<Then>;
    return ring_after(stream, bell, seq,
                      AfterRecord{[](void* f, void* event) { (*static_cast<Fn*>(f))(event); },
                               const_cast<void*>(static_cast<const void*>(&then))});
  }

  // Called on the watcher's thread with an event's `seq` once the GPU has reached it,
  // just before its bell rings: so that work the open makes due (the CUDA backend's
  // launch, FREERIDE_WATCHER_LAUNCH) is enqueued after one thread's wake-up, not after
  // this thread's and then the one the bell wakes. Not called once the watcher is
  // retired (an event may still be waited for then: the hook must cope with a call that
  // began just before), nor at the process's exit; an exception from it is dropped. Set
  // before the first ring_after, at most once. It runs with nothing of the watcher's
  // held, and the next event's wait begins only once it returns: it must be short, and
  // must not wait for the GPU.
  using Reached = std::function<void(uint32_t seq)>;
  void on_reached(Reached hook);

  static constexpr size_t kMaxPending = 1024;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace freeride
