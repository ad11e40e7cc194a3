// CudaShared's methods that need not be inline: its lifetime, gate writes and marks
// (shared.hpp has the state and the reasons; green_context.cpp its green context).
#include "cuda/shared.hpp"

#include "capture_mode.hpp"
#include "test_switches.hpp"

#include <algorithm>
#include <thread>

namespace freeride::cuda {

CudaShared::~CudaShared() {
  // A backend whose constructor refused its arguments (an unknown gate write or reserve
  // mechanism, a device that does not exist) made nothing, and has no device yet:
  // cudaSetDevice(-1) would leave cudaErrorInvalidDevice as the thread's last error,
  // for the next launch checked on it (run_plain, a kernel gate write) to report.
  if (device < 0) return;
  try {
    DeviceGuard guard(device);
    if (held()) {
      // Never reclaimed: launches may still be queued. Streams are destroyed lazily by
      // the driver once their work is done (cudaStreamDestroy); the green context and
      // the slabs are leaked (free_pools does nothing while held).
      green_side = nullptr;
      green = nullptr;
    }
    destroy_streams();
    free_pools();
  } catch (...) {
    // Destructors never throw; at process exit the runtime may already be gone.
    (void)cudaGetLastError();
  }
}

void CudaShared::destroy_streams() noexcept {
  if (side != nullptr) (void)cudaStreamDestroy(side);
  if (control != nullptr) (void)cudaStreamDestroy(control);
  side = nullptr;
  control = nullptr;
  destroy_green();
  streams_destroyed = true;
  (void)cudaGetLastError();
}

void CudaShared::hold_for_launches_left() noexcept {
  std::lock_guard<std::mutex> lk(pool_mu);
  states.hold();
  words.hold();
}

bool CudaShared::reclaim() noexcept {
  {
    std::lock_guard<std::mutex> lk(pool_mu);
    if (!held()) return true;
  }
  const RelaxedCaptureScope relaxed;  // beside a capture on another thread
  for (cudaStream_t stream : {side, green_side, control}) {
    // One look, no wait. Any error but "not ready" is the context's own (a kernel that
    // faulted): nothing on it runs any more, and what it held may go.
    if (stream != nullptr && wait_idle(stream, std::chrono::seconds(0)) == cudaErrorNotReady) {
      return false;
    }
  }
  destroy_streams();
  std::lock_guard<std::mutex> lk(pool_mu);
  states.release_held();
  words.release_held();
  return true;
}

void CudaShared::destroy_green() noexcept {
  const cuda_driver::Api& a = cuda_driver::api();
  if (green_side != nullptr) (void)a.stream_destroy(reinterpret_cast<CUstream>(green_side));
  if (green != nullptr) (void)a.green_ctx_destroy(green);
  green_side = nullptr;
  green = nullptr;
}

void CudaShared::enqueue_write(unsigned int* word, uint32_t value, cudaStream_t stream,
                               cuda_driver::GateWrite how) const {
  if (how == cuda_driver::GateWrite::kMemop) {
    const CUresult res = cuda_driver::api().stream_write_value32(
        stream, cuda_driver::device_ptr(word), value, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (res != CUDA_SUCCESS) {
      cuda_driver::throw_driver_error(res, "cuStreamWriteValue32", __FILE__, __LINE__);
    }
    return;
  }
  // Copy from pinned constants. A copy needs no SM, while a write kernel could not start
  // until a full-occupancy side kernel drains, which would turn the pause latency into
  // the rest of the phase. cudaMemcpyDefault: the word may be device memory or mapped
  // host memory (a mirror or a host gate). Sequence numbers have no constant to copy
  // from: they take the kernel.
  if (how == cuda_driver::GateWrite::kCopy &&
      (value == FREERIDE_GATE_OPEN || value == FREERIDE_GATE_CLOSED)) {
    const cudaError_t err = cudaMemcpyAsync(word, gate_constants() + value, sizeof(unsigned int),
                                            cudaMemcpyDefault, stream);
    if (err != cudaSuccess) throw_cuda(err, "cudaMemcpyAsync (gate write)", __FILE__, __LINE__);
    return;
  }
  kernels::launch_gate_write(word, value, stream);
}

cudaError_t CudaShared::wait_idle(cudaStream_t stream, std::chrono::steady_clock::duration within) {
  if (test_switches::streams_never_idle()) return cudaErrorNotReady;
  const auto begun = std::chrono::steady_clock::now();
  while (true) {
    const cudaError_t err = cudaStreamQuery(stream);
    if (err != cudaErrorNotReady) {
      if (err != cudaSuccess && cudaPeekAtLastError() == err) (void)cudaGetLastError();
      return err;
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    const auto waited = std::chrono::steady_clock::now() - begun;
    if (waited >= within) return cudaErrorNotReady;
    if (waited < std::chrono::microseconds(50)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

void CudaShared::finish_on_control(const char* what) {
  const RelaxedCaptureScope relaxed;  // beside a capture on another thread
  const cudaError_t err = wait_idle(control, kImmediateWriteWait);
  if (err == cudaErrorNotReady) {
    FR_THROW(RuntimeFailure,
             what << " did not take effect within " << kImmediateWriteWait.count()
                  << " s: the control stream waits behind work queued before it (with "
                     "CUDA_DEVICE_MAX_CONNECTIONS=1 every stream's, training's included), and "
                     "that work has not finished; the write is still enqueued");
  }
  if (err != cudaSuccess) throw_cuda(err, what, __FILE__, __LINE__);
}

void CudaShared::write_now(unsigned int* word, uint32_t value) {
  if (memops) {
    enqueue_write(word, value, control, cuda_driver::GateWrite::kMemop);
    finish_on_control("an immediate write");
    return;
  }
  // Fallback: a copy rather than the write kernel, for the SM reason above.
  std::lock_guard<std::mutex> lk(staging_mu);
  auto* src = reinterpret_cast<unsigned int*>(staging.host);
  *src = value;
  FR_CUDA_CHECK(cudaMemcpyAsync(word, src, sizeof(unsigned int), cudaMemcpyHostToDevice, control));
  finish_on_control("an immediate write");
}

void CudaShared::enqueue_gate_write(uint32_t value, cudaStream_t stream, uint32_t seq,
                                    uint32_t ordinal) const {
  if (gate_write == cuda_driver::GateWrite::kBatch) {
    const CUresult res = enqueue_gate_batch(value, stream, seq, ordinal);
    if (res != CUDA_SUCCESS) {
      cuda_driver::throw_driver_error(res, "cuStreamBatchMemOp (gate write)", __FILE__, __LINE__);
    }
    return;
  }
  if (value == FREERIDE_GATE_OPEN) enqueue_write(gate.mirror_dev + kMirrorSeq, seq, stream, gate_write);
  enqueue_write(gate.dev, value, stream, gate_write);
  if (!host_gate) enqueue_write(gate.mirror_dev, value, stream, gate_write);
  if (value != FREERIDE_GATE_OPEN) enqueue_write(gate.mirror_dev + kMirrorSeq, seq, stream, gate_write);
  if (ordinal != 0u) {
    enqueue_write(close_slots() + CloseLedger::slot(ordinal), ordinal, stream, gate_write);
  }
}

CUresult CudaShared::enqueue_gate_batch(uint32_t value, cudaStream_t stream, uint32_t seq,
                                        uint32_t ordinal) const {
  CUstreamBatchMemOpParams ops[4];
  unsigned int count = 0;
  auto add = [&](unsigned int* word, uint32_t v) {
    ops[count++] = cuda_driver::write_value_op(word, v);
  };
  const bool open = value == FREERIDE_GATE_OPEN;
  if (open) add(gate.mirror_dev + kMirrorSeq, seq);
  add(gate.dev, value);
  if (!host_gate) add(gate.mirror_dev, value);
  if (!open) add(gate.mirror_dev + kMirrorSeq, seq);
  if (ordinal != 0u) add(close_slots() + CloseLedger::slot(ordinal), ordinal);
  return cuda_driver::api().stream_batch_mem_op(stream, count, ops, 0);
}

void CudaShared::clear_close_slots() {
  closes.place(gate.mirror + kMirrorCloses);
  if (host_gate) {  // the gate's line is the mirror's: its host view
    for (unsigned int i = 0; i < FREERIDE_CLOSE_SLOTS; ++i) {
      std::atomic_ref<unsigned int>(gate.mirror[kCloseSlots + i]).store(0u);
    }
    return;
  }
  // A copy from the pinned zeros: no SM, and no memory operation the driver may refuse.
  FR_CUDA_CHECK(cudaMemcpyAsync(close_slots(), zeros.host, FREERIDE_CLOSE_SLOTS * sizeof(unsigned int),
                                cudaMemcpyHostToDevice, control));
  finish_on_control("clearing the close slots");
}

bool CudaShared::try_batch() {
  if (cuda_driver::api().stream_batch_mem_op == nullptr) return false;
  const CUresult res = enqueue_gate_batch(FREERIDE_GATE_OPEN, control, mirror_seq());
  FR_CUDA_CHECK(cudaStreamSynchronize(control));
  return res == CUDA_SUCCESS;
}

void CudaShared::write_gate_now(uint32_t value, uint32_t seq) {
  const bool open = value == FREERIDE_GATE_OPEN;
  if (open) open_ordinals.note(seq, closes.next());
  try {
    if (!host_gate && !stream_wait && gate_write == cuda_driver::GateWrite::kBatch) {
      const CUresult res = enqueue_gate_batch(value, control, seq);
      if (res != CUDA_SUCCESS) {
        cuda_driver::throw_driver_error(res, "cuStreamBatchMemOp (immediate gate write)",
                                        __FILE__, __LINE__);
      }
      finish_on_control("an immediate gate write");
      if (open) gate.bell->ring();
      return;
    }
    if (open) std::atomic_ref<unsigned int>(gate.mirror[kMirrorSeq]).store(seq);
    if (open && stream_wait) std::atomic_ref<unsigned int>(*gate.mirror).store(value);
    if (!host_gate) write_now(gate.dev, value);
    std::atomic_ref<unsigned int>(*gate.mirror).store(value);
    if (!open) std::atomic_ref<unsigned int>(gate.mirror[kMirrorSeq]).store(seq);
    if (open) gate.bell->ring();
  } catch (...) {
    // An open that failed may still take effect (a batch enqueued before its wait timed
    // out; under stream_wait, the mirror stored open before the device write): nothing
    // would ring for it.
    if (open) {
      unrung.note_unrung();
      gate.bell->ring();
    }
    throw;
  }
}

void CudaShared::ring_and_launch(cudaStream_t stream, uint32_t seq, bool launch) noexcept {
  if (launch) test_switches::delay_open_launch();
  if (watcher == nullptr) {
    if (launch) launch_at_open(stream, seq, nullptr);
    return;
  }
  bool rings = false;
  if (!launch) {
    rings = watcher->ring_after(stream, gate.bell, seq);
  } else {
    // The launch is enqueued before the watcher's thread may wait for the event, and so
    // before that thread can hand it to another open's record: the launch's stream wait
    // takes this open's record.
    rings = watcher->ring_after(stream, gate.bell, seq, [&](void* event) {
      launch_at_open(stream, seq, static_cast<cudaEvent_t>(event));
    });
  }
  if (!rings && unrung.note_unrung()) gate.bell->ring();
}

void CudaShared::launch_at_reached(uint32_t seq) noexcept {
  // Shared: shutdown, which drops the runners' streams, waits for this call; and this call
  // never waits for shutdown's end, which does not wait for the watcher's thread. No
  // RelaxedCaptureScope: that thread is in relaxed capture mode for good (its start).
  std::shared_lock<std::shared_mutex> lk(life);
  if (shut_down) return;
  std::lock_guard<std::mutex> alk(arm_mu);
  if (armed == nullptr) return;
  const bool others_pending =
      std::any_of(launchers.begin(), launchers.end(), [&](const OpenLauncher* other) {
        return other != armed && other->pending_on(armed->launch_stream());
      });
  if (armed->launch_at_reached_open(seq, others_pending)) watcher_launches.fetch_add(1);
}

bool CudaShared::captures(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err == cudaSuccess) return capture != cudaStreamCaptureStatusNone;
  // Not sticky, but it must not surface as the training thread's next launch error. The
  // legacy default stream while a blocking stream captures answers
  // cudaErrorStreamCaptureImplicit: enqueuing there would join that capture.
  (void)cudaGetLastError();
  return true;
}

void CudaShared::launch_at_open(cudaStream_t stream, uint32_t seq, cudaEvent_t recorded) noexcept {
  if (opened == nullptr) return;  // launches at opens off (set once, at construction)
  const RelaxedCaptureScope relaxed;  // beside a capture on another thread
  std::lock_guard<std::mutex> lk(arm_mu);
  auto context_for = [&](const OpenLauncher* runner) {
    OpenContext context;
    context.recorded = recorded != nullptr;
    for (const OpenLauncher* other : launchers) {
      if (other != runner) other->add_waiting_opens(context.others, runner->launch_stream());
    }
    return context;
  };
  const cudaEvent_t event = recorded != nullptr ? recorded : opened;
  bool took = false;
  if (armed != nullptr) took = armed->launch_at_open(stream, event, seq, context_for(armed));
  if (follower != nullptr) {
    // Behind the armed runner's launch on the one stream: it begins once that one left.
    OpenContext context = context_for(follower);
    context.chained = took;
    follower->launch_at_open(stream, event, seq, context);
  }
}

uint64_t CudaShared::mark(cudaStream_t stream) {
  const RelaxedCaptureScope relaxed;  // beside a capture on another thread
  std::lock_guard<std::mutex> lk(marks_mu);
  return mark_locked(stream);
}

uint64_t CudaShared::mark_locked(cudaStream_t stream) {
  cudaEvent_t ev = nullptr;
  if (free_events.empty()) {
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDefault));
  } else {
    ev = free_events.back();
    free_events.pop_back();
  }
  const cudaError_t err = cudaEventRecord(ev, stream);
  if (err != cudaSuccess) {
    free_events.push_back(ev);
    throw_cuda(err, "cudaEventRecord (mark)", __FILE__, __LINE__);
  }
  const uint64_t id = next_mark++;
  marks.emplace(id, ev);
  return id;
}

uint64_t CudaShared::derive_locked(uint64_t base, int64_t offset_ns) {
  const uint64_t id = next_mark++;
  derived.emplace(id, std::make_pair(base, offset_ns));
  ++bases[base];
  return id;
}

int64_t CudaShared::elapsed_ns(uint64_t from_id, uint64_t to_id) {
  const RelaxedCaptureScope relaxed;  // beside a capture on another thread
  std::lock_guard<std::mutex> lk(marks_mu);
  const auto [from, from_ns] = resolve_locked(from_id);
  const auto [to, to_ns] = resolve_locked(to_id);
  auto a = marks.find(from);
  auto b = marks.find(to);
  FR_ARG(a != marks.end() && b != marks.end(), "unknown mark " << from_id << " or " << to_id);
  float ms = 0.f;
  const cudaError_t err = cudaEventElapsedTime(&ms, a->second, b->second);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not sticky, but must not surface as a launch's error
    return kPending;
  }
  if (err != cudaSuccess) throw_cuda(err, "cudaEventElapsedTime", __FILE__, __LINE__);
  return static_cast<int64_t>(static_cast<double>(ms) * 1e6) + (to_ns - from_ns);
}

void CudaShared::release_mark(uint64_t id) noexcept {
  std::lock_guard<std::mutex> lk(marks_mu);
  release_locked(id);
}

void CudaShared::release_locked(uint64_t id) noexcept {
  auto d = derived.find(id);
  if (d != derived.end()) {
    const uint64_t base = d->second.first;
    derived.erase(d);
    auto b = bases.find(base);
    if (b != bases.end() && --b->second == 0) {
      bases.erase(b);
      // An anchor no longer current: it went on for the marks standing on it.
      if (base != anchor.mark && base != pending_anchor.before && base != pending_anchor.after) {
        release_locked(base);
      }
    }
    return;
  }
  // Derived marks still stand on it: it is released with the last of them.
  if (bases.count(id) != 0 || id == anchor.mark || id == pending_anchor.before ||
      id == pending_anchor.after) {
    return;
  }
  auto it = marks.find(id);
  if (it == marks.end()) return;
  free_events.push_back(it->second);
  marks.erase(it);
}

void CudaShared::destroy_events() noexcept {
  std::lock_guard<std::mutex> lk(marks_mu);
  for (auto& [id, ev] : marks) (void)cudaEventDestroy(ev);
  for (cudaEvent_t ev : free_events) (void)cudaEventDestroy(ev);
  marks.clear();
  derived.clear();
  bases.clear();
  anchor = ClockAnchor{};
  pending_anchor = PendingAnchor{};
  free_events.clear();
  (void)cudaGetLastError();
}

}  // namespace freeride::cuda
