// The scheduling rules' part of freeride._C._testing (test_hooks.hpp): the close ledger
// against a model of the device's close slots, the slice rule's pieces, the records of
// skipped and unrung opens, and the rules for successors, the watcher's launch, the
// launch's slice, waits behind another stream's open and item times. Each is the header
// the CUDA backend uses, driven on the CPU.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>

#include "check.hpp"
#include "cuda/close_ledger.hpp"
#include "cuda/open_ordinals.hpp"
#include "cuda/skipped_opens.hpp"
#include "cuda/unrung_opens.hpp"
#include "freeride/slice.h"
#include "item_time.hpp"
#include "launch_slice_rule.hpp"
#include "open_launch_rule.hpp"
#include "successor_rule.hpp"
#include "test_hooks.hpp"
#include "watcher_launch_rule.hpp"

namespace py = pybind11;

namespace freeride_ext {
namespace {

// The host's close ledger (csrc/cuda/close_ledger.hpp) against a model of the device:
// streams whose closes execute when the test says, each writing its ordinal to its slot as
// a close's batch does, and a kernel's decision at a claim (freeride/slice.h) over what
// the ledger published and the slots hold.
class CloseModel {
 public:
  CloseModel() { ledger_.place(&latest_); }

  // A stream-ordered close enqueued on `stream`, as CudaBackend::gate_write makes it:
  // `captured`, written into a graph capture; `fail`, its enqueue throws.
  void enqueue_close(int stream, bool captured, bool fail) {
    ledger_.close(!captured, [&](uint32_t ordinal) {
      if (fail) FR_THROW(freeride::RuntimeFailure, "the close's enqueue failed (test)");
      streams_[stream].push_back(ordinal);
    });
  }

  // The oldest close still queued on `stream` takes effect on the device.
  void execute(int stream) {
    auto it = streams_.find(stream);
    FR_ARG(it != streams_.end() && !it->second.empty(), "no close is queued on stream " << stream);
    const uint32_t ordinal = it->second.front();
    it->second.pop_front();
    if (ordinal != 0u) slots_[freeride::cuda::CloseLedger::slot(ordinal)] = ordinal;
  }

  bool pending() const { return freeride::close_pending(ledger_.latest(), slots_); }
  // A block of the launch begins now: it looks at the slots, and the launch keeps the
  // earliest look (enter_launch's atomic max). A launch none of whose blocks began has
  // looked at nothing (0): the rule that a close since its start ends it is off.
  void begin_block() { seen_ = std::max(seen_, freeride::closes_word(slots_)); }
  // The launch ended; the next one looks afresh (leave_launch's reset).
  void end_launch() {
    seen_ = 0u;
    next_close_ = 0u;
  }
  // The launch is made at an open written now (fr_item_ctx.next_close, as
  // CudaRunner::enqueue_locked sets it); it may begin much later (begin_block).
  void launch_at_open() { next_close_ = ledger_.next(); }
  // The executor's launch for an open whose ordinal was noted (OpenOrdinals), or 0.
  void launch_for(uint32_t next_close) { next_close_ = next_close; }
  uint32_t next_ordinal() const { return ledger_.next(); }
  bool may_claim(bool gate_open, uint64_t ran_ns, uint64_t slice_ns,
                 uint64_t max_slices) const {
    return freeride::may_claim(gate_open, ran_ns, slice_ns, ledger_.latest(), slots_, seen_,
                               next_close_, max_slices);
  }
  bool closed_since_start() const { return freeride::closed_since(seen_, slots_); }
  bool bubble_over() const { return freeride::bubble_over(next_close_, slots_); }
  uint32_t latest() const { return ledger_.latest(); }

 private:
  freeride::cuda::CloseLedger ledger_;
  unsigned int latest_ = 0;
  unsigned int slots_[FREERIDE_CLOSE_SLOTS] = {};
  unsigned int seen_ = 0;        // fr_launch_run.closes_seen
  unsigned int next_close_ = 0;  // fr_item_ctx.next_close
  std::map<int, std::deque<uint32_t>> streams_;
};

}  // namespace

void register_rule_hooks(py::module_& t) {
  py::class_<CloseModel>(t, "CloseModel",
                         "The host's close ledger against a model of the device's close "
                         "slots, and the kernels' claim decision over them (freeride/slice.h).")
      .def(py::init<>())
      .def("enqueue_close", &CloseModel::enqueue_close, py::arg("stream") = 0,
           py::arg("captured") = false, py::arg("fail") = false)
      .def("execute", &CloseModel::execute, py::arg("stream") = 0)
      .def_property_readonly("pending", &CloseModel::pending)
      .def_property_readonly("latest", &CloseModel::latest)
      .def("begin_block", &CloseModel::begin_block)
      .def("end_launch", &CloseModel::end_launch)
      .def_property_readonly("closed_since_start", &CloseModel::closed_since_start)
      .def("launch_at_open", &CloseModel::launch_at_open)
      .def("launch_for", &CloseModel::launch_for, py::arg("next_close"))
      .def_property_readonly("next_ordinal", &CloseModel::next_ordinal)
      .def_property_readonly("bubble_over", &CloseModel::bubble_over)
      .def("may_claim", &CloseModel::may_claim, py::arg("gate_open"), py::arg("ran_ns"),
           py::arg("slice_ns"), py::arg("max_slices") = 0);
  py::class_<freeride::cuda::OpenOrdinals>(
      t, "OpenOrdinals",
      "csrc/cuda/open_ordinals.hpp: the ordinal of the first close after each recent open.")
      .def(py::init<>())
      .def("note", &freeride::cuda::OpenOrdinals::note, py::arg("seq"), py::arg("next_close"))
      .def("next_close", &freeride::cuda::OpenOrdinals::next_close, py::arg("seq"))
      .def_property_readonly_static(
          "KEPT", [](py::object) { return freeride::cuda::OpenOrdinals::kKept; });
  t.def("close_ordinal_after", &freeride::cuda::CloseLedger::after, py::arg("ordinal"),
        "csrc/cuda/close_ledger.hpp's CloseLedger::after: the next ordinal, 0 skipped.");
  t.def(
      "closes_word",
      [](unsigned int a, unsigned int b, unsigned int c, unsigned int d) {
        const unsigned int slots[FREERIDE_CLOSE_SLOTS] = {a, b, c, d};
        return freeride::closes_word(slots);
      },
      "freeride/slice.h's closes_word over the four close slots.");
  t.def("waits_for_refresh", &freeride::waits_for_refresh, py::arg("word"), py::arg("now_ns"),
        "freeride/slice.h's waits_for_refresh.");
  t.def(
      "slice_time",
      [](uint64_t ran_ns, uint64_t slice_ns, uint64_t max_slices) {
        return static_cast<int>(freeride::slice_time(ran_ns, slice_ns, max_slices));
      },
      py::arg("ran_ns"), py::arg("slice_ns"), py::arg("max_slices") = 0,
      "freeride/slice.h's slice_time: 0 within the slice, 1 extendable, 2 over "
      "(max_slices 0: FREERIDE_MAX_SLICES).");
  t.def(
      "look_at_pending",
      [](uint64_t word, uint64_t now_ns) {
        const freeride::PendingLook look = freeride::look_at_pending(word, now_ns);
        return py::make_tuple(look.refresh, look.answer, static_cast<uint64_t>(look.kept));
      },
      py::arg("word"), py::arg("now_ns"),
      "freeride/slice.h's look_at_pending: (refresh, answer, kept).");
  t.def(
      "pending_word",
      [](bool pending, uint64_t at_ns, bool in_flight) {
        return static_cast<uint64_t>(freeride::pending_word(pending, at_ns, in_flight));
      },
      py::arg("pending"), py::arg("at_ns"), py::arg("in_flight") = false,
      "freeride/slice.h's pending_word.");
  t.def(
      "pending_answer",
      [](uint64_t word, uint64_t now_ns) { return freeride::pending_answer(word, now_ns); },
      py::arg("word"), py::arg("now_ns"), "freeride/slice.h's pending_answer.");
  t.attr("PENDING_FRESH_NS") = py::int_(FREERIDE_PENDING_FRESH_NS);
  t.attr("PENDING_WAIT_NS") = py::int_(FREERIDE_PENDING_WAIT_NS);
  py::class_<freeride::cuda::SkippedOpens>(
      t, "SkippedOpens",
      "The CUDA backend's record of stream-ordered opens written without a launch "
      "(csrc/cuda/skipped_opens.hpp).")
      .def(py::init<>())
      .def("note", &freeride::cuda::SkippedOpens::note, py::arg("seq"))
      .def("contains", &freeride::cuda::SkippedOpens::contains, py::arg("seq"))
      .def_property_readonly_static(
          "KEPT", [](const py::object&) { return freeride::cuda::SkippedOpens::kKept; });
  py::class_<freeride::cuda::UnrungOpens>(
      t, "UnrungOpens",
      "The CUDA backend's record of whether an open may take effect without a ring, and "
      "so how long the executor sleeps on the gate's bell between looks at the mirror "
      "(csrc/cuda/unrung_opens.hpp).")
      .def(py::init<>())
      .def("note_open", &freeride::cuda::UnrungOpens::note_open, py::arg("stream"),
           py::arg("captured"), py::arg("ambiguous") = false)
      .def("note_unrung", &freeride::cuda::UnrungOpens::note_unrung)
      .def("any", &freeride::cuda::UnrungOpens::any)
      .def("poll_us", [](const freeride::cuda::UnrungOpens& u) { return u.poll().count(); });
  t.def(
      "queue_successor",
      [](bool enabled, bool has_slice, size_t pending, bool newest_running, bool progressed,
         bool gate_open, bool stopping, bool phase_done, bool follows_protocol) {
        freeride::SuccessorState s;
        s.enabled = enabled;
        s.has_slice = has_slice;
        s.pending = pending;
        s.newest_running = newest_running;
        s.progressed = progressed;
        s.gate_open = gate_open;
        s.stopping = stopping;
        s.phase_done = phase_done;
        s.follows_protocol = follows_protocol;
        return freeride::queue_successor(s);
      },
      py::arg("enabled") = true, py::arg("has_slice") = true, py::arg("pending") = 1,
      py::arg("newest_running") = true, py::arg("progressed") = true,
      py::arg("gate_open") = true, py::arg("stopping") = false, py::arg("phase_done") = false,
      py::arg("follows_protocol") = true, "freeride/successor_rule.hpp's queue_successor.");
  t.def(
      "watcher_launches",
      [](bool enabled, bool pending, bool accepting, bool stopping, bool gate_open,
         bool same_open, bool skipped, bool others_pending) {
        freeride::ReachedOpen o;
        o.enabled = enabled;
        o.pending = pending;
        o.accepting = accepting;
        o.stopping = stopping;
        o.gate_open = gate_open;
        o.same_open = same_open;
        o.skipped = skipped;
        o.others_pending = others_pending;
        return freeride::watcher_launches(o);
      },
      py::arg("enabled") = true, py::arg("pending") = false, py::arg("accepting") = true,
      py::arg("stopping") = false, py::arg("gate_open") = true, py::arg("same_open") = true,
      py::arg("skipped") = false, py::arg("others_pending") = false,
      "csrc/watcher_launch_rule.hpp's watcher_launches.");
  t.def("launch_slice_ns", &freeride::launch_slice_ns, py::arg("slice_ns"),
        py::arg("at_open"), py::arg("next_close"), py::arg("stream_wait"),
        "csrc/launch_slice_rule.hpp's launch_slice_ns.");
  t.def("waits_behind_another_stream", &freeride::waits_behind_another_stream,
        py::arg("newest_at_open"), py::arg("newest_begun"), py::arg("same_stream"),
        "freeride/open_launch_rule.hpp's waits_behind_another_stream.");
  t.def("served_by_executor", &freeride::served_by_executor, py::arg("newest_at_open"),
        py::arg("newest_holds"), py::arg("newest_seq"), py::arg("seq"),
        "freeride/open_launch_rule.hpp's served_by_executor.");
  t.def("launch_block_item_ns", &freeride::launch_block_item_ns, py::arg("duration_ns"),
        py::arg("blocks"), py::arg("items"), "freeride/item_time.hpp's launch_block_item_ns.");
  t.def("smoothed_item_ns", &freeride::smoothed_item_ns, py::arg("estimate"),
        py::arg("measured"), "freeride/item_time.hpp's smoothed_item_ns.");
}

}  // namespace freeride_ext
