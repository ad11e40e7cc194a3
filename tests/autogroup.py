"""Whether sessions are scheduling groups of their own here, read from the kernel by the
tests themselves (not by freeride's own detection, which they check)."""

import os


def _cpu_cgroup_path() -> str | None:
    """This process's cgroup in the hierarchy with the cpu controller (v1), or its v2
    path where no v1 hierarchy has it; None without /proc/self/cgroup."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
        if not controllers:
            v2 = path
    return v2


def why_sessions_share_a_group() -> str | None:
    """None where autogroup is on and decides this process's group (its cpu cgroup is the
    root), so that a process started in a new session competes for the cores as a group
    of its own; else why not, as a skip reason."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            enabled = f.read().strip()
    except OSError:
        return "this kernel has no autogroup: sessions are no scheduling groups"
    if enabled != "1":
        return (
            "autogroup is off (/proc/sys/kernel/sched_autogroup_enabled is 0): sessions are "
            "no scheduling groups; as root, echo 1 > /proc/sys/kernel/sched_autogroup_enabled"
        )
    path = _cpu_cgroup_path()
    if path not in (None, "/") or os.path.exists("/sys/fs/cgroup/cpu.weight"):
        return f"this process is in cgroup {path}: autogroup may not decide its group"
    return None
