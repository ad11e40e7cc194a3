// The CUDA backend's wait for the gate (csrc/cuda/gate_wait.hpp) as part of
// freeride._C._testing (test_hooks.hpp), over a bell, a gate word and an open of the test's
// own, so that each FREERIDE_ADMISSION mode's looks, sleeps and spins show on any machine.
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "check.hpp"
#include "cuda/gate_wait.hpp"
#include "cuda/unrung_opens.hpp"
#include "doorbell.hpp"
#include "test_hooks.hpp"

namespace py = pybind11;

namespace freeride_ext {
namespace {

using freeride::cuda::AdmissionMode;

AdmissionMode mode_named(const std::string& name) {
  if (name == "ring") return AdmissionMode::kRing;
  if (name == "poll") return AdmissionMode::kPoll;
  FR_ARG(name == "spin", "mode must be 'ring', 'poll' or 'spin', got '" << name << "'");
  return AdmissionMode::kSpin;
}

// One wait_for_gate with a timeout of `timeout_ms`; after `event_ms` another thread opens
// the gate (`event` "open": the word moves, no ring; "rung open": the word moves and the
// bell rings) or stops the wait ("stop": the bell rings), or nothing happens ("none");
// "open during look": the gate opens, unrung, during the first look itself.
// `unrung`: an open may come without a ring (UnrungOpens set: ring's sleeps last
// kAdmissionPoll, else kAdmissionBackstop). `look_every_ms`: spin's longest stretch of
// yields between full looks (None: kSpinLookEvery). `open_for_ms`: the gate closes again
// that long after it opened, without a ring (None: it stays open).
std::map<std::string, py::object> wait_for_gate(const std::string& mode, const std::string& event,
                                                double event_ms, double timeout_ms,
                                                bool unrung,
                                                std::optional<double> look_every_ms,
                                                std::optional<double> open_for_ms) {
  FR_ARG(event == "open" || event == "rung open" || event == "stop" || event == "none" ||
             event == "open during look",
         "event must be 'open', 'rung open', 'stop', 'open during look' or 'none', got '"
             << event << "'");
  freeride::Doorbell bell;
  freeride::cuda::UnrungOpens opens;
  if (unrung) (void)opens.note_unrung();
  freeride::cuda::GateWatch watch{bell, opens, mode_named(mode)};
  if (look_every_ms) {
    FR_ARG(*look_every_ms > 0.0 && *look_every_ms <= 1e6,
           "look_every_ms must be in (0, 1e6], got " << *look_every_ms);
    watch.spin_look_every = std::chrono::microseconds(static_cast<int64_t>(*look_every_ms * 1e3));
  }
  std::atomic<uint64_t> word{0};
  std::atomic<bool> open{false};
  std::atomic<bool> stopped{false};
  freeride::cuda::GateWaitCounts counts;
  bool result = false;
  double elapsed_ms = 0.0;
  {
    py::gil_scoped_release release;
    std::thread other([&] {
      if (event == "none" || event == "open during look") return;
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(event_ms));
      if (event == "stop") {
        stopped.store(true);
        bell.ring();
        return;
      }
      open.store(true);
      word.fetch_add(1);
      if (event == "rung open") bell.ring();
      if (!open_for_ms) return;
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*open_for_ms));
      open.store(false);
      word.fetch_add(1);
    });
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double, std::milli>(timeout_ms));
    const auto began = std::chrono::steady_clock::now();
    // "open during look": the open lands while the first look is under way, after its
    // reading of the gate and before the pause.
    bool first_look = true;
    auto is_open = [&] {
      if (event == "open during look" && std::exchange(first_look, false)) {
        open.store(true);
        word.fetch_add(1);
        return false;
      }
      return open.load();
    };
    result = freeride::cuda::wait_for_gate(
        watch, deadline, [&] { return word.load(); }, [&] { return stopped.load(); }, is_open,
        &counts);
    elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                           began)
                     .count();
    other.join();
  }
  return {{"opened", py::bool_(result)},
          {"looks", py::int_(counts.looks)},
          {"sleeps", py::int_(counts.sleeps)},
          {"spins", py::int_(counts.spins)},
          {"elapsed_ms", py::float_(elapsed_ms)}};
}

}  // namespace

void register_gate_wait_hooks(py::module_& t) {
  t.def("wait_for_gate", &wait_for_gate, py::arg("mode"), py::arg("event"),
        py::arg("event_ms"), py::arg("timeout_ms"), py::arg("unrung") = false,
        py::arg("look_every_ms") = py::none(), py::arg("open_for_ms") = py::none(),
        "csrc/cuda/gate_wait.hpp's wait_for_gate under FREERIDE_ADMISSION `mode` (ring, "
        "poll, spin), with an `event` ('open': the gate's word moves without a ring, "
        "'rung open', 'stop', 'none', 'open during look') `event_ms` into a wait of "
        "`timeout_ms`; "
        "`look_every_ms` lengthens spin's stretches of yields between full looks, "
        "`open_for_ms` closes the gate again that long after the open: "
        "{opened, looks, sleeps, spins, elapsed_ms}.");
  t.attr("SPIN_LOOK_EVERY_MS") =
      std::chrono::duration<double, std::milli>(freeride::cuda::kSpinLookEvery).count();
}

}  // namespace freeride_ext
