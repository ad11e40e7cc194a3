#include "host_idle.hpp"

#ifdef __linux__
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include "check.hpp"
#include "test_switches.hpp"

namespace freeride {
namespace {

// The idle cgroup's name under the cpu hierarchy's root: one for every process and user
// of the machine, so that side threads are idle against each other's training too.
constexpr const char* kGroupName = "freeride-idle";

#ifdef __linux__
std::optional<std::string> read_text(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  if (n < 0) return std::nullopt;
  return out;
}

// Returns 0, or the errno of the failure.
int write_text(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const ssize_t n = write(fd, text.data(), text.size());
  const int error = n == static_cast<ssize_t>(text.size()) ? 0 : (n < 0 ? errno : EIO);
  close(fd);
  return error;
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  return std::string(s);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

bool has_token(std::string_view list, std::string_view token) {
  for (std::string_view t : split(list, ',')) {
    if (t == token) return true;
  }
  return false;
}

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

std::string errno_text(int error) { return std::string(std::strerror(error)); }

pid_t this_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Where this process's cpu controller is: a cgroup v1 hierarchy with "cpu" among its
// controllers, or else the v2 hierarchy; the process's path within it (from
// /proc/self/cgroup) and the folder that path is at (from /proc/self/mountinfo; empty
// where the hierarchy is not mounted at its root).
struct CpuCgroup {
  int version = 0;  // 0: no cgroup information
  std::string path;
  std::string folder;
  std::string mount;  // the hierarchy's root folder
};

CpuCgroup find_cpu_cgroup() {
  CpuCgroup found;
  const auto cgroups = read_text("/proc/self/cgroup");
  if (!cgroups) return found;
  std::string v2_path;
  bool has_v2 = false;
  for (std::string_view line : split(*cgroups, '\n')) {
    const size_t a = line.find(':');
    const size_t b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(a + 1, b - a - 1);
    const std::string_view path = line.substr(b + 1);
    if (has_token(controllers, "cpu")) {
      found.version = 1;
      found.path = std::string(path);
    } else if (line.substr(0, a) == "0" && controllers.empty()) {
      has_v2 = true;
      v2_path = std::string(path);
    }
  }
  if (found.version == 0 && has_v2) {
    found.version = 2;
    found.path = v2_path;
  }
  if (found.version == 0) return found;
  const auto mounts = read_text("/proc/self/mountinfo");
  if (!mounts) return found;
  for (std::string_view line : split(*mounts, '\n')) {
    const size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const auto fields = split(line.substr(0, dash), ' ');
    const auto tail = split(line.substr(dash + 3), ' ');
    if (fields.size() < 5 || tail.size() < 3) continue;
    const bool match = found.version == 1
                           ? tail[0] == "cgroup" && has_token(tail[2], "cpu")
                           : tail[0] == "cgroup2";
    if (!match || fields[3] != "/") continue;  // a subtree's mount: paths do not map
    found.mount = std::string(fields[4]);
    found.folder = found.mount + (found.path == "/" ? "" : found.path);
    return found;
  }
  return found;
}

// Whether autogroup decides this process's group: it does for processes whose cpu
// cgroup is the root one (the kernel's task_wants_autogroup), and a cgroup of their own
// otherwise. On v2 a cgroup with the cpu controller has cpu.weight, the root has none.
bool in_root_cpu_group(const CpuCgroup& cg, std::string& where) {
  where = cg.path;
  if (cg.version == 1) return cg.path == "/";
  if (cg.version != 2 || cg.mount.empty()) return true;
  std::string folder = cg.mount;
  if (exists(folder + "/cpu.weight")) return false;  // a namespace's root, not the machine's
  for (std::string_view part : split(cg.path, '/')) {
    if (part.empty()) continue;
    folder += '/';
    folder.append(part);
    if (exists(folder + "/cpu.weight")) return false;
  }
  return true;
}

// "" where autogroup decides this process's group, else why not.
std::string autogroup_leaves_alone() {
  const auto enabled = read_text("/proc/sys/kernel/sched_autogroup_enabled");
  if (!enabled) return "no autogroup on this kernel";
  if (trim(*enabled) != "1") return "autogroup is off";
  std::string where;
  if (!in_root_cpu_group(find_cpu_cgroup(), where)) {
    return "autogroup is on but leaves this process alone: it is in cpu cgroup " + where;
  }
  return "";
}

// Makes (or finds) the idle cgroup beside the autogroups, and moves a thread into it
// to see that side threads can join: "" and the group's and its parent's tasks files,
// or why not.
std::string find_idle_cgroup(std::string& tasks, std::string& parent) {
  if (test_switches::refuse_idle_cgroup()) {
    return "refused: forced by freeride._C._testing.refuse_idle_cgroup";
  }
  const CpuCgroup cg = find_cpu_cgroup();
  if (cg.version != 1) return "no cgroup v1 cpu hierarchy";
  if (cg.path != "/" || cg.mount.empty()) return "this process is not in its root";
  const std::string group = cg.mount + "/" + kGroupName;
  if (mkdir(group.c_str(), 0755) != 0 && errno != EEXIST) {
    return "cannot make " + group + ": " + errno_text(errno);
  }
  const auto idle = read_text(group + "/cpu.idle");
  if (!idle) return group + "/cpu.idle cannot be read (a kernel before 5.15?)";
  if (trim(*idle) != "1") {
    const int error = write_text(group + "/cpu.idle", "1");
    if (error != 0) return "cannot set " + group + "/cpu.idle: " + errno_text(error);
  }
  // By a thread of its own, not this (training's) one, which must never land there.
  const std::string into = group + "/tasks";
  const std::string back = cg.mount + "/tasks";
  int error = 0;
  std::thread probe([&] {
    const std::string tid = std::to_string(this_tid());
    error = write_text(into, tid);
    if (error == 0) (void)write_text(back, tid);  // needs root, as leave_all's moves do
  });
  probe.join();
  if (error != 0) return "cannot move a thread into " + into + ": " + errno_text(error);
  tasks = into;
  parent = back;
  return "";
}

std::mutex g_cgroup_mutex;
std::string g_parent_tasks;  // set once a HostIdle has used the idle cgroup
#endif

}  // namespace

HostIdle::HostIdle() {
#ifdef __linux__
  const char* env = std::getenv("FREERIDE_HOST_IDLE");
  const std::string asked = env != nullptr && *env != '\0' ? env : "auto";
  FR_ARG(asked == "auto" || asked == "sched-idle" || asked == "idle-cgroup" || asked == "backoff",
         "FREERIDE_HOST_IDLE must be auto, sched-idle, idle-cgroup or backoff, got '" << asked
                                                                                     << "'");
  std::string why = "FREERIDE_HOST_IDLE=" + asked;
  if (asked == "auto") {
    const std::string alone = autogroup_leaves_alone();
    if (!alone.empty()) {
      mechanism_ = "sched-idle";
      reason_ = alone;
      return;
    }
    // A process that shares its session (the demo's one-session launch, a test runner's
    // children) most likely shares it, and so its group, with the ranks it was started
    // with, and SCHED_IDLE alone keeps out of their way; one that leads its session
    // (torchrun's workers) is a group of its own.
    if (getsid(0) != getpid()) {
      mechanism_ = "sched-idle";
      reason_ = "autogroup is on, and this process shares its session and so its group";
      return;
    }
    why = "autogroup is on, and this process leads its session: a scheduling group of its own";
  }
  if (asked == "sched-idle") {
    mechanism_ = asked;
    reason_ = why;
    return;
  }
  if (asked != "backoff") {
    const std::string failure = find_idle_cgroup(group_tasks_, parent_tasks_);
    if (failure.empty()) {
      std::lock_guard<std::mutex> lock(g_cgroup_mutex);
      g_parent_tasks = parent_tasks_;
      mechanism_ = "idle-cgroup";
      const std::string group = group_tasks_.substr(0, group_tasks_.rfind('/'));
      reason_ = why + "; side threads join " + group + " (cpu.idle=1)";
      return;
    }
    why += "; no idle cgroup (" + failure + ")";
  }
  loadavg_fd_ = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (loadavg_fd_ < 0) {
    mechanism_ = "sched-idle";
    reason_ = why + "; /proc/loadavg cannot be read: " + errno_text(errno);
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores_ = std::max(1, CPU_COUNT(&set));
  mechanism_ = "backoff";
  reason_ = why + "; side threads sleep while more threads are runnable than the " +
            std::to_string(cores_) + " cores this process may use";
#else
  mechanism_ = "sched-idle";
  reason_ = "not Linux: no idle priority";
#endif
}

HostIdle::~HostIdle() {
#ifdef __linux__
  if (loadavg_fd_ >= 0) close(loadavg_fd_);
#endif
}

void HostIdle::enter() {
#ifdef __linux__
  // The host's equivalent of the lowest-priority side stream: a SCHED_IDLE thread gets a
  // core only when nothing else of its group wants it, and a waking training thread of
  // the group takes the core back at once. Best effort: where the policy is refused, the
  // thread runs at normal priority.
  sched_param param{};
  param.sched_priority = 0;
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
  if (group_tasks_.empty()) return;
  const pid_t tid = this_tid();
  // Probed at construction; a refusal now leaves this thread where it is, SCHED_IDLE.
  if (write_text(group_tasks_, std::to_string(tid)) == 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    joined_.push_back(tid);
  }
#endif
}

void HostIdle::leave_all() {
#ifdef __linux__
  std::lock_guard<std::mutex> lock(mutex_);
  for (const pid_t tid : joined_) (void)write_text(parent_tasks_, std::to_string(tid));
  joined_.clear();
#endif
}

bool HostIdle::crowded() const {
#ifdef __linux__
  if (loadavg_fd_ < 0) return false;
  // "0.64 0.64 0.54 3/82 10965": the fourth field counts the runnable threads of the
  // machine now, the caller included.
  char buf[128];
  const ssize_t n = pread(loadavg_fd_, buf, sizeof buf - 1, 0);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = buf;
  for (int field = 0; field < 3; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  return std::strtol(p, nullptr, 10) > cores_;
#else
  return false;
#endif
}

void leave_idle_cgroup(pid_t tid) {
#ifdef __linux__
  std::string parent;
  {
    std::lock_guard<std::mutex> lock(g_cgroup_mutex);
    parent = g_parent_tasks;
  }
  if (parent.empty()) return;
  const auto cgroups = read_text("/proc/self/task/" + std::to_string(tid) + "/cgroup");
  if (cgroups && cgroups->find(std::string("/") + kGroupName + "\n") != std::string::npos) {
    (void)write_text(parent, std::to_string(tid));
  }
#else
  (void)tid;
#endif
}

}  // namespace freeride
