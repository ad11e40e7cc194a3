#include "builtin_tasks.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>

#include "check.hpp"
#include "image_ops.hpp"
#include "steady_clock.hpp"
#ifdef FREERIDE_WITH_CUDA
#include "launchers.hpp"
#endif

namespace freeride {
namespace {

#ifndef FREERIDE_WITH_CUDA
[[noreturn]] void no_cuda(const char* task) {
  FR_THROW(RuntimeFailure, task << ": this build of freeride has no CUDA support");
}
#endif

void spin_for(uint64_t ns) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// A task whose phases all have the same number of items.
class UniformTask : public Task {
 public:
  UniformTask(uint64_t items, uint64_t phases) : items_(items), phases_(phases) {
    FR_ARG(items > 0, "items must be positive, got " << items);
    FR_ARG(phases > 0, "phases must be positive, got " << phases);
    FR_ARG(items <= std::numeric_limits<uint64_t>::max() / phases,
           "items * phases overflows 64 bits");
  }
  uint64_t num_phases() const override { return phases_; }
  uint64_t num_items(uint64_t) const override { return items_; }

 protected:
  uint64_t items_;
  uint64_t phases_;
};

class SpinTask final : public UniformTask {
 public:
  SpinTask(uint64_t items, uint64_t phases, uint64_t ns, uint64_t slice_blocks)
      : UniformTask(items, phases), ns_(ns), slice_blocks_(slice_blocks) {}
  std::string name() const override { return "Spin"; }
  // The slicing baseline's blocks run one item each and ignore the gate by design.
  bool follows_item_protocol() const override { return slice_blocks_ == 0; }
  bool supports_device_phases() const override { return slice_blocks_ == 0; }
  void run_item(uint64_t, uint64_t) override { spin_for(ns_); }
  void launch_cuda(const CudaLaunch& launch) override {
#ifdef FREERIDE_WITH_CUDA
    if (slice_blocks_ > 0) {
      kernels::launch_spin_slice(launch, ns_, slice_blocks_);
    } else {
      kernels::launch_spin(launch, ns_);
    }
#else
    (void)launch;
    no_cuda("Spin");
#endif
  }

 private:
  uint64_t ns_;
  uint64_t slice_blocks_;
};

class SaxpyTask final : public UniformTask {
 public:
  SaxpyTask(double a, uintptr_t x, uintptr_t y, uint64_t n, uint64_t chunk, int dtype)
      : UniformTask(chunk == 0 ? 1 : (n + chunk - 1) / chunk, 1),
        a_(a), x_(x), y_(y), n_(n), chunk_(chunk), dtype_(dtype) {
    FR_ARG(n > 0, "n must be positive, got " << n);
    FR_ARG(chunk > 0, "chunk must be positive, got " << chunk);
    FR_ARG(dtype == 0 || dtype == 1, "dtype must be 0 (float32) or 1 (float64), got " << dtype);
    FR_ARG(x != 0 && y != 0, "x and y must not be null");
  }
  std::string name() const override { return "Saxpy"; }
  void run_item(uint64_t, uint64_t item) override {
    const uint64_t begin = item * chunk_;
    const uint64_t end = std::min(n_, begin + chunk_);
    if (dtype_ == 0) {
      axpy(static_cast<float>(a_), reinterpret_cast<const float*>(x_),
           reinterpret_cast<float*>(y_), begin, end);
    } else {
      axpy(a_, reinterpret_cast<const double*>(x_), reinterpret_cast<double*>(y_), begin, end);
    }
  }
  void launch_cuda(const CudaLaunch& launch) override {
#ifdef FREERIDE_WITH_CUDA
    kernels::launch_saxpy(launch, a_, reinterpret_cast<const void*>(x_),
                          reinterpret_cast<void*>(y_), n_, chunk_, dtype_);
#else
    (void)launch;
    no_cuda("Saxpy");
#endif
  }

 private:
  template <typename T>
  static void axpy(T a, const T* x, T* y, uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) y[i] += a * x[i];
  }
  double a_;
  uintptr_t x_, y_;
  uint64_t n_, chunk_;
  int dtype_;
};

class ItemCounterTask final : public UniformTask {
 public:
  ItemCounterTask(uint64_t items, uint64_t phases, uintptr_t counts, uintptr_t phase_done,
                  uintptr_t violations, uintptr_t times, uint64_t ns, int64_t fail_phase,
                  int64_t fail_item)
      : UniformTask(items, phases),
        counts_(reinterpret_cast<uint32_t*>(counts)),
        phase_done_(reinterpret_cast<uint64_t*>(phase_done)),
        violations_(reinterpret_cast<uint64_t*>(violations)),
        times_(reinterpret_cast<uint64_t*>(times)),
        ns_(ns),
        fail_phase_(fail_phase),
        fail_item_(fail_item) {
    FR_ARG(counts && phase_done && violations, "counter buffers must not be null");
  }
  std::string name() const override { return "ItemCounter"; }
  // Its kernel checks the phase order that device phases keep on the device.
  bool supports_device_phases() const override { return fail_phase_ < 0; }
  void run_item(uint64_t phase, uint64_t item) override {
    if (static_cast<int64_t>(phase) == fail_phase_ && static_cast<int64_t>(item) == fail_item_) {
      FR_THROW(RuntimeFailure, "injected failure at phase " << phase << ", item " << item);
    }
    const uint64_t slot = phase * items_ + item;
    if (times_ != nullptr) times_[2 * slot] = static_cast<uint64_t>(steady_now_ns());
    if (phase > 0 && std::atomic_ref<uint64_t>(phase_done_[phase - 1]).load() != items_) {
      std::atomic_ref<uint64_t>(*violations_).fetch_add(1);
    }
    std::atomic_ref<uint32_t>(counts_[slot]).fetch_add(1);
    if (ns_ > 0) spin_for(ns_);
    if (times_ != nullptr) times_[2 * slot + 1] = static_cast<uint64_t>(steady_now_ns());
    std::atomic_ref<uint64_t>(phase_done_[phase]).fetch_add(1);
  }
  void launch_cuda(const CudaLaunch& launch) override {
    // A device-side fault would take the whole CUDA context down with it.
    FR_CHECK(fail_phase_ < 0, "ItemCounter: injected failures run on the host backend only");
#ifdef FREERIDE_WITH_CUDA
    kernels::launch_item_counter(launch, counts_,
                                 reinterpret_cast<unsigned long long*>(phase_done_),
                                 reinterpret_cast<unsigned long long*>(violations_),
                                 reinterpret_cast<unsigned long long*>(times_), items_, ns_);
#else
    (void)launch;
    no_cuda("ItemCounter");
#endif
  }

 private:
  uint32_t* counts_;
  uint64_t* phase_done_;
  uint64_t* violations_;
  uint64_t* times_;
  uint64_t ns_;
  int64_t fail_phase_;
  int64_t fail_item_;
};

class PageRankTask final : public Task {
 public:
  PageRankTask(const PageRankBuffers& b, uint64_t iters, double damping, uint64_t per_item)
      : b_(b), iters_(iters), damping_(damping), per_item_(per_item) {
    FR_ARG(b.n > 0, "PageRank: the graph must have nodes");
    FR_ARG(iters > 0, "PageRank: iters must be positive, got " << iters);
    FR_ARG(damping >= 0.0 && damping <= 1.0, "PageRank: damping must be in [0, 1], got " << damping);
    FR_ARG(per_item > 0, "PageRank: nodes_per_item must be positive");
    FR_ARG(b.in_indptr && b.in_indices && b.inv_outdeg && b.rank_a && b.rank_b && b.contrib &&
               b.dangling,
           "PageRank: buffers must not be null");
    items_ = (b.n + per_item - 1) / per_item;
  }
  std::string name() const override { return "PageRank"; }
  // Its phases have as many items each, and its kernel of device phases takes both kinds.
  bool supports_device_phases() const override { return true; }
  uint64_t num_phases() const override { return 2 * iters_; }
  uint64_t num_items(uint64_t) const override { return items_; }

  void run_item(uint64_t phase, uint64_t item) override {
    const uint64_t k = phase / 2;
    const uint64_t begin = item * per_item_;
    const uint64_t end = std::min(b_.n, begin + per_item_);
    const double* rank = ptr<double>(k % 2 == 0 ? b_.rank_a : b_.rank_b);
    double* contrib = ptr<double>(b_.contrib);
    double* dangling = ptr<double>(b_.dangling);
    if (phase % 2 == 0) {
      const double* inv = ptr<double>(b_.inv_outdeg);
      double lost = 0.0;
      for (uint64_t u = begin; u < end; ++u) {
        contrib[u] = rank[u] * inv[u];
        if (inv[u] == 0.0) lost += rank[u];
      }
      if (lost != 0.0) std::atomic_ref<double>(dangling[k]).fetch_add(lost);
      return;
    }
    double* next = ptr<double>(k % 2 == 0 ? b_.rank_b : b_.rank_a);
    const int64_t* indptr = ptr<int64_t>(b_.in_indptr);
    const int64_t* indices = ptr<int64_t>(b_.in_indices);
    const double n = static_cast<double>(b_.n);
    const double base = (1.0 - damping_) / n + damping_ * dangling[k] / n;
    for (uint64_t v = begin; v < end; ++v) {
      double sum = 0.0;
      for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) sum += contrib[indices[e]];
      next[v] = base + damping_ * sum;
    }
  }

  void launch_cuda(const CudaLaunch& launch) override {
#ifdef FREERIDE_WITH_CUDA
    kernels::launch_pagerank(launch, b_, damping_, per_item_);
#else
    (void)launch;
    no_cuda("PageRank");
#endif
  }

 private:
  template <typename T>
  static T* ptr(uintptr_t p) {
    return reinterpret_cast<T*>(p);
  }
  PageRankBuffers b_;
  uint64_t iters_;
  double damping_;
  uint64_t per_item_;
  uint64_t items_ = 0;
};

// An image task's items: `rows` output rows of one plane each.
class ImageTask : public Task {
 public:
  ImageTask(const ImageShape& s, uint64_t rows) : s_(s), rows_(rows) {
    FR_ARG(s.planes > 0 && s.in_h > 0 && s.in_w > 0 && s.out_h > 0 && s.out_w > 0,
           "image sizes must be positive");
    FR_ARG(s.dtype == 0 || s.dtype == 1, "image dtype must be 0 (uint8) or 1 (float32)");
    FR_ARG(rows > 0, "rows_per_item must be positive");
    tiles_ = (s.out_h + rows - 1) / rows;
  }
  uint64_t num_items(uint64_t) const override { return s_.planes * tiles_; }

 protected:
  // Plane and output row range of an item.
  void rows_of(uint64_t item, uint64_t* plane, uint64_t* y0, uint64_t* y1) const {
    *plane = item / tiles_;
    *y0 = (item % tiles_) * rows_;
    *y1 = std::min(s_.out_h, *y0 + rows_);
  }
  ImageShape s_;
  uint64_t rows_;
  uint64_t tiles_ = 0;
};

class GaussianBlurTask final : public ImageTask {
 public:
  GaussianBlurTask(const ImageShape& s, uintptr_t in, uintptr_t tmp, uintptr_t out,
                   uintptr_t weights, int radius, uint64_t rows)
      : ImageTask(s, rows), in_(in), tmp_(tmp), out_(out), weights_(weights), radius_(radius) {
    FR_ARG(s.in_h == s.out_h && s.in_w == s.out_w, "GaussianBlur keeps the image size");
    FR_ARG(radius >= 0, "GaussianBlur: radius must be >= 0");
    FR_ARG(in && tmp && out && weights, "GaussianBlur: buffers must not be null");
  }
  std::string name() const override { return "GaussianBlur"; }
  uint64_t num_phases() const override { return 2; }

  void run_item(uint64_t phase, uint64_t item) override {
    uint64_t p, y0, y1;
    rows_of(item, &p, &y0, &y1);
    const auto h = static_cast<long long>(s_.in_h), w = static_cast<long long>(s_.in_w);
    const auto* wt = reinterpret_cast<const float*>(weights_);
    auto* tmp = reinterpret_cast<float*>(tmp_);
    const uint64_t plane = p * s_.in_h * s_.in_w;
    for (uint64_t y = y0; y < y1; ++y) {
      for (long long x = 0; x < w; ++x) {
        float acc = 0.f;
        for (int k = -radius_; k <= radius_; ++k) {
          acc += wt[k + radius_] *
                 (phase == 0
                      ? image::load(reinterpret_cast<const void*>(in_), s_.dtype,
                                    plane + y * w + image::reflect(x + k, w))
                      : tmp[plane + image::reflect(static_cast<long long>(y) + k, h) * w + x]);
        }
        if (phase == 0) {
          tmp[plane + y * w + x] = acc;
        } else {
          image::store(reinterpret_cast<void*>(out_), s_.dtype, plane + y * w + x, acc);
        }
      }
    }
  }

  void launch_cuda(const CudaLaunch& launch) override {
#ifdef FREERIDE_WITH_CUDA
    kernels::launch_gaussian_blur(launch, s_, in_, tmp_, out_, weights_, radius_, rows_);
#else
    (void)launch;
    no_cuda("GaussianBlur");
#endif
  }

 private:
  uintptr_t in_, tmp_, out_, weights_;
  int radius_;
};

class ResizeTask final : public ImageTask {
 public:
  ResizeTask(const ImageShape& s, uintptr_t in, uintptr_t out, uint64_t rows)
      : ImageTask(s, rows), in_(in), out_(out) {
    FR_ARG(in && out, "Resize: buffers must not be null");
  }
  std::string name() const override { return "Resize"; }
  uint64_t num_phases() const override { return 1; }

  void run_item(uint64_t, uint64_t item) override {
    uint64_t p, y0, y1;
    rows_of(item, &p, &y0, &y1);
    const auto* in = reinterpret_cast<const void*>(in_);
    const uint64_t src = p * s_.in_h * s_.in_w;
    const uint64_t dst = p * s_.out_h * s_.out_w;
    for (uint64_t y = y0; y < y1; ++y) {
      const image::Tap ty = image::bilinear_tap(static_cast<long long>(y), s_.in_h, s_.out_h);
      for (uint64_t x = 0; x < s_.out_w; ++x) {
        const image::Tap tx = image::bilinear_tap(static_cast<long long>(x), s_.in_w, s_.out_w);
        const auto at = [&](long long yy, long long xx) {
          return image::load(in, s_.dtype, src + yy * s_.in_w + xx);
        };
        const float top = (1.f - tx.w1) * at(ty.i0, tx.i0) + tx.w1 * at(ty.i0, tx.i1);
        const float bottom = (1.f - tx.w1) * at(ty.i1, tx.i0) + tx.w1 * at(ty.i1, tx.i1);
        image::store(reinterpret_cast<void*>(out_), s_.dtype, dst + y * s_.out_w + x,
                     (1.f - ty.w1) * top + ty.w1 * bottom);
      }
    }
  }

  void launch_cuda(const CudaLaunch& launch) override {
#ifdef FREERIDE_WITH_CUDA
    kernels::launch_resize(launch, s_, in_, out_, rows_);
#else
    (void)launch;
    no_cuda("Resize");
#endif
  }

 private:
  uintptr_t in_, out_;
};

}  // namespace

std::shared_ptr<Task> make_gaussian_blur_task(const ImageShape& shape, uintptr_t in, uintptr_t tmp,
                                              uintptr_t out, uintptr_t weights, int radius,
                                              uint64_t rows_per_item) {
  return std::make_shared<GaussianBlurTask>(shape, in, tmp, out, weights, radius, rows_per_item);
}

std::shared_ptr<Task> make_resize_task(const ImageShape& shape, uintptr_t in, uintptr_t out,
                                       uint64_t rows_per_item) {
  return std::make_shared<ResizeTask>(shape, in, out, rows_per_item);
}

std::shared_ptr<Task> make_pagerank_task(const PageRankBuffers& buffers, uint64_t iters,
                                         double damping, uint64_t nodes_per_item) {
  return std::make_shared<PageRankTask>(buffers, iters, damping, nodes_per_item);
}

std::shared_ptr<Task> make_spin_task(uint64_t items, uint64_t phases, uint64_t ns_per_item,
                                     uint64_t slice_blocks) {
  return std::make_shared<SpinTask>(items, phases, ns_per_item, slice_blocks);
}

std::shared_ptr<Task> make_saxpy_task(double a, uintptr_t x, uintptr_t y, uint64_t n,
                                      uint64_t chunk, int dtype) {
  return std::make_shared<SaxpyTask>(a, x, y, n, chunk, dtype);
}

std::shared_ptr<Task> make_item_counter_task(uint64_t items, uint64_t phases, uintptr_t counts,
                                             uintptr_t phase_done, uintptr_t violations,
                                             uintptr_t times, uint64_t ns_per_item,
                                             int64_t fail_phase, int64_t fail_item) {
  return std::make_shared<ItemCounterTask>(items, phases, counts, phase_done, violations, times,
                                           ns_per_item, fail_phase, fail_item);
}

}  // namespace freeride
