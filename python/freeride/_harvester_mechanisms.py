"""What a harvester's backend chose for its mechanisms, read from its executor: the
introspection half of fr.Harvester, kept apart from its lifecycle and task API."""

from __future__ import annotations

from typing import Any

from ._harvester_counts import LaunchCounts


class BackendMechanisms:
    """Read-only properties of the mechanisms the backend runs with (how side kernels
    leave room, how side threads stay idle, how launches are admitted). Mixed into
    fr.Harvester, whose `_ex` is the executor they are read from."""

    _ex: Any

    @property
    def reserve_mechanism(self) -> str:
        """How side kernels leave room for training's kernels: "occupancy-cap",
        "green-context (120 of 132 SMs)" (built-in kernels in a green context of that
        many SMs; RawKernel tasks under the occupancy cap), or "none" on the host."""
        return str(self._ex.reserve_mechanism)

    @property
    def host_idle(self) -> str:
        """Host backend: how side threads stay out of other ranks' training, whose
        scheduling group may not be theirs: "sched-idle" (idle priority alone: autogroup
        is off or leaves this process alone, or the process shares its session and so
        its group with the ranks it was started with), or, in a process that leads its
        session as torchrun's workers do, "idle-cgroup" (idle priority in a cpu cgroup
        with cpu.idle=1, idle against every group) or, where none can be joined,
        "backoff" (idle priority, and they sleep while more threads are runnable than
        there are cores). FREERIDE_HOST_IDLE forces one; host_idle_reason says why.
        "" on CUDA. See "The host backend's cost" in docs/guide.md."""
        return str(self._ex.host_idle)

    @property
    def host_idle_reason(self) -> str:
        """Why host_idle is what it is, in words ("" on CUDA)."""
        return str(self._ex.host_idle_reason)

    @property
    def admission(self) -> str:
        """How a side launch is let in once the gate opens, where no launch was queued at
        the open: "ring" (the executor thread sleeps until a watcher thread, waiting for
        an event recorded behind the open, wakes it), "poll" (it polls the gate's host
        mirror: FREERIDE_ADMISSION=poll), "spin" (it yields between looks at the mirror
        while a task waits, for a host core: FREERIDE_ADMISSION=spin), "stream-wait"
        (Harvester(stream_wait=True)), or "host" on the host backend."""
        return str(self._ex.admission)

    @property
    def launches_at_opens(self) -> bool:
        """CUDA: whether each stream-ordered open enqueues the running side task's launch
        for its bubble then, at the open's point of the host's order, ahead of the wait
        and the compute training enqueues next (True unless FREERIDE_LAUNCH_AT_OPEN=0
        or stream_wait); the executor relaunches within a bubble as before. Where the
        host runs ahead of the GPU, and above all with one hardware queue
        (CUDA_DEVICE_MAX_CONNECTIONS=1), a launch made only when the host sees the open
        take effect queues behind all of that and finds its bubble over. False on the
        host backend, whose gate writes are immediate."""
        return bool(self._ex.launches_at_opens)

    @property
    def device_phases(self) -> bool:
        """CUDA: whether a task whose phases all run one kernel over as many items
        (PageRank, Spin, ItemCounter, ``RawKernel(..., device_phases=True)``) is served
        from one launch across its phases, a launch queued at an open running whatever
        phase is current when its bubble comes (True unless FREERIDE_DEVICE_PHASES=0).
        False on the host backend, whose workers keep the phases in order themselves."""
        return bool(self._ex.device_phases)

    def launch_counts(self) -> LaunchCounts:
        """The side launches so far: how many, how many ran no item, and how many of each
        were enqueued at opens."""
        ex = self._ex
        return LaunchCounts(
            ex.launches,
            ex.idle_launches,
            ex.open_launches,
            ex.idle_open_launches,
            ex.skipped_open_launches,
            ex.max_lookahead,
            ex.opens_beyond_lookahead,
            ex.opens_served_by_executor,
        )

    @property
    def reserve_fallback(self) -> str | None:
        """Why the green-context reserve (the default) fell back to the occupancy cap (a
        driver without green contexts, a failed split, a green-context stream that refused
        a trial launch); None where it did not."""
        return str(self._ex.reserve_fallback) or None

    @property
    def green_workqueues(self) -> str | None:
        """The green context's workqueues: "shared" (the device's, as every context's),
        "balanced" (its own: FREERIDE_GREEN_WORKQUEUE=balanced on a CUDA 13.1 driver), or
        "shared (balanced not had: why)"; None without a green context."""
        return str(self._ex.green_workqueues) or None
