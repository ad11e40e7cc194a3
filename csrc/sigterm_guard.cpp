#include "sigterm_guard.hpp"

#ifdef __linux__
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#include "host_idle.hpp"
#include "thread_name.hpp"
#endif

namespace freeride::sigterm_guard {

#ifdef __linux__
namespace {

constexpr char kSignal = 'T';  // the chain saw a SIGTERM
constexpr char kStop = 'S';    // disarm(): the watchdog returns

std::mutex g_mu;  // arm() and disarm()
// The handler the chain calls after noting the signal: written only while the chain is
// not installed.
struct sigaction g_previous {};
// The pipe from the chain (async-signal-safe write) to the watchdog; made once, kept for
// the process's life, so that a handler running late never writes to a reused descriptor.
std::atomic<int> g_write_fd{-1};
int g_read_fd = -1;
std::atomic<pid_t> g_owner{0};  // the process that armed: a forked child is not it
std::atomic<bool> g_stood_down{false};
// Never destroyed: a joinable std::thread destroyed at exit would call std::terminate.
std::thread* g_watchdog = nullptr;
bool g_chained = false;
bool g_atfork = false;

void chain(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const int fd = g_write_fd.load(std::memory_order_relaxed);
  if (fd >= 0 && g_owner.load(std::memory_order_relaxed) == getpid()) {
    const char c = kSignal;
    (void)!write(fd, &c, 1);  // a full pipe holds a kSignal already
  }
  if ((g_previous.sa_flags & SA_SIGINFO) != 0) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
  errno = saved_errno;
}

bool is_chain(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 && action.sa_sigaction == chain;
}

// Every thread of a dying process must run to exit, and one at idle priority (the host
// backend's side threads) gets a core only when no other thread wants one: on a busy
// machine the process would take seconds to go. Where the OS allows it, they leave idle
// priority first (see leave_idle_priority), and freeride's idle cgroup (host_idle.hpp).
void leave_idle_priority_all() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return;
  while (const dirent* entry = readdir(dir)) {
    const pid_t tid = static_cast<pid_t>(std::strtol(entry->d_name, nullptr, 10));
    if (tid <= 0 || sched_getscheduler(tid) != SCHED_IDLE) continue;
    sched_param param{};
    (void)sched_setscheduler(tid, SCHED_OTHER, &param);
    leave_idle_cgroup(tid);
  }
  closedir(dir);
}

// SIGTERM's default action, now: the process ends killed by SIGTERM.
[[noreturn]] void die() {
  leave_idle_priority_all();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  (void)sigaction(SIGTERM, &dfl, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  (void)pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  (void)kill(getpid(), SIGTERM);
  (void)pthread_kill(pthread_self(), SIGTERM);
  // Not reached where SIGTERM can be delivered; the shell's code for it otherwise.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  _exit(128 + SIGTERM);
}

void watch(int fd, double grace_s) {
  name_this_thread("freeride-term");
  using clock = std::chrono::steady_clock;
  const auto grace =
      std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(grace_s));
  bool pending = false;
  clock::time_point deadline{};
  while (true) {
    int timeout_ms = -1;
    if (pending) {
      const auto left = deadline - clock::now();
      if (left <= clock::duration::zero()) {
        pending = false;
        if (!g_stood_down.load()) die();
        continue;
      }
      timeout_ms = static_cast<int>(
          std::chrono::ceil<std::chrono::milliseconds>(left).count());
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, timeout_ms);
    if (ready < 0 && errno != EINTR) return;  // cannot happen with a valid pipe
    if (ready <= 0) continue;
    char buf[64];
    const ssize_t n = read(fd, buf, sizeof buf);
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == kStop) return;
      if (buf[i] == kSignal && !pending) {
        pending = true;
        deadline = clock::now() + grace;
      }
    }
  }
}

void drain(int fd) {
  char buf[64];
  while (read(fd, buf, sizeof buf) > 0) {
  }
}

// In a forked child only the forking thread exists: the watchdog is not there to stop,
// and the child takes back the handler the chain was in front of (async-signal-safe).
void after_fork_in_child() {
  new (&g_mu) std::mutex;  // another thread may have held it at the fork
  if (g_chained) {
    struct sigaction current {};
    if (sigaction(SIGTERM, nullptr, &current) == 0 && is_chain(current)) {
      (void)sigaction(SIGTERM, &g_previous, nullptr);
    }
    g_chained = false;
  }
  g_watchdog = nullptr;  // leaked: its thread does not exist here
}

}  // namespace

bool arm(double grace_s) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_chained || g_watchdog != nullptr) return false;
  struct sigaction current {};
  if (sigaction(SIGTERM, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) == 0 &&
      (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) {
    return false;
  }
  if (g_read_fd < 0) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    g_read_fd = fds[0];
    g_write_fd.store(fds[1]);
  }
  drain(g_read_fd);
  if (!g_atfork) {
    if (pthread_atfork(nullptr, nullptr, after_fork_in_child) != 0) return false;
    g_atfork = true;
  }
  g_previous = current;
  g_stood_down.store(false);
  g_owner.store(getpid());
  try {
    g_watchdog = new std::thread(watch, g_read_fd, grace_s);
  } catch (const std::exception&) {
    g_watchdog = nullptr;
    return false;
  }
  struct sigaction ours {};
  ours.sa_sigaction = chain;
  ours.sa_mask = current.sa_mask;
  ours.sa_flags = SA_SIGINFO | (current.sa_flags & (SA_ONSTACK | SA_RESTART));
  if (sigaction(SIGTERM, &ours, nullptr) != 0) {
    const char c = kStop;
    (void)!write(g_write_fd.load(), &c, 1);
    g_watchdog->join();
    delete g_watchdog;
    g_watchdog = nullptr;
    return false;
  }
  g_chained = true;
  return true;
}

void stand_down() { g_stood_down.store(true); }

void disarm(bool restore_default) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_chained) {
    struct sigaction current {};
    if (sigaction(SIGTERM, nullptr, &current) == 0 && is_chain(current)) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      (void)sigaction(SIGTERM, restore_default ? &dfl : &g_previous, nullptr);
    }
    g_chained = false;
  }
  if (g_watchdog != nullptr) {
    const char c = kStop;
    // EAGAIN: the pipe is full of signals the watchdog is reading; it makes room.
    while (write(g_write_fd.load(), &c, 1) < 0 && (errno == EINTR || errno == EAGAIN)) {
      std::this_thread::yield();
    }
    g_watchdog->join();
    delete g_watchdog;
    g_watchdog = nullptr;
  }
}

bool armed() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_chained;
}

#else  // not Linux: no guard

bool arm(double) { return false; }
void stand_down() {}
void disarm(bool) {}
bool armed() { return false; }

#endif

}  // namespace freeride::sigterm_guard
