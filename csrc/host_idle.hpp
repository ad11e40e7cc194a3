// How the host backend's side threads stay out of training's way, in every scheduling
// group of the machine and not only in their own.
//
// A SCHED_IDLE thread is idle only among the threads of its own group. With autogroup on
// (/proc/sys/kernel/sched_autogroup_enabled), every session of a process in the root cpu
// cgroup is a group of its own, and the kernel first shares the cores between groups: a
// rank started in its own session (as torchrun starts them) whose side workers run gets
// a group's share of the cores, taken from the other ranks' training. Measured on 2 cores:
// idle-priority spinners in their own sessions slowed a torch.rand loop by a quarter to a
// half, and did not slow it in its own session.
//
// The mechanisms, chosen once per backend (FREERIDE_HOST_IDLE: auto, the default, or one
// of the names below to force it; a forced "idle-cgroup" that cannot be had falls back to
// "backoff"):
//   "sched-idle"   SCHED_IDLE alone: where autogroup is off, or does not decide this
//                  process's group (it is in a cpu cgroup of its own), or the process
//                  shares its session, most likely with the ranks it was started with
//                  (the demo's one-session launch, a test runner's children), which then
//                  share its group. Idle against them, not against other sessions.
//   "idle-cgroup"  in a session leader (as torchrun's workers are) under autogroup:
//                  SCHED_IDLE, and the side threads join a cpu cgroup with cpu.idle=1
//                  beside the autogroups (cgroup v1's cpu hierarchy, as root or where an
//                  administrator made the group writable): idle against every group, and
//                  a waking training thread takes the core back at once.
//   "backoff"      the same where no idle cgroup can be had: SCHED_IDLE, and between
//                  items a side thread that sees more runnable threads than this
//                  process's cores sleeps until fewer are (/proc/loadavg, about a
//                  microsecond to read): unprivileged, at the cost of side work whenever
//                  the machine is busy (another rank's side thread, or a training thread
//                  spinning in a wait, counts too).
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <vector>

namespace freeride {

class HostIdle {
 public:
  HostIdle();
  ~HostIdle();
  HostIdle(const HostIdle&) = delete;
  HostIdle& operator=(const HostIdle&) = delete;

  // "sched-idle", "idle-cgroup" or "backoff", and in words why (which condition held,
  // and why a better mechanism was not had).
  const std::string& mechanism() const { return mechanism_; }
  const std::string& reason() const { return reason_; }

  // On a side thread (a worker, the executor): SCHED_IDLE where the OS allows it, and
  // into the idle cgroup with "idle-cgroup".
  void enter();
  // Close-time: the threads enter() put in the idle cgroup leave it (with
  // leave_idle_priority, so that they exit without waiting for an idle core).
  void leave_all();

  // "backoff", between items: whether more threads are runnable than there are cores
  // (so one waits: a training thread, or another rank's side thread). Always false with
  // the other mechanisms.
  bool crowded() const;
  // How long a side thread sleeps when crowded() before it looks again.
  static constexpr long kStepAsideNs = 200'000;

 private:
  std::string mechanism_;
  std::string reason_;
  std::string group_tasks_;   // idle-cgroup: the group's tasks file
  std::string parent_tasks_;  // ...and where its threads came from
  int loadavg_fd_ = -1;       // backoff
  int cores_ = 1;             // backoff: the cores this process may run on
  std::mutex mutex_;
  std::vector<pid_t> joined_;  // idle-cgroup: threads enter() moved
};

// Moves thread `tid` of this process out of freeride's idle cgroup, if any HostIdle put
// threads there (the SIGTERM path's leave_idle_priority_all); nothing otherwise.
void leave_idle_cgroup(pid_t tid);

}  // namespace freeride
