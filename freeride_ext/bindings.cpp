// freeride._C: thin pybind11 bindings over the core. Converts types, maps C++
// exceptions to Python ones, and releases the GIL around anything that may block.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "admission_stamp_object.hpp"
#include "backend.hpp"
#include "builtin_tasks.hpp"
#include "capture_mode.hpp"
#include "check.hpp"
#include "cuda/call_costs.hpp"
#include "cuda/green_context_plan.hpp"
#include "cuda/occupancy.hpp"
#include "cuda/step_stream.hpp"
#include "doorbell.hpp"
#include "executor.hpp"
#include "freeride/slice.h"
#include "gate.hpp"
#include "graph_layout.hpp"
#include "marks.hpp"
#include "raw_kernel_task.hpp"
#include "runtime_info.hpp"
#include "sigterm_guard.hpp"
#include "test_hooks.hpp"

namespace py = pybind11;
using freeride::Executor;
using freeride::Task;

namespace {

using release_gil = py::call_guard<py::gil_scoped_release>;

py::dict backend_info() {
  const freeride::BackendInfo info = freeride::query_backend_info();
  py::list devices;
  for (const auto& d : info.devices) {
    py::dict dev;
    dev["index"] = d.index;
    dev["name"] = d.name;
    dev["sm_count"] = d.sm_count;
    dev["compute_capability"] = py::make_tuple(d.compute_capability / 10, d.compute_capability % 10);
    dev["stream_mem_ops"] = d.stream_mem_ops;
    dev["gate_write"] = d.gate_write;
    dev["green_contexts"] = d.green_contexts;
    dev["reserve_mechanism"] = d.reserve_mechanism;
    dev["reserve_fallback"] = d.reserve_fallback;
    dev["green_sms_seen"] = d.green_sms_seen;
    devices.append(dev);
  }
  py::dict out;
  out["cuda_built"] = info.cuda_built;
  out["cuda"] = info.cuda;
  out["runtime_version"] = info.runtime_version;
  out["driver_version"] = info.driver_version;
  out["devices"] = devices;
  out["reason"] = info.reason;
  out["cuda_error"] = info.cuda_error;
  if (info.cuda_built) {
    py::dict build;
    build["toolkit"] = py::make_tuple(info.build_toolkit / 1000, info.build_toolkit % 1000 / 10);
    build["architectures"] = info.build_architectures;
    build["ptx_isa"] = info.build_ptx_isa;
    out["cuda_build"] = build;
  } else {
    out["cuda_build"] = py::none();
  }
  out["module_loading"] = info.module_loading.empty() ? py::object(py::none())
                                                      : py::object(py::str(info.module_loading));
  return out;
}

// (blocks, threads, registers per thread, shared bytes), as the Python API passes it.
using ReserveTuple = std::tuple<int, int, int, int>;

freeride::SmReserve to_reserve(const ReserveTuple& t) {
  return freeride::SmReserve{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
}

std::unique_ptr<Executor> make_executor(const std::string& kind, int device, int workers,
                                        bool gate_in_host_memory, bool stream_wait,
                                        uint64_t memory_budget, const ReserveTuple& reserve,
                                        uint64_t slice_ns, const std::string& reserve_mechanism,
                                        int reserve_sms) {
  freeride::CudaOptions options;
  options.gate_in_host_memory = gate_in_host_memory;
  options.stream_wait = stream_wait;
  options.reserve = to_reserve(reserve);
  options.slice_ns = slice_ns;
  options.reserve_mechanism = reserve_mechanism;
  options.reserve_sms = reserve_sms;
  return std::make_unique<Executor>(freeride::make_backend(kind, device, workers, options),
                                    memory_budget);
}

// (threads, blocks, registers, shared bytes, reserved shared bytes per block, warp size,
// compute capability as major * 10 + minor): what sm_limits reads from the device.
using LimitsTuple = std::tuple<int, int, int, int, int, int, int>;

freeride::SmLimits to_limits(const LimitsTuple& t) {
  freeride::SmLimits sm;
  freeride::set_architecture_units(sm, std::get<6>(t));
  sm.threads = std::get<0>(t);
  sm.blocks = std::get<1>(t);
  sm.registers = std::get<2>(t);
  sm.shared_bytes = std::get<3>(t);
  sm.reserved_shared_per_block = std::get<4>(t);
  sm.warp_size = std::get<5>(t);
  return sm;
}

const char* action_name(freeride::GreenContextStep::Action action) {
  using Action = freeride::GreenContextStep::Action;
  switch (action) {
    case Action::kAsk:
      return "ask";
    case Action::kUse:
      return "use";
    case Action::kFallBack:
      return "fallback";
    case Action::kRefuse:
      return "refuse";
  }
  return "?";
}

// (action, SMs, reserved SMs, message), raising ValueError where try_green_context does.
py::tuple green_step_tuple(const freeride::GreenContextStep& step) {
  FR_ARG(step.action != freeride::GreenContextStep::Action::kRefuse, step.message);
  return py::make_tuple(action_name(step.action), step.sms, step.reserved, step.message);
}

py::tuple status_tuple(const Executor& ex, uint64_t id) {
  freeride::TaskStatus s;
  {
    // The executor's lock may be held across a launch's bookkeeping: never with the GIL.
    py::gil_scoped_release release;
    s = ex.status(id);
  }
  return py::make_tuple(freeride::state_name(s.state), s.items_done, s.items_total, s.phase,
                        s.launches, static_cast<int>(s.error_kind), s.error);
}

// Longest a blocking wait stays in C++ before Python's signal handlers get a turn.
constexpr double kSignalSlice = 0.05;

// A wait that Ctrl-C (or any signal with a Python handler) interrupts: `wait(slice)`
// waits up to `slice` seconds with the GIL released and returns true once done; between
// slices Python's pending signal handlers run (on the main thread), and an exception one
// raises (KeyboardInterrupt) propagates. timeout_s < 0: no limit. True once done.
template <typename Wait>
bool wait_interruptibly(double timeout_s, Wait wait) {
  using clock = std::chrono::steady_clock;
  const bool bounded = timeout_s >= 0;
  const clock::time_point deadline = bounded ? clock::now() + freeride::clamp_timeout(timeout_s)
                                             : clock::time_point::max();
  while (true) {
    double slice = kSignalSlice;
    if (bounded) {
      const double left = std::chrono::duration<double>(deadline - clock::now()).count();
      slice = std::clamp(left, 0.0, kSignalSlice);
    }
    bool done;
    {
      py::gil_scoped_release release;
      done = wait(slice);
    }
    if (done) return true;
    if (bounded && clock::now() >= deadline) return false;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "freeride core: gate, executor, host and CUDA backends, built-in tasks";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const freeride::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const freeride::KernelImageError& e) {
      // Python's own class, so that device="auto" can tell it from other failures.
      const py::object error = py::module_::import("freeride.errors").attr("CudaUnavailableError");
      PyErr_SetString(error.ptr(), e.what());
    } catch (const freeride::RuntimeFailure& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.attr("GATE_OPEN") = FREERIDE_GATE_OPEN;
  m.attr("GATE_CLOSED") = FREERIDE_GATE_CLOSED;
  // Executor.status()'s error kinds (freeride::ErrorKind), for the handles to tell apart.
  m.attr("ERROR_FAILED") = static_cast<int>(freeride::ErrorKind::Failed);
  m.attr("ERROR_MEMORY_BUDGET") = static_cast<int>(freeride::ErrorKind::MemoryBudget);
  m.attr("ERROR_CANCELLED") = static_cast<int>(freeride::ErrorKind::Cancelled);
  m.attr("IMMEDIATE") = py::int_(static_cast<uint64_t>(freeride::kImmediate));
#ifdef FREERIDE_WITH_CUDA
  m.attr("CUDA_BUILT") = true;
#else
  m.attr("CUDA_BUILT") = false;
#endif
  m.def("backend_info", &backend_info, "What this build and machine offer.");
  m.def("free_device_memory", &freeride::free_device_memory, py::arg("device"), release_gil(),
        "Bytes of device memory free now (cudaMemGetInfo in relaxed capture mode, so that a "
        "graph another thread captures is not invalidated).");
  m.def(
      "measure_call_costs",
      [](int device, int calls) {
        freeride::CallCosts costs;
        {
          py::gil_scoped_release nogil;
          costs = freeride::measure_call_costs(device, calls);
        }
        py::list rows;
        for (const freeride::CallCost& c : costs.calls) {
          py::dict row;
          row["call"] = c.call;
          row["ns"] = py::cast(c.ns);
          row["unavailable"] = c.unavailable;
          rows.append(row);
        }
        py::dict out;
        out["held"] = costs.held;
        out["calls"] = rows;
        return out;
      },
      py::arg("device"), py::arg("calls"),
      "Host time of each kind of CUDA call a close+open pair of the hooks makes, `calls` of "
      "each on a stream of `device` (csrc/cuda/call_costs.hpp): {'held': whether a stream "
      "wait held the stream meanwhile, 'calls': [{'call', 'ns': [each call's ns], "
      "'unavailable': why not measured, or ''}]}; the first is the clock's own floor.");
  // The SIGTERM deadline of freeride._shutdown (csrc/sigterm_guard.hpp).
  m.def("_sigterm_guard_arm", &freeride::sigterm_guard::arm, py::arg("grace"), release_gil(),
        "Chains a watchdog in front of the SIGTERM handler installed now: `grace` seconds "
        "after a SIGTERM not answered by _sigterm_guard_stand_down(), SIGTERM's default "
        "action. False where the disposition is the default or ignore, or already armed.");
  m.def("_sigterm_guard_stand_down", &freeride::sigterm_guard::stand_down,
        "The process's SIGTERM handler has started (and ends the process itself).");
  m.def("_sigterm_guard_disarm", &freeride::sigterm_guard::disarm,
        py::arg("restore_default") = false, release_gil(),
        "Joins the watchdog; puts back the handler the chain was in front of (with "
        "restore_default, SIGTERM's default action instead).");
  m.def("_sigterm_guard_armed", &freeride::sigterm_guard::armed);
  m.def(
      "step_stream",
      [](int device) { return static_cast<uint64_t>(freeride::step_stream(device)); },
      py::arg("device"), release_gil(),
      "Handle of the device's stream for iterative tasks' steps: least priority, "
      "non-blocking, made once per process and never destroyed.");
  // Both are called beside training (the recorder asks before each recorded gate write
  // on the training thread) and never block: the GIL stays held.
  m.def(
      "_stream_is_capturing",
      [](uint64_t stream, int device) {
        return freeride::stream_is_capturing(static_cast<uintptr_t>(stream), device);
      },
      py::arg("stream"), py::arg("device"),
      "True while the stream handle (0, 1, 2: the device's default streams) is being "
      "captured into a CUDA graph. RuntimeError in builds without CUDA.");
  m.def("_relax_capture_mode", &freeride::relax_capture_mode,
        "Puts the calling thread into relaxed CUDA graph capture mode, so its syncs and "
        "event queries do not invalidate another thread's capture. False where it could "
        "not (no CUDA in this build, no driver).");

  py::class_<Task, std::shared_ptr<Task>>(m, "Task")
      .def_property_readonly("name", &Task::name)
      .def_property_readonly("num_phases", &Task::num_phases)
      .def("num_items", &Task::num_items, py::arg("phase"))
      .def_property_readonly("total_items", &Task::total_items)
      .def_property("memory_bytes", &Task::memory_bytes, &Task::set_memory_bytes);

  m.def("spin_task", &freeride::make_spin_task, py::arg("items"), py::arg("phases"),
        py::arg("ns_per_item"), py::arg("slice_blocks") = 0);
  m.def("saxpy_task", &freeride::make_saxpy_task, py::arg("a"), py::arg("x"), py::arg("y"),
        py::arg("n"), py::arg("chunk"), py::arg("dtype"));
  m.def("item_counter_task", &freeride::make_item_counter_task, py::arg("items"),
        py::arg("phases"), py::arg("counts"), py::arg("phase_done"), py::arg("violations"),
        py::arg("times"), py::arg("ns_per_item"), py::arg("fail_phase"), py::arg("fail_item"));

  using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
  m.def(
      "csr_transpose",
      [](const Int64Array& indptr, const Int64Array& indices) {
        FR_ARG(indptr.ndim() == 1 && indices.ndim() == 1, "indptr and indices must be 1-D");
        FR_ARG(indptr.size() >= 2, "indptr must have at least 2 entries (1 node)");
        const int64_t n = static_cast<int64_t>(indptr.size()) - 1;
        const int64_t edges = static_cast<int64_t>(indices.size());
        Int64Array in_indptr(n + 1);
        Int64Array in_indices(edges);
        const int64_t* ptr = indptr.data();
        const int64_t* idx = indices.data();
        int64_t* in_ptr = in_indptr.mutable_data();
        int64_t* in_idx = in_indices.mutable_data();
        {
          py::gil_scoped_release release;
          freeride::csr_transpose(ptr, idx, n, edges, in_ptr, in_idx);
        }
        return py::make_tuple(in_indptr, in_indices);
      },
      py::arg("indptr"), py::arg("indices"),
      "(in_indptr, in_indices): the CSC (in-links) of the graph whose out-links are the CSR "
      "(indptr, indices); sources grouped by destination in out-link order.");

  m.def(
      "pagerank_task",
      [](uint64_t n, uintptr_t in_indptr, uintptr_t in_indices, uintptr_t inv_outdeg,
         uintptr_t rank_a, uintptr_t rank_b, uintptr_t contrib, uintptr_t dangling, uint64_t iters,
         double damping, uint64_t nodes_per_item) {
        freeride::PageRankBuffers b;
        b.n = n;
        b.in_indptr = in_indptr;
        b.in_indices = in_indices;
        b.inv_outdeg = inv_outdeg;
        b.rank_a = rank_a;
        b.rank_b = rank_b;
        b.contrib = contrib;
        b.dangling = dangling;
        return freeride::make_pagerank_task(b, iters, damping, nodes_per_item);
      },
      py::arg("n"), py::arg("in_indptr"), py::arg("in_indices"), py::arg("inv_outdeg"),
      py::arg("rank_a"), py::arg("rank_b"), py::arg("contrib"), py::arg("dangling"),
      py::arg("iters"), py::arg("damping"), py::arg("nodes_per_item"));

  m.def(
      "gaussian_blur_task",
      [](uint64_t planes, uint64_t h, uint64_t w, int dtype, uintptr_t in, uintptr_t tmp,
         uintptr_t out, uintptr_t weights, int radius, uint64_t rows) {
        freeride::ImageShape s{planes, h, w, h, w, dtype};
        return freeride::make_gaussian_blur_task(s, in, tmp, out, weights, radius, rows);
      },
      py::arg("planes"), py::arg("h"), py::arg("w"), py::arg("dtype"), py::arg("in_"),
      py::arg("tmp"), py::arg("out"), py::arg("weights"), py::arg("radius"), py::arg("rows"));
  m.def(
      "resize_task",
      [](uint64_t planes, uint64_t in_h, uint64_t in_w, uint64_t out_h, uint64_t out_w, int dtype,
         uintptr_t in, uintptr_t out, uint64_t rows) {
        freeride::ImageShape s{planes, in_h, in_w, out_h, out_w, dtype};
        return freeride::make_resize_task(s, in, out, rows);
      },
      py::arg("planes"), py::arg("in_h"), py::arg("in_w"), py::arg("out_h"), py::arg("out_w"),
      py::arg("dtype"), py::arg("in_"), py::arg("out"), py::arg("rows"));

  m.def(
      "raw_kernel_task",
      [](std::string name,
         const std::vector<std::tuple<uintptr_t, uint64_t, uint32_t, uint32_t, uint32_t>>& kernels,
         uint64_t phases, std::vector<uint64_t> args, bool device_phases) {
        std::vector<freeride::RawPhase> ks;
        ks.reserve(kernels.size());
        for (const auto& [function, items, block, shared_mem, grid] : kernels) {
          ks.push_back(freeride::RawPhase{function, items, block, shared_mem, grid});
        }
        return freeride::make_raw_kernel_task(std::move(name), std::move(ks), phases,
                                              std::move(args), device_phases);
      },
      py::arg("name"), py::arg("kernels"), py::arg("phases"), py::arg("args"),
      py::arg("device_phases") = false,
      "kernels: (CUfunction, items, block, shared_mem, grid) each; phase p runs kernel "
      "p % len(kernels); args: one word per parameter; device_phases: the one kernel uses "
      "freeride::for_each_phase_item, so one launch may serve every phase");
  m.def(
      "function_info",
      [](uintptr_t function) {
        const freeride::FunctionInfo info = freeride::query_function(function);
        py::dict out;
        out["max_threads_per_block"] = info.max_threads_per_block;
        out["static_shared_bytes"] = info.static_shared_bytes;
        out["max_dynamic_shared_bytes"] = info.max_dynamic_shared_bytes;
        out["num_regs"] = info.num_regs;
        out["param_sizes"] =
            info.has_param_sizes ? py::object(py::cast(info.param_sizes)) : py::object(py::none());
        return out;
      },
      py::arg("function"), "What the driver says about a loaded CUfunction.");
  m.def("set_max_dynamic_shared", &freeride::set_max_dynamic_shared, py::arg("function"),
        py::arg("bytes"));

  m.attr("ITEM_CTX_BYTES") = py::int_(sizeof(fr_item_ctx));
  // How many time slices a launch may claim items for while a close is pending.
  m.attr("MAX_SLICES") = py::int_(FREERIDE_MAX_SLICES);
  m.def(
      "side_blocks_per_sm",
      [](const LimitsTuple& sm, const ReserveTuple& reserve, const std::tuple<int, int, int>& use) {
        const freeride::KernelUse u{std::get<0>(use), std::get<1>(use), std::get<2>(use)};
        const freeride::SmLimits limits = to_limits(sm);
        const freeride::SmReserve r = to_reserve(reserve);
        const int blocks = freeride::side_blocks_per_sm(limits, r, u);
        return std::make_tuple(blocks, freeride::carveout_percent(limits, r, u, blocks));
      },
      py::arg("sm"), py::arg("reserve"), py::arg("use"),
      "(side blocks per SM, carveout percent) for a kernel block `use` = (threads, registers "
      "per thread, shared bytes) on an SM `sm` = (threads, blocks, registers, shared bytes, "
      "reserved shared bytes per block, warp size, compute capability as major * 10 + minor) "
      "beside `reserve` = (blocks, threads, registers per thread, shared bytes).");
  m.def("green_context_sms", &freeride::green_context_sms, py::arg("total"), py::arg("reserved"),
        py::arg("min_partition"), py::arg("alignment"),
        "SMs of a green context leaving at least `reserved` of `total` out (0: none can).");
  m.def("default_reserved_sms", &freeride::default_reserved_sms, py::arg("alignment"),
        "SMs a green-context reserve leaves out when Reserve(sms=None).");
  m.def(
      "plan_green_context",
      [](int total, int reserve_sms, int min_partition, int alignment, int compute_capability,
         int device) {
        return green_step_tuple(freeride::plan_green_context(
            total, reserve_sms, min_partition, alignment, compute_capability, device));
      },
      py::arg("total"), py::arg("reserve_sms"), py::arg("min_partition"), py::arg("alignment"),
      py::arg("compute_capability"), py::arg("device") = 0,
      "The green-context reserve's plan before the driver splits: (\"ask\", SMs to ask for, "
      "reserved, \"\") or (\"fallback\", 0, reserved, reason); ValueError where reserve.sms "
      "cannot be honoured.");
  m.def(
      "check_green_split",
      [](int total, int reserve_sms, int min_partition, int alignment, int compute_capability,
         unsigned groups, int got) {
        const freeride::GreenContextStep plan = freeride::plan_green_context(
            total, reserve_sms, min_partition, alignment, compute_capability, 0);
        FR_ARG(plan.action == freeride::GreenContextStep::Action::kAsk,
               "the plan asks the driver for nothing: " << plan.message);
        return green_step_tuple(freeride::check_green_split(plan, total, groups, got));
      },
      py::arg("total"), py::arg("reserve_sms"), py::arg("min_partition"), py::arg("alignment"),
      py::arg("compute_capability"), py::arg("groups"), py::arg("got"),
      "After the driver split `groups` groups, the first of `got` SMs, for the plan of these "
      "arguments: (\"use\", got, reserved, \"\") or (\"fallback\", got, reserved, reason).");

  m.def(
      "check_green_partition",
      [](int green_sms, int total, const std::vector<unsigned>& seen, int beyond, int blocks,
         bool finished, int deadline_s) {
        freeride::PartitionSeen got;
        got.finished = finished;
        got.sms = freeride::census_sms(seen.data(), seen.size());
        got.beyond = beyond;
        got.blocks = blocks;
        return green_step_tuple(
            freeride::check_green_partition(green_sms, total, got, deadline_s));
      },
      py::arg("green_sms"), py::arg("total"), py::arg("seen"), py::arg("beyond") = 0,
      py::arg("blocks") = 1, py::arg("finished") = true, py::arg("deadline_s") = 5,
      "After the partition check of a green context of `green_sms` of `total` SMs, whose "
      "blocks (`blocks` of them, `beyond` on SM ids past the bitmap) set the bits of `seen` "
      "(32-bit words, bit i of word w for SM id 32 * w + i): (\"use\", SMs seen, SMs left "
      "out, \"\") or (\"fallback\", SMs seen, SMs left out, reason).");

  py::class_<Executor> executor(m, "Executor");
  executor
      .def(py::init(&make_executor), py::arg("kind"), py::arg("device"), py::arg("workers"),
           py::arg("gate_in_host_memory"), py::arg("stream_wait"), py::arg("memory_budget"),
           py::arg("reserve"), py::arg("slice_ns"),
           py::arg("reserve_mechanism") = "occupancy-cap", py::arg("reserve_sms") = 0,
           release_gil())
      .def("submit", &Executor::submit, py::arg("task"), py::arg("priority"),
           py::arg("after") = std::vector<uintptr_t>{}, release_gil(),
           "after: stream handles whose work so far the task's first launch waits for")
      .def("status", &status_tuple, py::arg("id"))
      // Blocking waits run Python's signal handlers every kSignalSlice: Ctrl-C reaches a
      // training loop waiting for a side task.
      .def(
          "wait",
          [](Executor& ex, uint64_t id, double timeout) {
            return wait_interruptibly(timeout, [&](double slice) { return ex.wait(id, slice); });
          },
          py::arg("id"), py::arg("timeout"))
      .def(
          "wait_all",
          [](Executor& ex, double timeout) {
            return wait_interruptibly(timeout, [&](double slice) { return ex.wait_all(slice); });
          },
          py::arg("timeout"))
      .def(
          "cancel",
          [](Executor& ex, uint64_t id, bool wait) {
            bool cancelled;
            {
              py::gil_scoped_release release;
              cancelled = ex.cancel(id, false);
            }
            if (cancelled && wait) {
              wait_interruptibly(-1.0, [&](double slice) { return ex.wait(id, slice); });
            }
            return cancelled;
          },
          py::arg("id"), py::arg("wait"))
      .def("forget", &Executor::forget, py::arg("id"), release_gil())
      .def("take_finished", &Executor::take_finished, release_gil(),
           "Ids of the tasks that became final since the last call.")
      .def("close", &Executor::close, py::arg("deadline") = Executor::kCloseDeadlineS,
           release_gil(),
           "Stops the thread and cancels what is not final; launches still in flight past "
           "`deadline` seconds are abandoned (see take_abandoned).")
      .def("take_abandoned", &Executor::take_abandoned, release_gil(),
           "Ids of the tasks whose launches close() abandoned: their memory must be kept "
           "(take_finished never names them).")
      .def("reclaim_abandoned", &Executor::reclaim_abandoned, release_gil(),
           "After close(): whether the device has passed every abandoned launch, so that "
           "their memory may go (what the backend held for them is then released).")
      // Each takes the executor's lock, which its thread may hold while admitting a task.
      .def_property_readonly("closed", py::cpp_function(&Executor::closed, release_gil()))
      .def_property_readonly("launches", py::cpp_function(&Executor::launches, release_gil()),
                             "Side launches so far.")
      .def_property_readonly("idle_launches",
                             py::cpp_function(&Executor::idle_launches, release_gil()),
                             "Launches the gate let in that ran no item.")
      .def_property_readonly("open_launches",
                             py::cpp_function(&Executor::open_launches, release_gil()),
                             "Launches enqueued at stream-ordered opens (CUDA).")
      .def_property_readonly("running_item_ns", &Executor::running_item_ns,
                             "How long one block (CUDA) or worker (host) spends on one item "
                             "of the task run last, in ns; 0 until measured.")
      .def_property_readonly(
          "skipped_open_launches",
          [](Executor& ex) { return ex.backend().skipped_open_launches(); },
          "Stream-ordered opens whose launch was left out: it would have waited behind "
          "another training stream's open.")
      .def_property_readonly(
          "max_lookahead", [](Executor& ex) { return ex.backend().max_lookahead(); },
          "The most launches at opens enqueued and not yet begun at once.")
      .def_property_readonly(
          "opens_beyond_lookahead",
          [](Executor& ex) { return ex.backend().opens_beyond_lookahead(); },
          "Stream-ordered opens that carried no launch: the lookahead bound was reached.")
      .def_property_readonly("idle_open_launches",
                             py::cpp_function(&Executor::idle_open_launches, release_gil()),
                             "Launches enqueued at opens that ran no item.")
      .def_property_readonly("memory_budget", &Executor::memory_budget)
      .def_property_readonly("memory_used",
                             py::cpp_function(&Executor::memory_used, release_gil()))
      .def(
          "run_plain",
          [](Executor& ex, const std::shared_ptr<Task>& task, uint64_t stream) {
            ex.backend().run_plain(*task, static_cast<uintptr_t>(stream));
          },
          py::arg("task"), py::arg("stream"), release_gil())
      .def("set_recording", &Executor::set_recording, py::arg("on"), release_gil())
      .def("take_launch_log",
           [](Executor& ex) {
             std::vector<freeride::LaunchRecord> log;
             {
               py::gil_scoped_release release;
               log = ex.take_launch_log();
             }
             py::list out;
             for (const auto& r : log) {
               out.append(py::make_tuple(r.task_id, r.phase, r.start_mark, r.end_mark, r.items));
             }
             return out;
           })
      .def("wait_launches_taken", &Executor::wait_launches_taken, py::arg("timeout"),
           release_gil(),
           "Waits until every launch whose end has come, or comes without a further gate "
           "open, has been taken into the launch log (True), or timeout seconds passed "
           "(False). A launch running on in an open bubble is not waited for.")
      .def_property_readonly("side_stream",
                             [](Executor& ex) { return ex.backend().side_stream(); })
      .def_property_readonly("kind", [](Executor& ex) { return ex.backend().kind(); })
      .def_property_readonly("admission", [](Executor& ex) { return ex.backend().admission(); })
      .def_property_readonly("launches_at_opens",
                             [](Executor& ex) { return ex.backend().launches_at_opens(); })
      .def_property_readonly("device_phases",
                             [](Executor& ex) { return ex.backend().device_phases(); })
      .def_property_readonly("watcher_launches",
                             [](Executor& ex) { return ex.backend().watcher_launches(); })
      .def_property_readonly(
          "admission_stamps",
          [](Executor& ex) {
            const freeride::AdmissionStamps a = ex.backend().admission_stamps();
            py::dict out;
            out["reached"] = freeride_ext::admission_stamp_object(a.reached);
            out["woke"] = freeride_ext::admission_stamp_object(a.woke);
            out["launched"] = freeride_ext::admission_stamp_object(a.launched);
            return out;
          },
          "When the host-started path of the latest admission passed each step: "
          "{'reached': the open watcher saw the GPU reach the open, 'woke': the executor "
          "saw the gate open and launches for it, 'launched': a launch the host made "
          "(the executor's, or the watcher's) was enqueued}, each "
          "(the open's sequence number, time.monotonic_ns()) or None where not yet "
          "(no watcher: 'reached' stays None). For benchmarks.")
      .def_property_readonly("reserve_mechanism",
                             [](Executor& ex) { return ex.backend().reserve_mechanism(); })
      .def_property_readonly("reserve_fallback",
                             [](Executor& ex) { return ex.backend().reserve_fallback(); })
      .def_property_readonly("host_idle", [](Executor& ex) { return ex.backend().host_idle(); })
      .def_property_readonly("host_idle_reason",
                             [](Executor& ex) { return ex.backend().host_idle_reason(); })
      .def_property_readonly("device", [](Executor& ex) { return ex.backend().device(); });
  freeride_ext::bind_gate(executor);
  freeride_ext::bind_marks(executor);

  // Test-only hooks, as _C._testing, only where the environment asks for them at import
  // (tests/conftest.py sets FREERIDE_TEST_HOOKS=1); otherwise there is no _C._testing.
  const char* test_hooks = std::getenv("FREERIDE_TEST_HOOKS");
  if (test_hooks != nullptr && std::string_view(test_hooks) == "1") {
    freeride_ext::register_test_hooks(m);
  }
}
