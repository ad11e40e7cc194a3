// Test-only bindings of the test queue backend (queue_backend.hpp): an Executor whose
// launches the test enqueues and ends, and the rules the CUDA runner's launches at opens
// follow. Part of freeride._C._testing (test_hooks.cpp).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "check.hpp"
#include "executor.hpp"
#include "follow_rule.hpp"
#include "open_launch_rule.hpp"
#include "phase_ahead_rule.hpp"
#include "queue_backend.hpp"
#include "test_hooks.hpp"
#include "withhold_rule.hpp"

namespace py = pybind11;

namespace freeride_ext {
namespace {

// A property of a runner's test launches, read under their lock (the runner's thread
// and the executor's change them).
template <typename Read>
auto locked(Read read) {
  return [read](freeride::QueuedLaunches& q) {
    std::lock_guard<std::mutex> lk(q.mu);
    return read(q);
  };
}

freeride::QueueBackend& queue_backend(freeride::Executor& ex) {
  auto* backend = dynamic_cast<freeride::QueueBackend*>(&ex.backend());
  FR_ARG(backend != nullptr, "the executor is not on the test queue backend");
  return *backend;
}

}  // namespace

void register_queue_hooks(py::module_& t) {
  using freeride::Executor;
  // The executor on a backend whose launches the test enqueues and ends (queue_backend.hpp).
  using freeride::QueueBackend;
  using freeride::QueuedLaunches;
  py::class_<QueuedLaunches, std::shared_ptr<QueuedLaunches>>(t, "QueuedLaunches")
      .def(
          "arrive",
          [](QueuedLaunches& q, size_t count, bool at_open, uint32_t seq) {
            return q.arrive(count, at_open, 0, false, 0, nullptr, seq);
          },
          py::arg("count") = 1, py::arg("at_open") = true, py::arg("seq") = 0,
          py::call_guard<py::gil_scoped_release>(),
           "Launches enqueued at opens (as many as the runner takes); how many were taken. "
           "at_open=False: launches of the executor's own (it backs off after one that "
           "ran nothing). seq: the open's number (the executor's own: the open it saw).")
      .def("begin", &QueuedLaunches::begin, py::call_guard<py::gil_scoped_release>(),
           "The oldest launch not yet begun begins: with the stop set, it claims nothing.")
      .def("end", &QueuedLaunches::end, py::arg("items"),
           py::call_guard<py::gil_scoped_release>(),
           "The oldest launch not yet ended ends, having run `items` items.")
      .def("fail", &QueuedLaunches::fail, py::arg("message"), py::arg("drop_pending") = true,
           py::call_guard<py::gil_scoped_release>(),
           "The next run() fails with `message`; with drop_pending (a kernel fault) every "
           "pending launch is gone, else only the oldest ended (a broken launch).")
      .def_property_readonly("pending",
                             locked([](const QueuedLaunches& q) { return q.pending.size(); }))
      .def_property_readonly("not_ended",
                             locked([](const QueuedLaunches& q) {
                               size_t n = 0;
                               for (const QueuedLaunches::Launch& l : q.pending) {
                                 n += l.items < 0 ? 1 : 0;
                               }
                               return n;
                             }),
                             "Launches pending that the test has not ended yet.")
      .def_property_readonly("stopped", locked([](const QueuedLaunches& q) { return q.stopped; }))
      .def_property_readonly("withheld",
                             locked([](const QueuedLaunches& q) { return q.withheld; }),
                             "Withheld (PhaseRunner::withhold) since it last resumed.")
      .def_property_readonly("withholds",
                             locked([](const QueuedLaunches& q) { return q.withholds; }),
                             "withhold() calls so far.")
      .def_property_readonly("bubbles",
                             locked([](const QueuedLaunches& q) { return q.bubbles_locked(); }),
                             "PhaseRunner::bubbles_in_flight, as the model counts them.")
      .def_property_readonly("abandoned",
                             locked([](const QueuedLaunches& q) { return q.abandoned; }))
      .def(
          "make_stop_fail",
          [](QueuedLaunches& q) {
            std::lock_guard<std::mutex> lk(q.mu);
            q.stop_fails = true;
          },
          "From now on stop() throws, as a stop write does on a broken CUDA context.")
      .def_property_readonly("begun", locked([](const QueuedLaunches& q) { return q.phases > 0; }))
      .def_property_readonly("runs", locked([](const QueuedLaunches& q) { return q.runs; }))
      .def_property_readonly("phase", locked([](const QueuedLaunches& q) { return q.phase; }),
                             "The runner's current phase (the last begin_phase()).")
      .def_property_readonly("n_items", locked([](const QueuedLaunches& q) { return q.n_items; }),
                             "Items of the runner's current phase, as begin_phase() gave them.")
      .def_property_readonly("pending_phases",
                             locked([](const QueuedLaunches& q) {
                               py::list out;
                               for (const QueuedLaunches::Launch& l : q.pending) {
                                 out.append(py::make_tuple(l.phase, l.guarded));
                               }
                               return out;
                             }),
                             "(phase, guarded) of every launch pending, oldest first.")
      .def_property_readonly("ran", locked([](const QueuedLaunches& q) { return q.ran; }),
                             "Items every ended launch ran, in all (the model's device).");

  t.def(
      "queue_executor",
      [](uint64_t memory_budget, bool phases_ahead, uint64_t max_lookahead, bool followers,
         bool device_phases, bool withhold) {
        freeride::QueueSwitches on;
        on.phases_ahead = phases_ahead;
        on.lookahead_bound = max_lookahead;
        on.followers = followers;
        on.device_phases = device_phases;
        on.withhold = withhold;
        return std::make_unique<Executor>(std::make_unique<QueueBackend>(on), memory_budget);
      },
      py::arg("memory_budget") = 0, py::arg("phases_ahead") = false,
      py::arg("max_lookahead") = 0, py::arg("followers") = false,
      py::arg("device_phases") = false, py::arg("withhold") = false,
      "An Executor on the test queue backend: its launches are enqueued and ended by the "
      "test (queue_launches). phases_ahead: its runners begin phases with launches in "
      "flight and chain the next phase's at opens (csrc/phase_ahead_rule.hpp). "
      "max_lookahead: the lookahead bound (csrc/open_launch_rule.hpp; 0: none). followers: "
      "the next task follows one in its tail (csrc/follow_rule.hpp). device_phases: a task "
      "that can serve every phase from one launch does (csrc/device_phases.hpp). withhold: "
      "a task preempted with launches queued ahead runs their items (csrc/withhold_rule.hpp).");
  t.def("within_lookahead", &freeride::within_lookahead, py::arg("opens_ahead"),
        py::arg("bound"), "csrc/open_launch_rule.hpp's within_lookahead.");
  t.def(
      "launches_at_open",
      [](bool enabled, uint64_t phase, uint64_t num_phases, bool phase_done, uint64_t next_items,
         size_t room) {
        const freeride::OpenLaunches go = freeride::launches_at_open(
            freeride::PhaseAheadState{enabled, phase, num_phases, phase_done, next_items, room});
        return py::make_tuple(go.current, go.next);
      },
      py::arg("enabled"), py::arg("phase"), py::arg("num_phases"), py::arg("phase_done"),
      py::arg("next_items"), py::arg("room"),
      "csrc/phase_ahead_rule.hpp's launches_at_open: (current, next) an open carries.");
  t.def("phase_slot", &freeride::phase_slot, py::arg("phase"),
        "csrc/phase_ahead_rule.hpp's phase_slot: which set of counters a phase uses.");
  t.def(
      "queue_launches",
      [](Executor& ex, size_t index, double timeout) {
        return queue_backend(ex).launches(index, timeout);
      },
      py::arg("executor"), py::arg("index"), py::arg("timeout") = 10.0,
      py::call_guard<py::gil_scoped_release>(),
      "The launches of the index-th runner the executor made (admission order).");
  t.def(
      "queue_open",
      [](Executor& ex, size_t count, uint64_t stream, uint32_t seq) {
        return queue_backend(ex).open(count, stream, seq);
      },
      py::arg("executor"), py::arg("count") = 1, py::arg("stream") = 0, py::arg("seq") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "`count` stream-ordered opens on training stream `stream` (a number), numbered from "
      "`seq` (0: not given), each launching the runner armed then: (its index in admission "
      "order, or -1 where none is armed, launches it took).");
  t.def(
      "queue_open_one",
      [](Executor& ex, uint64_t stream) {
        std::vector<int64_t> queued;
        {
          py::gil_scoped_release released;
          queued = queue_backend(ex).open_one(stream);
        }
        py::list out;
        for (const int64_t index : queued) out.append(index);
        return out;
      },
      py::arg("executor"), py::arg("stream") = 0,
      "One open: the runner index of every launch it queued, in stream order (the armed "
      "runner's, then its follower's).");
  t.def(
      "queue_follower", [](Executor& ex) { return queue_backend(ex).follower(); },
      py::arg("executor"), "The index of the runner following the armed one (-1: none).");
  t.def(
      "follow_next",
      [](bool enabled, bool last_phase, uint64_t items_left, uint64_t items_per_open,
         uint64_t in_flight) {
        return freeride::follow_next(
            freeride::FollowState{enabled, last_phase, items_left, items_per_open, in_flight});
      },
      py::arg("enabled"), py::arg("last_phase"), py::arg("items_left"),
      py::arg("items_per_open"), py::arg("in_flight"), "csrc/follow_rule.hpp's follow_next.");
  t.def(
      "withhold_preempted",
      [](bool enabled, uint64_t bubbles, bool urgent_queued) {
        return freeride::withhold_preempted(
            freeride::WithholdState{enabled, bubbles, urgent_queued});
      },
      py::arg("enabled"), py::arg("bubbles"), py::arg("urgent_queued"),
      "csrc/withhold_rule.hpp's withhold_preempted.");
  t.def("withholds", &freeride::withholds, py::arg("enabled"), py::arg("launch_at_opens"),
        py::arg("one_queue"), "csrc/withhold_rule.hpp's withholds.");
  t.def(
      "queue_hold_backoffs",
      [](Executor& ex, bool on) {
        queue_backend(ex).hold_backoffs(on);
      },
      py::arg("executor"), py::arg("on"),
      "While on, each backoff of the executor lasts until a submit, cancel or close.");
  t.def(
      "queue_wait_backoffs",
      [](Executor& ex, uint64_t count, double timeout) {
        return queue_backend(ex).wait_backoffs(count, timeout);
      },
      py::arg("executor"), py::arg("count"), py::arg("timeout") = 10.0,
      py::call_guard<py::gil_scoped_release>(),
      "Whether `count` backoffs have begun within `timeout` seconds.");
  t.def(
      "queue_abandoned_work",
      [](Executor& ex) {
        return queue_backend(ex).abandoned_work();
      },
      py::arg("executor"), "Whether close() told the backend that launches were abandoned.");
}

}  // namespace freeride_ext
