// CUDA graph capture, as seen from freeride's Python layer: whether a stream a caller
// hands over is being captured, and a thread's capture mode.
#pragma once

#include <cstdint>

namespace freeride {

// True while `stream` (a cudaStream_t handle; 0, 1 and 2 are the legacy and per-thread
// default streams of `device`) is being captured into a CUDA graph, including a capture
// already invalidated but not yet ended, and for the legacy default stream while another
// blocking stream of the device captures (enqueuing there would join that capture).
// Throws RuntimeFailure for any other CUDA error, and in builds without CUDA.
bool stream_is_capturing(uintptr_t stream, int device);

// Puts the calling thread into cudaStreamCaptureModeRelaxed, so that its syncs, event
// queries and allocations do not invalidate a capture another thread runs in the default
// global mode. True where the mode is now relaxed; false in builds without CUDA or where
// the runtime refused (no driver), which leaves the thread as it was.
bool relax_capture_mode();

// Relaxed capture mode on the calling thread for the scope's lifetime, then the thread's
// mode as it was: around freeride's own queries, records and allocations, which any thread
// may reach (a training thread's gate write, a job thread's bubble_stats(), a submit), so
// that none of them invalidates a capture in global mode on another thread. The mode is
// thread-local and the exchange costs no driver round trip. A no-op in builds without CUDA.
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope() noexcept;
  ~RelaxedCaptureScope();
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  int previous_ = -1;  // the thread's cudaStreamCaptureMode before; -1: not exchanged
};

}  // namespace freeride
