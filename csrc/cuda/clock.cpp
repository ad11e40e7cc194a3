// CudaShared's clock anchor: %globaltimer, the clock kernels read and end records carry,
// placed on the marks' event timeline, so that a launch's marks are where its first block
// began and its last block left (see shared.hpp); and a mark placed on the wall clock by
// watching an anchor's stamp land (mark_unix_ns).
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "capture_mode.hpp"
#include "cuda/shared.hpp"
#include "doorbell.hpp"
#include "launchers.hpp"

namespace freeride::cuda {

namespace {

// How long mark_unix_ns waits past its deadline for the events around a stamp it saw.
constexpr std::chrono::milliseconds kStampSettle{10};

int64_t ms_to_ns(float ms) { return static_cast<int64_t>(static_cast<double>(ms) * 1e6); }

int64_t unix_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// cudaEventQuery, its not-ready answer cleared from the thread's last error (not sticky,
// but it must not surface as a launch's error).
cudaError_t query(cudaEvent_t ev) {
  const cudaError_t err = cudaEventQuery(ev);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

unsigned long long read_stamp(const CudaShared& s) {
  return std::atomic_ref<unsigned long long>(
             *reinterpret_cast<unsigned long long*>(s.clock_slot.host))
      .load();
}

// The anchor a mark_unix_ns call watches. Each of its events is held by a derived mark
// (release_locked keeps a mark while any stands on it): the executor thread's
// launch_marks may adopt or drop the anchor while the watcher spins without the lock,
// and would otherwise free (and reuse) the events the watcher then times against.
struct StampWatch {
  uint64_t before = 0;
  uint64_t after = 0;
  uint64_t holds[2] = {0, 0};
};

StampWatch watch_pending_locked(CudaShared& s) {
  StampWatch w{s.pending_anchor.before, s.pending_anchor.after};
  w.holds[0] = s.derive_locked(w.before, 0);
  w.holds[1] = s.derive_locked(w.after, 0);
  ++s.stamp_watchers;
  return w;
}

void unwatch_locked(CudaShared& s, StampWatch& w) noexcept {
  for (uint64_t& hold : w.holds) {
    if (hold != 0) s.release_locked(hold);
    hold = 0;
  }
  --s.stamp_watchers;
}

}  // namespace

void CudaShared::enqueue_anchor_locked() {
  auto* stamp = reinterpret_cast<unsigned long long*>(clock_slot.host);
  std::atomic_ref<unsigned long long>(*stamp).store(0);
  PendingAnchor made;
  made.before = mark_locked(control);
  try {
    kernels::launch_clock_stamp(reinterpret_cast<unsigned long long*>(clock_slot.dev), control);
    made.after = mark_locked(control);
  } catch (...) {
    release_locked(made.before);
    throw;
  }
  pending_anchor = made;
}

bool CudaShared::adopt_anchor_locked() {
  if (pending_anchor.before == 0) return false;
  cudaEvent_t before = marks.at(pending_anchor.before);
  cudaEvent_t after = marks.at(pending_anchor.after);
  float ms = 0.f;
  const cudaError_t err = cudaEventElapsedTime(&ms, before, after);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  const uint64_t stamp = std::atomic_ref<unsigned long long>(
                             *reinterpret_cast<unsigned long long*>(clock_slot.host))
                             .load();
  const PendingAnchor done = pending_anchor;
  pending_anchor = PendingAnchor{};
  release_locked(done.after);
  const auto bracket_ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  // The first anchor is taken whatever its bracket (better than none); a later one only
  // where its events were close (the stamp kernel found an SM at once).
  const bool take = err == cudaSuccess && stamp != 0 &&
                    (anchor.mark == 0 || bracket_ns <= kAnchorBracketNs);
  if (err != cudaSuccess) (void)cudaGetLastError();
  if (!take) {
    release_locked(done.before);
    return false;
  }
  const uint64_t old = anchor.mark;
  anchor = ClockAnchor{done.before, stamp, bracket_ns / 2};
  if (old != 0) release_locked(old);  // freed now, or with the last mark standing on it
  return true;
}

void CudaShared::anchor_clock() {
  const RelaxedCaptureScope relaxed;
  std::lock_guard<std::mutex> lk(marks_mu);
  enqueue_anchor_locked();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!adopt_anchor_locked() && pending_anchor.before != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::pair<uint64_t, uint64_t> CudaShared::launch_marks(uint64_t start_ns, uint64_t end_ns) {
  const RelaxedCaptureScope relaxed;
  std::lock_guard<std::mutex> lk(marks_mu);
  (void)adopt_anchor_locked();
  if (anchor.mark == 0) return {0, 0};
  const int64_t since = static_cast<int64_t>(start_ns - anchor.timer_ns);
  // Not while a mark_unix_ns watches the stamp word: a new anchor would clear it.
  if ((since > kReanchorNs || since < -kReanchorNs) && pending_anchor.before == 0 &&
      stamp_watchers == 0) {
    try {
      enqueue_anchor_locked();
    } catch (...) {
      (void)cudaGetLastError();  // the old anchor serves on
    }
  }
  const uint64_t base = anchor.mark;
  const int64_t from = anchor.offset_ns + since;
  const int64_t to = from + static_cast<int64_t>(end_ns - start_ns);
  return {derive_locked(base, from), derive_locked(base, to)};
}

int64_t CudaShared::mark_unix_ns(uint64_t id, double timeout_s) {
  using std::chrono::steady_clock;
  using std::chrono::system_clock;
  const RelaxedCaptureScope relaxed;
  const auto deadline = steady_clock::now() + clamp_timeout(timeout_s);
  const auto event_of = [&](uint64_t mark) {
    auto it = marks.find(resolve_locked(mark).first);
    FR_ARG(it != marks.end(), "unknown mark " << mark);
    return it->second;
  };
  const auto pause = [] { std::this_thread::sleep_for(std::chrono::microseconds(20)); };

  // 1. An anchor whose stamp has not landed yet, and whose `before` the mark precedes on
  // the device: so that the mark's distance to it is asked of cudaEventElapsedTime in
  // the order the events completed (the documentation does not say what the reverse
  // order gives). Ours, enqueued once the mark has passed; or the re-anchor launch_marks
  // has in flight, where `before` has not completed yet (checked after the mark: so it
  // completes after it) and its stamp word still reads zero (so this thread sees the
  // store land). Never a new one over a stamp another watcher watches.
  StampWatch w;
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(marks_mu);
      const cudaError_t passed = query(event_of(id));
      if (passed != cudaSuccess && passed != cudaErrorNotReady) return kPending;
      if (passed == cudaSuccess) {
        (void)adopt_anchor_locked();
        if (pending_anchor.before == 0 && stamp_watchers == 0) {
          try {
            enqueue_anchor_locked();
          } catch (const RuntimeFailure&) {
            (void)cudaGetLastError();
            return kPending;  // the caller has its fallback; launch_marks' anchor stands
          }
          w = watch_pending_locked(*this);
          break;
        }
        if (pending_anchor.before != 0 &&
            query(marks.at(pending_anchor.before)) == cudaErrorNotReady &&
            read_stamp(*this) == 0) {
          w = watch_pending_locked(*this);
          break;
        }
      }
    }
    if (steady_clock::now() >= deadline) return kPending;
    pause();
  }

  // 2. The stamp kernel's store reaches the mapped host word about a microsecond after
  // it ran (it fences with __threadfence_system), however long the stamp queued behind
  // other work first (one hardware queue: all of training's backlog). Spinning without
  // the lock, so that launch_marks goes on meanwhile; yielding, so that the training
  // thread keeps its core on a busy host. The store landed between the last read of zero
  // and the first nonzero read: their midpoint, on the system clock.
  auto zero_seen = system_clock::now();  // the word read zero just before (step 1)
  int64_t seen_ns = 0;
  for (;;) {
    const unsigned long long stamp = read_stamp(*this);
    const auto now = system_clock::now();
    if (stamp != 0) {
      seen_ns = unix_ns(zero_seen) + (unix_ns(now) - unix_ns(zero_seen)) / 2;
      break;
    }
    zero_seen = now;
    if (steady_clock::now() >= deadline) break;
    std::this_thread::yield();
  }

  // 3. The stamp is half the anchor's bracket after `before` (as adopt_anchor_locked
  // places it, at most that far off); the mark is the events' distance before that. The
  // anchor is then adopted or dropped by adopt_anchor_locked's own rule: a better one
  // replaces launch_marks' anchor, a worse one leaves it as it was. A stamp seen just
  // before the deadline is still worth the microseconds its `after` event takes.
  const auto settle_by = std::max(deadline, steady_clock::now() + kStampSettle);
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(marks_mu);
      if (seen_ns == 0) {
        unwatch_locked(*this, w);
        return kPending;
      }
      const auto at = resolve_locked(id);
      auto m = marks.find(at.first);
      if (m == marks.end()) {
        unwatch_locked(*this, w);
        FR_ARG(false, "mark " << id << " was released while its Unix time was asked for");
      }
      float bracket_ms = 0.f;
      float since_ms = 0.f;
      cudaError_t err = cudaEventElapsedTime(&bracket_ms, marks.at(w.before), marks.at(w.after));
      if (err == cudaSuccess) err = cudaEventElapsedTime(&since_ms, m->second, marks.at(w.before));
      if (err != cudaSuccess) (void)cudaGetLastError();
      if (err != cudaErrorNotReady) {
        (void)adopt_anchor_locked();
        unwatch_locked(*this, w);
        if (err != cudaSuccess) return kPending;
        const int64_t before_unix = seen_ns - ms_to_ns(bracket_ms) / 2;
        return before_unix - ms_to_ns(since_ms) + at.second;
      }
      if (steady_clock::now() >= settle_by) {
        unwatch_locked(*this, w);
        return kPending;
      }
    }
    pause();
  }
}

}  // namespace freeride::cuda
