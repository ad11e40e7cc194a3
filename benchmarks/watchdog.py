"""Runs a command under a hard time limit and, if it hangs, says where before killing it.

    python benchmarks/watchdog.py SECONDS CMD...

At the limit every process of the command's tree is dumped first, so a hang shows its
native and Python stacks instead of only "timed out": each Python process with
`py-spy dump --native` where py-spy is installed (benchmarks/run_gpu.sh installs it from
a carried wheel), and with WATCHDOG_CUDA_GDB=1 the GPU's resident kernels with cuda-gdb
(slow: up to a minute a process); then the tree gets SIGABRT (faulthandler prints the
Python stacks of a process that has it on) and, 10 s later, SIGKILL. Exits with the command's status,
or 124 after a timeout (as coreutils' timeout does).
"""

import os
import shutil
import signal
import subprocess
import sys
import time


def descendants(root: int) -> list[int]:
    """root and every process below it (read from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def dump(pids: list[int]) -> None:
    spy = shutil.which("py-spy")
    for pid in pids:
        line = cmdline(pid)
        print(f"\n=== watchdog: pid {pid}: {line[:300]}", flush=True)
        if spy and "python" in line:
            subprocess.run([spy, "dump", "--native", "--pid", str(pid)], timeout=30, check=False)
    gdb = shutil.which("cuda-gdb")
    if gdb and os.environ.get("WATCHDOG_CUDA_GDB") == "1":
        for pid in pids:
            if "python" not in cmdline(pid):
                continue
            print(f"\n=== watchdog: cuda kernels of pid {pid}", flush=True)
            subprocess.run(
                [gdb, "-p", str(pid), "-batch", "-ex", "info cuda kernels"],
                timeout=60,
                check=False,
                stdin=subprocess.DEVNULL,
            )


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def main() -> int:
    limit, cmd = float(sys.argv[1]), sys.argv[2:]
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        pass
    pids = descendants(proc.pid)
    print(f"\n=== watchdog: {cmd[:3]} still running after {limit:.0f} s", flush=True)
    try:
        dump(pids)
    except Exception as exc:  # noqa: BLE001 - the kill below must still happen
        print(f"=== watchdog: dump failed: {exc}", flush=True)
    signal_all(descendants(proc.pid), signal.SIGABRT)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_all(descendants(proc.pid), signal.SIGKILL)
    proc.wait()
    return 124


if __name__ == "__main__":
    sys.exit(main())
