#include "builtin_tasks.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>

#include "check.hpp"
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

uint64_t steady_now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

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
  SpinTask(uint64_t items, uint64_t phases, uint64_t ns) : UniformTask(items, phases), ns_(ns) {}
  std::string name() const override { return "Spin"; }
  void run_item(uint64_t, uint64_t) override { spin_for(ns_); }
  void launch_cuda(const CudaLaunch& launch) override {
#ifdef FREERIDE_WITH_CUDA
    kernels::launch_spin(launch, ns_);
#else
    (void)launch;
    no_cuda("Spin");
#endif
  }

 private:
  uint64_t ns_;
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
  void run_item(uint64_t phase, uint64_t item) override {
    if (static_cast<int64_t>(phase) == fail_phase_ && static_cast<int64_t>(item) == fail_item_) {
      FR_THROW(RuntimeFailure, "injected failure at phase " << phase << ", item " << item);
    }
    const uint64_t slot = phase * items_ + item;
    if (times_ != nullptr) times_[2 * slot] = steady_now_ns();
    if (phase > 0 && std::atomic_ref<uint64_t>(phase_done_[phase - 1]).load() != items_) {
      std::atomic_ref<uint64_t>(*violations_).fetch_add(1);
    }
    std::atomic_ref<uint32_t>(counts_[slot]).fetch_add(1);
    if (ns_ > 0) spin_for(ns_);
    if (times_ != nullptr) times_[2 * slot + 1] = steady_now_ns();
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

}  // namespace

std::shared_ptr<Task> make_pagerank_task(const PageRankBuffers& buffers, uint64_t iters,
                                         double damping, uint64_t nodes_per_item) {
  return std::make_shared<PageRankTask>(buffers, iters, damping, nodes_per_item);
}

std::shared_ptr<Task> make_spin_task(uint64_t items, uint64_t phases, uint64_t ns_per_item) {
  return std::make_shared<SpinTask>(items, phases, ns_per_item);
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
