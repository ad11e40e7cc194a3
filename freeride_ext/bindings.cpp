// freeride._C: thin pybind11 bindings over the core. Converts types, maps C++
// exceptions to Python ones, and releases the GIL around anything that may block. This
// file holds the module, its constants and what it asks of the build and the device
// (launch shapes, green-context plans); the Executor class is executor_bindings.cpp, the
// tasks task_bindings.cpp, and the test hooks test_hooks.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "backend.hpp"
#include "capture_mode.hpp"
#include "check.hpp"
#include "cuda/call_costs.hpp"
#include "cuda/green_context_plan.hpp"
#include "cuda/occupancy.hpp"
#include "cuda/step_stream.hpp"
#include "executor.hpp"
#include "executor_bindings.hpp"
#include "freeride/item_ctx.h"
#include "freeride/slice.h"
#include "reserve_tuple.hpp"
#include "runtime_info.hpp"
#include "sigterm_guard.hpp"
#include "task_bindings.hpp"
#include "test_hooks.hpp"

namespace py = pybind11;
using freeride_ext::ReserveTuple;
using freeride_ext::to_reserve;

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

  freeride_ext::bind_tasks(m);


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

  freeride_ext::bind_executor(m);

  // Test-only hooks, as _C._testing, only where the environment asks for them at import
  // (tests/conftest.py sets FREERIDE_TEST_HOOKS=1); otherwise there is no _C._testing.
  const char* test_hooks = std::getenv("FREERIDE_TEST_HOOKS");
  if (test_hooks != nullptr && std::string_view(test_hooks) == "1") {
    freeride_ext::register_test_hooks(m);
  }
}
