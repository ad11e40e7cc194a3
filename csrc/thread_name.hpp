// Names and scheduling of freeride's own threads.
#pragma once

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

#include <thread>

namespace freeride {

// Names the calling thread (Linux: at most 15 characters, shown in /proc/<pid>/task/*/comm,
// top -H, py-spy and gdb), so that freeride's threads can be told apart from the
// training's: every one of them is named "freeride-...".
inline void name_this_thread(const char* name) {
#ifdef __linux__
  (void)pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

// Close-time: a side thread running at idle priority (SCHED_IDLE) gets a core only when
// no other thread of the machine wants one, so on a busy machine joining it could wait
// for seconds. Where the OS allows it (CAP_SYS_NICE, as root in most containers, or an
// RLIMIT_NICE of 20 or more) the thread goes back to the normal policy to exit; elsewhere
// this does nothing and the join waits for an idle core. Threads not at idle priority are
// left as they are.
inline void leave_idle_priority(std::thread& thread) {
#ifdef __linux__
  if (!thread.joinable()) return;
  const pthread_t handle = thread.native_handle();
  int policy = 0;
  sched_param param{};
  if (pthread_getschedparam(handle, &policy, &param) != 0 || policy != SCHED_IDLE) return;
  param.sched_priority = 0;
  (void)pthread_setschedparam(handle, SCHED_OTHER, &param);
#else
  (void)thread;
#endif
}

}  // namespace freeride
