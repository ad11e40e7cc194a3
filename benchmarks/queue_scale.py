"""The job queue at scale (issue 35): a leader's Hub and Coordinator in this process, N
simulated ranks as channel Links spread over P worker processes on loopback.

    python benchmarks/queue_scale.py [--ranks 4096] [--procs 8] [--window 10] [--json PATH]

Reports the time from spawning the workers until the hub holds a session for every rank,
the Links that failed to get in (and why), and over `--window` seconds of steady state
(every rank sending its stats as a real rank's beat thread does) the CPU the leader
process spends, as a share of one core, split by thread, with the workers' CPU beside it.
Targets: no failures at 4,096 ranks and the leader's liveness under 5% of one core.

The run follows JobQueue's own order: every Link is welcomed first (a JobQueue's
constructor returns on no rank before its gloo barrier), then the coordinator starts and
the ranks start beating. Rank 0, the leader's own rank, keeps its Link and beat in this
process as a real leader does; ranks 1..N-1 live in the workers. What a simulated rank
leaves out: its agent's serving thread (a rank-side cost; the leader never sees it).
A worker's Links share one zmq context (one I/O thread) where the channel allows, since a
context each would be two more threads per simulated rank; `--context-per-link` gives
each its own, as a real rank's single Link has.

On a real job the leader's machine does not also run thousands of ranks; here it does,
so the leader's figure is what it got while competing with them. Whether the workers kept
their ranks' beat is reported beside it (stats sent per second against the target, and
how long a Link went without hearing the hub): where they did not, the leader carried
less than a real job's load. `--worker-nice` lowers the workers' priority so that the
leader gets what it asks for; but starved workers stop reading the hub's beats, which
then queue in their sockets (up to the channel's high-water mark, per Link), so the run
stops itself (MemoryError) if the machine's available memory runs low.

Workers are this file run with `--worker`: their settings, the job's secret included,
come on stdin (never argv, which every local user can read), then one command a line
("go", "mark", "report", "stop"; end of input stops too), and each answers with one JSON
line per phase on stdout.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import logging
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

HOST = "127.0.0.1"
CPU_TARGET_PCT = 5.0  # the leader's liveness, as a share of one core (issue 35)
# What ranks used before freeride.job.liveness (which scales both with the job's size):
# queue.py's fixed _BEAT_S and JobQueue's default rank_timeout then.
FIXED_INTERVAL_S = 0.1
FIXED_RANK_TIMEOUT_S = 5.0
LINK_TIMEOUT_S = 60.0  # JobQueue's default setup timeout, which bounds each rank's Link
CONNECT_THREADS = 64
WORKER_NICE = 0
MIN_AVAILABLE = 0.15  # share of the machine's memory kept free, or the run stops
KEEP_ERRORS = 5
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- settings shared by both sides -----------------------------------------------------------


def liveness_settings(ranks: int) -> tuple[float, float, str]:
    """(stats interval, rank_timeout, where they came from) for a job of `ranks` ranks:
    freeride.job.liveness where it exists, else the fixed values from before it."""
    try:
        from freeride.job import liveness
    except ImportError:
        return FIXED_INTERVAL_S, FIXED_RANK_TIMEOUT_S, "fixed (no freeride.job.liveness)"
    timeout = float(liveness.rank_timeout(ranks))
    return float(liveness.every(ranks, timeout)), timeout, "freeride.job.liveness"


def accepts(function: Any, name: str) -> bool:
    """Whether `function` takes the keyword `name`. The channel took its liveness interval
    (beat_s, ping_s) and a shared context with freeride.job.liveness; an older one beat
    every 100 ms and gave each Link a context (an I/O thread) of its own. The benchmark
    runs against either, so that a change can be measured before and after."""
    return name in inspect.signature(function).parameters


def send_stats(link: Any, rank: int) -> None:
    """Sends what a rank with an idle harvester and 1 GiB free sends as its beat: packed
    stats where the channel has them (Link.send_stats), else the pickled message an
    older rank sent."""
    if hasattr(link, "send_stats"):
        from freeride.job import messages

        link.send_stats(messages.pack_stats(0, 0, 1 << 30, 0))
    else:
        link.send(("stats", rank, 0, 0, 1 << 30, 0))


def split(first: int, end: int, parts: int) -> list[tuple[int, int]]:
    """[first, end) cut into `parts` contiguous ranges as even as can be (empty ones
    left out)."""
    count = end - first
    bounds = [first + count * i // parts for i in range(parts + 1)]
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def summary(values: list[float]) -> dict[str, float | None]:
    """Median, 90th percentile and maximum of `values` (None each where empty)."""
    if not values:
        return {"median": None, "p90": None, "max": None}
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 4),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
        "max": round(ordered[-1], 4),
    }


def process_resources() -> dict[str, float]:
    """This process's threads, open descriptors and resident memory (MiB), from /proc."""
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_mib": round(rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1),
    }


# -- a worker: the simulated ranks -----------------------------------------------------------


class Beats(threading.Thread):
    """One thread sending every Link's stats once per `interval`, the sends spread evenly
    over it. Like a real rank's beat thread it never bursts to catch up: a round that
    starts more than an interval late starts now, and counts as late."""

    def __init__(self, links: list[tuple[int, Any]], interval: float) -> None:
        super().__init__(name="queue-scale-beats", daemon=True)
        self._links = links
        self._interval = interval
        self._stop_event = threading.Event()
        self.sent = 0
        self.late_rounds = 0
        self.max_lag = 0.0
        self.received: dict[str, int] = {}

    def run(self) -> None:
        gap = self._interval / len(self._links)
        begun = time.monotonic()
        while not self._stop_event.is_set():
            for k, (rank, link) in enumerate(self._links):
                due = begun + k * gap
                lag = time.monotonic() - due
                # Sleeping less than a couple of ms costs more than it spreads.
                if lag < -0.002 and self._stop_event.wait(-lag):
                    return
                self.max_lag = max(self.max_lag, lag)
                send_stats(link, rank)
                self.sent += 1
                self._drain(link)
            begun += self._interval
            if time.monotonic() - begun > self._interval:
                self.late_rounds += 1
                begun = time.monotonic()

    def _drain(self, link: Any) -> None:
        """Counts what the coordinator sent the rank ("lost" would mean a miss)."""
        while (message := link.poll()) is not None:
            kind = str(message[0]) if isinstance(message, tuple) and message else "?"
            self.received[kind] = self.received.get(kind, 0) + 1

    def halt(self) -> None:
        self._stop_event.set()


def connect_all(
    config: dict[str, Any], context: Any
) -> tuple[list[tuple[int, Any]], dict[str, Any]]:
    """Opens a Link for each of the config's ranks, `threads` at a time (a Link blocks
    until welcomed), on `context` where not None. Returns the Links in and a report:
    counts, failures by type with the first few messages, and when (s since the first
    attempt) each was welcomed."""
    from freeride.job import auth, channel

    secret = bytes.fromhex(config["secret"])
    key = config["key"].encode()
    port = config["port"]
    address = f"{HOST}:{port}"
    options = link_options(config["interval"])
    if context is not None:
        options["context"] = context
    begun = time.monotonic()

    def connect(rank: int) -> tuple[int, Any, str | None, float]:
        try:
            link = channel.Link(
                HOST,
                port,
                secret,
                key,
                auth.rank_role(rank),
                config["link_timeout"],
                address,
                **options,
            )
        except Exception as exc:  # noqa: BLE001 - a failure is what this measures
            return rank, None, f"{type(exc).__name__}: {exc}", time.monotonic() - begun
        return rank, link, None, time.monotonic() - begun

    links: list[tuple[int, Any]] = []
    welcomed: list[float] = []
    by_type: dict[str, int] = {}
    errors: list[str] = []
    first, end = config["ranks"]
    with ThreadPoolExecutor(config["threads"]) as pool:
        for rank, link, error, at in pool.map(connect, range(first, end)):
            if link is not None:
                links.append((rank, link))
                welcomed.append(at)
                continue
            kind = error.split(":", 1)[0]
            # The first few, and the first of each kind: a rare kind is the telling one.
            if len(errors) < KEEP_ERRORS or kind not in by_type:
                errors.append(f"rank {rank} after {at:.1f} s: {error}")
            by_type[kind] = by_type.get(kind, 0) + 1
    report = {
        "phase": "in",
        "in": len(links),
        "failed": end - first - len(links),
        "failed_by_type": by_type,
        "errors": errors,
        "welcomed_s": [round(t, 3) for t in welcomed],
        "connect_s": round(time.monotonic() - begun, 3),
        **process_resources(),
    }
    return links, report


def link_options(interval: float) -> dict[str, Any]:
    """The keywords a rank's Link gets from JobQueue: it pings when it has been silent
    for the stats interval (where the channel takes that)."""
    from freeride.job import channel

    return {"ping_s": interval} if accepts(channel.Link, "ping_s") else {}


def close_all(links: list[tuple[int, Any]], threads: int, context: Any) -> float:
    """Closes every Link (several at once: each joins its thread), then the shared
    `context` if any; returns the seconds it took."""
    begun = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda entry: entry[1].close(), links))
    if context is not None:
        context.term()
    return time.monotonic() - begun


def worker_main() -> None:
    """A worker's life: settings on stdin, Links opened, then commands until "stop" or
    the end of input; answers on stdout, one JSON line each."""
    from freeride.job import channel

    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but the answers may reach the leader's pipe

    def answer(record: dict[str, Any]) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    config = json.loads(sys.stdin.readline())
    os.nice(config["nice"])
    descriptors = channel.raise_descriptor_limit()
    # One I/O thread for all of this worker's Links, where the channel allows: a context
    # each (a real rank's single Link has its own) is two threads per simulated rank.
    context = None
    if config["shared_context"] and accepts(channel.Link, "context"):
        import zmq

        context = zmq.Context()
        # libzmq allows 1,023 sockets a context by default; a Link holds up to four
        # (its dealer, its handshake's monitor, its waker's pair).
        first, end = config["ranks"]
        context.max_sockets = 4 * (end - first) + 64
    links, report = connect_all(config, context)
    answer({**report, "descriptor_limit": descriptors, "shared_context": context is not None})
    beats = Beats(links, config["interval"]) if links else None
    marked = (0.0, 0.0, 0)
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "go" and beats is not None:
                beats.start()
            elif command == "mark":
                marked = (time.monotonic(), time.process_time(), beats.sent if beats else 0)
            elif command == "report":
                wall = time.monotonic() - marked[0]
                answer(
                    {
                        "phase": "window",
                        "wall_s": round(wall, 3),
                        "cpu_s": round(time.process_time() - marked[1], 3),
                        "sent": (beats.sent if beats else 0) - marked[2],
                        "late_rounds": beats.late_rounds if beats else 0,
                        "max_send_lag_s": round(beats.max_lag, 4) if beats else 0.0,
                        "received": dict(beats.received) if beats else {},
                        "max_silence_s": round(
                            max((l.silent_for() for _, l in links), default=0.0), 3
                        ),
                        "link_dropped": sum(l.dropped for _, l in links),
                        "link_malformed": sum(l.malformed for _, l in links),
                        **process_resources(),
                    }
                )
            elif command == "stop":
                break
    finally:
        if beats is not None:
            beats.halt()
            if beats.is_alive():
                beats.join(5.0)
        closing = close_all(links, config["threads"], context)
        answer({"phase": "closed", "close_s": round(closing, 3)})


# -- the leader --------------------------------------------------------------------------------


class Workers:
    """The worker processes and what they answered: each one's stdout is read by a thread
    of its own into one queue, and the tail of its stderr kept for the report."""

    def __init__(self, config: dict[str, Any], ranges: list[tuple[int, int]]) -> None:
        self.answers: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.stderr: list[deque[str]] = []
        self.procs: list[subprocess.Popen] = []
        self._readers: list[threading.Thread] = []
        for i, span in enumerate(ranges):
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            self.procs.append(proc)
            self.stderr.append(deque(maxlen=20))
            proc.stdin.write(json.dumps({**config, "ranks": list(span)}) + "\n")
            proc.stdin.flush()
            for target in (self._read, self._read_stderr):
                reader = threading.Thread(target=target, args=(i,), daemon=True)
                reader.start()
                self._readers.append(reader)

    def _read(self, i: int) -> None:
        for line in self.procs[i].stdout:
            try:
                self.answers.put((i, json.loads(line)))
            except json.JSONDecodeError:
                self.stderr[i].append(line.rstrip())

    def _read_stderr(self, i: int) -> None:
        for line in self.procs[i].stderr:
            self.stderr[i].append(line.rstrip())

    def tell(self, command: str) -> None:
        """Sends `command` to every worker still running."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.stdin.write(command + "\n")
                    proc.stdin.flush()
                except (BrokenPipeError, ValueError):
                    pass

    def collect(self, phase: str, deadline: float, waiting: Any = None) -> list[dict]:
        """Every worker's answer for `phase`, by worker, or TimeoutError at `deadline` (a
        worker that died first: RuntimeError with its stderr; memory running low:
        MemoryError). `waiting` is called about every 20 ms meanwhile."""
        got: dict[int, dict[str, Any]] = {}
        while len(got) < len(self.procs):
            if waiting is not None:
                waiting()
            self.guard_memory()
            try:
                i, record = self.answers.get(timeout=0.02)
            except queue.Empty:
                for i, proc in enumerate(self.procs):
                    if i not in got and proc.poll() is not None and self.answers.empty():
                        tail = "\n".join(self.stderr[i])
                        raise RuntimeError(
                            f"worker {i} exited ({proc.returncode}) before its {phase!r} "
                            f"answer:\n{tail}"
                        ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{len(self.procs) - len(got)} worker(s) gave no {phase!r} answer in time"
                    ) from None
                continue
            if record.get("phase") == phase:
                got[i] = record
        return [got[i] for i in range(len(self.procs))]

    def stop(self, timeout: float = 60.0) -> list[dict]:
        """Tells every worker to close its Links and waits for it (killing any that has
        not exited by `timeout`); returns the "closed" answers that came."""
        self.tell("stop")
        for proc in self.procs:
            try:
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        end = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for reader in self._readers:  # the last answers are read after the exit
            reader.join(max(0.1, end - time.monotonic()))
        closed = []
        while not self.answers.empty():
            _, record = self.answers.get()
            if record.get("phase") == "closed":
                closed.append(record)
        return closed

    def guard_memory(self) -> None:
        """MemoryError, naming the workers' footprint, once the machine's available memory
        falls under MIN_AVAILABLE of its total: better than the OOM killer's choice."""
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                name, value = line.split(":", 1)
                info[name] = int(value.split()[0]) * 1024
        if info["MemAvailable"] >= MIN_AVAILABLE * info["MemTotal"]:
            return
        rss = 0
        for proc in self.procs:
            try:
                with open(f"/proc/{proc.pid}/statm") as f:
                    rss += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except OSError:
                continue
        raise MemoryError(
            f"stopped: {info['MemAvailable'] / 2**30:.1f} GiB of "
            f"{info['MemTotal'] / 2**30:.1f} GiB left available, the workers hold "
            f"{rss / 2**30:.1f} GiB (beats queued for Links their threads do not read)"
        )

    def pause(self, seconds: float) -> None:
        """Sleeps `seconds`, watching the machine's memory meanwhile."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.guard_memory()
            time.sleep(min(left, 0.5))

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def thread_cpu(native_id: int | None) -> float:
    """CPU seconds (user + system) a thread of this process has used; 0.0 if it is gone."""
    if native_id is None:
        return 0.0
    return thread_cpu_path(f"/proc/self/task/{native_id}/stat")


def thread_cpu_path(path: str) -> float:
    """User + system CPU seconds from a /proc stat file (a process's counts its threads,
    the ended ones included); 0.0 if it cannot be read."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def zmq_threads_cpu() -> float:
    """CPU seconds of this process's libzmq background threads (named "ZMQbg/...")."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("ZMQbg"):
                    total += thread_cpu(int(tid))
        except OSError:
            continue
    return total


class LeaderRank:
    """Rank 0 as the leader holds it: its own Link to the hub and a beat thread."""

    def __init__(self, hub: Any, secret: bytes, interval: float, link_timeout: float) -> None:
        from freeride.job import auth, channel

        self.link = channel.Link(
            HOST,
            hub.port,
            secret,
            hub.public_key,
            auth.rank_role(0),
            link_timeout,
            f"{HOST}:{hub.port}",
            **link_options(interval),
        )
        self.beats = Beats([(0, self.link)], interval)

    def close(self) -> None:
        self.beats.halt()
        if self.beats.is_alive():
            self.beats.join(5.0)
        self.link.close()


def _thread_ids(hub: Any, coordinator: Any, rank0: LeaderRank | None) -> dict[str, list]:
    """The native ids of the leader's threads worth telling apart (private attributes:
    this is a measurement, not an API)."""

    def native(owner: Any, attribute: str) -> int | None:
        thread = getattr(owner, attribute, None)
        return getattr(thread, "native_id", None)

    return {
        "hub": [native(hub, "_thread")],
        "coordinator": [native(coordinator, "_thread")],
        "rank 0 (link, beats)": [native(rank0.link, "_thread"), rank0.beats.native_id]
        if rank0
        else [],
    }


def _leader_cpu(ids: dict[str, list]) -> dict[str, float]:
    """CPU seconds so far: the whole process, each of `ids`' groups, libzmq's threads."""
    cpu = {name: sum(thread_cpu(t) for t in tids) for name, tids in ids.items()}
    cpu["zmq I/O threads"] = zmq_threads_cpu()
    # From /proc like the threads' figures, so that the rest is not a rounding artefact.
    cpu["process"] = thread_cpu_path("/proc/self/stat")
    return cpu


def run(
    ranks: int = 4096,
    procs: int = 8,
    window: float = 10.0,
    settle: float = 2.0,
    threads: int = CONNECT_THREADS,
    link_timeout: float = LINK_TIMEOUT_S,
    interval: float | None = None,
    nice: int = WORKER_NICE,
    shared_context: bool = True,
    budget: float | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Runs the benchmark and returns its figures (see the module's docstring). `settle`:
    seconds of beating before the window opens. `budget`: seconds the whole run may take
    before TimeoutError (default: generous for the setup timeouts). `interval`: the
    ranks' stats interval, instead of what freeride.job.liveness (or today's fixed value)
    gives. `nice`: the workers' niceness. `shared_context`: each worker's Links share one
    zmq context, where the channel allows (else a context each). Leaves nothing
    running, whatever happens."""
    from freeride.job import auth, channel
    from freeride.job.coordinator import Coordinator
    from freeride.job.placement import Policy

    say = progress or (lambda _text: None)
    every, rank_timeout, source = liveness_settings(ranks)
    if interval is None:
        interval = every
    else:
        source += f"; interval {interval:g} s given"
    ranges = split(1, ranks, procs)
    if budget is None:
        # A worker opens its Links `threads` at a time, each allowed link_timeout.
        widest = max(hi - lo for lo, hi in ranges)
        budget = (-(-widest // threads) + 1) * link_timeout + window + settle + 120
    deadline = time.monotonic() + budget
    secret = auth.new_secret()
    # As JobQueue makes it: beating at liveness.beat_every where there is one, else at
    # the stats interval, where the channel takes one.
    beat = {}
    if accepts(channel.Hub, "beat_s"):
        try:
            from freeride.job import liveness

            beat = {"beat_s": liveness.beat_every(ranks, rank_timeout)}
        except (ImportError, AttributeError):
            beat = {"beat_s": interval}
    hub = channel.Hub(HOST, secret, list(range(ranks)), **beat)
    config = {
        "secret": secret.hex(),
        "key": hub.public_key.decode(),
        "port": hub.port,
        "interval": interval,
        "threads": threads,
        "link_timeout": link_timeout,
        "nice": nice,
        "shared_context": shared_context,
    }
    workers: Workers | None = None
    coordinator = None
    rank0: LeaderRank | None = None
    result: dict[str, Any] = {}
    try:
        hub_ids = {"hub": [getattr(getattr(hub, "_thread", None), "native_id", None)]}
        connect_cpu = _leader_cpu(hub_ids)
        spawned = time.monotonic()
        workers = Workers(config, ranges)
        rank0 = LeaderRank(hub, secret, interval, link_timeout)
        all_in: list[float] = []
        curve: list[tuple[float, int]] = []  # (s since spawning, sessions), every 5 s

        def watch_sessions() -> None:
            now, count = time.monotonic(), hub.sessions()
            if not all_in and count >= ranks:
                all_in.append(now - spawned)
            if now - spawned >= 5.0 * (len(curve) + 1):
                curve.append((round(now - spawned, 1), count))
                if len(curve) % 3 == 0:
                    say(f"sessions: {count}/{ranks} after {now - spawned:.0f} s")

        say(f"{len(ranges)} workers spawned; waiting for {ranks} sessions")
        joined = workers.collect("in", deadline, watch_sessions)
        watch_sessions()
        sessions_in = hub.sessions()
        connected = time.monotonic() - spawned
        after_connect = _leader_cpu(hub_ids)
        connect_cpu = {k: v - connect_cpu[k] for k, v in after_connect.items()}
        say(f"sessions: {sessions_in}/{ranks} after {connected:.1f} s")

        # JobQueue's order: every Link in (its barrier), then the coordinator, then beats.
        coordinator = Coordinator(Policy(2), hub, list(range(ranks)), 0, rank_timeout)
        coordinator.start()
        rank0.beats.start()
        workers.tell("go")
        workers.pause(settle)
        ids = _thread_ids(hub, coordinator, rank0)
        counters = (hub.dropped, hub.refused, hub.malformed)
        before, wall0 = _leader_cpu(ids), time.monotonic()
        workers.tell("mark")
        say(f"steady state: measuring {window:g} s")
        workers.pause(window)
        after, wall = _leader_cpu(ids), time.monotonic() - wall0
        workers.tell("report")
        windows = workers.collect("window", deadline)
        lost = sorted(coordinator.lost)
        inbox = getattr(hub, "_in", None)
        result = {
            "benchmark": "queue_scale",
            "settings": {
                "ranks": ranks,
                "procs": len(ranges),
                "window_s": window,
                "settle_s": settle,
                "connect_threads": threads,
                "link_timeout_s": link_timeout,
                "worker_nice": nice,
                "shared_context": all(w["shared_context"] for w in joined),
                "hub_beat_s": beat.get("beat_s", getattr(channel, "BEAT_S", None)),
                "stats_interval_s": interval,
                "rank_timeout_s": rank_timeout,
                "liveness": source,
            },
            "all_in_s": round(all_in[0], 3) if all_in else None,
            "sessions": sessions_in,
            "in": 1 + sum(w["in"] for w in joined),
            "failed": sum(w["failed"] for w in joined),
            "failed_by_type": _merge(w["failed_by_type"] for w in joined),
            "errors": _first_errors(w["errors"] for w in joined),
            "welcome_s": summary([t for w in joined for t in w["welcomed_s"]]),
            "sessions_over_time": curve,
            "connect_phase": {
                "wall_s": round(connected, 3),
                "leader_cpu_pct_one_core": round(100 * connect_cpu["process"] / connected, 1),
                "hub_thread_pct_one_core": round(100 * connect_cpu["hub"] / connected, 1),
                "zmq_io_pct_one_core": round(100 * connect_cpu["zmq I/O threads"] / connected, 1),
            },
            "leader": _leader_figures(before, after, wall, process_resources()),
            "workers": _worker_figures(joined, windows, ranks - 1, interval),
            "hub": {
                "dropped": hub.dropped,
                "refused": hub.refused,
                "malformed": hub.malformed,
                "denied": getattr(hub, "denied", None),  # refused at the transport (ZAP)
                "window_delta": {
                    k: now - then
                    for k, now, then in zip(
                        ("dropped", "refused", "malformed"),
                        (hub.dropped, hub.refused, hub.malformed),
                        counters,
                    )
                },
                "inbox_backlog": len(inbox) if inbox is not None else None,
            },
            "coordinator": {
                "lost": len(lost),
                "lost_ranks": lost[:20],
                "malformed": coordinator.malformed,
            },
        }
    except BaseException:
        if workers is not None:
            workers.kill()
        raise
    finally:
        if coordinator is not None:
            coordinator.stop(5.0)
        # Bounded whatever the budget: a worker that will not close in time is killed.
        closed = workers.stop(30.0) if workers is not None else []
        if rank0 is not None:
            rank0.close()
        hub.close()
    if result:
        result["workers"]["close_s_max"] = max((c["close_s"] for c in closed), default=None)
        result["targets"] = {
            "no_failures": result["failed"] == 0 and result["in"] == ranks,
            "none_lost": result["coordinator"]["lost"] == 0,
            "leader_cpu_under_5pct": result["leader"]["cpu_pct_one_core"] < CPU_TARGET_PCT,
        }
    return result


def _first_errors(lists: Any) -> list[str]:
    """The first KEEP_ERRORS of the workers' errors, and the first of each other kind."""
    kept: list[str] = []
    kinds: set[str] = set()
    for error in (e for errors in lists for e in errors):
        kind = error.split(": ", 2)[1] if error.count(": ") >= 2 else error
        if len(kept) < KEEP_ERRORS or kind not in kinds:
            kept.append(error)
        kinds.add(kind)
    return kept


def _merge(counts: Any) -> dict[str, int]:
    merged: dict[str, int] = {}
    for each in counts:
        for kind, n in each.items():
            merged[kind] = merged.get(kind, 0) + n
    return merged


def _leader_figures(
    before: dict[str, float], after: dict[str, float], wall: float, resources: dict
) -> dict[str, Any]:
    """The leader's CPU over the window as % of one core, in total and by thread."""
    pct = {k: round(100 * (after[k] - before[k]) / wall, 2) for k in after}
    total = pct.pop("process")
    pct["rest (main, readers)"] = round(total - sum(pct.values()), 2)
    return {
        "cpu_pct_one_core": total,
        "by_thread_pct": pct,
        "window_wall_s": round(wall, 3),
        **resources,
    }


def _worker_figures(
    joined: list[dict], windows: list[dict], simulated: int, interval: float
) -> dict[str, Any]:
    """The workers' CPU over the window and how well they kept their ranks' beat."""
    cpu = sum(w["cpu_s"] / w["wall_s"] for w in windows if w["wall_s"] > 0)
    sent = sum(w["sent"] / w["wall_s"] for w in windows if w["wall_s"] > 0)
    received = _merge(w["received"] for w in windows)
    return {
        "cpu_pct_one_core": round(100 * cpu, 1),
        "cpu_us_per_rank_per_s": round(1e6 * cpu / simulated, 1) if simulated else None,
        "stats_per_s": round(sent, 1),
        "stats_per_s_target": round(simulated / interval, 1),
        "late_rounds": sum(w["late_rounds"] for w in windows),
        "max_send_lag_s": max((w["max_send_lag_s"] for w in windows), default=None),
        "max_silence_s": max((w["max_silence_s"] for w in windows), default=None),
        "received": received,
        "link_dropped": sum(w["link_dropped"] for w in windows),
        "connect_s_max": max((w["connect_s"] for w in joined), default=None),
        "threads": sum(w["threads"] for w in windows),
        "fds": sum(w["fds"] for w in windows),
        "rss_mib": round(sum(w["rss_mib"] for w in windows), 1),
        "descriptor_limit": min((w["descriptor_limit"] for w in joined), default=None),
    }


# -- reporting -------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Machine, date and commit for the JSON."""
    import zmq

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "load_average": os.getloadavg(),
    }


def table(result: dict[str, Any]) -> str:
    """The figures as readable lines, targets last."""
    s, leader, workers, hub = result["settings"], result["leader"], result["workers"], result["hub"]
    welcome, connect = result["welcome_s"], result["connect_phase"]
    all_in = result["all_in_s"]
    rows = [
        ("ranks / worker processes", f"{s['ranks']} / {s['procs']}"),
        ("stats interval", f"{s['stats_interval_s']:g} s ({s['liveness']})"),
        ("rank_timeout", f"{s['rank_timeout_s']:g} s"),
        (
            "time until every rank is in",
            _seconds(all_in) if all_in is not None else f"never ({result['sessions']} sessions)",
        ),
        ("ranks in / failed", f"{result['in']} / {result['failed']} {result['failed_by_type']}"),
        ("welcome after (median/p90/max)", "/".join(_seconds(welcome[k]) for k in welcome)),
        (
            "leader CPU while connecting",
            (
                f"{connect['leader_cpu_pct_one_core']:.1f}% "
                f"(hub {connect['hub_thread_pct_one_core']}%, "
                f"zmq I/O {connect['zmq_io_pct_one_core']}%) over {connect['wall_s']:.0f} s"
            ),
        ),
        ("leader CPU, % of one core", f"{leader['cpu_pct_one_core']:.1f}"),
        *((f"  {name}", f"{pct:.1f}") for name, pct in leader["by_thread_pct"].items()),
        (
            "workers CPU, % of one core",
            (
                f"{workers['cpu_pct_one_core']:.1f} "
                f"({workers['cpu_us_per_rank_per_s']} µs per rank per s)"
            ),
        ),
        (
            "stats sent per s (target)",
            (
                f"{workers['stats_per_s']:.0f} ({workers['stats_per_s_target']:.0f}), "
                f"late rounds {workers['late_rounds']}"
            ),
        ),
        ("longest a Link went unbeaten", _seconds(workers["max_silence_s"])),
        (
            "hub dropped/refused/malformed",
            (
                f"{hub['dropped']}/{hub['refused']}/{hub['malformed']} "
                f"(inbox backlog {hub['inbox_backlog']})"
            ),
        ),
        ("ranks declared lost", str(result["coordinator"]["lost"])),
        (
            "workers: threads, fds, RSS",
            f"{workers['threads']}, {workers['fds']}, {workers['rss_mib']:.0f} MiB",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"error: {e}" for e in result["errors"]]
    for name, met in result["targets"].items():
        lines.append(f"target {name}: {'met' if met else 'NOT MET'}")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


class FirstFew(logging.Filter):
    """Lets the first `keep` records through, then says once that it holds the rest back:
    a coordinator that loses a thousand ranks logs a thousand lines, and the figures
    count them anyway."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self._left = keep

    def filter(self, record: logging.LogRecord) -> bool:
        self._left -= 1
        if self._left == -1:
            record.msg, record.args = "(further warnings of freeride.job not shown)", ()
        return self._left >= -1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4096, help="simulated ranks (N)")
    parser.add_argument("--procs", type=int, default=8, help="worker processes holding them")
    parser.add_argument("--window", type=float, default=10.0, help="steady-state seconds measured")
    parser.add_argument("--settle", type=float, default=2.0, help="beating before the window")
    parser.add_argument(
        "--threads", type=int, default=CONNECT_THREADS, help="Links opened at once per worker"
    )
    parser.add_argument(
        "--link-timeout", type=float, default=LINK_TIMEOUT_S, help="each Link's setup timeout"
    )
    parser.add_argument(
        "--interval", type=float, help="the ranks' stats interval (default: the queue's own)"
    )
    parser.add_argument(
        "--worker-nice", type=int, default=WORKER_NICE, help="the worker processes' niceness"
    )
    parser.add_argument(
        "--context-per-link",
        action="store_true",
        help="give each Link a zmq context of its own, as a real rank's has",
    )
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.ranks < 2 or args.procs < 1:
        parser.error("--ranks must be at least 2 and --procs at least 1")
    logging.getLogger("freeride.job").addFilter(FirstFew(KEEP_ERRORS))
    result = run(
        args.ranks,
        args.procs,
        args.window,
        args.settle,
        args.threads,
        args.link_timeout,
        args.interval,
        args.worker_nice,
        not args.context_per_link,
        progress=lambda text: print(text, file=sys.stderr, flush=True),
    )
    result["environment"] = environment()
    print(table(result))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
